"""The credit of one response, from the outcome to the per-token advantage: what ``stepcredit explain``
shows.

A response is split into episodes; the configured value estimator gives V_0 (empty response) and V_i
after each episode; the credit form turns them into step credits c_i (U_i = V_i - V_(i-1) by default);
the verifier scores the whole response (the outcome); and the configured advantage estimator turns the
outcome and the process channel into each token's advantage, as in training for a group of this one
response (verl's rule for a single response: group mean 0, std 1, so the outcome term is the score).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from stepcredit.advantages import ESTIMATORS, AdvantageInputs, compute_advantages
from stepcredit.config import Config
from stepcredit.errors import UserError
from stepcredit.process import VALUE_ESTIMATORS, ValueEstimatorSpec, prefix_request, process_channel
from stepcredit.process.diagnostics import describe_episodes, prompt_ids
from stepcredit.reward import Rewarder
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
    """The advantage of each of its tokens."""


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the outcome's nan as None)."""
        out = asdict(self)
        out["outcome"] = None if math.isnan(self.outcome) else self.outcome
        return out


def _advantages(
    cfg: Config, outcome: float, ends: list[int], values: list[float], T: int
) -> list[float] | None:
    """Per-token advantage of a group of this one response; None for an estimator that needs a critic."""
    if ESTIMATORS.get(cfg.algorithm.advantage).needs_values:
        return None
    mask_BT = torch.ones(1, T, dtype=torch.bool)
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
) -> Explanation:
    """V, step credit and per-token advantage of ``response`` to ``prompt`` (a user message or chat
    messages) with gold answer ``answer``, under ``cfg.process`` and ``cfg.algorithm``; ``rewarder``
    scores the outcome and, for value estimators that need one, the continuations."""
    p_ids = prompt_ids(tok, prompt, raw=raw_prompt)
    r_ids = list(tok(response, add_special_tokens=False)["input_ids"])
    if not r_ids:
        raise UserError("--response: the response is empty")
    messages = ({"role": "user", "content": prompt},) if isinstance(prompt, str) else tuple(prompt)
    sample = Sample(prompt=messages, ground_truth=answer, uid="explain")
    # one response, no group: V_0 comes from its own continuations (process.mc_v0=group needs a group)
    pcfg = replace(cfg.process, mc_v0="sample")
    spec = VALUE_ESTIMATORS.get(pcfg.value_estimator)
    ends, request = prefix_request(sample, p_ids, r_ids, tok, pcfg)
    verify = rewarder.verifier_fn()
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with torch.no_grad():
            values = spec(model, tok, [request], pcfg, score_fn=verify if spec.needs_verifier else None)[0]
    finally:
        if was_training:
            model.train()
    result = rewarder.score_batch([sample], [response])[0]
    adv = _advantages(replace(cfg, process=pcfg), result.score, ends, values, len(r_ids))
    episodes = [
        ExplainedEpisode(**e, advantage=adv[e["token_start"] : e["token_end"] + 1] if adv is not None else [])
        for e in describe_episodes(r_ids, tok, ends, values, pcfg)
    ]
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
    )
