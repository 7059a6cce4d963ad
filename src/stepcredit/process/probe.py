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
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from stepcredit.config import ProcessConfig
from stepcredit.errors import DataError
from stepcredit.process.segment import token_char_spans
from stepcredit.process.utility import CREDIT_FORMS, marginal_utilities
from stepcredit.process.values import VALUE_ESTIMATORS, PrefixRequest, ScoreFn

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


def solvable_figures(by_case: dict[int, dict[str, float]], solvable: set[int]) -> dict[str, float]:
    """The argmin figures on the traces the policy can solve (its continuation V_0 of the clean trace >
    0). On the others every continuation value is 0 at every prefix, so the argmin ties over all
    episodes and scores exactly chance whatever the estimator: they pull the overall figures to chance
    and say nothing about the estimator. Empty when no trace is solvable."""
    rows = [r for i, r in by_case.items() if i in solvable]
    if not rows:
        return {}
    keys: list[str] = [k for k in ("lower", "argmin", "chance", "v_before", "v_after") if k in rows[0]]
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
    return {"n": float(len(rows)), **mean, "argmin_vs_chance": mean["argmin"] / mean["chance"]}


def run_probe(
    model: Any,
    tokenizer: Any,
    cases: Sequence[ProbeCase],
    cfg: ProcessConfig,
    estimators: Sequence[str],
    *,
    score_fn: ScoreFn | None,
    credit_forms: Sequence[str] = (),
) -> dict[str, Any]:
    """Value every case with every estimator (each over the whole set at once) and summarise.

    Returns ``{"n", "chance", "chance_next", "estimators": {name: {"lower", "argmin", "argmin_vs_chance",
    "argmin_next", "argmin_next_vs_chance", "final_drop", "v_before", "v_after", "s_per_trace", "solvable"}},
    "solvable_by", "n_solvable", "spearman_forced_vs_mc"}``. Each estimator also gets ``credits``: for
    every form of ``credit_forms`` (:data:`CREDIT_FORMS`, with ``cfg.clip``) the figures of
    :func:`credit_indicators` (``lower``, ``argmin``, ``argmin_vs_chance``, and ``solvable``).
    ``solvable`` (:func:`solvable_figures`)
    repeats the figures on the traces whose clean V_0 > 0 by ``solvable_by``, the first estimator given
    whose registry entry says it ``needs_verifier`` (its V is a chance of reaching the gold answer); the last is the rank correlation, over every
    prefix of every trace, of ``forced_answer_logprob``'s V with ``monte_carlo``'s (when both ran).
    """
    import torch

    requests = [r for c in cases for r in (c.clean, c.corrupt)]
    # a clean trace and its corrupted twin share a prompt but are not samples of the policy: V_0 must
    # come from continuations, not from the other trace's reward (process.mc_v0=group)
    cfg = replace(cfg, mc_v0="sample")
    out: dict[str, Any] = {"n": len(cases), "estimators": {}}
    all_values: dict[str, list[list[float]]] = {}
    per_case: dict[str, dict[int, dict[str, float]]] = {}
    per_form: dict[str, dict[str, dict[int, dict[str, float]]]] = {}  # estimator -> form -> case -> figures
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        for name in estimators:
            spec = VALUE_ESTIMATORS.get(name)
            t0 = time.perf_counter()
            with torch.no_grad():
                values = spec(
                    model, tokenizer, requests, cfg, score_fn=score_fn if spec.needs_verifier else None
                )
            seconds = time.perf_counter() - t0
            all_values[name] = values
            # A trace the verifier could not score (NaN values) says nothing either way: left out, counted.
            ok = [
                i
                for i in range(len(cases))
                if not any(math.isnan(v) for v in values[2 * i] + values[2 * i + 1])
            ]
            if not ok:
                raise DataError(f"probe: {name} values could not be computed for any trace (verifier failed)")
            rows = [case_indicators(values[2 * i], values[2 * i + 1], cases[i]) for i in ok]
            per_case[name] = dict(zip(ok, rows, strict=True))
            mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
            out["chance"], out["chance_next"] = mean["chance"], mean["chance_next"]
            out["estimators"][name] = {
                "lower": mean["lower"],
                "argmin": mean["argmin"],
                "argmin_vs_chance": mean["argmin"] / mean["chance"],
                "argmin_next": mean["argmin_next"],
                "argmin_next_vs_chance": mean["argmin_next"] / mean["chance_next"],
                "final_drop": mean["final_drop"],
                "v_before": mean["v_before"],
                "v_after": mean["v_after"],
                "s_per_trace": seconds / max(1, len(requests)),
                "unscored": len(cases) - len(ok),
                "credits": {},
            }
            for form in credit_forms:
                by_case = {
                    i: credit_indicators(values[2 * i], values[2 * i + 1], cases[i], form=form, clip=cfg.clip)
                    for i in ok
                }
                per_form.setdefault(name, {})[form] = by_case
                fm = {
                    k: sum(r[k] for r in by_case.values()) / len(by_case)
                    for k in ("lower", "argmin", "chance")
                }
                out["estimators"][name]["credits"][form] = {
                    "lower": fm["lower"],
                    "argmin": fm["argmin"],
                    "argmin_vs_chance": fm["argmin"] / fm["chance"],
                }
    finally:
        if was_training:
            model.train()
    # the first estimator whose V is the policy's chance of reaching the gold answer (it scores
    # continuations with the verifier) says which traces the policy can solve at all
    reference = next((n for n in estimators if VALUE_ESTIMATORS.get(n).needs_verifier), None)
    if reference is not None:
        solvable = {i for i in range(len(cases)) if all_values[reference][2 * i][0] > 0}
        out["solvable_by"], out["n_solvable"] = reference, len(solvable)
        for name, by_case in per_case.items():
            figures = solvable_figures(by_case, solvable)
            if figures:
                out["estimators"][name]["solvable"] = figures
            for form, form_cases in per_form.get(name, {}).items():
                figures = solvable_figures(form_cases, solvable)
                if figures:
                    out["estimators"][name]["credits"][form]["solvable"] = figures
    if "forced_answer_logprob" in all_values and "monte_carlo" in all_values:
        fa = [v for vs in all_values["forced_answer_logprob"] for v in vs]
        mc = [v for vs in all_values["monte_carlo"] for v in vs]
        pairs = [(a, b) for a, b in zip(fa, mc, strict=True) if not (math.isnan(a) or math.isnan(b))]
        out["spearman_forced_vs_mc"] = spearman([a for a, _ in pairs], [b for _, b in pairs])
    return out
