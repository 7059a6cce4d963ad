"""LaTeX answer normalisation and the exact comparisons of the math verifier's fast path.

Everything here is plain string and :class:`fractions.Fraction` work, no sympy: :func:`normalize`
rewrites an answer into one canonical spelling, :func:`parse_answer` reads that spelling as a
structure (number, bracketed sequence, set, matrix, relation, list of answers), and
:func:`compare` decides ``True``/``False`` where the structures make that certain, else ``None``
(the caller then asks math-verify). The rules follow math-verify 0.9.0's comparisons
(``math_verify/grader.py``: assignments compare by right-hand side, sets ignore order, tuples and
intervals do not, open and closed ends must match, floats compare rounded to 6 decimals); where we
deliberately differ, ``docs/verifiers.md`` says so and why.
"""

from __future__ import annotations

import ast
import cmath
import functools
import math
import operator
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

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


# ------------------------------------------------------------------------------------- numbers
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


def numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Exact equality; with a decimal on either side, equality to 1e-6 relative (math-verify rounds to 6)."""
    (x, dx), (y, dy) = a, b
    if x == y:
        return True
    if dx or dy:
        return abs(x - y) <= Fraction(1, 10**6) * max(Fraction(1), abs(y))
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

    def __init__(self, s: str) -> None:
        toks: list[str] = []
        pos = 0
        for m in _CONST_TOKEN_RE.finditer(s):
            if m.start() != pos:
                raise ValueError("not a constant")
            toks.append(m.group(0))
            pos = m.end()
        if pos != len(s) or not toks:
            raise ValueError("not a constant")
        self.toks, self.i, self.decimal = toks, 0, False

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
        return v

    def product(self) -> complex:
        v = self.unary()
        while True:
            t = self.peek()
            if t in ("*", "/", "\\cdot", "\\times", "\\div"):
                self.take()
                w = self.unary()
                v = v / w if t in ("/", "\\div") else v * w
            elif t is not None and (t[0].isdigit() or t in ("(", "{", "\\frac", "\\sqrt", "\\pi")):
                v = v * self.power()  # implicit product: 2\sqrt{3}, 3\pi, \frac{1}{2}(5)
            else:
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
            return complex(base**exp)
        return base

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
