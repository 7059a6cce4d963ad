"""Expressions with variables read as floats at fixed points: enough to prove that an expression is not
a constant (``x^2 + 1``, ``3R^2``, ``\\cot x``), so that it surely differs from a number, without sympy."""

from __future__ import annotations

import cmath
import functools
import math
import re

from stepcredit.reward.verifiers.latex.values import _ConstReader

# The constant reader's tokens, then functions of one argument and variables: one letter with an optional
# subscript ("x", "R", "a_1", "z_{2002}"). "\cosh" is no "\cos" followed by "h".
_VAR_TOKEN_RE = re.compile(
    r"\d+(?:\.\d+)?|\\frac|\\sqrt|\\pi|\\cdot|\\times|\\div|[-+*/^(){}\[\]]"
    r"|\\(?:sin|cos|tan|cot|sec|csc)(?!h)|\\ln"
    r"|[a-zA-Z](?:_(?:\{[a-zA-Z0-9]+\}|[a-zA-Z0-9]))?"
)
_FUNCTIONS = {
    "\\sin": cmath.sin,
    "\\cos": cmath.cos,
    "\\tan": cmath.tan,
    "\\cot": lambda z: 1 / cmath.tan(z),
    "\\sec": lambda z: 1 / cmath.cos(z),
    "\\csc": lambda z: 1 / cmath.sin(z),
    "\\ln": cmath.log,
}
# Letters that are constants to math-verify's parser (e, i) or may be (E, I), never variables here.
_NOT_VARIABLES = frozenset("eEiI")
# Two-letter words a reader takes for words, not products of two variables.
_WORDS = frozenset({"or", "ln", "lg", "tg", "no", "to", "of", "on", "at", "by", "as", "so", "up", "do", "pm"})
# Points at which the variables are read: irrational-looking values away from the usual poles (0, 1,
# multiples of pi/2), different per variable (by its order of appearance) and per point.
_POINTS = (
    (0.5772156649, 1.3247179572, 0.7390851332, 1.6180339887, 0.4142135623, 1.2020569031),
    (1.1557273497, 0.6931471805, 1.4626517459, 0.8346268416, 1.2599210498, 0.5671432904),
)


class _VarReader(_ConstReader):
    """:class:`_ConstReader` with variables (each bound to a value) and a few functions of one argument.

    A function's argument is one atom without a power (``\\sin x``, ``\\cot(2x)``); ``\\sin x^2`` and
    ``\\sin xy``, which readers take differently, are refused (ValueError)."""

    TOKEN_RE = _VAR_TOKEN_RE

    def __init__(self, s: str, values: dict[str, float]) -> None:
        super().__init__(s)
        self.values = values

    def starts_atom(self, t: str) -> bool:
        return super().starts_atom(t) or t[0].isalpha() or t in _FUNCTIONS

    def other_atom(self, t: str) -> complex:
        self.take()
        if t in _FUNCTIONS:
            if self.peek() == "^":
                raise ValueError("a power of a function")
            arg = self.atom()
            nxt = self.peek()
            if nxt is not None and (nxt == "^" or self.starts_atom(nxt)):
                raise ValueError("a function's argument that readers split differently")
            return self.seen(complex(_FUNCTIONS[t](arg)))
        if t[0] in _NOT_VARIABLES:
            raise ValueError("a constant letter")
        return self.seen(complex(self.values[t]))


def _variables(s: str) -> list[str] | None:
    """The variables of ``s`` in order of appearance; None when a run of letters reads as a word."""
    bare = re.sub(r"\\[a-zA-Z]+", " ", s)
    bare = re.sub(r"_(?:\{[a-zA-Z0-9]+\}|[a-zA-Z0-9])", " ", bare)
    for run in re.findall(r"[a-zA-Z]{2,}", bare):
        if len(run) > 2 or run.lower() in _WORDS:
            return None
    names: list[str] = []
    for m in _VAR_TOKEN_RE.finditer(s):
        t = m.group(0)
        if t[0].isalpha() and t not in names:
            names.append(t)
    return names


@functools.lru_cache(maxsize=65536)
def nonconstant(s: str) -> bool:
    """Whether the normalised expression ``s`` surely is not a constant: it has variables, and its values at
    two points differ by more than float error could make (1e-6 of the largest magnitude met while
    reading). False when unsure (a word, an unknown command, a pole, a relation)."""
    if not s or len(s) > 200:
        return False
    names = _variables(s)
    if not names or len(names) > len(_POINTS[0]):
        return False
    got: list[tuple[complex, float]] = []
    for point in _POINTS:
        try:
            reader = _VarReader(s, dict(zip(names, point, strict=False)))
            v = reader.read()
        except (ValueError, ZeroDivisionError, OverflowError, RecursionError, TypeError, KeyError):
            return False
        if not (math.isfinite(v.real) and math.isfinite(v.imag)):
            return False
        got.append((v, reader.scale))
    (v1, s1), (v2, s2) = got
    return abs(v1 - v2) > 1e-6 * max(1.0, s1, s2)
