"""The bridge to math-verify: its parser and grader called the way it reads answers, with verdicts known in advance."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from stepcredit.reward.verifiers.latex import normalize
from stepcredit.reward.verifiers.math.extract import Anchor, _boxes, extract_gold, starts_expression
from stepcredit.reward.verifiers.math.fast import fast_verdict
from stepcredit.reward.verifiers.math.mv_read import (
    _fitted,
    _gold_readings,
    _mv_first_number,
    _mv_parse_cached,
    _mv_parse_text,
    _mv_timeouts,
    _plain_number,
)

READS_ANSWER_ALONE = (Anchor.BOXED, Anchor.BARE)
"""Anchors whose answer math-verify reads on its own (one distinct box, a bare response), not in the response."""


def reads_alone(how: Anchor, pred: str | None) -> bool:
    """Whether math-verify is given the extracted answer alone rather than the response: the anchors of
    :data:`READS_ANSWER_ALONE`, and an answer phrase whose answer is an expression that starts with a
    number (``starts_expression``: in the response, math-verify reads "Answer: 2\\sqrt2" as 2)."""
    return how in READS_ANSWER_ALONE or (how is Anchor.PHRASE and starts_expression(pred))


def _mv_sure_false(g: tuple[Any, ...], p: tuple[Any, ...]) -> bool:
    """True when ``math_verify.verify(g, p)`` is certainly False without running it: every pair of
    readings is two different strings, a string and an expression, two different exact rationals, or
    a number against a set, tuple or interval of several elements or a non-constant polynomial, or a
    gold constant more than 1e-6 (relative) away from an exact rational or a decimal
    (:func:`_const_sure_false`), or a gold rational against an equation whose last right side is
    surely not it.

    Why: ``verify`` runs ``sympy.simplify`` on each expression pair, most of the cost of a wrong
    MATH answer. For two rationals ``a != b`` each of its comparisons (string, numeric, symbolic)
    is False, so this skips work and never changes a verdict."""
    import sympy

    for a in g:
        for b in p:
            if isinstance(a, str) and isinstance(b, str):
                if a.strip() == b.strip():
                    return False
            elif isinstance(a, str) or isinstance(b, str):
                continue
            elif isinstance(a, sympy.Rational) and isinstance(b, sympy.Rational):
                if a == b:
                    return False
            elif _number_vs_other(a, b) or _number_vs_other(b, a):
                continue
            elif isinstance(b, sympy.Number) and _is_assignment(a):
                # a gold assignment "x = 5" against a number is compared by its right side
                # (math_verify.grader.sympy_expr_eq)
                if not _mv_sure_false((_last_rhs(a),), (b,)):
                    return False
            elif isinstance(b, sympy.Rational) and _const_sure_false((a,), complex(b)):
                # a gold constant ("2\sqrt{5}") far from an exact rational answer (see there)
                continue
            elif (
                isinstance(b, sympy.Float)
                and b.is_finite
                and isinstance(a, sympy.Expr)
                and not a.free_symbols
                and _const_sure_false((a,), complex(b))
            ):
                # a gold constant far from a decimal answer: its numeric check rounds both to 6
                # decimals, more than 1e-6 apart they differ; the symbolic one never cancels
                continue
            elif isinstance(a, sympy.Rational) and _is_equation(b):
                # an equation (or a chain of them) against a gold number is compared by its last
                # right side (math_verify.grader.sympy_expr_eq)
                if not _mv_sure_false((a,), (_last_rhs(b),)):
                    return False
            else:
                return False
    return True


def _grader_says(test: str, x: Any) -> bool:
    """math-verify's own predicate ``math_verify.grader.<test>`` on ``x``; False where it is missing
    (another layout) or cannot read ``x``: no shortcut then."""
    try:
        import math_verify.grader as grader

        return bool(getattr(grader, test)(x))
    except Exception:
        return False


def _is_assignment(x: Any) -> bool:
    return _grader_says("is_assignment_relation", x)


def _is_equation(x: Any) -> bool:
    return _grader_says("is_equation", x)


def _last_rhs(x: Any) -> Any:
    from math_verify.grader import take_last_relation

    return take_last_relation(x).rhs


def _number_vs_other(a: Any, b: Any) -> bool:
    """Whether math-verify's comparison of the number ``a`` with ``b`` is certainly False: ``b`` is a
    set, tuple or interval of several elements or a union (its set comparison makes a number a
    one-element set), or a polynomial that is not constant (``simplify(a - b)`` keeps its variables)."""
    import sympy

    if not isinstance(a, sympy.Number):
        return False
    try:
        if isinstance(b, (sympy.FiniteSet, sympy.Tuple)):
            return len(set(b.args)) >= 2
        if isinstance(b, sympy.Interval):
            return bool(b.start != b.end)
        if isinstance(b, sympy.Union):
            return True
        if isinstance(b, sympy.Expr) and b.free_symbols and b.is_polynomial():
            return not sympy.Poly(b).is_ground
    except Exception:  # any doubt leaves it to verify
        return False
    return False


def _mv_verify(g: tuple[Any, ...], p: tuple[Any, ...]) -> bool:
    from math_verify import verify

    if not g or not p or _mv_sure_false(g, p):
        return False
    t = 5 if _mv_timeouts() else None
    return bool(verify(list(g), list(p), timeout_seconds=t))  # type: ignore[arg-type]


def _mv_sure_wrong(text: str, golds: list[str]) -> str | None:
    """The number math-verify reads in ``text`` when its verdict against every gold is certainly
    "incorrect", else None. :func:`_mv_first_number` is what it compares (a chain of equations by its
    last right side, against a gold that is no equation). Against each gold, either :func:`fast_verdict`
    is sure the two differ (two exact numbers apart by more than math-verify's float rounding can
    bridge, a number against a tuple, interval or set of several elements, an exact constant far from
    it), or, for an exact number that is no decimal, :func:`_mv_sure_false` is sure of it against
    math-verify's own readings of the gold (:func:`_gold_readings`, parsed once per gold and cached: a
    group shares its gold), the readings the slow path would compare. Golds that are worked solutions
    are left to math-verify (it reads the whole solution too)."""
    got = _mv_first_number(text)
    if got is None:
        return None
    return got[2] if _number_surely_wrong(*got, golds) else None


def _number_surely_wrong(
    value: Fraction | complex, decimal: bool, written: str, chain: bool, golds: list[str]
) -> bool:
    """Whether math-verify's verdict on an answer it reads as the number ``value`` (``written``; the
    last part of a chain of equations when ``chain``) is "incorrect" against every gold (see
    :func:`_mv_sure_wrong`)."""
    if not golds:
        return False
    for gold in golds:
        if extract_gold(gold) != gold:
            return False
        if fast_verdict(gold, written) is False:
            continue
        if decimal:
            return False
        readings = _gold_readings(gold)
        if not readings or not _mv_reads_as_number(readings, written, chain):
            return False
        if isinstance(value, complex):
            if not _const_sure_false(readings, value):
                return False
            continue
        import sympy

        if not _mv_sure_false(readings, (sympy.Rational(value.numerator, value.denominator),)):
            return False
    return True


def _const_sure_false(readings: tuple[Any, ...], value: complex) -> bool:
    """Whether math-verify's comparison of every gold reading with an exact constant of this value is
    certainly False (``math_verify.grader.sympy_expr_eq``): a gold assignment is compared by its right
    side; a set, tuple or interval of several elements never equals a number; a constant more than
    1e-6 (relative) away fails its numeric check (15 digits) and its symbolic one (a nonzero difference
    never simplifies to zero); a non-constant polynomial keeps its variables. Texts were checked by
    :func:`_mv_reads_as_number`. Anything else (relations, matrices, other expressions) is not sure."""
    import sympy

    for a in readings:
        if isinstance(a, str):
            continue
        if isinstance(a, sympy.Basic) and a.has(sympy.UnevaluatedExpr):
            return False  # a percentage (X * 1/100 unevaluated): compared by X where the other is an integer
        try:
            if _is_assignment(a):
                a = _last_rhs(a)
            if isinstance(a, (sympy.FiniteSet, sympy.Tuple)) and len(set(a.args)) >= 2:
                continue
            if (isinstance(a, sympy.Interval) and a.start != a.end) or isinstance(a, sympy.Union):
                continue
            if not isinstance(a, sympy.Expr) or isinstance(a, sympy.core.relational.Relational):
                return False
            if a.free_symbols:
                if a.is_polynomial() and not sympy.Poly(a).is_ground:
                    continue
                return False
            c = complex(a.evalf(30))
        except Exception:  # any doubt leaves it to math-verify
            return False
        if not abs(c - value) > 1e-6 * max(1.0, abs(c), abs(value)):
            return False
    return True


def _mv_reads_as_number(readings: tuple[Any, ...], written: str, chain: bool) -> bool:
    """Whether math-verify compares a response whose answer is the number ``written`` with these gold
    readings as that number alone: no gold reading is a text equal to the answer's (its string
    comparison), and after a chain of equations no gold reading is a relation (it would compare the
    chain, not its last part)."""
    import sympy

    for a in readings:
        if isinstance(a, str):
            t = re.sub(r"\s+", "", a)
            if t == re.sub(r"\s+", "", written) or _plain_number(t.strip("$").removesuffix(".")) is not None:
                return False
        elif chain and isinstance(a, (sympy.core.relational.Relational, sympy.And)):
            return False
    return True


def math_verify_verdict(
    gold: str, text: str, pred: str | None, how: Anchor
) -> tuple[bool | None, str | None]:
    r"""math-verify's verdict on the response ``text`` against ``gold`` and the answer it read; None when
    it read nothing in the response.

    The response is read as math-verify reads it by default (``parse(text)``: its own extraction, the
    same configuration ``LatexExtractionConfig`` + ``ExprExtractionConfig``), except where the answer
    is unambiguous and math-verify's default reading of it is known to be lossy: one distinct
    ``\boxed{}`` (read as ``$\boxed{...}$``; bare, ``\boxed{2m}`` reads as 2), a response that is
    only a bare answer, and an answer phrase followed by an expression that starts with a number
    (:func:`reads_alone`: in the response, "Answer: 2\\sqrt2" reads as 2). The gold is read by :func:`_gold_readings`; any reading that matches counts."""
    g = _gold_readings(gold)
    if reads_alone(how, pred) and pred is not None and len({normalize(b) for b in _boxes(text)}) <= 1:
        fit = f"$\\boxed{{{pred}}}$" if how == Anchor.BOXED else _fitted(pred)
        if fit is not None:
            p = _mv_parse_cached(fit)
            if p:
                return _mv_verify(g, p), pred
    p = tuple(_mv_parse_text(text))
    if not p:
        return None, None
    got = next((x for x in p if isinstance(x, str)), None)
    return _mv_verify(g, p), got
