"""The process stage at rollout time: episodes and V(prefix) of responses, returned as new values.

Pure in the sense of the house style: :func:`prefix_values` takes token ids (no padded batch) and
returns a :class:`PrefixValues`; nothing is written into its inputs. The trainer calls it right after
generation while the policy is loaded (:func:`compute_prefix_values` reads a :class:`Batch`'s ids and
its rollout cache), the VeRL plugin builds its value probes from :func:`build_requests` on verl's own
ids, and ``explain``/``probe`` value fixed traces through the same requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# each estimator module registers itself (monte_carlo and greedy_continuation, greedy_bisect, group_prefix,
# step_oracle, tree)
import stepcredit.process.bisection
import stepcredit.process.continuation
import stepcredit.process.group_prefix
import stepcredit.process.oracle
import stepcredit.process.tree  # noqa: F401  (these lines bind one name)
from stepcredit.config import Config, ProcessConfig
from stepcredit.errors import ConfigError
from stepcredit.process.forced import STRATEGIES
from stepcredit.process.segment import segment_episodes
from stepcredit.process.utility import CREDIT_FORMS
from stepcredit.process.values import (
    VALUE_ESTIMATORS,
    PrefixRequest,
    ScoreFn,
    ToolContext,
    ValueContext,
    estimate,
)
from stepcredit.types import Batch, RolloutCache, Sample


@dataclass(frozen=True)
class PrefixValues:
    """Episodes and V(prefix) of a list of responses (the process stage's output at rollout time)."""

    episode_ends: list[list[int]]
    """Per response: token indices (into the response) of each episode's last token."""
    values: list[list[float]]
    """Per response: V_0 (empty response), V_1, ..., V_S at the episode ends; NaN where the verifier
    could not score a text the value needed."""


def _content_len(ids: list[int], tokenizer: Any) -> int:
    # Trailing eos/pad are not part of the reasoning: a prefix never includes them, so the last value
    # is "prompt + whole response text + force + answer", not an answer forced after end-of-sequence.
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    n = len(ids)
    while n > 0 and ids[n - 1] in special:
        n -= 1
    return n


def prefix_request(
    sample: Any,
    prompt_ids: list[int],
    response_ids: list[int],
    tokenizer: Any,
    cfg: ProcessConfig,
    observed: Sequence[bool] | None = None,
    logp: Sequence[float] | None = None,
) -> tuple[list[int], PrefixRequest]:
    """Episode ends and the value request of one response (token ids without padding; ``observed``:
    its tool results' tokens as the rollout marked them, or None; ``logp``: its tokens' behaviour
    log-probs, or None)."""
    ends = segment_episodes(response_ids, tokenizer, cfg, observed)
    n_content = _content_len(response_ids, tokenizer)
    lens = [0] + [min(e + 1, n_content) for e in ends]
    complete = bool(response_ids) and response_ids[-1] == getattr(tokenizer, "eos_token_id", None)
    marks = list(observed) if observed is not None and any(observed) else []
    return ends, PrefixRequest(
        sample,
        prompt_ids,
        response_ids,
        lens,
        str(sample.ground_truth),
        complete,
        observed=marks,
        logp=list(logp) if logp is not None else [],
    )


def build_requests(
    samples: Sequence[Sample],
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    tokenizer: Any,
    cfg: ProcessConfig,
    observed: Sequence[Sequence[bool]] | None = None,
    logps: Sequence[Sequence[float]] | None = None,
) -> tuple[list[list[int]], list[PrefixRequest]]:
    """Episode ends and the value requests of every response (token ids without padding; the gold
    answer is ``str(sample.ground_truth)``; ``observed``: each response's result marks, or None;
    ``logps``: each response's behaviour log-probs, or None)."""
    ends_all, requests = [], []
    marks = list(observed) if observed is not None else [None] * len(response_ids)
    lps = list(logps) if logps is not None else [None] * len(response_ids)
    for sample, prompt, resp, obs, lp in zip(samples, prompt_ids, response_ids, marks, lps, strict=True):
        ends, req = prefix_request(sample, list(prompt), list(resp), tokenizer, cfg, obs, lp)
        ends_all.append(ends)
        requests.append(req)
    return ends_all, requests


def batch_token_ids(batch: Batch) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt and response token ids of every response of ``batch``, padding removed."""
    prompts = [
        ids[m.bool()].tolist() for ids, m in zip(batch.prompt_ids_BP, batch.prompt_mask_BP, strict=True)
    ]
    responses = [
        ids[m.bool()].tolist() for ids, m in zip(batch.response_ids_BT, batch.attention_BT(), strict=True)
    ]
    return prompts, responses


def batch_logps(batch: Batch) -> list[list[float]] | None:
    """Per response of ``batch`` (padding removed, as :func:`batch_token_ids`), its tokens' behaviour
    log-probs; None for a batch without them."""
    if batch.behaviour_logp_BT is None:
        return None
    lp = batch.behaviour_logp_BT.to(batch.response_mask_BT.device)
    return [x[m.bool()].tolist() for x, m in zip(lp, batch.attention_BT(), strict=True)]


def batch_observed(batch: Batch) -> list[list[bool]] | None:
    """Per response of ``batch`` (padding removed, as :func:`batch_token_ids`), which tokens are tool
    results, as the rollout recorded them (``observation_BT``); None for a batch without tools."""
    if batch.observation_BT is None:
        return None
    obs = batch.observation_BT.to(batch.response_mask_BT.device)
    return [o[m.bool()].tolist() for o, m in zip(obs, batch.attention_BT(), strict=True)]


def prefix_values(
    model: Any,
    tokenizer: Any,
    samples: Sequence[Sample],
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    cfg: ProcessConfig,
    *,
    score_fn: ScoreFn | None = None,
    body: RolloutCache | None = None,
    tools: ToolContext | None = None,
    observed: Sequence[Sequence[bool]] | None = None,
    logps: Sequence[Sequence[float]] | None = None,
) -> PrefixValues:
    """Episode ends and [V_0, V_1, ..., V_S] of every response, by ``cfg.value_estimator``.

    With ``forced_answer_logprob`` and the ``packed`` strategy all prefixes of a response are valued in
    one packed evaluation (several responses per pass); ``body``, the rollout's cache over exactly these
    responses (``generate(keep_cache=True)``; it is read, never modified), leaves only the
    force-answer suffixes to run. ``score_fn(samples, texts) -> scores`` is the batched verifier; pass
    it whenever ``VALUE_ESTIMATORS.get(cfg.value_estimator).needs_verifier`` (``monte_carlo``,
    ``greedy_continuation``): without it those raise a ConfigError. ``tools``: the responses are a
    tool rollout's (``rollout.mode=tools``), and an estimator that ``takes_tools`` values a prefix that
    ends at a call after the call's result (:attr:`ValueEstimatorSpec.takes_tools`); the others
    ignore it. ``observed``: each response's result marks (``Batch.observation_BT``): the turns.
    ``logps``: each response's behaviour log-probs (``Batch.behaviour_logp_BT``), which greedy
    continuations read to share continuations between prefixes (never needed for the values).
    """
    ends, requests = build_requests(samples, prompt_ids, response_ids, tokenizer, cfg, observed, logps)
    return PrefixValues(ends, estimate(ValueContext(model, tokenizer, requests, cfg, score_fn, body, tools)))


def compute_prefix_values(
    model: Any,
    tokenizer: Any,
    batch: Batch,
    cfg: ProcessConfig,
    *,
    score_fn: ScoreFn | None = None,
    tools: ToolContext | None = None,
) -> PrefixValues:
    """:func:`prefix_values` of every response of ``batch`` (continuing from its rollout cache when it
    carries one); the batch is left as it was."""
    prompts, responses = batch_token_ids(batch)
    return prefix_values(
        model,
        tokenizer,
        batch.samples,
        prompts,
        responses,
        cfg,
        score_fn=score_fn,
        body=batch.kv_cache,
        tools=tools,
        observed=batch_observed(batch),
        logps=batch_logps(batch),
    )


def check_config(cfg: Config) -> None:
    """Start-up checks of the process settings that need the registries (ConfigError on a bad one)."""
    p = cfg.process
    VALUE_ESTIMATORS.require(p.value_estimator, "process.value_estimator")
    STRATEGIES.require(p.strategy, "process.strategy")
    CREDIT_FORMS.require(p.credit, "process.credit")
    spec = VALUE_ESTIMATORS.get(p.value_estimator)

    def having(capability: str) -> str:  # the estimators whose registry entry says ``capability``
        return ", ".join(n for n in VALUE_ESTIMATORS if getattr(VALUE_ESTIMATORS.get(n), capability))

    if p.enabled and p.treerl and not spec.from_outcomes:
        raise ConfigError(
            f"config key process.treerl: TreeRL's credit needs a tree rollout's node values; "
            f"process.value_estimator={p.value_estimator} has none (use {having('from_outcomes')} with rollout.mode=tree or tools_tree)"
        )
    if p.credit_groups != "all" and not p.enabled:
        raise ConfigError(
            f"config key process.credit_groups: {p.credit_groups} chooses which groups get step credit, and "
            "there is none without process.enabled=true"
        )
    if p.placebo_on and not p.enabled:
        raise ConfigError(
            f"config key process.placebo: {p.placebo} moves step credits, and there are none without "
            "process.enabled=true"
        )
    form = CREDIT_FORMS.get(p.credit)
    if p.enabled and form.needs_success_probability and not spec.success_probability:
        raise ConfigError(
            f"config keys process.credit={p.credit} and process.value_estimator={p.value_estimator}: this "
            f"credit form compares V with a certain success (1) and needs values that are probabilities of "
            f"success in [0, 1], which {p.value_estimator} does not give; use one of {having('success_probability')} or another "
            f"process.credit"
        )
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
