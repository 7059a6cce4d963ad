"""The few dataclasses every stage shares, and the dimension key.

Dimension key (suffixes on tensor names in the maths):
    B  responses in a batch (prompts x samples per prompt)
    G  group size (samples per prompt)
    P  prompt tokens
    T  response tokens (right-padded)
    S  episodes / steps of a response
    V  vocabulary
A mask is ``bool`` and True means "counts".

This module imports no torch at module level so that verifiers can be used without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Status(str, Enum):
    """Why a reward is what it is. ``ok``, ``unparseable``, ``program_error`` and ``program_timeout``
    are real scores (verdicts on the response, :attr:`is_verdict`); the others mean the reward could
    not be computed, and the failure policy decides what they become."""

    OK = "ok"
    """The reward was computed."""
    UNPARSEABLE = "unparseable"
    """No answer could be extracted from the response: the model's fault, scored as wrong."""
    TIMEOUT = "timeout"
    """The reward function (a judge, a reward model, a custom function) ran past its deadline and was stopped."""
    ERROR = "error"
    """The reward could not be computed: the reward function raised or crashed, or the row is malformed."""
    SANDBOX_ERROR = "sandbox_error"
    """The sandbox itself failed: neither the model's fault nor a pass."""
    UNSCORED = "unscored"
    """No reward function applies to the sample (every TRL-style function returned None)."""
    PROGRAM_ERROR = "program_error"
    """The model's program ran and crashed or raised on a test case: the model's fault, a real score
    (the fraction of cases passed, or 0), never a failure of the reward."""
    PROGRAM_TIMEOUT = "program_timeout"
    """The model's program ran past its per-case limit and was stopped: the model's fault, a real score."""

    @property
    def is_verdict(self) -> bool:
        """True when a result with this status is a real score on the response (failure policy,
        circuit breaker and ``score_mean`` metrics count it as a score, never as a failure)."""
        return self in _VERDICTS


_VERDICTS = frozenset({Status.OK, Status.UNPARSEABLE, Status.PROGRAM_ERROR, Status.PROGRAM_TIMEOUT})


@dataclass
class RewardResult:
    """A typed reward: a score plus a status; "could not score" is never a silent 0."""

    score: float
    status: Status = Status.OK
    extracted: str | None = None
    """The answer the verifier extracted from the response, if any."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form details (the judge's explanation, test outcomes, the raw return value...)."""
    latency_s: float = 0.0
    source: str = ""
    """Which reward function produced it (the routing key)."""
    verdict: bool | None = None
    """Whether ``score`` is a real verdict on the response. None = decided by the status
    (:attr:`Status.is_verdict`); a reward function may force either way (False: the failure policy decides)."""

    @property
    def ok(self) -> bool:
        """True when the score is a real verdict on the response and finite."""
        verdict = self.verdict if self.verdict is not None else self.status.is_verdict
        return verdict and math.isfinite(self.score)

    @classmethod
    def failure(cls, status: Status, message: str, **info: Any) -> RewardResult:
        """A result for a reward that could not be computed; ``score`` is NaN so nobody averages it."""
        return cls(score=float("nan"), status=status, info={"message": message, **info})

    def to_json(self) -> dict[str, Any]:
        return {
            "score": None if math.isnan(self.score) else self.score,
            "status": self.status.value,
            "extracted": self.extracted,
            "info": self.info,
            "latency_s": self.latency_s,
            "source": self.source,
            "verdict": self.ok,
        }


@dataclass(frozen=True)
class Sample:
    """One prompt row in the verl schema, plus where it came from."""

    prompt: tuple[dict[str, str], ...]
    """Chat messages ``({"role": ..., "content": ...}, ...)``."""
    ground_truth: Any
    data_source: str = "arith"
    ability: str = "math"
    style: str = "rule"
    """``rule`` (a verifier) or ``model`` (a reward model)."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    domain: str = "default"
    tag: str = "default"
    uid: str = ""
    """A stable id of the row (file:row or task:seed:index) used in error messages and logs."""

    def with_(self, **kw: Any) -> Sample:
        return replace(self, **kw)


@dataclass(frozen=True)
class RolloutCache:
    """The KV cache of the rollout's forward pass over every prompt + response (the pass that computes
    the behaviour log-probs), for the process stage to continue from.

    Row ``b`` holds response ``b``: its left-padded prompt starts at column ``starts[b]``, its response
    at the prompt width, and positions follow the attention mask (the prompt's first token is at
    position 0). ``width`` is the number of cached columns.
    """

    cache: Any
    starts: list[int]
    width: int


_BATCH_TENSORS = (
    "group_B",
    "prompt_ids_BP",
    "prompt_mask_BP",
    "response_ids_BT",
    "response_mask_BT",
    "behaviour_logp_BT",
    "observation_BT",
    "truncated_B",
    "values_BT",
    "engine_logp_BT",
)


_BATCH_WHOLE = ("policy_version", "policy_updates", "kv_cache")
"""Fields of a :class:`Batch` that belong to the whole batch, not to each response (never indexed)."""


@dataclass
class Batch:
    """What a rollout produces and every later stage reads or extends.

    Per response ``b`` (B in all): the ``Sample`` it answers, its group id, and its tensors.
    The reward stage fills ``rewards``; the process stage fills ``episode_ends`` and ``values``;
    the estimators read ``outcome_BT`` and ``process_BT`` (kept apart until the estimator combines them).
    """

    samples: list[Sample]
    group_B: torch.Tensor
    """Long ids; responses to the same prompt share an id."""
    prompt_ids_BP: torch.Tensor
    """Left-padded prompt tokens."""
    prompt_mask_BP: torch.Tensor
    response_ids_BT: torch.Tensor
    """Right-padded response tokens (eos included when generated)."""
    response_mask_BT: torch.Tensor
    behaviour_logp_BT: torch.Tensor | None
    """Log-probs of the sampled tokens under the policy that generated them; None when the rollout
    skipped that pass because the batch's one optimiser step starts from those very weights (the
    training pass is then the behaviour pass: see ``trainer.update.needs_behaviour_logp``)."""
    texts: list[str]
    """Decoded responses (special tokens removed)."""
    truncated_B: torch.Tensor
    """True where the response hit the length limit without eos."""
    policy_version: int = 0
    """RL steps completed by the weights that generated this batch (staleness = steps since)."""
    policy_updates: int = 0
    """Optimiser steps taken by the weights that generated this batch (has the policy moved since?)."""
    values_BT: torch.Tensor | None = None
    rewards: list[RewardResult] | None = None
    episode_ends: list[list[int]] | None = None
    """Per response: token indices (into the response) of each episode's last token."""
    prefix_values: list[list[float]] | None = None
    """Per response: V_0 (empty response), V_1, ..., V_S at the episode ends."""
    tree_ends: list[list[int]] | None = None
    """Tree rollouts: per response, the token index of the last token before each branch point on its
    path (shared with its siblings up to there), then its own last token."""
    tree_nodes: list[list[int]] | None = None
    """Tree rollouts: per response, the ids (unique within its group) of the tree nodes whose values are
    V_0 (the root: the bare prompt), V_1, ... at ``tree_ends``; its own outcome is the last value."""
    observation_BT: torch.Tensor | None = None
    """Multi-turn rollouts (``rollout.mode=tools``): True on the tool results' tokens, which the policy
    reads but did not write. They are not in ``response_mask_BT`` (never trained on, no reward placed
    on them) but are attended to: :meth:`attention_BT` is the response's attention mask."""
    engine_logp_BT: torch.Tensor | None = None
    """Log-probs of the sampled tokens as the rollout engine computed them when that engine is not the
    trainer's own model (vLLM): the loss compares them with the trainer's (``loss.tis_cap``)."""
    kv_cache: RolloutCache | None = None
    """The rollout's KV cache over prompt + response (``generate(keep_cache=True)``), held only until
    the process stage has used it: never selected, concatenated or saved."""

    def __len__(self) -> int:
        return len(self.samples)

    def attention_BT(self) -> torch.Tensor:
        """The response tokens the model sees: the trained ones and the tool results between them."""
        if self.observation_BT is None:
            return self.response_mask_BT
        return self.response_mask_BT | self.observation_BT.to(self.response_mask_BT.device)

    def select(self, idx: list[int]) -> Batch:
        """A sub-batch of the given response indices (in that order)."""
        import torch

        index = torch.as_tensor(idx, dtype=torch.long)

        def pick(x: Any) -> Any:
            if x is None:
                return None
            if hasattr(x, "index_select"):
                return x.index_select(0, index.to(x.device))
            return [x[i] for i in idx]

        per_response = (f.name for f in fields(self) if f.name not in _BATCH_WHOLE)
        return replace(self, kv_cache=None, **{name: pick(getattr(self, name)) for name in per_response})

    def to(self, device: Any) -> Batch:
        """The same batch with its tensors on ``device`` (the rollout cache stays where it is)."""

        def move(x: Any) -> Any:
            return x.to(device) if hasattr(x, "to") and hasattr(x, "device") else x

        return replace(
            self,
            **{f: move(getattr(self, f)) for f in _BATCH_TENSORS if getattr(self, f) is not None},
        )

    def with_rewards(self, results: list[RewardResult]) -> Batch:
        """A copy carrying one reward result per response (the reward stage's output)."""
        if len(results) != len(self):
            raise ValueError(f"{len(results)} reward results for {len(self)} responses")
        return replace(self, rewards=list(results), kv_cache=None)

    def without_rewards(self) -> Batch:
        """A copy without reward results (what a checkpoint stores of a batch still being scored)."""
        return replace(self, rewards=None, kv_cache=None)

    @staticmethod
    def concat(parts: list[Batch]) -> Batch:
        """Responses of several batches in one (prompt and response tensors padded to the longest)."""
        import torch

        if not parts:
            raise ValueError("Batch.concat needs at least one batch")
        if len(parts) == 1:
            return parts[0]
        P = max(b.prompt_ids_BP.shape[1] for b in parts)
        T = max(b.response_ids_BT.shape[1] for b in parts)

        def lpad(x: torch.Tensor, n: int, v: float | bool) -> torch.Tensor:
            return torch.nn.functional.pad(x, (n - x.shape[1], 0), value=v)

        def rpad(x: torch.Tensor, n: int, v: float | bool) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, n - x.shape[1]), value=v)

        def cat_opt(name: str) -> torch.Tensor | None:
            xs = [getattr(b, name) for b in parts]
            return None if any(x is None for x in xs) else torch.cat([rpad(x, T, 0.0) for x in xs])

        def cat_list(name: str) -> list[Any] | None:
            xs = [getattr(b, name) for b in parts]
            return None if any(x is None for x in xs) else [v for x in xs for v in x]

        pad_id = (
            int(parts[0].prompt_ids_BP[~parts[0].prompt_mask_BP].flatten()[:1].tolist()[0])
            if bool((~parts[0].prompt_mask_BP).any())
            else 0
        )
        return Batch(
            samples=[s for b in parts for s in b.samples],
            group_B=torch.cat([b.group_B for b in parts]),
            prompt_ids_BP=torch.cat([lpad(b.prompt_ids_BP, P, pad_id) for b in parts]),
            prompt_mask_BP=torch.cat([lpad(b.prompt_mask_BP, P, False) for b in parts]),
            response_ids_BT=torch.cat([rpad(b.response_ids_BT, T, pad_id) for b in parts]),
            response_mask_BT=torch.cat([rpad(b.response_mask_BT, T, False) for b in parts]),
            behaviour_logp_BT=cat_opt("behaviour_logp_BT"),
            texts=[t for b in parts for t in b.texts],
            truncated_B=torch.cat([b.truncated_B for b in parts]),
            policy_version=min(b.policy_version for b in parts),
            policy_updates=min(b.policy_updates for b in parts),
            values_BT=cat_opt("values_BT"),
            rewards=cat_list("rewards"),
            episode_ends=cat_list("episode_ends"),
            prefix_values=cat_list("prefix_values"),
            tree_ends=cat_list("tree_ends"),
            tree_nodes=cat_list("tree_nodes"),
            observation_BT=None
            if any(b.observation_BT is None for b in parts)
            else torch.cat([rpad(b.observation_BT, T, False) for b in parts if b.observation_BT is not None]),
            engine_logp_BT=cat_opt("engine_logp_BT"),
        )
