"""math-verify's reading of the set, interval and fraction answers MATH writes, built without its LaTeX parser."""

from __future__ import annotations

import re
from typing import Any

# A fraction, or a tuple, interval or union of intervals of integers, fractions, infinities and
# multiples or fractions of pi, maybe after "x \\in", as MATH writes them: "\\frac{4}{9}", "(8,-2)",
# "\\left( 3, \\frac{\\pi}{2} \\right)", "(-\\infty, 0]", "x \\in [-2,7]", "(2,12) \\cup (12,102)". math-verify's LaTeX parser takes 20-50 ms on a set (its grammar's set rules
# fall back to full-context prediction), most of the cost of a gold answer's reading;
# :func:`_set_reading` builds the same reading directly.
_SET_ELEM = r"\s*(?:-?\d+|-?\\frac\{\d+\}\{[1-9]\d*\}|-?\\infty|-?\d*\\pi|-?\\frac\{\\pi\}\{[1-9]\d*\})\s*"
_SET_GROUP_RE = re.compile(rf"([(\[])({_SET_ELEM}(?:,{_SET_ELEM})+)([)\]])")
_SET_TEXT_RE = re.compile(
    rf"\s*(?:(?P<var>[a-df-hj-z])\s*\\in(?![a-zA-Z])\s*)?"
    rf"{_SET_GROUP_RE.pattern}(?:\s*\\cup\s*{_SET_GROUP_RE.pattern})*\s*"
)
_FRAC_TEXT_RE = re.compile(r"\s*-?\\frac\{\d+\}\{[1-9]\d*\}\s*")
_SET_VALUE_RE = re.compile(
    r"(-?)(?:(\d+)|\\frac\{(\d+)\}\{(\d+)\}|(\\infty)|(\d*)\\pi|\\frac\{\\pi\}\{(\d+)\})"
)


_OPEN_END = {"(": True, ")": True, "[": False, "]": False}
"""An interval's bracket -> whether that end is open."""


def _set_reading(s: str) -> tuple[Any, ...] | None:
    """math-verify's reading of ``$s$`` (``parse``: the expression, then the text it matched, with
    ``\\left``/``\\right`` dropped and ``\\dfrac``/``\\tfrac`` spelt ``\\frac`` as its normalisation does)
    for a fraction of integers, or a tuple, interval or union of intervals of integers, such
    fractions, infinities and multiples or fractions of pi, maybe after ``x \\in``
    (:data:`_SET_TEXT_RE`), built without its parser; None for anything else. latex2sympy_extended's rules, which the test ``test_set_reading_equals_math_verify`` checks
    against its parser on generated and MATH-500 answers: a fraction is the rational it equals; two
    elements in brackets are an interval (open at a parenthesis), except an empty one with both ends
    alike ("(3,1)", "[3,1]"), which is the tuple; more elements are a tuple; a union is built left to
    right, unevaluated, a tuple in it becoming the set of its elements; ``x \\in S`` is the unevaluated
    equation of the real symbol x and S."""
    t = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)).strip()
    if _FRAC_TEXT_RE.fullmatch(t):
        return _set_value(t), t
    whole = _SET_TEXT_RE.fullmatch(t)
    if whole is None:
        return None
    import sympy

    var = whole.group("var")
    parts: list[Any] = []
    for m in _SET_GROUP_RE.finditer(t, whole.start(2) if var else 0):
        left, body, right = m.groups()
        items = [_set_value(x) for x in body.split(",")]
        if len(items) > 2:
            if (left, right) not in (("(", ")"), ("[", "]")):
                return None  # "(1,2,3]": not a form this reader knows
            parts.append(sympy.Tuple(*items))
            continue
        a, b = items
        lo, ro = _OPEN_END[left], _OPEN_END[right]
        if (lo and ro and b <= a) or (not lo and not ro and b < a):
            parts.append(sympy.Tuple(a, b))
        else:
            parts.append(sympy.Interval(a, b, left_open=lo, right_open=ro))
    acc = parts[0]
    for nxt in parts[1:]:
        acc, nxt = (sympy.FiniteSet(*x) if isinstance(x, sympy.Tuple) else x for x in (acc, nxt))
        acc = sympy.Union(acc, nxt, evaluate=False)
    if var:  # "x \\in [a, b]": an equation of the (real) variable and the set
        acc = sympy.Eq(sympy.Symbol(var, real=True), acc, evaluate=False)
    return acc, t


def _set_value(x: str) -> Any:
    """An element of :data:`_SET_TEXT_RE` as latex2sympy reads it: an Integer, a Rational, +-oo, or
    ``k\\pi`` / ``\\frac{\\pi}{q}`` (with a sign) as its unevaluated product."""
    import sympy

    m = _SET_VALUE_RE.fullmatch(x.strip())
    assert m is not None  # the caller matched the grammar
    neg = bool(m.group(1))
    if m.group(2) is not None:
        return sympy.Integer(-int(m.group(2)) if neg else int(m.group(2)))
    if m.group(3) is not None:
        return sympy.Rational(-int(m.group(3)) if neg else int(m.group(3)), int(m.group(4)))
    if m.group(5) is not None:
        return -sympy.oo if neg else sympy.oo
    # multiples and fractions of pi stay unevaluated products, as latex2sympy builds them
    if m.group(7) is not None:
        factors: list[Any] = [sympy.Pow(sympy.Integer(int(m.group(7))), sympy.Integer(-1), evaluate=False)]
    elif m.group(6):
        factors = [sympy.Integer(int(m.group(6)))]
    else:
        factors = []
    factors = [sympy.Integer(-1), *factors] if neg else factors
    return sympy.Mul(*factors, sympy.pi, evaluate=False) if factors else sympy.pi
