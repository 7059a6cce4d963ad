"""LaTeX answer normalisation and the exact comparisons of the math verifier's fast path.

Everything here is plain string and :class:`fractions.Fraction` work, no sympy: :func:`normalize`
rewrites an answer into one canonical spelling, :func:`parse_answer` reads that spelling as a
structure (number, bracketed sequence, set, matrix, relation, list of answers), and
:func:`compare` decides ``True``/``False`` where the structures make that certain, else ``None``
(the caller then asks math-verify). The rules follow math-verify 0.9.0's comparisons
(``math_verify/grader.py``: assignments compare by right-hand side, sets ignore order, tuples and
intervals do not, open and closed ends must match, floats compare rounded to 6 decimals); where we
deliberately differ, ``docs/verifiers.md`` says so and why.


The numbers themselves (rationals, Gaussian rationals, constants) are read by
:mod:`stepcredit.reward.verifiers.latex_numbers`; their names are re-exported here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from stepcredit.reward.verifiers.latex_numbers import (
    const_value,
    numbers_equal,
    to_complex,
    to_number,
)

# ------------------------------------------------------------------------------- normalisation
_WRAPPERS = (
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "mathrm",
    "mathbf",
    "mbox",
    "mathit",
    "textsf",
    "hbox",
)
_WRAPPER_RE = re.compile(r"\\(?:" + "|".join(_WRAPPERS) + r")\s*\{")
_SPACES_RE = re.compile(
    r"(?<!\\)\\[,;:! >]|~|\\quad|\\qquad|\\displaystyle|\\textstyle|[\u00a0\u2009\u202f\u2005\u2006]"
)
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree")
_THOUSANDS_RE = re.compile(r"^[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL_COMMA_RE = re.compile(r"^[-+]?\d+,\d+$")
_RELATION_WORDS = tuple(
    (re.compile(pat), rep)
    for pat, rep in (
        (r"\\geqslant|\\geq|\\ge(?![a-zA-Z])|>=", "≥"),
        (r"\\leqslant|\\leq|\\le(?![a-zA-Z])|<=", "≤"),
        (r"\\neq|\\ne(?![a-zA-Z])|!=", "≠"),
        (r"\\lt(?![a-zA-Z])", "<"),
        (r"\\gt(?![a-zA-Z])", ">"),
    )
)
_MIXED_RE = re.compile(r"(?<![\d.}^_{])(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}")
_UNIT_WORDS_RE = re.compile(r"^(.*?[\d}.)])\s+([a-zA-Z]{2,}\.?(?:\s+[a-zA-Z]+\.?)*)$")


def _group_end(s: str, start: int) -> int:
    """The index just after the brace group opening at ``s[start] == '{'``; -1 when unbalanced."""
    depth = 0
    i = start
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _brace_args(s: str, command: str, nargs: int) -> str:
    """``\\frac13`` -> ``\\frac{1}{3}``, ``\\sqrt3`` -> ``\\sqrt{3}``: one spelling for unbraced arguments
    (TeX reads a single character or control word as the argument)."""
    out: list[str] = []
    i = 0
    pat = "\\" + command
    while True:
        j = s.find(pat, i)
        if j < 0 or (j + len(pat) < len(s) and s[j + len(pat)].isalpha()):
            if j < 0:
                out.append(s[i:])
                return "".join(out)
            out.append(s[i : j + len(pat)])
            i = j + len(pat)
            continue
        out.append(s[i : j + len(pat)])
        k = j + len(pat)
        if command == "sqrt" and k < len(s) and s[k] == "[":  # \sqrt[3]{x}
            close = s.find("]", k)
            if close < 0:
                out.append(s[k:])
                return "".join(out)
            out.append(s[k : close + 1])
            k = close + 1
        for _ in range(nargs):
            while k < len(s) and s[k] == " ":
                k += 1
            if k >= len(s):
                break
            if s[k] == "{":
                end = _group_end(s, k)
                if end < 0:
                    break
                out.append(s[k:end])
                k = end
            elif s[k] == "\\":
                m = re.match(r"\\[a-zA-Z]+", s[k:])
                arg = m.group(0) if m else s[k : k + 2]
                out.append("{" + arg + "}")
                k += len(arg)
            else:
                out.append("{" + s[k] + "}")
                k += 1
        i = k


def _unwrap_text(s: str) -> str:
    """``\\text{...}``-like wrappers: a unit or word beside other math is dropped ("5\\text{ cm}"); any
    other content is kept without its wrapper ("\\textbf{5}", "\\text{Evelyn}")."""
    for _ in range(8):
        m = _WRAPPER_RE.search(s)
        if not m:
            return s
        end = _group_end(s, m.end() - 1)
        if end < 0:
            return s
        inner = s[m.end() : end - 1]
        rest = (s[: m.start()] + s[end:]).strip(" .,")
        is_word = re.fullmatch(r"\s*[a-zA-Z][a-zA-Z\s.]*", inner) is not None
        if is_word and re.search(r"[\d}]", rest):
            # a unit, with its power if any ("54\text{ cm}^2")
            power = re.match(r"\s*\^\s*(?:\{\s*\d\s*\}|\d)", s[end:])
            s = s[: m.start()] + s[end + (power.end() if power else 0) :]
        else:
            s = s[: m.start()] + inner + s[end:]
    return s


def _strip_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        while len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : len(s) - len(right)].strip()
    return s


@functools.lru_cache(maxsize=65536)
def normalize(s: str) -> str:
    """A canonical spelling of an answer string; equal outputs mean equal answers (never the reverse).

    Removed: math delimiters, ``\\left``/``\\right``, spacing commands, degree signs, ``$`` and ``%``
    signs, text units, a trailing full stop, thousands separators (comma, ``{,}``, thin space, ``\\!``)
    and whitespace. Unified: ``\\dfrac``/``\\tfrac``/``\\cfrac`` -> ``\\frac`` with braced arguments,
    ``\\sqrt3`` -> ``\\sqrt{3}``, relation symbols (``\\geq``, ``>=``, ``\\geqslant`` -> ``≥``), ``.4``
    -> ``0.4``. Assignments and chains are kept: :func:`parse_answer` reads them.
    """
    s = _strip_delimiters(s)
    listed = re.search(r"\d,\s+\d", s) is not None  # "32, 349" is a list of two, not 32349
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])\s*\.?", "", s)
    s = s.replace("{,}", ",").replace("{.}", ".")
    s = _SPACES_RE.sub(" ", s)
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = s.replace("−", "-").replace("–", "-").replace("∞", "\\infty")
    for pat, rep in _RELATION_WORDS:
        s = pat.sub(lambda _m, rep=rep: rep, s)  # type: ignore[misc]
    # "x = 3 or x = 4", "1 \text{ and } 2": several answers, read as a list
    s = re.sub(
        r"\s*(?:\\(?:text|mbox|textrm)\s*\{\s*(?:or|and)\s*\}|(?<![a-zA-Z\\])(?:or|and)(?![a-zA-Z]))\s*",
        ",",
        s,
    )
    s = _unwrap_text(s)
    approx = re.split(r"\\approx|≈", s, maxsplit=1)
    if approx[0].strip():  # "x = 1/3 \approx 0.33": the exact value comes before the approximation
        s = approx[0]
    s = s.strip().rstrip(".").strip()
    unit = _UNIT_WORDS_RE.match(s)
    if unit and not re.search(r"[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", unit.group(1))):
        s = unit.group(1)  # "12 meters", "\frac13 cm": a number then English words
    if "\\frac" in s:
        s = _brace_args(s, "frac", 2)
        # "15\frac{39}{40}" is a mixed number, as math-verify (latex2sympy) reads it
        s = _MIXED_RE.sub(r"(\1+\\frac{\2}{\3})", s)
    if "\\sqrt" in s:
        s = _brace_args(s, "sqrt", 1)
    # "1 000" and "1\,000": a space between digit groups of three is a thousands separator
    s = re.sub(r"(?<=\d) (?=\d{3}(?!\d))", "", s)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"(?<![\d}])\.(?=\d)", "0.", s)
    if _THOUSANDS_RE.match(s) and not listed:
        s = s.replace(",", "")
    elif re.fullmatch(r"[-+]?0,\d+", s):  # "0,111" can only be a decimal comma
        s = s.replace(",", ".")
    choice = re.fullmatch(r"\(([A-Za-z])\)", s)  # "(C)" -> "C"
    if choice:
        s = choice.group(1)
    if re.fullmatch(r"[-+]?\d+\.0+", s):
        s = s.split(".")[0]
    return s


# --------------------------------------------------------------------------------- structures
@dataclass(frozen=True)
class Seq:
    """A bracketed sequence: tuple ``(a,b)``, interval ``[a,b)``, set ``\\{a,b\\}`` or a bare list ``a, b``."""

    open: str
    """``(``, ``[``, ``{`` (a set) or empty (a bare list of answers)."""
    close: str
    """``)``, ``]``, ``}`` or empty."""
    items: tuple[Any, ...]
    """The elements, each a parsed answer."""

    @property
    def unordered(self) -> bool:
        return self.open in ("{", "")


@dataclass(frozen=True)
class Union:
    """A union of intervals or sets (``\\cup``); order does not matter."""

    parts: tuple[Any, ...]
    """The united parts."""


@dataclass(frozen=True)
class Matrix:
    """A matrix or vector, whatever its environment (pmatrix, bmatrix, array, ...)."""

    rows: tuple[tuple[str, ...], ...]
    """Entries row by row, each a normalised scalar."""


@dataclass(frozen=True)
class Relation:
    """A relation ``lhs op rhs`` with ``op`` in ``< > ≤ ≥ ≠ =``; chains are several relations."""

    parts: tuple[str, ...]
    """The sides, left to right (two for ``x<5``, three for ``1<x<5``)."""
    ops: tuple[str, ...]
    """The operators between consecutive sides."""


_MATRIX_RE = re.compile(
    r"^[\[(]?\\begin\{(pmatrix|bmatrix|Bmatrix|matrix|smallmatrix|array)\}(.*)\\end\{\1\}[\])]?$"
)
_MEMBER_RE = re.compile(r"^(.+?)\\in(?![a-zA-Z])(.+)$")
_REL_SPLIT_RE = re.compile(r"(≤|≥|≠|<|>|=)")
_FLIP = {"<": ">", ">": "<", "≤": "≥", "≥": "≤", "≠": "≠", "=": "="}
_SIMPLE_LHS_RE = re.compile(
    r"^(?:[a-zA-Z]|\\[a-zA-Z]+|\\(?:mathbf|bold|vec|boldsymbol|overrightarrow)\{[a-zA-Z]\})"
    r"(?:_\{?[a-zA-Z0-9]+\}?)?(?:\([a-zA-Z]\))?$"
)


def _split_top(s: str, sep: str = ",") -> list[str]:
    """``s`` split on ``sep`` outside any bracket; [] when the brackets do not balance."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return []
        elif c == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    if depth != 0:
        return []
    parts.append(s[start:])
    return parts


def _closes_at_end(s: str) -> bool:
    """Whether the bracket opening at ``s[0]`` closes at the last character ("(1,2)", not "(a)(b)");
    ( and [ count alike, so an interval "[0,1)" closes too."""
    depth = 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i == len(s) - 1
    return False


def _matrix(s: str) -> Matrix | None:
    m = _MATRIX_RE.match(s)
    if not m:
        return None
    body = m.group(2)
    if "\\begin" in body or "\\end" in body:  # a product or sum of matrices, not one matrix
        return None
    if m.group(1) == "array" and body.startswith("{"):
        end = _group_end(body, 0)
        body = body[end:] if end > 0 else body
    body = body.replace("\\hline", "")
    rows = [r for r in re.split(r"\\\\", body)]
    while rows and not rows[-1]:
        rows.pop()
    if not rows:
        return None
    return Matrix(tuple(tuple(c for c in r.split("&")) for r in rows))


@functools.lru_cache(maxsize=65536)
def parse_answer(s: str) -> Any:
    """The structure of a normalised answer: a :class:`Matrix`, :class:`Union`, :class:`Seq`,
    :class:`Relation`, or the string itself for a scalar."""
    if not s:
        return s
    mat = _matrix(s)
    if mat is not None:
        return mat
    if "\\cup" in s:
        parts = s.split("\\cup")
        if all(parts):
            return Union(tuple(parse_answer(p) for p in parts))
    if s.startswith("\\{") and s.endswith("\\}"):
        items = _split_top(s[2:-2])
        if items and all(items):
            return Seq("{", "}", tuple(parse_answer(x) for x in items))
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _closes_at_end(s):
        if _THOUSANDS_RE.match(s[1:-1]):  # "(1,000)" may be a number written with a separator
            return s
        items = _split_top(s[1:-1])
        if len(items) >= 2 and all(items):
            return Seq(s[0], s[-1], tuple(parse_answer(x) for x in items))
    items = _split_top(s)
    if len(items) >= 2 and all(items):
        return Seq("", "", tuple(parse_answer(x) for x in items))
    member = _MEMBER_RE.match(s)
    if member and is_simple_lhs(member.group(1)):  # "x \in (0, 1]": the set is the answer
        return parse_answer(member.group(2))
    rel = _REL_SPLIT_RE.split(s)
    if len(rel) >= 3:
        sides, ops = tuple(rel[0::2]), tuple(rel[1::2])
        if all(sides):
            return Relation(sides, ops)
    return s


# -------------------------------------------------------------------------------- comparison
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


def is_simple_lhs(s: str) -> bool:
    """Whether a normalised left-hand side names one variable (``x``, ``a_1``, ``f(x)``, ``\\mathbf{v}``)."""
    return _SIMPLE_LHS_RE.match(s) is not None


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
        # right-hand side ("(a,b) = (-2,1)", "p(8) = ... = \\frac{3}{56}", "2x = 10" vs "10").
        return compare_structures(a, parse_answer(b.parts[-1]))
    if isinstance(a, str) and isinstance(b, str):
        return _scalar_eq(a, b)
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


__all__ = [
    "Matrix",
    "Relation",
    "Seq",
    "Union",
    "compare_structures",
    "const_value",
    "is_simple_lhs",
    "normalize",
    "numbers_equal",
    "parse_answer",
    "to_complex",
    "to_number",
]
