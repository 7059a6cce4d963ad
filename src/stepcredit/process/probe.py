"""The signal probe: do a model's values find a wrong step that was put into a correct solution?

For each solution one calculation is made wrong and the error is carried forward (every later result
that depends on it changes by the same amount, so the trace stays self-consistent and in the original
format, and its final answer is wrong). Each value estimator then values the prefixes of the clean and
of the corrupted trace; a useful estimator gives the wrong step a lower U than the clean trace gets at
the same step, and puts the most negative U of the corrupted trace on it more often than picking an
episode at random would. The probe's figures are what a researcher checks before paying for process
rewards in training (issue 16); ``stepcredit probe`` is its command.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from stepcredit.config import ArithConfig, ProcessConfig, RolloutConfig, ToolsConfig
from stepcredit.errors import DataError
from stepcredit.process import prefix_request
from stepcredit.process.diagnostics import prompt_ids
from stepcredit.process.segment import token_char_spans
from stepcredit.process.utility import CREDIT_FORMS, marginal_utilities
from stepcredit.process.values import (
    VALUE_ESTIMATORS,
    PrefixRequest,
    ScoreFn,
    ToolTurns,
    ValueContext,
    estimate,
    evaluating,
)
from stepcredit.rollout.tools import render_tool_prompts
from stepcredit.types import Sample

_NUM = r"\d+(?:\.\d+)?"
# "a op b (op c ...) = r" with optional "$" before numbers (GSM8K); GSM8K's calculator annotations
# "<<48/2=24>>24" hold such an equation too, and the number after ">>" is carried like any other.
_EQUATION = re.compile(rf"(\$?{_NUM}(?:\s*[-+*/×x]\s*\$?{_NUM})+)\s*=\s*\$?({_NUM})")
_TOKEN = re.compile(rf"{_EQUATION.pattern}|(?<![\d.])({_NUM})(?![\d])")
_OPERAND = re.compile(_NUM)


@dataclass(frozen=True)
class Injection:
    """A solution with one wrong step whose error is carried forward."""

    text: str
    """The corrupted solution."""
    position: int
    """Character offset of the wrong result (the same in the clean and the corrupted text)."""
    old: str
    """The correct result there."""
    new: str
    """The wrong result written instead."""


def _eval(expr: str) -> Fraction | None:
    """The value of ``a op b op c`` with the usual precedence (None on anything else, or x/0)."""
    src = expr.replace("$", "").replace("×", "*").replace("x", "*")
    if not re.fullmatch(r"[\d.\s+\-*/]+", src):
        return None
    terms = re.findall(rf"({_NUM})|([-+*/])", src)
    vals: list[Fraction] = []
    ops: list[str] = []
    try:
        for num, op in terms:
            if num:
                vals.append(Fraction(num))
            else:
                ops.append(op)
        if len(vals) != len(ops) + 1:
            return None
        # * and / first, then + and - left to right
        acc, pending = [vals[0]], []
        for op, v in zip(ops, vals[1:], strict=True):
            if op == "*":
                acc[-1] *= v
            elif op == "/":
                acc[-1] /= v
            else:
                pending.append(op)
                acc.append(v)
        total = acc[0]
        for op, v in zip(pending, acc[1:], strict=True):
            total = total + v if op == "+" else total - v
        return total
    except ZeroDivisionError:
        return None


def _fmt(x: Fraction, like: str) -> str | None:
    """``x`` written like ``like`` (an integer, or as many decimals); None when it cannot be."""
    if "." in like:
        decimals = len(like.split(".")[1])
        return f"{float(x):.{decimals}f}"
    return str(x.numerator) if x.denominator == 1 else None


def inject_wrong_step(
    text: str, rng: random.Random, *, deltas: Sequence[int] = (-2, -1, 1, 2)
) -> Injection | None:
    """Change the result of one correct equation of ``text`` by a small integer and carry it forward.

    The step is drawn among equations whose written result is right and an integer, other than the
    correction of a slip (not the last one when there is a choice, so the error has something to carry
    into; preferably one whose error reaches the final answer). Later, each equation's leftmost
    operand that equals a changed value is replaced, its result recomputed (a slip that was written
    there keeps its offset: result' = value(operands') + (result - value(operands))), and every other
    number equal to a changed value (a restated total, "The answer is N", "#### N") is rewritten. None
    when the text has no such equation.
    """
    found = list(_EQUATION.finditer(text))
    # right, integer results; not the correction of a slip (same operands as the equation before it)
    eqs = [
        m
        for i, m in enumerate(found)
        if _eval(m.group(1)) == Fraction(m.group(2))
        and "." not in m.group(2)
        and not (i > 0 and found[i - 1].group(1) == m.group(1))
    ]
    if not eqs:
        return None
    pool = eqs[:-1] if len(eqs) > 1 else eqs
    order = rng.sample(pool, len(pool))
    u = rng.random()
    fallback = None
    for pick in order:  # a step whose error reaches the final answer if there is one
        inj = _inject_at(text, pick, deltas, u)
        if inj is None:
            continue
        if _last_number(inj.text) != _last_number(text):
            return inj
        fallback = fallback or inj
    return fallback


def _last_number(text: str) -> str:
    found = _OPERAND.findall(text)
    return found[-1] if found else ""


def _inject_at(text: str, pick: re.Match[str], deltas: Sequence[int], u: float) -> Injection | None:
    old = pick.group(2)
    choices = [d for d in deltas if int(old) + d >= 0] or [abs(d) for d in deltas]
    delta = choices[min(int(u * len(choices)), len(choices) - 1)]
    for d in (delta, abs(delta)):  # when a carried value would go below 0 (a new format), raise instead
        new = str(int(old) + d)
        result = _carry(text, pick, new)
        if result is not None:
            return Injection(result, pick.start(2), old, new)
    return None


def _carry(text: str, pick: re.Match[str], new: str) -> str | None:
    """``text`` with ``pick``'s result set to ``new`` and carried forward; None if a value turns < 0."""
    changed = {pick.group(2): new}
    out = [text[: pick.start(2)], new]
    pos = pick.end(2)
    for m in _TOKEN.finditer(text, pos):
        out.append(text[pos : m.start()])
        if m.group(1) is not None:  # an equation
            out.append(_carry_equation(m, changed))
        else:
            out.append(changed.get(m.group(3), m.group(3)))
        pos = m.end()
    out.append(text[pos:])
    if any(v.startswith("-") for v in changed.values()):
        return None
    return "".join(out)


def _carry_equation(m: re.Match[str], changed: dict[str, str]) -> str:
    expr, result = m.group(1), m.group(2)
    before = _eval(expr)
    hit = next((o for o in _OPERAND.finditer(expr) if o.group() in changed), None)
    if hit is None or before is None:
        return m.group(0)  # its operands did not change, so neither does its result
    new_expr = expr[: hit.start()] + changed[hit.group()] + expr[hit.end() :]
    after = _eval(new_expr)
    if after is None:
        return m.group(0)
    new_result = _fmt(after + (Fraction(result) - before), result)
    if new_result is None:
        return m.group(0)
    if new_result != result:
        changed[result] = new_result
    whole = m.group(0)
    eq_at = m.start(2) - m.start()
    return new_expr + whole[len(expr) : eq_at] + new_result + whole[m.end(2) - m.start() :]


def episode_at(response_ids: Sequence[int], tokenizer: Any, ends: Sequence[int], char: int) -> int:
    """Index of the episode (into ``ends``) holding character ``char`` of the decoded response."""
    _, spans = token_char_spans(response_ids, tokenizer)
    tok = next((i for i, (_, e) in enumerate(spans) if e > char), len(spans) - 1)
    return next((k for k, e in enumerate(ends) if tok <= e), len(ends) - 1)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan for fewer than 2 points or no spread."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(x) < 2:
        return float("nan")
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


@dataclass(frozen=True)
class ProbeCase:
    """One solution and its corrupted twin, ready to be valued."""

    clean: PrefixRequest
    corrupt: PrefixRequest
    clean_step: int
    """Episode of the clean trace holding the step that was changed."""
    corrupt_step: int
    """Episode of the corrupted trace holding the wrong step."""


_TIE = 1e-9
"""Credits this close to the minimum tie with it: values such as thirds (Monte Carlo with K=3) give
differences that should be equal but differ in the last bit (-0.33333333333333337 vs -0.3333333333333333)."""


def _ties_at_min(c: Sequence[float]) -> list[int]:
    lowest = min(c)
    return [i for i, x in enumerate(c) if x <= lowest + _TIE]


def case_indicators(
    clean_v: Sequence[float], corrupt_v: Sequence[float], case: ProbeCase
) -> dict[str, float]:
    """The probe's per-trace figures from the two traces' values (U = V_i - V_(i-1), no clip or scale).

    ``lower``: U at the wrong step < U at the same step of the clean trace. ``argmin``: the most
    negative U of the corrupted trace is on the wrong step (1/m when m episodes tie for it).
    ``chance``: 1/S, what picking an episode at random scores. ``argmin_next``: the most negative U is
    on the wrong step or the one after it (where the error is first built on; a policy that often
    corrects a slip loses its value there), against ``chance_next`` (2/S). ``final_drop``: V after
    the whole corrupted response < V after the clean one. ``v_before`` / ``v_after``: V of the corrupted
    trace just before and just after the wrong step (for ``monte_carlo``: how often the policy still
    reaches the gold answer once the wrong result is written; near 0 if it follows its own chain).
    """
    u_clean, u_bad = marginal_utilities(clean_v), marginal_utilities(corrupt_v)
    ties = _ties_at_min(u_bad)
    near = {case.corrupt_step, min(case.corrupt_step + 1, len(u_bad) - 1)}
    return {
        "lower": float(u_bad[case.corrupt_step] < u_clean[case.clean_step]),
        "argmin": (1.0 / len(ties)) if case.corrupt_step in ties else 0.0,
        "chance": 1.0 / len(u_bad),
        "argmin_next": len(near.intersection(ties)) / len(ties),
        "chance_next": len(near) / len(u_bad),
        "final_drop": float(corrupt_v[-1] < clean_v[-1]),
        "v_before": float(corrupt_v[case.corrupt_step]),
        "v_after": float(corrupt_v[case.corrupt_step + 1]),
    }


def credit_indicators(
    clean_v: Sequence[float], corrupt_v: Sequence[float], case: ProbeCase, *, form: str, clip: float = 0.0
) -> dict[str, float]:
    """The locating figures of one credit form of :data:`CREDIT_FORMS`, on its step credits c_i (what
    the process channel carries at episode i's end with ``process.last_episode=utility``, and what a
    step-level estimator such as ``vineppo`` gives every token of the step) instead of the plain,
    unclipped U_i of :func:`case_indicators`; ``clip`` is ``process.clip``.

    ``lower``: c at the wrong step < c at the same step of the clean trace; ``argmin``: the most negative
    c of the corrupted trace is on the wrong step (1/m for an m-way tie); ``chance``: 1/S. A form that
    pays no negative credit (``watermark``: c_i >= 0) ties every step that lost value at 0, so it can
    only score about chance here: it is built to ignore drops, not to point at them.
    """
    fn = CREDIT_FORMS.get(form)
    c_clean = fn(clean_v, clip=clip, scale=1.0, zero_last=False)
    c_bad = fn(corrupt_v, clip=clip, scale=1.0, zero_last=False)
    for c, v in ((c_clean, clean_v), (c_bad, corrupt_v)):
        if len(c) != len(v) - 1:
            raise DataError(
                f"credit form {form!r}: {len(v)} values gave {len(c)} credits, expected {len(v) - 1}"
            )
    ties = _ties_at_min(c_bad)
    return {
        "lower": float(c_bad[case.corrupt_step] < c_clean[case.clean_step]),
        "argmin": (1.0 / len(ties)) if case.corrupt_step in ties else 0.0,
        "chance": 1.0 / len(c_bad),
    }


Verdict = Literal["signal", "no signal", "too few traces"]
"""What a probe's figures say about one estimator (see :func:`verdict`)."""

MIN_TRACES = 30
"""Below this many scored traces a hit rate whose interval reaches chance is "too few traces" rather
than "no signal": at n = 20 a ratio to chance of 0.9-1.1x is well inside the noise."""


@dataclass(frozen=True)
class Interval:
    """A two-sided 95 % confidence interval."""

    low: float
    """Lower bound."""
    high: float
    """Upper bound."""


def wilson_interval(rate: float, n: int, *, z: float = 1.96) -> Interval:
    """Wilson's score interval for a binomial rate ``rate`` observed on ``n`` trials (Wilson 1927;
    Brown, Cai and DasGupta 2001 recommend it over the normal interval for small n):

        (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)

    A tie shared by m steps counts 1/m of a hit, so ``rate`` may be any value in [0, 1]."""
    if n <= 0:
        return Interval(0.0, 1.0)
    denom = 1.0 + z * z / n
    centre = (rate + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(rate * (1.0 - rate), 0.0) / n + z * z / (4 * n * n)) / denom
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def verdict(hit: Interval, chance: float, n: int) -> Verdict:
    """``signal`` when the whole interval of the hit rate lies above chance; else ``too few traces`` when
    fewer than :data:`MIN_TRACES` traces were scored (the interval is too wide to rule a signal out);
    else ``no signal``."""
    if hit.low > chance:
        return "signal"
    return "too few traces" if n < MIN_TRACES else "no signal"


@dataclass(frozen=True)
class Locating:
    """How often the most negative credit of a corrupted trace falls on its wrong step."""

    n: int
    """Traces these figures are over."""
    lower: float
    """Share where the credit at the wrong step is lower than at the same step of the clean trace."""
    argmin: float
    """Share where the most negative credit is on the wrong step (the hit rate; 1/m for an m-way tie)."""
    chance: float
    """What picking an episode at random scores (mean 1/S)."""
    argmin_vs_chance: float
    """``argmin / chance``."""
    argmin_ci: Interval
    """Wilson 95 % interval of ``argmin``."""
    vs_chance_ci: Interval
    """The same interval as a ratio to chance."""
    verdict: Verdict
    """What the interval says (:func:`verdict`)."""
    v_before: float | None = None
    """Mean V of the corrupted trace just before the wrong step (None for credit forms)."""
    v_after: float | None = None
    """Mean V of the corrupted trace just after it."""


def locating(rows: Sequence[dict[str, float]]) -> Locating:
    """The :class:`Locating` figures from per-trace indicators (:func:`case_indicators` or
    :func:`credit_indicators` rows)."""
    n = len(rows)
    mean = {k: sum(r[k] for r in rows) / n for k in rows[0]}
    ci = wilson_interval(mean["argmin"], n)
    chance = mean["chance"]
    return Locating(
        n=n,
        lower=mean["lower"],
        argmin=mean["argmin"],
        chance=chance,
        argmin_vs_chance=mean["argmin"] / chance,
        argmin_ci=ci,
        vs_chance_ci=Interval(ci.low / chance, ci.high / chance),
        verdict=verdict(ci, chance, n),
        v_before=mean.get("v_before"),
        v_after=mean.get("v_after"),
    )


@dataclass(frozen=True)
class CreditFigures:
    """The locating figures of one credit form (:data:`CREDIT_FORMS`) on one estimator's values."""

    all: Locating
    """Over every scored trace."""
    solvable: Locating | None
    """Over the traces the policy can solve (None without a reference estimator or such traces)."""


@dataclass(frozen=True)
class EstimatorFigures:
    """What the probe measured for one value estimator."""

    name: str
    """The value estimator (:data:`VALUE_ESTIMATORS`)."""
    all: Locating
    """Plain U = V_i - V_(i-1) over every scored trace."""
    solvable: Locating | None
    """The same over the traces the policy can solve (:func:`solvable_figures`)."""
    argmin_next: float
    """Share where the most negative U is on the wrong step or the next one."""
    chance_next: float
    """The chance of ``argmin_next`` (mean 2/S)."""
    argmin_next_vs_chance: float
    """``argmin_next / chance_next``."""
    final_drop: float
    """Share where V after the whole corrupted response is below the clean one's."""
    s_per_trace: float
    """Seconds of valuing per trace (clean and corrupted counted apart)."""
    unscored: int
    """Traces left out because the verifier could not score them (NaN values)."""
    credits: dict[str, CreditFigures]
    """Per credit form, its step credits' locating figures."""


@dataclass(frozen=True)
class RankCorrelation:
    """Spearman's rank correlation, over every prefix of every trace, of two estimators' V."""

    x: str
    """An estimator whose V needs no verifier (a likelihood)."""
    y: str
    """The reference: an estimator whose V is a chance of reaching the gold answer."""
    spearman: float
    """The correlation (nan without spread)."""


@dataclass(frozen=True)
class ProbeReport:
    """The probe's result: per estimator its figures, with intervals and a verdict."""

    n: int
    """Traces probed (a clean solution and its corrupted twin each)."""
    chance: float
    """Chance of the argmin (mean 1/S over the traces)."""
    chance_next: float
    """Chance of the argmin on the wrong step or the next (mean 2/S)."""
    estimators: dict[str, EstimatorFigures]
    """Per value estimator, in the order given."""
    solvable_by: str | None
    """The reference estimator that says which traces the policy can solve (its V_0 > 0)."""
    n_solvable: int
    """How many traces it says the policy can solve."""
    rank_correlation: RankCorrelation | None
    """V of a likelihood estimator against the reference's, when both ran."""
    skipped: int = 0
    """Solutions with no equation to make wrong."""
    not_correct: int = 0
    """Solutions the verifier does not score correct (no baseline for a wrong step)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: intervals as ``{"low", "high"}``; each estimator's ``all`` figures also at its top
        level (``lower``, ``argmin``, ``argmin_vs_chance``, ...) as the table shows them."""
        out = asdict(self)
        for name, e in self.estimators.items():
            flat = {k: v for k, v in asdict(e.all).items() if k not in ("n",)}
            out["estimators"][name] = {**flat, **out["estimators"][name], "n_scored": e.all.n}
        return out


def run_probe(
    model: Any,
    tokenizer: Any,
    cases: Sequence[ProbeCase],
    cfg: ProcessConfig,
    estimators: Sequence[str],
    *,
    score_fn: ScoreFn | None,
    credit_forms: Sequence[str] = (),
    tree_rollout: RolloutConfig | None = None,
    tools: ToolTurns | None = None,
) -> ProbeReport:
    """Value every case with every estimator (each over the whole set at once) and summarise.

    ``tools``: the policy's rollouts call tools (``rollout.mode=tools``): estimators that take them
    (``takes_tools``) value each prefix as training does, continuations as tool rollouts that run the
    calls (:mod:`stepcredit.process.continuation`); None: without tools.

    ``tree_rollout``: estimators whose values come from a tree rollout's outcomes (``from_outcomes``:
    ``tree``) value each trace by a tree of this shape and branch rule grown over it
    (:func:`stepcredit.process.tree.grown_tree_values`: ``rollout.tree.branch_at=entropy`` too), as a
    tree run would; None: by their function on fixed traces (continuations at every episode end).

    Per estimator: the locating figures of plain U (:func:`case_indicators`) and, for every form of
    ``credit_forms`` (with ``cfg.clip``), of its step credits (:func:`credit_indicators`), each with
    a Wilson 95 % interval and a verdict; and the same on the traces the policy can solve, by the first
    estimator given whose registry entry says ``needs_verifier`` (its V is a chance of reaching the
    gold answer). Which estimators are compared is read from the registry, never from their names.
    """
    # a clean trace and its corrupted twin share a prompt but are not samples of the policy: V_0 must
    # come from continuations, not from the other trace's reward (process.mc_v0=group)
    cfg = replace(cfg, mc_v0="sample")
    requests = [r for c in cases for r in (c.clean, c.corrupt)]
    values, seconds = _value_all(model, tokenizer, requests, cfg, estimators, score_fn, tree_rollout, tools)
    # a tree grown over the trace counts the trace's own outcome in its V_0: no judge of solvability
    reference = next(
        (
            n
            for n in estimators
            if VALUE_ESTIMATORS.get(n).needs_verifier
            and not (VALUE_ESTIMATORS.get(n).from_outcomes and tree_rollout is not None)
        ),
        None,
    )
    solvable = (
        {i for i in range(len(cases)) if values[reference][2 * i][0] > 0} if reference is not None else set()
    )
    figures = {
        name: _estimator_figures(
            name, values[name], cases, cfg, credit_forms, solvable if reference else None,
            seconds[name] / max(1, len(requests)),
        )
        for name in estimators
    }  # fmt: skip
    first = next(iter(figures.values()))
    return ProbeReport(
        n=len(cases),
        chance=first.all.chance,
        chance_next=first.chance_next,
        estimators=figures,
        solvable_by=reference,
        n_solvable=len(solvable),
        rank_correlation=_rank_correlation(values, estimators, reference),
    )


def _value_all(
    model: Any,
    tokenizer: Any,
    requests: list[PrefixRequest],
    cfg: ProcessConfig,
    estimators: Sequence[str],
    score_fn: ScoreFn | None,
    tree_rollout: RolloutConfig | None = None,
    tools: ToolTurns | None = None,
) -> tuple[dict[str, list[list[float]]], dict[str, float]]:
    from stepcredit.process.tree import grown_tree_values

    values: dict[str, list[list[float]]] = {}
    seconds: dict[str, float] = {}
    ctx = ValueContext(model, tokenizer, requests, cfg, score_fn, tools=tools)
    for name in estimators:
        t0 = time.perf_counter()
        if VALUE_ESTIMATORS.get(name).from_outcomes and tree_rollout is not None:
            if score_fn is None:
                raise DataError(f"probe: {name} values grown trees' leaves with a verifier")
            with evaluating(model):
                values[name] = grown_tree_values(model, tokenizer, requests, cfg, tree_rollout, score_fn)
        else:
            values[name] = estimate(ctx, name)
        seconds[name] = time.perf_counter() - t0
    return values, seconds


def _estimator_figures(
    name: str,
    values: list[list[float]],
    cases: Sequence[ProbeCase],
    cfg: ProcessConfig,
    credit_forms: Sequence[str],
    solvable: set[int] | None,
    s_per_trace: float,
) -> EstimatorFigures:
    # A trace the verifier could not score (NaN values) says nothing either way: left out, counted.
    ok = [i for i in range(len(cases)) if not any(math.isnan(v) for v in values[2 * i] + values[2 * i + 1])]
    if not ok:
        raise DataError(f"probe: {name} values could not be computed for any trace (verifier failed)")
    rows = {i: case_indicators(values[2 * i], values[2 * i + 1], cases[i]) for i in ok}
    mean_next = sum(r["argmin_next"] for r in rows.values()) / len(ok)
    chance_next = sum(r["chance_next"] for r in rows.values()) / len(ok)
    credits = {}
    probability = VALUE_ESTIMATORS.get(name).success_probability
    for form in credit_forms:
        if CREDIT_FORMS.get(form).needs_success_probability and not probability:
            continue  # blame on log-probabilities compares them with 1: a number with no meaning
        by_case = {
            i: credit_indicators(values[2 * i], values[2 * i + 1], cases[i], form=form, clip=cfg.clip)
            for i in ok
        }
        credits[form] = CreditFigures(locating(list(by_case.values())), solvable_figures(by_case, solvable))
    return EstimatorFigures(
        name=name,
        all=locating(list(rows.values())),
        solvable=solvable_figures(rows, solvable),
        argmin_next=mean_next,
        chance_next=chance_next,
        argmin_next_vs_chance=mean_next / chance_next,
        final_drop=sum(r["final_drop"] for r in rows.values()) / len(ok),
        s_per_trace=s_per_trace,
        unscored=len(cases) - len(ok),
        credits=credits,
    )


def solvable_figures(by_case: dict[int, dict[str, float]], solvable: set[int] | None) -> Locating | None:
    """The locating figures on the traces the policy can solve (its continuation V_0 of the clean trace >
    0). On the others every continuation value is 0 at every prefix, so the argmin ties over all
    episodes and scores exactly chance whatever the estimator: they pull the overall figures to chance
    and say nothing about the estimator. None when no trace is solvable (or nothing says which are)."""
    rows = [r for i, r in by_case.items() if solvable is not None and i in solvable]
    return locating(rows) if rows else None


def _rank_correlation(
    values: dict[str, list[list[float]]], estimators: Sequence[str], reference: str | None
) -> RankCorrelation | None:
    # a likelihood V (no verifier) against the reference's chance of success, when both ran
    x = next((n for n in estimators if not VALUE_ESTIMATORS.get(n).needs_verifier), None)
    if x is None or reference is None:
        return None
    xs = [v for vs in values[x] for v in vs]
    ys = [v for vs in values[reference] for v in vs]
    pairs = [(a, b) for a, b in zip(xs, ys, strict=True) if not (math.isnan(a) or math.isnan(b))]
    return RankCorrelation(x, reference, spearman([a for a, _ in pairs], [b for _, b in pairs]))


# ------------------------------------------------------------------------------- the whole probe
def load_solutions(
    data: str, arith: ArithConfig, *, n: int, seed: int, src: Path | None = None
) -> list[tuple[Sample, str]]:
    """Up to ``n`` (sample, correct solution) pairs of ``data``: ``arith`` (validation problems of
    ``arith`` drawn with ``seed``, from a teacher that makes no slips), a registered dataset's eval
    split (:data:`stepcredit.data.prepare.DATASETS`) or a verl-schema file whose solution is
    ``response``, ``extra_info.solution`` or ``extra_info.answer``."""
    from stepcredit.data.arith import make_rows
    from stepcredit.data.io import read_rows, row_to_sample
    from stepcredit.data.prepare import ARITH, DATASETS, data_names, dataset_rows

    if data == ARITH:
        # the probe corrupts correct solutions: a noisy teacher's uncorrected slips are left out
        rows = make_rows(replace(arith, teacher_error_prob=0.0), n, seed=seed, split="val")
        return [(row_to_sample(r, f"arith:{i}"), r["extra_info"]["solution"]) for i, r in enumerate(rows)]
    if data in DATASETS:
        rows, path = dataset_rows(data, src=src)
    else:
        path = Path(data)
        if not path.is_file():
            raise DataError(f"--data {data}: not one of {', '.join(data_names())} and no such file")
        rows = read_rows(path)
    out = []
    for i, r in enumerate(rows[:n]):
        extra = r.get("extra_info") or {}
        text = r.get("response") or extra.get("solution") or extra.get("answer")
        if not isinstance(text, str) or not text.strip():
            raise DataError(
                f"{path}:{i + 1}: no solution text (response, extra_info.solution or extra_info.answer)"
            )
        out.append((row_to_sample(r, f"{path}:{i + 1}"), text))
    return out


def build_cases(
    tokenizer: Any,
    solutions: Sequence[tuple[Sample, str]],
    cfg: ProcessConfig,
    *,
    deltas: Sequence[int],
    rng: random.Random,
    tools: ToolsConfig | None = None,
) -> tuple[list[ProbeCase], list[int]]:
    """A :class:`ProbeCase` for each solution with an equation to make wrong, and the indices of those
    solutions (the others are skipped). Both traces end with the tokenizer's eos, as a finished
    response does. ``tools``: the prompts are a tool rollout's (the offered tools' schemas where the
    chat template prints them)."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    cases, used = [], []
    for i, (sample, text) in enumerate(solutions):
        inj = inject_wrong_step(text, rng, deltas=deltas)
        if inj is None:
            continue
        prompt = (
            prompt_ids(tokenizer, list(sample.prompt))
            if tools is None
            else render_tool_prompts(tokenizer, [sample], tools.names)[0]
        )
        pair = []
        for t in (text, inj.text):
            ids = list(tokenizer(t, add_special_tokens=False)["input_ids"]) + eos
            ends, req = prefix_request(sample, prompt, ids, tokenizer, cfg)
            pair.append((req, episode_at(ids, tokenizer, ends, inj.position)))
        cases.append(ProbeCase(pair[0][0], pair[1][0], pair[0][1], pair[1][1]))
        used.append(i)
    return cases, used


def probe(
    model: Any,
    tokenizer: Any,
    solutions: Sequence[tuple[Sample, str]],
    cfg: ProcessConfig,
    estimators: Sequence[str],
    *,
    score_fn: ScoreFn,
    deltas: Sequence[int] = (-2, -1, 1, 2),
    seed: int = 0,
    credit_forms: Sequence[str] = (),
    tree_rollout: RolloutConfig | None = None,
    tools: ToolTurns | None = None,
) -> ProbeReport:
    """The signal probe on ``solutions`` (sample, correct solution text): one wrong step injected into
    each (drawn with ``seed`` from ``deltas``), the clean solutions the verifier ``score_fn`` does not
    score correct left out, then :func:`run_probe` (``tree_rollout``, ``tools``: see there; with
    ``tools`` the prompts are the tool rollout's too). DataError when nothing is left to probe."""
    if not deltas or 0 in deltas:
        raise DataError(f"probe: deltas {list(deltas)} must be non-zero integers")
    cases, used = build_cases(
        tokenizer,
        solutions,
        cfg,
        deltas=deltas,
        rng=random.Random(seed),
        tools=tools.tools if tools is not None else None,
    )
    if not cases:
        raise DataError("probe: no solution has an equation 'a op b = c' to make wrong")
    # a "clean" trace the verifier does not score correct is no baseline for a wrong step
    clean = score_fn([solutions[i][0] for i in used], [solutions[i][1] for i in used])  # one submission
    keep = [k for k, score in enumerate(clean) if score >= 1.0 - 1e-6]
    if not keep:
        raise DataError("probe: the verifier scores none of the solutions correct")
    report = run_probe(
        model,
        tokenizer,
        [cases[k] for k in keep],
        cfg,
        estimators,
        score_fn=score_fn,
        credit_forms=credit_forms,
        tree_rollout=tree_rollout,
        tools=tools,
    )
    return replace(report, skipped=len(solutions) - len(cases), not_correct=len(cases) - len(keep))
