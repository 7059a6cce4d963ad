"""The math verifier: answer extraction, normalisation, an exact fast path, math-verify for LaTeX.

Scoring a response against a ground truth goes in three steps:

1. **Extraction** (:func:`extract_answer`): the text after the last ``</think>`` is searched for, in
   order of strength, the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces) or GSM8K's ``#### N``
   (whichever comes last), then the last answer phrase (``Final answer: ...``, ``The answer is ...``,
   an ``Answer: ...`` line, GSM8K's ``A: 26``). In ``flexible`` mode a response without any of these
   falls back to its last number (or to math-verify's own anchor-free extraction); ``strict`` mode
   calls it unparseable, and an unfinished ``<think>`` block is unparseable too.
2. **Fast path** (:func:`fast_verdict`): after normalisation (``$``, units in ``\\text{}``, ``%``,
   thousands separators, ``\\dfrac``, ``\\left``/``\\right``, trailing ``.0`` ...) two identical strings
   are equal, and two plain numbers, fractions or small arithmetic expressions are compared exactly as
   :class:`fractions.Fraction` (decimals to 1e-6 relative, as math-verify's ``float_rounding=6``).
   This decides GSM8K-style answers and most MATH answers without sympy.
3. **Slow path**: everything else goes to the ``math-verify`` library (``parse`` + ``verify``), which
   can hang on adversarial input; the :class:`~stepcredit.reward.run.rewarder.Rewarder` therefore runs it
   in the kill-safe pool. We never parse LaTeX into sympy ourselves.

The functions registered here follow VeRL's signature
``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
import threading
from fractions import Fraction
from typing import Any

from stepcredit.reward.base import register_reward
from stepcredit.types import RewardResult, Status

MODES = ("strict", "flexible")

# ---------------------------------------------------------------------------------- extraction
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_HASH_RE = re.compile(r"####\s*([^\n]*)")
# Answer phrases, weakest after the boxed / #### markers. Each captures the rest of its line.
_PHRASE_RES = (
    re.compile(r"(?i)\bfinal\s+answer\s*(?:is|:|：)?\s*[:：]?\s*([^\n]*)"),
    re.compile(r"(?i)\b(?:the\s+)?(?:correct\s+)?answer\s+is\s*[:：]?\s*([^\n]*)"),
    re.compile(r"(?im)^[\s*#>_-]*answer\s*[*_]*\s*[:：]\s*[*_]*\s*([^\n]*)"),
    re.compile(r"(?m)^\s*A\s*[:：]\s*([^\n]*)"),
)
_NUMBER_TOKEN = r"[-+−]?\$?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?"
_LEADING_NUMBER_RE = re.compile(rf"^({_NUMBER_TOKEN})(?![\d.]*\s*[+\-*/^=(])")
_ALL_NUMBERS_RE = re.compile(r"[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def strip_think(text: str, *, strict: bool) -> str | None:
    """The part of ``text`` after the last ``</think>``; None for an unfinished ``<think>`` in strict mode."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if strict and "<think>" in text:
        return None
    return text


def _balanced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at ``text[start] == '{'`` and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "\\":  # an escaped brace \{ does not count
            continue
        if c == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif c == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def last_boxed(text: str) -> tuple[int, str] | None:
    """Position and content of the last complete ``\\boxed{...}`` (or ``\\fbox``, or ``\\boxed 5``)."""
    matches = list(_BOXED_RE.finditer(text))
    for m in reversed(matches):
        end = m.end()
        if end < len(text) and text[end] == "{":
            got = _balanced(text, end)
            if got is not None:
                return m.start(), got[0]
        elif m.group(0).endswith(" ") or m.group(0).endswith("\n"):  # "\boxed 5"
            rest = re.match(r"[^\s$]+", text[end:])
            if rest:
                return m.start(), rest.group(0)
    return None


def _clean_phrase(s: str) -> str | None:
    """The answer inside the tail of an answer phrase ("18 dollars.", "$\\frac12$.", "**26**")."""
    s = s.strip().strip("*_").strip()
    if not s:
        return None
    dollars = [i for i, c in enumerate(s) if c == "$" and (i == 0 or s[i - 1] != "\\")]
    if len(dollars) >= 2:
        inner = s[dollars[0] + 1 : dollars[1]].strip()
        # "$\frac12$" is LaTeX; "$18 a day, or $126" is money around English words.
        if inner and not re.search(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}", inner):
            return inner
    s = s.rstrip(" .;!")
    m = _LEADING_NUMBER_RE.match(s)
    if m:
        return m.group(1).strip()
    if len(s) <= 60:
        return s
    return None


def extract_answer(text: str, *, mode: str = "flexible") -> tuple[str | None, str]:
    """The final answer of a response and how it was found (``boxed``, ``####``, ``phrase``, ``last_number``,
    ``none``). ``None`` when nothing answer-like was found (the response is unparseable)."""
    strict = mode == "strict"
    body = strip_think(text, strict=strict)
    if body is None:
        return None, "unfinished_think"
    boxed = last_boxed(body)
    hashes = list(_HASH_RE.finditer(body))
    hash_hit = (hashes[-1].start(), hashes[-1].group(1)) if hashes else None
    strong = [h for h in (boxed, hash_hit) if h is not None]
    if strong:
        pos, content = max(strong, key=lambda h: h[0])
        how = "boxed" if boxed is not None and pos == boxed[0] else "####"
        cleaned = content.strip()
        if how == "####":
            cleaned = _clean_phrase(cleaned) or cleaned
        if cleaned:
            return cleaned, how
    best: tuple[int, str] | None = None
    for rx in _PHRASE_RES:
        for m in rx.finditer(body):
            cand = _clean_phrase(m.group(1))
            if cand and (best is None or m.start() > best[0]):
                best = (m.start(), cand)
    if best is not None:
        return best[1], "phrase"
    if strict:
        return None, "none"
    nums = _ALL_NUMBERS_RE.findall(body)
    if nums:
        return nums[-1], "last_number"
    return None, "none"


def extract_gold(ground_truth: Any) -> str:
    """The ground truth as a string; a full GSM8K solution or a boxed solution is reduced to its answer."""
    s = str(ground_truth).strip()
    if "####" in s:
        s = s.rsplit("####", 1)[1].strip()
    elif "\\boxed" in s or "\\fbox" in s:
        b = last_boxed(s)
        if b is not None:
            s = b[1].strip()
    return s


# ------------------------------------------------------------------------------- normalisation
_UNIT_TEXT_RE = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{\s*[a-zA-Z][a-zA-Z\s.]*\}")
_SPACES_RE = re.compile(r"\\[,;:! ]|~|\\quad|\\qquad|\\displaystyle")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_THOUSANDS_RE = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_ASSIGN_RE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?=[^=])")


@functools.lru_cache(maxsize=65536)
def normalize(s: str) -> str:
    """A canonical spelling of an answer string; equal outputs mean equal answers (never the reverse)."""
    s = s.strip()
    for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        while len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : len(s) - len(right)].strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = _SPACES_RE.sub(" ", s)
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = s.replace("−", "-")
    whole_text = re.fullmatch(r"\\(?:text|textbf|mathrm)\s*\{([^{}]*)\}", s.strip())
    if whole_text:  # "\text{Evelyn}", "\text{(C)}": the answer itself, not a unit
        s = whole_text.group(1)
    else:
        s = _UNIT_TEXT_RE.sub("", s)
    s = s.strip().rstrip(".").strip()
    s = _ASSIGN_RE.sub("", s)
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    s = re.sub(r"\s+", "", s)
    choice = re.fullmatch(r"\(([A-Za-z])\)", s)  # "(C)" -> "C"
    if choice:
        s = choice.group(1)
    if re.fullmatch(r"[-+]?\d+\.0+", s):
        s = s.split(".")[0]
    return s


# ------------------------------------------------------------------------------------- numbers
_FRAC_RE = re.compile(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}|\\frac\s*(\d)\s*(\d)")
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
        t2 = _FRAC_RE.sub(lambda m: f"(({m.group(1) or m.group(3)})/({m.group(2) or m.group(4)}))", t)
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
    if re.search(r"\d\(|\)\d|\)\(", t):  # implicit multiplication "2(3)" is math-verify's business
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


# A constant written with numbers, fractions, roots, pi and i only: a single number, never a list.
_SCALAR_RE = re.compile(r"^(?:[0-9+\-*/().{}^]|\\frac|\\sqrt|\\pi|\\cdot|\\times|i)+$")
_ROW_BREAK_RE = re.compile(r"\\+(?![a-zA-Z{}])")
_THOUSANDS_LIST_RE = re.compile(r"^[(\[]-?\d{1,3}(?:,\d{3})+[)\]]$")


def list_size(s: str) -> int:
    """How many elements a normalised answer lists when it is a bracketed tuple, interval or set with
    top-level commas ("(1,2)", "[0,3)", "\\{1,2,3\\}"), a union of intervals or a vector/matrix (entries
    counted); 1 for anything else."""
    if "\\cup" in s:
        return 2
    if s.startswith("\\begin{") and "matrix}" in s[:16]:
        # row breaks (normalisation may have left "\\\\" as a single backslash) and column breaks
        return 1 + len(_ROW_BREAK_RE.findall(s)) + s.count("&")
    if _THOUSANDS_LIST_RE.match(s):  # "(1,000)" may be a number written with a separator
        return 1
    if s.startswith("\\{") and s.endswith("\\}"):
        inner = s[2:-2]
    elif s[:1] in "([" and s[-1:] in ")]":
        inner = s[1:-1]
    else:
        return 1
    depth, commas = 0, 0
    i = 0
    while i < len(inner):
        c = inner[i]
        if inner.startswith("\\{", i) or inner.startswith("\\}", i):
            depth += 1 if inner[i + 1] == "{" else -1
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:  # "(a+5)(b+2)": the first bracket closes before the end
                return 1
        elif c == "," and depth == 0:
            commas += 1
        i += 1
    return commas + 1 if depth == 0 else 1


def _is_scalar(s: str) -> bool:
    return bool(_SCALAR_RE.match(s)) and bool(re.search(r"\d|\\pi", s))


def fast_verdict(gold: str, pred: str) -> bool | None:
    """True/False when the answers can be compared without sympy, else None (use math-verify).

    Decided here: equal normalised strings; two exact numbers (rationals, small arithmetic, Gaussian
    rationals with ``i``); and a list of two or more elements (tuple, interval, set, union, vector)
    against a constant (never equal under math-verify, whose comparison needs matching structure).
    """
    g, p = normalize(gold), normalize(pred)
    if not g or not p:
        return None
    if g == p:
        return True
    gv, pv = to_number(g), to_number(p)
    if gv is not None and pv is not None:
        return numbers_equal(gv, pv)
    gc = to_complex(g) if gv is None else (gv[0], Fraction(0))
    pc = to_complex(p) if pv is None else (pv[0], Fraction(0))
    if gc is not None and pc is not None and not (gv and gv[1]) and not (pv and pv[1]):
        return gc == pc
    for a, b in ((g, p), (p, g)):
        if _is_scalar(a) and list_size(b) >= 2:
            return False
    return None


# ---------------------------------------------------------------------------------- math-verify
_USE_MV_TIMEOUTS = True
"""math-verify's own SIGALRM timeouts; the pool worker switches them off (its parent kills it instead)."""


def disable_math_verify_timeouts() -> None:
    """Called in pool workers, where a hung verification is stopped by killing the worker."""
    global _USE_MV_TIMEOUTS
    _USE_MV_TIMEOUTS = False
    try:  # silence its one-off "timeout is disabled" warning: the pool is the timeout
        import math_verify.grader
        import math_verify.parser

        math_verify.parser.TIMEOUT_WARNING_SHOWN = True  # type: ignore[attr-defined]
        math_verify.grader.TIMEOUT_WARNING_SHOWN = True  # type: ignore[attr-defined]
    except ImportError:
        pass


def _mv_timeouts() -> bool:
    # SIGALRM only works on the main thread; elsewhere math-verify raises unless they are off.
    return _USE_MV_TIMEOUTS and threading.current_thread() is threading.main_thread()


def _mv_parse(s: str) -> list[Any]:
    from math_verify import parse

    t = 5 if _mv_timeouts() else None
    return list(parse(s, parsing_timeout=t))  # type: ignore[arg-type]


@functools.lru_cache(maxsize=4096)
def _mv_parse_answer(s: str) -> tuple[Any, ...]:
    """math-verify's reading of a bare answer string (gold, or our extracted candidate)."""
    if not s:
        return ()
    got = _mv_parse(f"${s}$")
    if not got:
        got = _mv_parse(s)
    return tuple(got)


_PROBE_POINTS = (
    (Fraction(7, 5), Fraction(13, 11), Fraction(3, 7)),
    (Fraction(17, 3), Fraction(5, 13), Fraction(11, 2)),
)
"""Two fixed points at which expressions in up to three variables are compared."""


def _clearly_different(g: list[Any], p: list[Any], gold: str, pred: str) -> bool:
    """True when math-verify's first readings of gold and prediction are plain expressions whose values
    differ by more than 1e-4 relative (at two fixed points for their common variables).

    Why: for a wrong answer math-verify's ``verify`` runs ``sympy.simplify`` on each reading pair,
    most of the cost of a MATH verification. Expressions that differ in value are not equal under any
    of its comparisons, so this only skips work; it never turns an equal pair into a wrong one. Sets,
    tuples, intervals, relations, matrices and percentages are left to ``verify``.
    """
    if "%" in gold or "%" in pred:
        return False
    import sympy
    from sympy.matrices.expressions import MatrixExpr

    a = next((x for x in g if not isinstance(x, str)), None)
    b = next((x for x in p if not isinstance(x, str)), None)
    exprs = (a, b)
    if not all(isinstance(x, sympy.Expr) and not isinstance(x, MatrixExpr) for x in exprs):
        return False
    assert isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr)
    # Both sides are evaluated at the same points for the union of their variables: if they differ
    # there, a - b is not identically 0 ("x^3+3x-6" vs "1"). Names equal up to case ("C" vs "c") are
    # left to verify, whose string comparisons may treat them alike.
    syms = a.free_symbols | b.free_symbols
    names = [str(x) for x in syms]
    if len(syms) > 3 or len({n.lower() for n in names}) != len(names):
        return False
    ordered = sorted(syms, key=str)
    points = _PROBE_POINTS if ordered else ((),)
    for point in points:
        subs = {s: sympy.Rational(v.numerator, v.denominator) for s, v in zip(ordered, point, strict=False)}
        try:
            va = complex(a.subs(subs).evalf(30))
            vb = complex(b.subs(subs).evalf(30))
        except (TypeError, ValueError, ArithmeticError, AttributeError):
            return False
        if not all(math.isfinite(v.real) and math.isfinite(v.imag) for v in (va, vb)):
            return False
        if abs(va - vb) <= 1e-4 * max(1.0, abs(vb)):
            return False
    return True


def math_verify_equal(gold: str, pred: str | None, text: str) -> tuple[bool | None, str | None]:
    """math-verify's verdict of ``pred`` (or, when None, of its own extraction from ``text``) against
    ``gold``; None when it could not read the response."""
    from math_verify import verify

    # When one side is a plain number, parse only the other one first: a clear numeric mismatch
    # then costs one LaTeX parse instead of two plus sympy's simplify.
    if pred is not None:
        for num_side, other in ((gold, pred), (pred, gold)):
            num = to_number(normalize(num_side))
            if num is not None:
                import sympy

                known = [sympy.Rational(num[0].numerator, num[0].denominator)]
                parsed = list(_mv_parse_answer(other))
                if parsed and _clearly_different(known, parsed, gold, pred):
                    return False, pred
                break
    g = list(_mv_parse_answer(gold))
    if not g:
        return None, pred
    p = list(_mv_parse_answer(pred)) if pred else []
    if not p and pred is None:
        p = _mv_parse(text)
    if not p:
        return None, pred
    extracted = pred if pred is not None else str(p[-1])
    if _clearly_different(g, p, gold, pred or ""):
        return False, extracted
    t = 5 if _mv_timeouts() else None
    return bool(verify(g, p, timeout_seconds=t)), extracted  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ the verifier
def _result(ok: bool, extracted: str | None, how: str, *, format_score: float, path: str) -> RewardResult:
    return RewardResult(
        score=1.0 if ok else float(format_score),
        status=Status.OK,
        extracted=extracted,
        info={"how": how, "path": path},
    )


def _unparseable(how: str) -> RewardResult:
    return RewardResult(score=0.0, status=Status.UNPARSEABLE, extracted=None, info={"how": how})


def _golds(ground_truth: Any) -> list[str]:
    if isinstance(ground_truth, (list, tuple)):
        return [extract_gold(g) for g in ground_truth]
    return [extract_gold(ground_truth)]


def math_fast(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    mode: str = "flexible",
    format_score: float = 0.0,
    **kwargs: Any,
) -> RewardResult | None:
    """The verdict when it needs no sympy (run inline), else None (run :func:`math_compute_score`)."""
    if mode not in MODES:
        raise ValueError(f"math verifier mode must be one of {MODES}, got {mode!r}")
    golds = [g for g in _golds(ground_truth) if g]
    if not golds:
        return RewardResult.failure(Status.ERROR, f"empty ground truth {ground_truth!r}")
    pred, how = extract_answer(solution_str, mode=mode)
    if pred is None:
        if how == "none" and mode == "flexible" and ("\\" in solution_str or "$" in solution_str):
            return None  # LaTeX without a marker: math-verify's anchor-free extraction may read it
        return _unparseable(how)
    verdicts = [fast_verdict(g, pred) for g in golds]
    if any(v is True for v in verdicts):
        return _result(True, pred, how, format_score=format_score, path="fast")
    if all(v is False for v in verdicts):
        return _result(False, pred, how, format_score=format_score, path="fast")
    return None


def math_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    mode: str = "flexible",
    format_score: float = 0.0,
    **kwargs: Any,
) -> RewardResult:
    """The full math verifier: the fast path, then math-verify for what it could not decide.

    ``mode``: ``strict`` needs an explicit answer marker, ``flexible`` falls back to the last number.
    ``format_score``: the score of a well-formed but wrong answer (VeRL's ``format_score``).
    """
    fast = math_fast(
        data_source, solution_str, ground_truth, extra_info, mode=mode, format_score=format_score
    )
    if fast is not None:
        return fast
    pred, how = extract_answer(solution_str, mode=mode)
    body = strip_think(solution_str, strict=mode == "strict") or ""
    extracted: str | None = pred
    for gold in _golds(ground_truth):
        if not gold:
            continue
        verdict, got = math_verify_equal(gold, pred, body)
        if verdict is None and pred is not None and how != "boxed":
            # Our candidate was not readable as math (e.g. a sentence after "Answer:"): let
            # math-verify search the whole response, as it would on its own.
            verdict, got = math_verify_equal(gold, None, body)
        extracted = got if got is not None else extracted
        if verdict:
            return _result(True, got, how, format_score=format_score, path="math_verify")
        if verdict is None and extracted is None:
            continue
    if extracted is None:
        return _unparseable(how)
    return _result(False, extracted, how, format_score=format_score, path="math_verify")


register_reward(
    "math",
    "openai/gsm8k",
    "gsm8k",
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math500",
    "MATH",
    "math_dapo",
    "aime*",
    "arith",
    fast=math_fast,
)(math_compute_score)
