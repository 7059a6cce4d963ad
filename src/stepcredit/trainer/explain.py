"""The credit of one response, from the outcome to the per-token advantage: what ``stepcredit explain``
shows.

A response is split into episodes; the configured value estimator gives V_0 (empty response) and V_i
after each episode; the credit form turns them into step credits c_i (U_i = V_i - V_(i-1) by default);
the verifier scores the whole response (the outcome); and the configured advantage estimator turns the
outcome and the process channel into each token's advantage, as in training for a group of this one
response (verl's rule for a single response: group mean 0, std 1, so the outcome term is the score).

A response whose turns called tools (results appended in any registered convention,
:data:`stepcredit.tools.PARSERS`) is explained per turn: each turn ends at its call, the segmenter's
episode end, and the result that opens the next turn is attended to but never trained on, so its tokens
get no advantage, as in training (``Batch.observation_BT``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from stepcredit.advantages import ESTIMATORS, AdvantageInputs, compute_advantages
from stepcredit.config import Config, ProcessConfig
from stepcredit.errors import UserError
from stepcredit.process import VALUE_ESTIMATORS, ValueEstimatorSpec, prefix_request, process_channel
from stepcredit.process.diagnostics import describe_episodes, prompt_ids
from stepcredit.process.segment import token_char_spans, trace_observed
from stepcredit.process.values import ToolContext, ValueContext, estimate
from stepcredit.reward import Rewarder
from stepcredit.rollout.tool_render import render_tool_prompts
from stepcredit.tools import PARSERS, TOOLS
from stepcredit.types import Sample


def value_unit(spec: ValueEstimatorSpec) -> str:
    """What a value estimator's V measures, read from its registry metadata."""
    if spec.needs_step_values:
        return "the data's exact step value (1 while every stated quantity is right, 0 after a slip)"
    if spec.terminal_is_reward:
        return "the chance of reaching the gold answer: verifier score of the policy's continuations (0-1)"
    if spec.needs_verifier:
        return "the verifier's score of the policy's continuations"
    return "mean log-probability per token of the gold answer forced after the prefix (nats, <= 0)"


def credit_unit(cfg: ProcessConfig) -> str:
    """The scale of the step credit column: V's units through the credit form, ``process.scale`` and
    ``process.clip``."""
    clip = f", clipped to [-{cfg.clip:g}, {cfg.clip:g}]" if cfg.clip > 0 else ""
    last = "; the last episode pays 0 (process.last_episode=zero)" if cfg.zero_last else ""
    return f"V's units (a change of V by the {cfg.credit} form) x process.scale {cfg.scale:g}{clip}{last}"


def advantage_unit(cfg: Config) -> str:
    """The scale of the advantage column, read from the estimator's registry entry and ``algorithm.*``.
    explain values a group of one response, which has mean 0 and std 1 (verl's rule for a singleton
    group, :func:`stepcredit.advantages.outcome.grpo_advantage_B`): its outcome part is R itself."""
    a = cfg.algorithm
    est = ESTIMATORS.get(a.advantage)
    if est.needs_values:
        return f"none: {a.advantage} needs a critic's values"
    outcome = (
        "(R - group mean) / group std" if a.norm_by_std else "R - group mean (algorithm.norm_by_std=false)"
    )
    alone = "in this group of one response mean 0 and std 1, so R itself"
    if not est.token_level:
        return f"one number per response, {outcome}: {alone}"
    steps = (
        "each step credit standardised over the group's steps ((c - mean) / std: units of that std)"
        if est.process_std_normalised and a.norm_by_std
        else "the step credits in c's units"
    )
    return (
        f"per token, the outcome part {outcome} ({alone}) + process_weight {a.process_weight:g} x the sum, "
        f"from the token's episode to the end, of {steps}"
    )


@dataclass(frozen=True)
class ExplainedEpisode:
    """One episode of the response with its value, credit and advantage."""

    start: int
    """Character offset of the episode in the response."""
    end: int
    """Character offset just after it."""
    token_start: int
    """Its first token (index into the response's tokens)."""
    token_end: int
    """Its last token (inclusive)."""
    text: str
    """Its text."""
    value: float
    """V_i: the value after the episode."""
    utility: float
    """c_i: its step credit as the process channel gets it (credit form, clip, scale, last-episode rule)."""
    advantage: list[float]
    """The advantage of each of its trained tokens (a tool result's tokens have none)."""
    observation: str = ""
    """The tool result that opens the episode ("" for none): attended to, never trained on."""
    tool_call: str = ""
    """The tool call the episode ends with, ``name {arguments}`` ("" when no result follows it)."""


@dataclass(frozen=True)
class Explanation:
    """The credit of one response (:func:`explain`)."""

    value_estimator: str
    """How V was estimated (``process.value_estimator``)."""
    value_unit: str
    """What V measures (:func:`value_unit`)."""
    credit: str
    """The credit form that turns V into step credits (``process.credit``)."""
    advantage_estimator: str
    """The estimator of the per-token advantage (``algorithm.advantage``)."""
    process_weight: float
    """``algorithm.process_weight``: the process channel's weight against the outcome."""
    outcome: float
    """The verifier's score of the whole response (nan: could not be scored)."""
    outcome_status: str
    """Its status (``ok``, ``unparseable``, ...)."""
    v0: float
    """V_0: the value of the empty response."""
    episodes: list[ExplainedEpisode]
    """The episodes in order."""
    advantage_note: str
    """Empty, or why there is no advantage (an estimator that needs a critic)."""
    answer: str
    """The gold answer."""
    response: str
    """The response explained."""
    turns: int = 0
    """Turns of a response that called tools (its results + 1; each call ends a turn); 0 for a plain one."""
    credit_unit: str = ""
    """The scale of the step credit c (:func:`credit_unit`)."""
    advantage_unit: str = ""
    """The scale of the advantage A (:func:`advantage_unit`)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the outcome's nan as None)."""
        out = asdict(self)
        out["outcome"] = None if math.isnan(self.outcome) else self.outcome
        return out


def tool_results(text: str) -> list[tuple[int, int, str]]:
    """(start, end, convention) of every tool result appended in ``text``, in order."""
    return sorted(
        (a, b, name) for name in PARSERS.names() for a, b in PARSERS.get(name).observation_spans(text)
    )


def _call_text(text: str, convention: str) -> str:
    """The first complete call in ``text`` under ``convention``, as ``name {arguments}``."""
    found = PARSERS.get(convention).find(text, {n: TOOLS.get(n) for n in TOOLS.names()})
    if found is None:
        return ""
    call = found.call
    args = "(malformed: " + call.error + ")" if call.arguments is None else json.dumps(call.arguments)
    return f"{call.name} {args}"


def _advantages(
    cfg: Config, outcome: float, ends: list[int], values: list[float], trained_T: list[bool]
) -> list[float] | None:
    """Per-token advantage of a group of this one response (0 where ``trained_T`` is False: a tool
    result's tokens); None for an estimator that needs a critic."""
    if ESTIMATORS.get(cfg.algorithm.advantage).needs_values:
        return None
    T = len(trained_T)
    mask_BT = torch.tensor([trained_T], dtype=torch.bool)
    outcome_BT = torch.zeros(1, T)
    outcome_BT[0, -1] = 0.0 if math.isnan(outcome) else outcome
    process_BT, steps_BT = process_channel([ends], [values], mask_BT, cfg.process)
    inp = AdvantageInputs(
        outcome_BT=outcome_BT,
        mask_BT=mask_BT,
        group_B=torch.zeros(1, dtype=torch.long),
        valid_B=torch.tensor([not math.isnan(outcome)]),
        process_BT=process_BT,
        process_mask_BT=steps_BT,
    )
    return [float(a) for a in compute_advantages(cfg.algorithm, inp).adv_BT[0]]


def explain(
    model: Any,
    tok: Any,
    prompt: str | Sequence[dict[str, str]],
    response: str,
    answer: str,
    cfg: Config,
    rewarder: Rewarder,
    *,
    raw_prompt: bool = False,
    tools: ToolContext | None = None,
    data_source: str = "arith",
) -> Explanation:
    """V, step credit and per-token advantage of ``response`` to ``prompt`` (a user message or chat
    messages) with gold answer ``answer``, under ``cfg.process`` and ``cfg.algorithm``; ``rewarder``
    scores the outcome and, for value estimators that need one, the continuations. ``tools``: the
    policy's rollouts call tools (``rollout.mode=tools``): the prompt is the tool rollout's (unless
    ``raw_prompt``) and an estimator that takes tools values each prefix as training does
    (continuations run the calls, :mod:`stepcredit.process.continuation`). ``data_source`` picks the
    outcome's reward as for a row of the task."""
    messages = ({"role": "user", "content": prompt},) if isinstance(prompt, str) else tuple(prompt)
    sample = Sample(prompt=messages, ground_truth=answer, uid="explain", data_source=data_source)
    if tools is not None and not raw_prompt and getattr(tok, "chat_template", None):
        p_ids = render_tool_prompts(tok, [sample], tools.config.names)[0]
    else:
        p_ids = prompt_ids(tok, prompt, raw=raw_prompt)
    r_ids = list(tok(response, add_special_tokens=False)["input_ids"])
    if not r_ids:
        raise UserError("--response: the response is empty")
    # one response, no group: V_0 comes from its own continuations (process.mc_v0=group needs a group)
    pcfg = replace(cfg.process, mc_v0="sample")
    spec = VALUE_ESTIMATORS.get(pcfg.value_estimator)
    marks = trace_observed(r_ids, tok)  # a response given as text: its result blocks, read once
    ends, request = prefix_request(sample, p_ids, r_ids, tok, pcfg, marks)
    values = estimate(ValueContext(model, tok, [request], pcfg, rewarder.verifier_fn(), tools=tools))[0]
    result = rewarder.score_batch([sample], [response])[0]
    text, _ = token_char_spans(r_ids, tok)
    results = tool_results(text)
    trained = [not m for m in marks]  # a token inside an appended result is not trained on
    adv = _advantages(replace(cfg, process=pcfg), result.score, ends, values, trained)
    episodes = []
    for e in describe_episodes(r_ids, tok, ends, values, pcfg):
        lo, hi = e["token_start"], e["token_end"] + 1
        opening = [(a, b) for a, b, _ in results if e["start"] <= a < e["end"]]
        after = [name for a, _, name in results if a == e["end"]]  # a result right after: a call ended it
        episodes.append(
            ExplainedEpisode(
                **e,
                advantage=[x for x, t in zip(adv[lo:hi], trained[lo:hi], strict=True) if t]
                if adv is not None
                else [],
                observation="".join(text[a:b] for a, b in opening),
                tool_call=_call_text(text[max([e["start"], *(b for _, b in opening)]) : e["end"]], after[0])
                if after
                else "",
            )
        )
    return Explanation(
        value_estimator=pcfg.value_estimator,
        value_unit=value_unit(spec),
        credit=pcfg.credit,
        advantage_estimator=cfg.algorithm.advantage,
        process_weight=cfg.algorithm.process_weight,
        outcome=result.score,
        outcome_status=result.status.value,
        v0=float(values[0]),
        episodes=episodes,
        advantage_note="" if adv is not None else f"{cfg.algorithm.advantage} needs a critic's values",
        answer=answer,
        response=response,
        turns=len(results) + 1 if results else 0,
        credit_unit=credit_unit(pcfg),
        advantage_unit=advantage_unit(cfg),
    )
