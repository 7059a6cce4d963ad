"""Exact numbers (:class:`fractions.Fraction`), Gaussian rationals and closed-form constants read from
normalised LaTeX, without sympy."""

from __future__ import annotations

import ast
import cmath
import functools
import math
import operator
import re
from fractions import Fraction
from typing import Any

_FRAC_RE = re.compile(r"\\frac\{([^{}]*)\}\{([^{}]*)\}")
_ARITH_OK_RE = re.compile(r"^[0-9+\-*/().]+$")
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _eval(node: ast.AST) -> tuple[Fraction, bool]:
    """Exact value of a small arithmetic AST and whether a decimal literal took part."""
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        if isinstance(node.value, float):
            return Fraction(repr(node.value)), True
        return Fraction(node.value), False
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v, d = _eval(node.operand)
        return (-v if isinstance(node.op, ast.USub) else v), d
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, da = _eval(node.left)
        b, db = _eval(node.right)
        return _OPS[type(node.op)](a, b), da or db
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        a, da = _eval(node.left)
        b, db = _eval(node.right)
        # Bounded so that "9^9^9" cannot hang the fast path.
        if b.denominator != 1 or abs(b) > 64 or abs(a.numerator) > 10**6:
            raise ValueError("exponent too large")
        return a ** int(b), da or db
    raise ValueError("not arithmetic")


def _as_python_arith(s: str) -> str:
    """A normalised answer's simple LaTeX arithmetic in Python syntax (\\frac, \\cdot, \\times, \\div,
    braces, ^); whatever else it contains is left for the caller's character check to reject."""
    t = s
    for _ in range(3):
        t2 = _FRAC_RE.sub(lambda m: f"(({m.group(1)})/({m.group(2)}))", t)
        if t2 == t:
            break
        t = t2
    t = t.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("{", "(")
    return t.replace("}", ")").replace("^", "**")


@functools.lru_cache(maxsize=65536)
def to_number(s: str) -> tuple[Fraction, bool] | None:
    """The exact value of a normalised answer that is a number, fraction or small arithmetic expression,
    and whether it was written with a decimal point; None for anything else (left to math-verify)."""
    if not s or len(s) > 80:
        return None
    t = _as_python_arith(s)
    if not _ARITH_OK_RE.match(t) or not re.search(r"\d", t) or "//" in t or "***" in t:
        return None
    if re.search(r"\d\(|\)\d|\)\(", t):  # implicit multiplication "2(3)": left to the float reader
        return None
    try:
        return _eval(ast.parse(t, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def _places(x: Fraction) -> int:
    """The fewest decimal places that write ``x`` (a decimal's value: its denominator is 2^a 5^b)."""
    d, places = x.denominator, 0
    while d % 10 == 0:
        d //= 10
        places += 1
    while d % 2 == 0 or d % 5 == 0:
        d //= 2 if d % 2 == 0 else 5
        places += 1
    return places


def numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Exact equality; with a decimal on either side, equality to 1e-6 relative (math-verify rounds to 6)
    **and** within half a unit of the coarser decimal's last place: "0.333333" rounds 1/3, but "123456.1"
    does not round 123456 (1e-6 of it is 0.12; math-verify says no too)."""
    (x, dx), (y, dy) = a, b
    if x == y:
        return True
    if dx or dy:
        places = min(_places(v) for v, d in (a, b) if d)
        return abs(x - y) <= Fraction(1, 10**6) * max(Fraction(1), abs(y)) and abs(x - y) <= Fraction(
            1, 2 * 10**places
        )
    return False


_COMPLEX_OK_RE = re.compile(r"^[0-9+\-*/().i]+$")


def _eval_gauss(node: ast.AST) -> tuple[Fraction, Fraction]:
    """Exact value (real, imaginary) of a small arithmetic AST over the rationals and ``i``."""
    if isinstance(node, ast.Expression):
        return _eval_gauss(node.body)
    if isinstance(node, ast.Name) and node.id == "i":
        return Fraction(0), Fraction(1)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return Fraction(node.value), Fraction(0)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        a, b = _eval_gauss(node.operand)
        return (-a, -b) if isinstance(node.op, ast.USub) else (a, b)
    if isinstance(node, ast.BinOp):
        (a, b), (c, d) = _eval_gauss(node.left), _eval_gauss(node.right)
        if isinstance(node.op, ast.Add):
            return a + c, b + d
        if isinstance(node.op, ast.Sub):
            return a - c, b - d
        if isinstance(node.op, ast.Mult):
            return a * c - b * d, a * d + b * c
        if isinstance(node.op, ast.Div):
            n = c * c + d * d
            return (a * c + b * d) / n, (b * c - a * d) / n
        if isinstance(node.op, ast.Pow) and d == 0 and c.denominator == 1 and 0 <= c <= 64:
            re_, im = Fraction(1), Fraction(0)
            for _ in range(int(c)):
                re_, im = re_ * a - im * b, re_ * b + im * a
            return re_, im
    raise ValueError("not a Gaussian-rational expression")


@functools.lru_cache(maxsize=65536)
def to_complex(s: str) -> tuple[Fraction, Fraction] | None:
    """The exact value of a normalised answer with integer parts and the imaginary unit ``i``
    ("6-5i", "\\frac{1}{2}+3i", "(1+2i)^2"), or None. Decimals are left to :func:`to_number`/math-verify."""
    if "i" not in s or len(s) > 80 or "." in s:
        return None
    t = _as_python_arith(s)
    if not _COMPLEX_OK_RE.match(t) or re.search(r"ii|i[\d(]|\)\d|\)\(|\d\(|//|\*\*\*", t):
        return None
    t = re.sub(r"(?<=[\d)])i", "*i", t)  # "5i" -> "5*i"
    try:
        return _eval_gauss(ast.parse(t, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


# ------------------------------------------------------------------ constants as floating point
_CONST_TOKEN_RE = re.compile(r"\d+(?:\.\d+)?|\\frac|\\sqrt|\\pi|\\cdot|\\times|\\div|[-+*/^(){}\[\]]")


class _ConstReader:
    """A recursive-descent reader of a constant LaTeX expression (numbers, ``\\frac``, ``\\sqrt``,
    ``\\sqrt[n]``, ``\\pi``, ``+ - * / ^``, implicit products such as ``2\\sqrt{3}``) into a float.

    Used to decide, without sympy, that two closed forms are equal (``\\sqrt{12}`` vs ``2\\sqrt{3}``)
    or clearly different. Anything else (a variable, a function) raises ValueError."""

    TOKEN_RE = _CONST_TOKEN_RE
    """The tokens this reader knows; a subclass that reads more (variables) widens it."""

    def __init__(self, s: str) -> None:
        toks: list[str] = []
        pos = 0
        for m in self.TOKEN_RE.finditer(s):
            if m.start() != pos:
                raise ValueError("not a constant")
            toks.append(m.group(0))
            pos = m.end()
        if pos != len(s) or not toks:
            raise ValueError("not a constant")
        self.toks, self.i, self.decimal = toks, 0, False
        self.scale = 0.0
        """The largest magnitude of any value met while reading: float error is relative to it."""

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, tok: str | None = None) -> str:
        t = self.peek()
        if t is None or (tok is not None and t != tok):
            raise ValueError("unexpected end")
        self.i += 1
        return t

    def read(self) -> complex:
        v = self.sum()
        if self.peek() is not None:
            raise ValueError("trailing tokens")
        return v

    def sum(self) -> complex:
        v = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            w = self.product()
            v = v + w if op == "+" else v - w
        return self.seen(v)

    def product(self) -> complex:
        v = self.unary()
        while True:
            t = self.peek()
            if t in ("*", "/", "\\cdot", "\\times", "\\div"):
                self.take()
                w = self.unary()
                v = v / w if t in ("/", "\\div") else v * w
            elif t is not None and self.starts_atom(t):
                v = v * self.power()  # implicit product: 2\sqrt{3}, 3\pi, \frac{1}{2}(5)
            else:
                return self.seen(v)

    def starts_atom(self, t: str) -> bool:
        """Whether the token ``t`` opens a factor of an implicit product."""
        return t[0].isdigit() or t in ("(", "{", "\\frac", "\\sqrt", "\\pi")

    def seen(self, v: complex) -> complex:
        self.scale = max(self.scale, abs(v))
        return v

    def unary(self) -> complex:
        if self.peek() in ("-", "+"):
            sign = -1 if self.take() == "-" else 1
            return sign * self.unary()
        return self.power()

    def power(self) -> complex:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            exp = self.unary() if self.peek() not in ("{", "(") else self.atom()
            if abs(exp) > 64 or abs(base) > 1e6:
                raise ValueError("power too large")
            return self.seen(complex(base**exp))
        return self.seen(base)

    def group(self) -> complex:
        t = self.take()
        close = {"{": "}", "(": ")", "[": "]"}.get(t)
        if close is None:
            raise ValueError("expected a group")
        v = self.sum()
        self.take(close)
        return v

    def atom(self) -> complex:
        t = self.peek()
        if t is None:
            raise ValueError("unexpected end")
        if t[0].isdigit():
            self.take()
            self.decimal = self.decimal or "." in t
            return complex(float(t))
        if t == "\\pi":
            self.take()
            return complex(math.pi)
        if t == "\\frac":
            self.take()
            num = self.group()
            return num / self.group()
        if t == "\\sqrt":
            self.take()
            index: complex = 2
            if self.peek() == "[":
                index = self.group()
            radicand = self.group()
            if radicand.real < 0 and radicand.imag == 0 and index == 2:
                return cmath.sqrt(radicand)
            return complex(radicand ** (1 / index))
        if t in ("(", "{"):
            return self.group()
        return self.other_atom(t)

    def other_atom(self, t: str) -> complex:
        """An atom only a subclass knows (a variable, a function); here none."""
        raise ValueError(f"unexpected {t}")


@functools.lru_cache(maxsize=65536)
def const_value(s: str) -> tuple[complex, bool] | None:
    """The floating-point value of a normalised constant expression and whether a decimal literal took
    part; None when it is not a constant we read (variables, functions, too long)."""
    if not s or len(s) > 120 or not re.search(r"\d|\\pi", s):
        return None
    try:
        reader = _ConstReader(s)
        v = reader.read()
    except (ValueError, ZeroDivisionError, OverflowError, RecursionError, TypeError):
        return None
    if not (math.isfinite(v.real) and math.isfinite(v.imag)):
        return None
    return v, reader.decimal
