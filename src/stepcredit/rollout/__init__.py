"""Rollout: n samples per prompt with behaviour log-probs, by the configured engine.

``generate`` returns a :class:`~stepcredit.types.Batch` with left-padded prompts, right-padded
responses (eos included, so the policy learns to stop), response masks, truncation flags and the
log-probs of the sampled tokens under the generating policy (:mod:`stepcredit.rollout.batching`).
Which engine samples (``rollout.engine``: our decode loop or vLLM) is the one bound to the model
(:mod:`stepcredit.rollout.engines`); the rollout modes (``flat``, ``tree``) sample through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from stepcredit.config import RolloutConfig
from stepcredit.errors import ConfigError
from stepcredit.registry import Registry
from stepcredit.rollout.batching import finish_batch, left_pad, render_prompts, sampling_logprobs_exact
from stepcredit.rollout.engines import engine_for, installed
from stepcredit.rollout.tree import BRANCH_RULES, tree_rollout
from stepcredit.types import Batch, Sample

if TYPE_CHECKING:
    from stepcredit.config import Config

__all__ = [
    "ROLLOUT_MODES",
    "RolloutModeSpec",
    "check_config",
    "finish_batch",
    "generate",
    "left_pad",
    "render_prompts",
    "sampling_logprobs_exact",
]


@torch.no_grad()
def generate(
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
    row_seeds: list[int] | None = None,
) -> Batch:
    """Sample ``n`` responses per prompt (greedy when ``temperature == 0``) with the engine bound to
    ``model`` (:func:`stepcredit.rollout.engines.engine_for`; none bound: the model itself).

    Responses of prompt ``i`` get group id ``group_offset + i``. Runs under ``torch.no_grad`` (not
    inference mode: its tensors would break the later backward pass). ``with_logprobs=False`` skips the
    behaviour log-prob pass (``behaviour_logp_BT`` is then None). ``keep_cache``: the behaviour
    log-prob pass keeps its KV cache in ``batch.kv_cache`` (a :class:`~stepcredit.types.RolloutCache`)
    so the process stage values prefixes without running the responses through the model again.
    Generation runs on the model's device; the returned batch is on the CPU (the cache stays on the device).
    ``logprobs_from_sampling`` (``hf`` only): the behaviour log-probs are those the sampling loop computed
    from its own logits, with no pass of their own, where that is the training pass's distribution to
    float rounding (:func:`sampling_logprobs_exact`; else, or with ``keep_cache``, the pass runs).
    ``times`` (a dict) gets ``time/behaviour_logp_s``, the behaviour log-probs' own cost. An external
    engine (vLLM) also fills ``engine_logp_BT`` with its own log-probs of the sampled tokens.
    ``row_seeds`` (one int per prompt): each prompt's responses draw from a random stream of their own
    (validation's common random numbers: a row's tokens depend on its seed and the model alone); None:
    the engine's shared stream.
    """
    return engine_for(model).generate(
        model,
        tok,
        samples,
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        group_offset=group_offset,
        with_logprobs=with_logprobs,
        policy_version=policy_version,
        keep_cache=keep_cache,
        logprobs_from_sampling=logprobs_from_sampling,
        times=times,
        **({"row_seeds": row_seeds} if row_seeds is not None else {}),
    )


# ------------------------------------------------------------------------------------ rollout modes
class RolloutMode(Protocol):
    def __call__(
        self,
        model: Any,
        tok: Any,
        samples: list[Sample],
        cfg: RolloutConfig,
        *,
        group_offset: int,
        policy_version: int,
        with_logprobs: bool,
        keep_cache: bool,
        boundaries: Callable[[list[int]], list[int]],
    ) -> tuple[Batch, dict[str, float]]: ...


@dataclass(frozen=True)
class RolloutModeSpec:
    """A registered way of sampling a prompt's group, and what later stages must know about it."""

    fn: RolloutMode
    """Returns the batch (``rollout.n`` responses per prompt, each prompt's contiguous, one group per
    prompt) and the rollout's counters (sums: ``rollout/responses``, ``rollout/generated_tokens``...)."""
    shares_prefixes: bool
    """The group's responses share prefixes and the batch carries ``tree_ends`` / ``tree_nodes``, so the
    mean outcome below a node values its prefix (what ``from_outcomes`` value estimators need)."""
    check: Callable[[Config], None] | None = None
    """The mode's own start-up check of its settings (raises ConfigError), run by :func:`check_config`."""


ROLLOUT_MODES: Registry[RolloutModeSpec] = Registry("rollout mode")


def _flat(
    model: Any,
    tok: Any,
    samples: list[Sample],
    cfg: RolloutConfig,
    *,
    group_offset: int,
    policy_version: int,
    with_logprobs: bool,
    keep_cache: bool,
    boundaries: Callable[[list[int]], list[int]],
) -> tuple[Batch, dict[str, float]]:
    """``rollout.n`` independent responses per prompt."""
    times: dict[str, float] = {}
    batch = generate(
        model,
        tok,
        samples,
        n=cfg.n,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        group_offset=group_offset,
        policy_version=policy_version,
        with_logprobs=with_logprobs,
        keep_cache=keep_cache,
        logprobs_from_sampling=cfg.logprobs_from_sampling,
        times=times,
    )
    tokens = float(batch.response_mask_BT.sum())
    return batch, {
        **times,
        "rollout/responses": float(len(batch)),
        "rollout/generated_tokens": tokens,
        "rollout/response_tokens": tokens,
    }


ROLLOUT_MODES.add("flat", RolloutModeSpec(_flat, shares_prefixes=False))
ROLLOUT_MODES.add("tree", RolloutModeSpec(tree_rollout, shares_prefixes=True))


def check_config(cfg: Config) -> None:
    """Start-up checks of the rollout settings the config tree cannot see: a known mode and engine,
    the engine installed, and able to do what the mode asks of it (raises ConfigError)."""
    mode = ROLLOUT_MODES.get(cfg.rollout.mode)  # an unknown name: one line with the valid ones
    engine = installed(cfg.rollout.engine)
    if mode.check is not None:
        mode.check(cfg)
    rule = BRANCH_RULES.get(cfg.rollout.tree.branch_at)
    if mode.shares_prefixes and rule.needs_entropy and not engine.returns_entropy:
        raise ConfigError(
            f"config key rollout.tree.branch_at: {cfg.rollout.tree.branch_at} reads each token's entropy, "
            f"which rollout.engine={cfg.rollout.engine} does not report (use branch_at=episode or engine=hf)"
        )
