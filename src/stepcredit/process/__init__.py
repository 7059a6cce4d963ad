"""Training-free process rewards: episodes, V(prefix) from the policy itself, marginal utility.

A response is split into episodes (:func:`segment_episodes`); right after generation, while the policy
is loaded, :func:`compute_prefix_values` stores V_0 (empty response) and V_1..V_S (after each episode)
on the batch; later stages turn them into the process channel with :func:`process_channel`, which
is arithmetic only. Value estimators are registered in :data:`VALUE_ESTIMATORS`.
"""

from __future__ import annotations

from typing import Any

import torch

from stepcredit.config import Config, ProcessConfig
from stepcredit.errors import ConfigError
from stepcredit.process import oracle as _oracle  # noqa: F401  (registers step_oracle)
from stepcredit.process.diagnostics import describe_episodes
from stepcredit.process.segment import segment_episodes, token_char_spans
from stepcredit.process.tree import outcome_values, tree_values
from stepcredit.process.utility import (
    CREDIT_FORMS,
    marginal_utilities,
    min_form_credit,
    process_channel,
    step_credits,
    watermark_credit,
)
from stepcredit.process.values import (
    STRATEGIES,
    VALUE_ESTIMATORS,
    PrefixRequest,
    ScoreFn,
    ValueEstimatorSpec,
    ValueQuery,
    answer_suffix,
    continuation_values,
    forced_answer_values,
    mc_prefix_indices,
    register_value_estimator,
    resolve_force_prompt,
)
from stepcredit.types import Batch, Sample

__all__ = [
    "CREDIT_FORMS",
    "STRATEGIES",
    "VALUE_ESTIMATORS",
    "PrefixRequest",
    "ScoreFn",
    "ValueEstimatorSpec",
    "ValueQuery",
    "answer_suffix",
    "build_requests",
    "check_config",
    "check_data",
    "compute_prefix_values",
    "continuation_values",
    "describe_episodes",
    "forced_answer_values",
    "marginal_utilities",
    "mc_prefix_indices",
    "min_form_credit",
    "outcome_values",
    "prefix_request",
    "process_channel",
    "register_value_estimator",
    "resolve_force_prompt",
    "segment_episodes",
    "step_credits",
    "token_char_spans",
    "tree_values",
    "watermark_credit",
]


def _content_len(ids: list[int], tokenizer: Any) -> int:
    # Trailing eos/pad are not part of the reasoning: a prefix never includes them, so the last value
    # is "prompt + whole response text + force + answer", not an answer forced after end-of-sequence.
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    n = len(ids)
    while n > 0 and ids[n - 1] in special:
        n -= 1
    return n


def prefix_request(
    sample: Any, prompt_ids: list[int], response_ids: list[int], tokenizer: Any, cfg: ProcessConfig
) -> tuple[list[int], PrefixRequest]:
    """Episode ends and the value request of one response (token ids without padding)."""
    ends = segment_episodes(response_ids, tokenizer, cfg)
    n_content = _content_len(response_ids, tokenizer)
    lens = [0] + [min(e + 1, n_content) for e in ends]
    complete = bool(response_ids) and response_ids[-1] == getattr(tokenizer, "eos_token_id", None)
    return ends, PrefixRequest(sample, prompt_ids, response_ids, lens, str(sample.ground_truth), complete)


def build_requests(
    batch: Batch, tokenizer: Any, cfg: ProcessConfig
) -> tuple[list[list[int]], list[PrefixRequest]]:
    """Episode ends and the value requests of every response of ``batch`` (padding removed)."""
    ends_all, requests = [], []
    for b, sample in enumerate(batch.samples):
        prompt = batch.prompt_ids_BP[b][batch.prompt_mask_BP[b].bool()].tolist()
        resp = batch.response_ids_BT[b][batch.response_mask_BT[b].bool()].tolist()
        ends, req = prefix_request(sample, prompt, resp, tokenizer, cfg)
        ends_all.append(ends)
        requests.append(req)
    return ends_all, requests


def compute_prefix_values(
    model: Any, tokenizer: Any, batch: Batch, cfg: ProcessConfig, *, score_fn: ScoreFn | None = None
) -> None:
    """Fill ``batch.episode_ends`` and ``batch.prefix_values`` ([V_0, V_1, ..., V_S] per response).

    The gold answer is ``str(sample.ground_truth)``. With ``forced_answer_logprob`` and the ``packed``
    strategy all prefixes of a response are valued in one packed evaluation (several responses per
    pass); when the batch carries the rollout's cache (``generate(keep_cache=True)``) only the
    force-answer suffixes run through the model.
    ``score_fn(sample, text) -> float`` is the verifier; pass it whenever
    ``VALUE_ESTIMATORS.get(cfg.value_estimator).needs_verifier`` (``monte_carlo``,
    ``greedy_continuation``): without it those raise a ConfigError.
    """
    ends, requests = build_requests(batch, tokenizer, cfg)
    estimator = VALUE_ESTIMATORS.get(cfg.value_estimator)
    was_training = bool(getattr(model, "training", False))
    body, batch.kv_cache = batch.kv_cache, None  # used once, then freed
    model.eval()
    try:
        with torch.no_grad():
            values = estimator(model, tokenizer, requests, cfg, score_fn=score_fn, body=body)
    finally:
        if was_training:
            model.train()
    batch.episode_ends = ends
    batch.prefix_values = values


def check_config(cfg: Config) -> None:
    """Start-up checks of the process settings that need the registries (ConfigError on a bad one)."""
    p = cfg.process
    if p.value_estimator not in VALUE_ESTIMATORS:
        raise ConfigError(
            f"config key process.value_estimator: unknown {p.value_estimator!r} "
            f"(valid: {', '.join(VALUE_ESTIMATORS.names())})"
        )
    if p.strategy not in STRATEGIES:
        raise ConfigError(
            f"config key process.strategy: unknown {p.strategy!r} (valid: {', '.join(STRATEGIES.names())})"
        )
    if p.credit not in CREDIT_FORMS:
        raise ConfigError(
            f"config key process.credit: unknown {p.credit!r} (valid: {', '.join(CREDIT_FORMS.names())})"
        )
    spec = VALUE_ESTIMATORS.get(p.value_estimator)
    if p.enabled and spec.generates and p.mc_samples * p.mc_max_new_tokens > 1 << 20:
        raise ConfigError(
            "config key process.mc_samples: mc_samples * mc_max_new_tokens is unreasonably large"
        )


def check_data(cfg: ProcessConfig, samples: list[Sample], domains: frozenset[str]) -> None:
    """Start-up checks of the process settings against the data (DataError naming the first bad row)."""
    from stepcredit.data import STEP_VALUES
    from stepcredit.errors import DataError

    if not cfg.enabled or not VALUE_ESTIMATORS.get(cfg.value_estimator).needs_step_values:
        return
    for s in samples:
        if s.domain in domains and s.data_source not in STEP_VALUES:
            raise DataError(
                f"sample {s.uid or '?'}: process.value_estimator={cfg.value_estimator} needs exact step values, "
                f"which data source {s.data_source!r} does not have (known: {', '.join(STEP_VALUES.names())})"
            )
