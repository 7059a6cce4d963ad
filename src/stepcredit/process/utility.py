"""Step credit from the stored V(prefix) values: pure arithmetic, and the one process channel.

The seed's credit is the marginal utility U_i = V_i - V_(i-1), with V_0 the value of the empty
response: how much episode i moved the policy's belief that it will reach the gold answer (the
"progress" reward of Setlur et al. 2024, "Rewarding Progress", arXiv:2410.08146, with the policy itself
as the prover). Other ways to turn values into credit are registered in :data:`CREDIT_FORMS` under one
signature ``form(values, *, clip, scale, zero_last) -> [c_1, ..., c_S]``; the chosen form's c_i sits at
the last token of episode i in the process channel and every other token gets 0. The estimators sum the
channel from a token onward (a return), so a form that wants a return other than a sum (``min_form``)
writes the per-step rewards whose sums are that return.

The last episode gets U_S = V_S - V_(S-1) like the others (``last_episode="utility"``): V_S is the
value after the whole response, so U_S credits the final step (usually the answer) for its own move.
The outcome reward sits on the same token in its own channel; ``last_episode="zero"`` leaves the final
step to the outcome reward alone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, get_args

import torch

from stepcredit.config import ProcessConfig
from stepcredit.config.credit import Placebo, StepCostAs
from stepcredit.registry import Registry


class CreditForm(Protocol):
    def __call__(
        self, values: Sequence[float], *, clip: float, scale: float, zero_last: bool
    ) -> list[float]: ...


@dataclass(frozen=True)
class CreditFormSpec:
    """A registered credit form: the function and what the values it reads must be."""

    fn: CreditForm
    """``form(values, *, clip, scale, zero_last) -> [c_1, ..., c_S]``."""
    needs_success_probability: bool = False
    """It compares V with a certain success (V = 1), so V must be a probability of success in [0, 1]
    on the outcome's scale (the value estimator's ``success_probability``)."""

    def __call__(
        self, values: Sequence[float], *, clip: float = 0.0, scale: float = 1.0, zero_last: bool = False
    ) -> list[float]:
        return self.fn(values, clip=clip, scale=scale, zero_last=zero_last)


CREDIT_FORMS: Registry[CreditFormSpec] = Registry("credit form")


def register_credit_form(
    name: str, *, needs_success_probability: bool = False
) -> Callable[[CreditForm], CreditForm]:
    """Decorator: add ``fn`` to :data:`CREDIT_FORMS` with what it needs of the values."""

    def deco(fn: CreditForm) -> CreditForm:
        CREDIT_FORMS.add(name, CreditFormSpec(fn, needs_success_probability=needs_success_probability))
        return fn

    return deco


def _clip_scale(u: float, clip: float, scale: float) -> float:
    if clip > 0:
        u = min(max(u, -clip), clip)
    return u * scale


def marginal_utilities(
    values: Sequence[float], *, clip: float = 0.0, scale: float = 1.0, zero_last: bool = False
) -> list[float]:
    """[U_1, ..., U_S] from [V_0, V_1, ..., V_S]: U_i = scale * clip(V_i - V_(i-1), -c, c).

    ``clip=0`` disables clipping; ``zero_last`` gives the last episode 0.
    """
    out = [_clip_scale(float(values[i]) - float(values[i - 1]), clip, scale) for i in range(1, len(values))]
    if zero_last and out:
        out[-1] = 0.0
    return out


register_credit_form("difference")(marginal_utilities)


@register_credit_form("min_form")
def min_form_credit(
    values: Sequence[float], *, clip: float = 0.0, scale: float = 1.0, zero_last: bool = False
) -> list[float]:
    """PURE's min-form credit (Cheng et al. 2025, "Stop Summation", arXiv:2504.15275): the return
    of step t is the minimum of the step rewards from t on, not their sum.

        u_i = scale * clip(V_i - V_(i-1))       (the difference utilities, as ``difference``)
        G_t = min_{t <= i <= S} u_i,  G_(S+1) = 0
        c_t = G_t - G_(t+1)                      so that sum_{i >= t} c_i = G_t

    A step is worth no more than the worst step it leads to, so one noisy high step cannot buy credit
    for a trace that later goes wrong (the reward hacking of summed PRM rewards that PURE reports). This
    is the exact min (PURE's temperature -> 0 limit of its softmin weighting). With ``zero_last`` the last
    step gets 0 and is left out of the minima.
    """
    u = marginal_utilities(values, clip=clip, scale=scale)
    n = len(u) - 1 if zero_last and u else len(u)
    g = [0.0] * (len(u) + 1)
    if n > 0:
        g[n - 1] = u[n - 1]
        for t in range(n - 2, -1, -1):
            g[t] = min(u[t], g[t + 1])
    return [g[t] - g[t + 1] for t in range(len(u))]


@register_credit_form("watermark")
def watermark_credit(
    values: Sequence[float], *, clip: float = 0.0, scale: float = 1.0, zero_last: bool = False
) -> list[float]:
    """MIG's watermark credit (Wang et al. 2026, "Discovering Process-Outcome Credit", arXiv:2602.01034,
    step-wise marginal information gain against a monotonic historical watermark):

        W_0 = V_0,  W_i = max(W_(i-1), V_i),  c_i = scale * clip(W_i - W_(i-1))  (>= 0)

    Only progress above the best value reached so far is paid: a step that falls back and a later step
    that merely recovers the lost ground both get 0, so noise that goes down and up again earns nothing.
    """
    out, w = [], float(values[0]) if len(values) else 0.0
    for v in values[1:]:
        nw = max(w, float(v))
        out.append(_clip_scale(nw - w, clip, scale))
        w = nw
    if zero_last and out:
        out[-1] = 0.0
    return out


@dataclass(frozen=True)
class StepCostForm:
    """One way of charging ``process.step_cost`` (``process.step_cost_as``)."""

    charge: Callable[[int, int, float], float]
    """(step index i, steps that pay n, cost c) -> what step i's credit loses (0 for i >= n)."""
    on_outcome: bool
    """The outcome score pays c x episodes before its group normalisation (:func:`step_cost_outcome_B`)."""
    cost_to_go: bool = False
    """A step's charge is already the return of the costs from it on: only for advantage estimators that
    read a step's credit as its advantage (``needs_reward_values``); one that sums credits into returns
    (``grpo_process``) would count every cost again."""


STEP_COST_FORMS: dict[str, StepCostForm] = {
    # -c on each step: with every token of a response shifted alike, token-mean aggregation sees a
    # baseline whose expected gradient is about zero (measured -0.23/token at c = 0.1: inert)
    "token": StepCostForm(lambda i, n, c: c if i < n else 0.0, on_outcome=False),
    # the cost's return: step i pays for itself and every step after it, sum_{j=i}^{n-1} c = c (n - i),
    # as grpo_process sums its step rewards; a long response's early steps pay most
    "return": StepCostForm(lambda i, n, c: c * (n - i) if i < n else 0.0, on_outcome=False, cost_to_go=True),
    # the credits pay nothing; the outcome score pays c x episodes (step_cost_outcome_B)
    "outcome": StepCostForm(lambda i, n, c: 0.0, on_outcome=True),
}
assert set(STEP_COST_FORMS) == set(get_args(StepCostAs))


# V_0 := 1 is a certain success: only values that are chances of success in [0, 1] can be compared with it
@register_credit_form("blame", needs_success_probability=True)
def blame_credit(
    values: Sequence[float], *, clip: float = 0.0, scale: float = 1.0, zero_last: bool = False
) -> list[float]:
    """The exact oracle's shape for any value: differences from V_0 := 1 instead of the estimated V_0.

        c_1 = scale * clip(V_1 - 1),   c_i = scale * clip(V_i - V_(i-1))  (i > 1)

    With exact step values (``step_oracle``) V_0 is 1 and the credits sum to R - 1: a right response is
    charged nothing overall, a wrong one -1 on the steps that lost the value (blame only). The estimated
    forms start from an estimated V_0 (a group mean for trees and Monte Carlo), so their credits sum to
    R - mean(group) and repeat the outcome advantage GRPO already carries; this form keeps only the
    drops (and the recoveries after them) and leaves the outcome to its own channel.
    """
    return marginal_utilities([1.0, *list(values)[1:]], clip=clip, scale=scale, zero_last=zero_last)


def step_credits(values: Sequence[float], cfg: ProcessConfig, *, row_key: int | None = None) -> list[float]:
    """[c_1, ..., c_S] of one response by the configured credit form, clip, scale and last-episode rule,
    moved by ``process.placebo`` (``row_key`` names the response's own permutation), less its share of
    ``step_cost`` by ``step_cost_as`` (every step pays, the last one too unless ``last_episode="zero"``
    leaves it to the outcome)."""
    credits = CREDIT_FORMS.get(cfg.credit)(values, clip=cfg.clip, scale=cfg.scale, zero_last=cfg.zero_last)
    return charge_step_cost(apply_placebo(credits, cfg, row_key=row_key), cfg)


def _keep(credits: Sequence[float], rng: random.Random) -> list[float]:
    return list(credits)


def _shuffle(credits: Sequence[float], rng: random.Random) -> list[float]:
    out = list(credits)
    rng.shuffle(out)  # Fisher-Yates: every permutation equally likely
    return out


PLACEBOS: dict[str, Callable[[Sequence[float], random.Random], list[float]]] = {
    "none": _keep,
    # the same numbers on the wrong steps: the multiset of each response's credits (hence their sum,
    # sparsity and scale) is kept, only where they land changes
    "shuffle_within_response": _shuffle,
}
"""``process.placebo``: ``fn(credits, rng) -> credits`` of one response (a permutation of them)."""
assert set(PLACEBOS) == set(get_args(Placebo))


def apply_placebo(credits: Sequence[float], cfg: ProcessConfig, *, row_key: int | None = None) -> list[float]:
    """``credits`` moved by ``process.placebo``. The permutation is drawn from a stream seeded by
    (``process.placebo_seed``, ``row_key``), so a rerun moves the same credits the same way. With
    ``last_episode="zero"`` the last step keeps its 0 (the outcome's alone) and only the credited steps
    are permuted, so the placebo has the arm's sparsity."""
    out = [float(c) for c in credits]
    if not cfg.placebo_on or len(out) < 2:
        return out
    n = len(out) - 1 if cfg.zero_last else len(out)
    rng = random.Random(f"{cfg.placebo_seed}:{row_key if row_key is not None else 0}")
    return PLACEBOS[cfg.placebo](out[:n], rng) + out[n:]


def charge_step_cost(credits: Sequence[float], cfg: ProcessConfig) -> list[float]:
    """``credits`` less their share of ``process.step_cost`` by ``process.step_cost_as``."""
    out = [float(c) for c in credits]
    if cfg.step_cost:
        n = len(out) - 1 if cfg.zero_last else len(out)
        charge = STEP_COST_FORMS[cfg.step_cost_as].charge
        out = [c - charge(i, n, cfg.step_cost) for i, c in enumerate(out)]
    return out


def step_cost_outcome_B(episode_ends: Sequence[Sequence[int]], cfg: ProcessConfig) -> torch.Tensor:
    """What each response's outcome score loses to the step cost before its group normalisation:
    c x (its number of episodes) with ``step_cost_as=outcome``, else 0 (float32, one per response).

    Charged on the outcome, the cost is a length term that GRPO's group normalisation compares across
    the group: a response with more episodes than its siblings gets a lower advantage on every token."""
    n_B = torch.tensor([len(e) for e in episode_ends], dtype=torch.float32)
    if not (cfg.enabled and cfg.step_cost and STEP_COST_FORMS[cfg.step_cost_as].on_outcome):
        return torch.zeros_like(n_B)
    return cfg.step_cost * n_B


EQUAL_OUTCOMES_TOL = 1e-6
"""Outcomes closer than this are equal (as ``groups/all_equal_frac`` counts them)."""


def credited_rows(
    group_B: Sequence[int], score_B: Sequence[float], valid_B: Sequence[bool], which: str
) -> list[bool]:
    """Per response, does it get step credit under ``process.credit_groups`` = ``which``: every one
    (``all``); those whose group's valid outcomes are all equal within :data:`EQUAL_OUTCOMES_TOL`
    (``all_equal``; a group with fewer than two valid outcomes counts as all equal: it has no outcome
    contrast either); or the rest (``mixed``)."""
    if which == "all":
        return [True] * len(group_B)
    if which not in ("all_equal", "mixed"):
        raise ValueError(f"process.credit_groups: unknown {which!r}")
    seen: dict[int, list[float]] = {}
    for g, s, ok in zip(group_B, score_B, valid_B, strict=True):
        outcomes = seen.setdefault(int(g), [])
        if ok and math.isfinite(float(s)):
            outcomes.append(float(s))
    equal = {g: not v or max(v) - min(v) <= EQUAL_OUTCOMES_TOL for g, v in seen.items()}
    return [equal[int(g)] == (which == "all_equal") for g in group_B]


def process_channel(
    episode_ends: Sequence[Sequence[int]],
    prefix_values: Sequence[Sequence[float]],
    response_mask_BT: torch.Tensor,
    cfg: ProcessConfig,
    *,
    credits: Sequence[Sequence[float]] | None = None,
    row_keys: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The process channel: (process_BT float32, process_mask_BT bool) on a right-padded response layout.

        c_i = step_credits(V)[i]  at the last token of episode i   (default: U_i = V_i - V_(i-1))

    ``process_mask_BT`` is True at the episode ends that carry a c_i. Ends outside the response or on
    tokens ``response_mask_BT`` does not count carry nothing. A row with no episodes (a padding row of
    verl's batch, a domain without process rewards) gets an all-zero channel. The one version used by
    the trainer and the verl plugin. ``credits`` (one list per row, one credit per episode): step credits
    computed elsewhere (TreeRL's tree credit, :func:`stepcredit.process.tree.tree_credits`), placed
    instead of the credit form's; the step cost is charged on them all the same. ``row_keys`` (one int
    per row, default the row index): what seeds each row's ``process.placebo`` permutation; the trainer
    passes (group id, rank in the group), so a response's placebo does not depend on its mini-batch.
    """
    mask_BT = response_mask_BT.bool()
    B, T = mask_BT.shape
    if len(episode_ends) != B or len(prefix_values) != B:
        raise ValueError(f"expected {B} rows of episode ends and values, got {len(episode_ends)}")
    process_BT = torch.zeros(B, T, dtype=torch.float32)
    steps_BT = torch.zeros(B, T, dtype=torch.bool)
    for b, (ends, values) in enumerate(zip(episode_ends, prefix_values, strict=True)):
        if not ends:
            continue
        if len(values) != len(ends) + 1:
            raise ValueError(f"row {b}: {len(ends)} episodes need {len(ends) + 1} values, got {len(values)}")
        key = row_keys[b] if row_keys is not None else b
        if credits is None:
            row = step_credits(values, cfg, row_key=key)
        else:
            row = charge_step_cost(apply_placebo(credits[b], cfg, row_key=key), cfg)
        for e, c in zip(ends, row, strict=True):
            if 0 <= e < T:
                process_BT[b, e] = c
                steps_BT[b, e] = True
    steps_BT &= mask_BT
    return process_BT.to(response_mask_BT.device), steps_BT.to(response_mask_BT.device)
