"""The math verifier's fast verdict: exact comparisons of normalised answers, sure without sympy or math-verify."""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from typing import Any

from stepcredit.reward.verifiers.latex import (
    Matrix,
    Relation,
    Seq,
    Union,
    compare_structures,
    const_value,
    normalize,
    numbers_equal,
    parse_answer,
    to_complex,
    to_number,
)
from stepcredit.reward.verifiers.latex.compare import _assignment_rhs, _canonical_relation
from stepcredit.reward.verifiers.latex.normal import _DECIMAL_COMMA_RE
from stepcredit.reward.verifiers.latex.variables import nonconstant


# ------------------------------------------------------------------------------------ fast path
def _percent_eq(gold: str, pred: str) -> bool:
    """Whether one side is a percentage whose value over 100 is the other side ("50\\%" vs "0.5");
    the plain reading (50 vs 50) is :func:`normalize`'s."""
    for pct, other in ((pred, gold), (gold, pred)):
        if "%" in pct:
            pv, ov = to_number(normalize(pct)), to_number(normalize(other))
            if pv is not None and ov is not None and numbers_equal((pv[0] / 100, pv[1]), ov):
                return True
    return False


def _pred_readings(pred: str, gold: str) -> list[str]:
    """A normalised prediction and, for "1000,99" against a gold number, its decimal-comma reading
    (a list of two is the other reading; a gold list "1,5" is never read as 1.5)."""
    if _DECIMAL_COMMA_RE.match(pred) and to_number(gold) is not None:
        return [pred, pred.replace(",", ".")]
    return [pred]


def _terminating(x: Fraction) -> bool:
    """Whether ``x`` has a finite decimal expansion (its denominator has no prime factor but 2 and 5)."""
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def _sure_different(gold: str, pred: str, g: str, p: str) -> bool:
    """Whether two answers that are not equal are surely different: both read in full as exact numbers
    (integers, fractions, terminating decimals, small arithmetic), one reading each, and far enough
    apart that math-verify's float rounding (6 decimals) cannot make them equal.

    Anything else (a decimal against a fraction or root it may approximate, percentages, a decimal
    comma, lists, relations, expressions) is left to math-verify: an "incorrect" we are not sure of
    is a wrong gradient in RL."""
    if "%" in gold or "%" in pred:
        return False
    gv, pv = to_number(g), to_number(p)
    if gv is None or pv is None:
        return False
    (x, xd), (y, yd) = gv, pv
    if x == y:
        return False
    commas = re.search(r"\d\s*,\s*\d", gold) or re.search(r"\d\s*,\s*\d", pred)
    if commas and not (x.denominator == 1 and y.denominator == 1):
        return False  # "1,5" may be a decimal comma
    if xd or yd:
        # A decimal may approximate an exact value to the precision it is written with: decided
        # only between values with finite expansions, and well apart.
        if not (_terminating(x) and _terminating(y)):
            return False
        return abs(x - y) > Fraction(1, 10**5) * max(Fraction(1), abs(x), abs(y))
    return True


def _bracketed_many(x: Any) -> bool:
    """A bracketed tuple, interval or set of at least two different elements, or a union of them."""
    if isinstance(x, Union):
        return True
    return (
        isinstance(x, Seq)
        and x.open in ("(", "[", "{")
        and x.close in (")", "]", "}")
        and len(x.items) >= 2
        and len({repr(i) for i in x.items}) >= 2
    )


def _is_constant(s: str) -> bool:
    """Whether a normalised answer reads as one constant: an exact number or a closed form (roots, pi)."""
    return to_number(s) is not None or const_value(s) is not None


def _number_vs_many(gold: str, pred: str, g: str, p: str) -> bool:
    """Whether one side is one constant (an exact number or a closed form such as ``12\\pi``) and the other a tuple, interval or set of several
    different elements (or a union): never equal (``4`` against ``(-\\sqrt{3}, \\sqrt{3})``). A
    decimal comma ("1,5") and percentages are left to math-verify."""
    if "%" in gold or "%" in pred:
        return False
    for num, raw, other, other_raw in ((g, gold, p, pred), (p, pred, g, gold)):
        if _is_constant(num) and not re.search(r"\d\s*,\s*\d", raw):
            # "(1,000)" may be a number with a thousands separator
            thousands = re.search(r"\d\s*,\s*\d{3}(?!\d)", other_raw)
            if thousands or not _bracketed_many(parse_answer(other)):
                return False
            # a closed form is new here: math-verify must read both sides without dropping a unit
            return to_number(num) is not None or _unit_free(gold, pred)
    return False


def _exact_const(s: str) -> complex | None:
    """The value of an exact constant (integers, fractions, roots, powers, pi, ``i``) with no decimal
    literal in it, else None."""
    if "." in s:
        return None
    cv = const_value(s)
    if cv is not None:
        return None if cv[1] else cv[0]
    c = to_complex(s)
    return complex(float(c[0]), float(c[1])) if c is not None else None


def _consts_differ(gold: str, pred: str, g: str, p: str) -> bool:
    """Whether two exact constants (``3\\sqrt{13}`` and ``4``, ``\\pi`` and ``28``, ``6+9i`` and
    ``-50``) surely differ: no decimal on either side (a decimal may approximate), no percentage,
    degree sign or decimal comma, and values apart by more than 1e-6 relative (float error is
    ~1e-15)."""
    both = gold + pred
    if "%" in both or "circ" in both or "degree" in both or re.search(r"\d\s*,\s*\d", both):
        return False
    x, y = _exact_const(g), _exact_const(p)
    if x is None or y is None:
        return False
    return abs(x - y) > 1e-6 * max(1.0, abs(x), abs(y))


@functools.lru_cache(maxsize=1)
def _mv_unit_stripper() -> Any:
    """math-verify's own unit removal (``latex2sympy2_extended``'s ``normalize_latex`` with only its
    ``units`` step, which its default extraction runs); None where it cannot be imported."""
    try:
        from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex
    except ImportError:
        return None
    config = NormalizationConfig(basic_latex=False, units=True, boxed="none")
    return lambda s: normalize_latex(s, config)


def _unit_free(*raw: str) -> bool:
    """Whether math-verify reads each answer without dropping a trailing unit: it reads ``5m``, ``4 t``
    and ``2\\sqrt{3}h`` as numbers (its unit list has single letters), where we see a variable."""
    strip = _mv_unit_stripper()
    return strip is not None and all(strip(r) == r.strip() for r in raw)


def _entries(x: Any) -> int | None:
    """How many scalars a matrix or a bracketed tuple holds; None for anything else."""
    if isinstance(x, Matrix):
        return sum(len(r) for r in x.rows)
    if isinstance(x, Seq) and x.open in ("(", "[") and not any(isinstance(i, (Seq, Matrix)) for i in x.items):
        return len(x.items)
    return None


def _kinds_differ(gold: str, pred: str, g: str, p: str) -> bool:
    """Whether the two answers are surely different objects: one constant against an expression that is
    surely not constant (``4`` against ``x^2+1``, ``\\frac{3\\sqrt{3}}{4}`` against ``\\cot x``: its values at
    two points differ), or against a matrix of several entries; a matrix against a tuple or matrix with
    another number of entries; two matrices of one shape with an entry that surely differs. A gold
    assignment is read by its right side and a predicted equation by its last right side, as
    :func:`~stepcredit.reward.verifiers.latex.compare_structures` (and math-verify) compare them. A
    decimal comma is left to math-verify."""
    if re.search(r"\d\s*,\s*\d", gold + pred) or not _unit_free(gold, pred):
        return False
    a, b = parse_answer(g), parse_answer(p)
    if isinstance(a, Relation) and not isinstance(b, Relation) and (ra := _assignment_rhs(a)) is not None:
        a = parse_answer(ra[1])
    if isinstance(b, Relation) and not isinstance(a, Relation) and all(op == "=" for op in b.ops):
        b = parse_answer(_canonical_relation(b).parts[-1])  # "3 = x" is x = 3, as compare_structures reads it
    for x, y in ((a, b), (b, a)):
        if isinstance(x, str) and _is_constant(x):
            if isinstance(y, str) and nonconstant(y):
                return True
            if isinstance(y, Matrix) and (_entries(y) or 0) >= 2:
                return True
    if isinstance(a, Matrix) or isinstance(b, Matrix):
        na, nb = _entries(a), _entries(b)
        if na is not None and nb is not None and na != nb:
            return True
        return isinstance(a, Matrix) and isinstance(b, Matrix) and compare_structures(a, b) is False
    return False


_CHOICE_GOLD_RE = re.compile(r"^\s*(?:\\text(?:bf)?\s*\{\s*)?\(([A-E])\)\s*\}?\s*$")
# an AMC option as contest solutions write it, its letter then its value: "\textbf{(C) }12" -> "(C)12"
_CHOICE_WITH_VALUE_RE = re.compile(r"^\(([A-E])\)[^,;()]+$")


def _choice_with_value(gold: str, p: str) -> bool:
    """Whether a multiple-choice gold (MATH writes ``\\text{(C)}``) is answered by its letter followed by
    the option's value, ``\\textbf{(C) }12`` (normalised ``(C)12``): the letter is the answer. A second
    letter, a list or a hedge (``(C),(D)``) is not."""
    g = _CHOICE_GOLD_RE.match(gold)
    m = _CHOICE_WITH_VALUE_RE.match(p)
    return g is not None and m is not None and m.group(1) == g.group(1)


def fast_verdict(gold: str, pred: str) -> bool | None:
    """True/False when the answers can be compared without sympy and the verdict is sure, else None
    (math-verify decides).

    True (see :mod:`~stepcredit.reward.verifiers.latex`): equal normalised strings; exact numbers
    (rationals, small arithmetic, Gaussian rationals with ``i``) and constant closed forms (roots, pi)
    equal to 1e-12; assignments and chains by their last exact right-hand side; single-variable
    inequalities either way round; tuples and intervals (ends must match), sets and lists of answers
    (in any order), matrices in any environment; a percentage and its value.
    False: only :func:`_sure_different` (two exact numbers, one reading each),
    :func:`_number_vs_many` (one constant against a tuple, interval or set of several elements),
    :func:`_consts_differ` (two exact constants without decimals, far apart) and :func:`_kinds_differ`
    (a constant against an expression that is surely not constant or a matrix; matrices of other sizes).
    """
    g, p = normalize(gold), normalize(pred)
    if not g or not p:
        return None
    if g == p:
        return True
    readings = _pred_readings(p, g)
    verdicts = [compare_structures(parse_answer(g), parse_answer(y)) for y in readings]
    if any(v is True for v in verdicts) or _percent_eq(gold, pred) or _choice_with_value(gold, p):
        return True
    if len(readings) == 1 and (
        _sure_different(gold, pred, g, p)
        or _number_vs_many(gold, pred, g, p)
        or _consts_differ(gold, pred, g, p)
        or _kinds_differ(gold, pred, g, p)
    ):
        return False
    return None
