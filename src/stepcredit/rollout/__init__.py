"""Rollout: n samples per prompt with behaviour log-probs, by the configured engine.

``generate`` returns a :class:`~stepcredit.types.Batch` with left-padded prompts, right-padded
responses (eos included, so the policy learns to stop), response masks, truncation flags and the
log-probs of the sampled tokens under the generating policy (:mod:`stepcredit.rollout.batching`).
Which engine samples (``rollout.engine``: our decode loop or vLLM) is the one bound to the model
(:mod:`stepcredit.rollout.engines`); the rollout modes (``flat``, ``tree``) sample through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stepcredit.config import RolloutConfig
from stepcredit.errors import ConfigError
from stepcredit.registry import Registry
from stepcredit.rollout.batching import (
    finish_batch,
    generate_batch,
    generation_spec,
    left_pad,
    render_prompts,
    sampling_logprobs_exact,
)
from stepcredit.rollout.engines import GenerationSpec, engine_for, installed
from stepcredit.rollout.tree import BRANCH_RULES, tree_rollout
from stepcredit.types import Batch, Sample

if TYPE_CHECKING:
    from stepcredit.config import Config

__all__ = [
    "ROLLOUT_MODES",
    "GenerationSpec",
    "RolloutModeSpec",
    "check_config",
    "finish_batch",
    "generate",
    "generation_spec",
    "left_pad",
    "render_prompts",
    "sampling_logprobs_exact",
]


def generate(
    model: Any,
    tok: Any,
    samples: list[Sample],
    spec: GenerationSpec | None = None,
    *,
    times: dict[str, float] | None = None,
    **fields: Any,
) -> Batch:
    """Sample ``spec.n`` responses per prompt (greedy when ``spec.temperature == 0``) with the engine bound
    to ``model`` (:func:`stepcredit.rollout.engines.engine_for`; none bound: the model itself), as
    :func:`~stepcredit.rollout.batching.generate_batch` describes. ``spec``: a
    :class:`~stepcredit.rollout.engines.GenerationSpec`, or its fields as keywords
    (``generate(model, tok, samples, n=4, max_new_tokens=32)``). Generation runs on the model's device;
    the returned batch is on the CPU (its cache stays on the device)."""
    if spec is None:
        spec = GenerationSpec(**fields)
    elif fields:
        spec = dataclasses.replace(spec, **fields)
    return generate_batch(engine_for(model), model, tok, samples, spec, times=times)


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
    spec = generation_spec(cfg, group_offset=group_offset, policy_version=policy_version)
    spec = dataclasses.replace(spec, with_logprobs=with_logprobs, keep_cache=keep_cache)
    batch = generate(model, tok, samples, spec, times=times)
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
