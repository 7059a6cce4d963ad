"""Rollout: n samples per prompt with behaviour log-probs, by the configured engine.

``generate`` returns a :class:`~stepcredit.types.Batch` with left-padded prompts, right-padded
responses (eos included, so the policy learns to stop), response masks, truncation flags and the
log-probs of the sampled tokens under the generating policy (:mod:`stepcredit.rollout.batching`).
Which engine samples (``rollout.engine``: our decode loop or vLLM) is the one bound to the model
(:mod:`stepcredit.rollout.engines`). A rollout mode (``flat``, ``tree``, ``tools``, ``tools_tree``) is
one registered function that takes a :class:`RolloutRequest` (:mod:`stepcredit.rollout.modes`); the
built-in ones are registered by :mod:`stepcredit.rollout.builtin`, imported here.
"""

import stepcredit.rollout.builtin  # noqa: F401  (registers flat, tree, tools, tools_tree)
from stepcredit.rollout.batching import (
    finish_batch,
    generation_spec,
    left_pad,
    render_prompts,
    sampling_logprobs_exact,
)
from stepcredit.rollout.engines import GenerationSpec
from stepcredit.rollout.flat_mode import generate
from stepcredit.rollout.modes import ROLLOUT_MODES, RolloutModeSpec, RolloutRequest, check_config
from stepcredit.rollout.tool_context import ToolContext

__all__ = [
    "ROLLOUT_MODES",
    "GenerationSpec",
    "RolloutModeSpec",
    "RolloutRequest",
    "ToolContext",
    "check_config",
    "finish_batch",
    "generate",
    "generation_spec",
    "left_pad",
    "render_prompts",
    "sampling_logprobs_exact",
]
