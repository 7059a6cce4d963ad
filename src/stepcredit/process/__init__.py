"""Training-free process rewards: episodes, V(prefix) from the policy itself, marginal utility.

A response is split into episodes (:func:`segment_episodes`); right after generation, while the policy
is loaded, :func:`prefix_values` (or :func:`compute_prefix_values` on a batch) returns V_0 (empty
response) and V_1..V_S (after each episode) as a :class:`PrefixValues`; later stages turn them into
the process channel with :func:`process_channel`, which is arithmetic only. Value estimators are
registered in :data:`VALUE_ESTIMATORS` (:mod:`.values`); the built-in ones live in :mod:`.forced`,
:mod:`.continuation`, :mod:`.tree`, :mod:`.group_prefix` and :mod:`.oracle`; the stage itself is :mod:`.stage`.
"""

from __future__ import annotations

from stepcredit.process.continuation import continuation_values, mc_prefix_indices
from stepcredit.process.diagnostics import describe_episodes
from stepcredit.process.forced import (
    STRATEGIES,
    ValueQuery,
    answer_suffix,
    forced_answer_values,
    request_suffixes,
    resolve_force_prompt,
)
from stepcredit.process.group_prefix import group_prefix_values, shared_prefix_share
from stepcredit.process.segment import segment_episodes, token_char_spans
from stepcredit.process.stage import (
    PrefixValues,
    batch_logps,
    batch_observed,
    batch_token_ids,
    build_requests,
    check_config,
    check_data,
    compute_prefix_values,
    prefix_request,
    prefix_values,
)
from stepcredit.process.tree import outcome_values, tree_credits, tree_values
from stepcredit.process.utility import (
    CREDIT_FORMS,
    PLACEBOS,
    STEP_COST_FORMS,
    CreditFormSpec,
    apply_placebo,
    blame_credit,
    credited_rows,
    marginal_utilities,
    min_form_credit,
    process_channel,
    register_credit_form,
    step_cost_outcome_B,
    step_credits,
    watermark_credit,
)
from stepcredit.process.values import (
    VALUE_ESTIMATORS,
    PrefixRequest,
    ScoreFn,
    ValueContext,
    ValueEstimatorSpec,
    estimate,
    register_value_estimator,
    score_each,
)

__all__ = [
    "CREDIT_FORMS",
    "PLACEBOS",
    "STEP_COST_FORMS",
    "STRATEGIES",
    "VALUE_ESTIMATORS",
    "CreditFormSpec",
    "PrefixRequest",
    "PrefixValues",
    "ScoreFn",
    "ValueContext",
    "ValueEstimatorSpec",
    "ValueQuery",
    "answer_suffix",
    "apply_placebo",
    "batch_logps",
    "batch_observed",
    "batch_token_ids",
    "blame_credit",
    "build_requests",
    "check_config",
    "check_data",
    "compute_prefix_values",
    "continuation_values",
    "credited_rows",
    "describe_episodes",
    "estimate",
    "forced_answer_values",
    "group_prefix_values",
    "marginal_utilities",
    "mc_prefix_indices",
    "min_form_credit",
    "outcome_values",
    "prefix_request",
    "prefix_values",
    "process_channel",
    "register_credit_form",
    "register_value_estimator",
    "request_suffixes",
    "resolve_force_prompt",
    "score_each",
    "segment_episodes",
    "shared_prefix_share",
    "step_cost_outcome_B",
    "step_credits",
    "token_char_spans",
    "tree_credits",
    "tree_values",
    "watermark_credit",
]
