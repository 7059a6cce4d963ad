"""Normalised answers read as structures: numbers, bracketed sequences, sets, unions, matrices, relations."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from stepcredit.reward.verifiers.latex.normal import _THOUSANDS_RE, _group_end


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


def is_simple_lhs(s: str) -> bool:
    """Whether a normalised left-hand side names one variable (``x``, ``a_1``, ``f(x)``, ``\\mathbf{v}``)."""
    return _SIMPLE_LHS_RE.match(s) is not None


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
