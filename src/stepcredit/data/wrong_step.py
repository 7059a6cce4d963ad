"""Trace surgery for the signal probe: one calculation of a correct solution made wrong, the error
carried forward, and the solutions it is done to (``stepcredit probe --data``).

For each solution one calculation is made wrong and the error is carried forward (every later result
that depends on it changes by the same amount, so the trace stays self-consistent and in the original
format, and its final answer is wrong): :func:`inject_wrong_step`. The equations it edits are the
task's own (``arith``'s chain, GSM8K's worked solutions and their ``<<a*b=c>>`` annotations).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from stepcredit.config import ArithConfig
from stepcredit.errors import DataError
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


def load_solutions(
    data: str, arith: ArithConfig, *, n: int, seed: int, src: Path | None = None
) -> list[tuple[Sample, str]]:
    """Up to ``n`` (sample, correct solution) pairs of ``data``: ``arith`` (validation problems of
    ``arith`` drawn with ``seed``, from a teacher that makes no slips), a registered dataset's eval
    split (:data:`stepcredit.data.prepare.DATASETS`) or a verl-schema file whose solution is
    ``response``, ``extra_info.solution`` or ``extra_info.answer``."""
    from stepcredit.data.arith import make_rows
    from stepcredit.data.io import numbered_rows, row_to_sample
    from stepcredit.data.prepare import ARITH, DATASETS, data_names, dataset_rows

    if data == ARITH:
        # the probe corrupts correct solutions: a noisy teacher's uncorrected slips are left out
        rows = make_rows(replace(arith, teacher_error_prob=0.0), n, seed=seed, split="val")
        return [(row_to_sample(r, f"arith:{i}"), r["extra_info"]["solution"]) for i, r in enumerate(rows)]
    if data in DATASETS:
        rows, path = dataset_rows(data, src=src)
        numbered = [(f"{path}:{i + 1}", r) for i, r in enumerate(rows)]
    else:
        path = Path(data)
        if not path.is_file():
            raise DataError(f"--data {data}: not one of {', '.join(data_names())} and no such file")
        numbered = numbered_rows(path)
    out = []
    for where, r in numbered[:n]:
        if not isinstance(r, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(r).__name__}")
        extra = r.get("extra_info") or {}
        text = r.get("response") or extra.get("solution") or extra.get("answer")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: no solution text (response, extra_info.solution or extra_info.answer)")
        out.append((row_to_sample(r, where), text))
    return out
