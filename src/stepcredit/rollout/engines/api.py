"""What a rollout engine is: its sampling and generation requests and its completion, its protocol, its registry entry, and
the helpers every engine shares (weight fingerprints, stop strings, ragged and left-padded rows)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from stepcredit.config import Config
    from stepcredit.types import RolloutCache


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
    stop_pattern: str = ""
    """A regular expression (a task's answer marker, ``stepcredit.data.ANSWER_ENDS``): a continuation
    ends with the token that completes the first match in its own text (kept). ``hf`` stops there in
    the sampling loop, so nothing after it is generated; an engine that cannot ignores it and the
    continuation runs on to eos, which the task's contract makes worth the same. '' = none."""
    seed: int | None = None
    """Seed of this call's draws (context i uses ``seed + i`` in vLLM, one seeded stream here); None =
    torch's global random stream (``hf`` draws from it, ``vllm`` draws its seed from it)."""
    row_seeds: tuple[int, ...] = ()
    """One seed per context (overrides ``seed``): context i's continuations draw from a stream of their
    own (``hf``: keyed by (row_seeds[i], j) for continuation j; ``vllm``: a request seeded row_seeds[i]),
    so what one context samples does not depend on the others. Empty: ``seed``'s rule."""
    logprobs: bool = False
    """Report each sampled token's log-probability (:attr:`Completion.logprobs`)."""
    entropy: bool = False
    """Report each token's next-token entropy (:attr:`Completion.entropy`; an engine whose registry
    entry says ``returns_entropy``)."""
    keep_kv: bool = False
    """Keep each completion's keys and values (:attr:`Completion.kv`), so that a later call can continue
    from a prefix of it without running that prefix again (a tree's branches); an engine that keeps
    none leaves ``kv`` None."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingSpec: n, max_tokens >= 1, temperature >= 0, 0 < top_p <= 1: {self}")


@dataclass(frozen=True)
class GenerationSpec:
    """What a batch generation asks for (:func:`stepcredit.rollout.generate`): ``n`` responses per prompt,
    how they are sampled, and what the batch carries beside them. Every engine reads it the same way."""

    n: int = 1
    """Responses per prompt (one group per prompt)."""
    max_new_tokens: int = 64
    """Length limit of a response (eos included when it stops)."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling threshold (Holtzman et al. 2020)."""
    group_offset: int = 0
    """Responses to prompt ``i`` get group id ``group_offset + i``."""
    with_logprobs: bool = True
    """Compute the behaviour log-probs (False: ``behaviour_logp_BT`` is None)."""
    policy_version: int = 0
    """The policy version stamped on the batch (off-policy bookkeeping)."""
    keep_cache: bool = False
    """The behaviour log-prob pass keeps its KV cache in ``batch.kv_cache`` (the process stage continues
    from it instead of running the responses through the model again)."""
    row_seeds: tuple[int, ...] = ()
    """One seed per prompt: prompt i's responses draw from random streams of their own (validation's
    common random numbers: a row's tokens depend on its seed and the model alone); empty: the engine's
    shared stream (:attr:`SamplingSpec.row_seeds`)."""
    logprobs_from_sampling: bool = False
    """The behaviour log-probs are the sampling loop's own, with no pass of their own, where those are the
    training pass's distribution to float rounding (an engine that runs the trainer's model, float32;
    else, or with ``keep_cache``, the pass runs)."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"GenerationSpec: n, max_new_tokens >= 1, temperature >= 0, 0 < top_p <= 1: {self}"
            )
        object.__setattr__(self, "row_seeds", tuple(self.row_seeds))  # a list given: kept as a tuple

    def sampling(self, *, logprobs: bool = False) -> SamplingSpec:
        """The per-context sampling request of this generation (what :meth:`Engine.sample` takes)."""
        return SamplingSpec(
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_new_tokens,
            row_seeds=self.row_seeds,
            logprobs=logprobs,
        )


@dataclass(frozen=True)
class Completion:
    """One sampled continuation."""

    ids: list[int]
    """Tokens, ending at the first eos (kept) or stop string, or at the length limit."""
    logprobs: list[float] = field(default_factory=list)
    """Per token, its log-probability under softmax(logits / temperature) (empty unless asked for)."""
    entropy: list[float] = field(default_factory=list)
    """Per token, the entropy of the distribution it was drawn from (empty unless asked for)."""
    kv: Any = None
    """The keys and values of its context and tokens (``SamplingSpec.keep_kv``), an opaque handle for
    ``prefixes`` of a later :meth:`Engine.sample` of the same engine; None when not kept."""


@dataclass(frozen=True)
class CachedContexts:
    """Contexts that are each the prompt and a prefix of a rollout's response, with the rollout's KV
    cache over those responses (an engine that ``continues_cache`` starts from it)."""

    body: RolloutCache
    """The rollout's cache (read, never modified)."""
    rows: tuple[int, ...]
    """The cache row (the response) of each context."""
    contexts: tuple[tuple[int, ...], ...]
    """Each context's tokens (at least one)."""


Contexts = Sequence[Sequence[int]]
"""Token-id contexts to continue (a prompt, or a prompt and a prefix of a response)."""

Budgets = Sequence[int] | None
"""A token limit per context (None: ``spec.max_tokens`` for every one)."""

Prefixes = Sequence[Any] | None
"""Per context, a :attr:`Completion.kv` whose row begins with all of the context's tokens but the last
(None: every context is run from its first token)."""


class Engine(Protocol):
    """A generation backend (see the module docstring)."""

    external: bool
    """The engine holds its own copy of the weights (which must follow the trainer's), rather than
    running the trainer's model: its log-probs are kept beside the trainer's (``engine_logp_BT``), never
    used as the behaviour log-probs."""

    def sample(
        self,
        model: Any,
        tok: Any,
        contexts: Contexts,
        spec: SamplingSpec,
        *,
        budgets: Budgets = None,
        prefixes: Prefixes = None,
    ) -> list[Completion]:
        """``spec.n`` completions per context, context-major (``len(contexts) * spec.n``); ``budgets``:
        a token limit per context (at most ``spec.max_tokens``); ``prefixes``: kept keys and values of
        each context's start (an engine that keeps none, or caches prefixes itself, ignores them)."""
        ...

    def sync(self, model: Any) -> None:
        """Make the engine generate with ``model``'s current weights (no-op when it runs the model)."""
        ...

    def sleep(self) -> None:
        """Free the engine's accelerator memory for the update (no-op where there is none to free)."""
        ...

    def feed(self, weights: Callable[[], Mapping[str, Any]]) -> None:
        """From now on :meth:`sync` pushes ``weights()`` (Hugging Face names): how an adapter-wrapped
        policy is served with its adapters merged (no-op when the engine runs the model itself)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineSpec:
    """A registered engine and what the start-up check must know about it."""

    build: Callable[[Config, Any, Any], Engine]
    """(config, policy model, tokenizer) -> the engine (called once at set-up)."""
    returns_entropy: bool
    """It can report each token's next-token entropy (``rollout.tree.branch_at=entropy`` needs it)."""
    runs_decode_loop: bool = False
    """It generates with stepcredit's decode loop (:func:`stepcredit.rollout.sampling.decode`), so the
    loop's switches apply: ``rollout.decode_compile`` and ``model.lora.merge_for_generation``."""
    requires: str = ""
    """The module it imports, checked at start-up ('' = none beyond the core install)."""
    install_hint: str = ""
    """How to install that module, for the start-up error."""


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


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows as one left-padded ``[len(seqs), longest]`` id tensor and its bool mask."""
    import torch

    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, P - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[i, P - len(s) :] = True
    return ids, mask
