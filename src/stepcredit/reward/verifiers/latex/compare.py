"""Exact comparison of two answers' structures: ``True``/``False`` where certain, else ``None``."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from stepcredit.reward.verifiers.latex.structures import (
    _FLIP,
    _SIMPLE_LHS_RE,
    Matrix,
    Relation,
    Seq,
    Union,
    parse_answer,
)
from stepcredit.reward.verifiers.latex.values import const_value, numbers_equal, to_complex, to_number


def _scalar_eq(a: str, b: str) -> bool | None:
    """Two normalised scalars: True/False when certain, else None."""
    if a == b:
        return True
    av, bv = to_number(a), to_number(b)
    if av is not None and bv is not None:
        return numbers_equal(av, bv)
    ac = to_complex(a) if av is None else (av[0], Fraction(0))
    bc = to_complex(b) if bv is None else (bv[0], Fraction(0))
    if ac is not None and bc is not None and not (av and av[1]) and not (bv and bv[1]):
        return ac == bc
    if a in ("\\infty", "+\\infty", "-\\infty") or b in ("\\infty", "+\\infty", "-\\infty"):
        ai, bi = a.lstrip("+"), b.lstrip("+")
        if ai in ("\\infty", "-\\infty") and bi in ("\\infty", "-\\infty"):
            return ai == bi
        if (ai in ("\\infty", "-\\infty") and const_value(bi)) or (
            bi in ("\\infty", "-\\infty") and const_value(ai)
        ):
            return False
        return None
    ax, bx = const_value(a), const_value(b)
    if ax is None or bx is None:
        return None
    (x, xd), (y, yd) = ax, bx
    scale = max(1.0, abs(y))
    if abs(x - y) <= 1e-12 * scale:
        return True
    # math-verify rounds floats to 6 decimals; a gap well above that is a different answer. Between
    # the two thresholds the verdict depends on its exact rounding, so it decides.
    if abs(x - y) > (1e-5 if (xd or yd) else 1e-9) * scale:
        return False
    return None


def _all(verdicts: list[bool | None]) -> bool | None:
    if all(v is True for v in verdicts):
        return True
    if any(v is False for v in verdicts):
        return False
    return None


def _unordered(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool | None:
    """Set equality of two element lists: every element has an equal partner on the other side."""
    table = [[compare_structures(x, y) for y in b] for x in a]
    a_ok = [any(v is True for v in row) for row in table]
    b_ok = [any(table[i][j] is True for i in range(len(a))) for j in range(len(b))]
    if all(a_ok) and all(b_ok):
        return True
    a_none = [all(v is False for v in row) for row in table]
    b_none = [all(table[i][j] is False for i in range(len(a))) for j in range(len(b))]
    if any(a_none) or any(b_none):
        return False
    return None


def _assignment_rhs(r: Relation) -> tuple[str, str] | None:
    """(lhs, last exact rhs) of an assignment or chain ``x = 5+5+1 = 16``; None for other relations."""
    if not r.ops or any(op != "=" for op in r.ops) or not _SIMPLE_LHS_RE.match(r.parts[0]):
        return None
    return r.parts[0], r.parts[-1]


def _canonical_relation(r: Relation) -> Relation:
    """Inequalities read with ``<``/``≤`` ("x ≥ 5" -> "5 ≤ x"), and "5 = x" as "x = 5"."""
    if all(op in (">", "≥") for op in r.ops):
        return Relation(tuple(reversed(r.parts)), tuple(_FLIP[op] for op in reversed(r.ops)))
    one_eq = len(r.ops) == 1 and r.ops[0] in ("=", "≠")
    if one_eq and not _SIMPLE_LHS_RE.match(r.parts[0]) and _SIMPLE_LHS_RE.match(r.parts[1]):
        return Relation((r.parts[1], r.parts[0]), r.ops)  # "5 = x" -> "x = 5"
    return r


def _relations_eq(a: Relation, b: Relation) -> bool | None:
    a, b = _canonical_relation(a), _canonical_relation(b)
    if len(a.parts) != len(b.parts):
        return None
    # Only a single variable against constants is decided here; equations with several terms (equal
    # up to a factor, rearranged) are math-verify's business.
    for x, y in zip(a.parts, b.parts, strict=True):
        if _SIMPLE_LHS_RE.match(x) or _SIMPLE_LHS_RE.match(y):
            if x != y:
                return None
        elif (const_value(x) is None and to_number(x) is None and x not in ("\\infty", "-\\infty")) or (
            const_value(y) is None and to_number(y) is None and y not in ("\\infty", "-\\infty")
        ):
            return None
    if not any(_SIMPLE_LHS_RE.match(x) for x in a.parts):
        return None
    if a.ops != b.ops:
        return False
    return _all([_scalar_eq(x, y) for x, y in zip(a.parts, b.parts, strict=True)])


_INFINITIES = ("\\infty", "+\\infty", "-\\infty")


def _surely_interval(x: Any) -> bool:
    """A gold read as an interval, never a point: two ends in brackets with a square one or an infinite
    end ("[1, 2)", "(-\\infty, 0)"); a plain "(1, 2)" may be an ordered pair."""
    return (
        isinstance(x, Seq)
        and x.open in "(["
        and x.close in ")]"
        and len(x.items) == 2
        and all(isinstance(i, str) for i in x.items)
        and ("[" in (x.open, x.close) or "]" in (x.open, x.close) or any(i in _INFINITIES for i in x.items))
    )


def _as_interval(r: Relation) -> Seq | None:
    """The interval a single-variable inequality describes ("1 < x \\le 2" -> "(1, 2]", "x \\ge 3" ->
    "[3, \\infty)"), else None (other relations, several variables, "\\ne")."""
    r = _canonical_relation(r)
    if not r.ops or any(op not in ("<", "≤") for op in r.ops):
        return None
    var = [i for i, part in enumerate(r.parts) if _SIMPLE_LHS_RE.match(part)]
    if len(var) != 1 or len(r.parts) > 3 or (len(r.parts) == 3 and var != [1]):
        return None
    i = var[0]
    lo, lo_op = (r.parts[i - 1], r.ops[i - 1]) if i > 0 else ("-\\infty", "<")
    hi, hi_op = (r.parts[i + 1], r.ops[i]) if i + 1 < len(r.parts) else ("\\infty", "<")
    return Seq("(" if lo_op == "<" else "[", ")" if hi_op == "<" else "]", (lo, hi))


def compare_structures(a: Any, b: Any) -> bool | None:
    """Equality of two parsed answers (``a`` the gold side): True/False when certain, else None."""
    if isinstance(a, Relation) and (ra := _assignment_rhs(a)) is not None:
        if isinstance(b, Relation) and (rb := _assignment_rhs(b)) is not None:
            if ra[0] != rb[0]:
                return None  # "x=1" vs "y=1": math-verify compares the whole relations
            return compare_structures(parse_answer(ra[1]), parse_answer(rb[1]))
        if not isinstance(b, Relation):
            return compare_structures(parse_answer(ra[1]), b)
    if isinstance(b, Relation) and not isinstance(a, Relation) and all(op == "=" for op in b.ops):
        # math-verify: a predicted equation against a gold that is none compares its last
        # right-hand side ("(a,b) = (-2,1)", "p(8) = ... = \\frac{3}{56}", "2x = 10" vs "10"); "3 = x"
        # is read as "x = 3" first (math-verify would compare x: a careful grader reads the value)
        return compare_structures(a, parse_answer(_canonical_relation(b).parts[-1]))
    if isinstance(a, str) and isinstance(b, str):
        return _scalar_eq(a, b)
    if isinstance(b, Relation) and _surely_interval(a) and (interval := _as_interval(b)) is not None:
        # An interval answered as the inequality of one variable that describes it ("[3, \\infty)" vs
        # "x \\ge 3"): the same set. math-verify compares them only the other way round (a gold relation
        # against a predicted set; grader.sympy_expr_eq, allow_set_relation_comp=False); the
        # differential test labels both directions right (interval_notations).
        return compare_structures(a, interval)
    if isinstance(a, Relation) and isinstance(b, Relation):
        return _relations_eq(a, b)
    if isinstance(a, Matrix) and isinstance(b, Matrix):
        if [len(r) for r in a.rows] != [len(r) for r in b.rows]:
            return False
        return _all(
            [
                _scalar_eq(x, y)
                for ra_, rb_ in zip(a.rows, b.rows, strict=True)
                for x, y in zip(ra_, rb_, strict=True)
            ]
        )
    if isinstance(a, Seq) and isinstance(b, Seq):
        if a.unordered and b.unordered:
            return _unordered(a.items, b.items)
        if (a.open, a.close) != (b.open, b.close) or a.unordered or b.unordered:
            # "[0,1)" vs "[0,1]": intervals with different ends differ; a tuple vs a set is
            # math-verify's business (its strict mode says no, its lenient mode may say yes).
            if not a.unordered and not b.unordered and len(a.items) == len(b.items) == 2:
                return False
            return None
        if len(a.items) != len(b.items):
            return False
        return _all([compare_structures(x, y) for x, y in zip(a.items, b.items, strict=True)])
    if isinstance(a, Union) and isinstance(b, Union):
        return _unordered(a.parts, b.parts)
    # A single constant is never equal to a list of two or more, an interval, a union or a matrix
    # (math-verify's comparisons need matching structure).
    for x, y in ((a, b), (b, a)):
        if isinstance(x, str) and const_value(x) is not None and isinstance(y, (Seq, Union, Matrix)):
            if isinstance(y, Matrix) and len(y.rows) == 1 and len(y.rows[0]) == 1:
                return None
            return False
    return None
