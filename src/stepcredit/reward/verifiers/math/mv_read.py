"""math-verify's readings of answers: its parser called with its own timeouts, and, where the result is
certain, the same reading built without it (a plain number or constant in a response, a gold's fitted
spelling)."""

from __future__ import annotations

import functools
import re
import threading
from fractions import Fraction
from typing import Any

from stepcredit.reward.verifiers.latex import normalize, to_number
from stepcredit.reward.verifiers.latex.normal import _DECIMAL_COMMA_RE
from stepcredit.reward.verifiers.math.extract import extract_gold
from stepcredit.reward.verifiers.math.fast import _exact_const
from stepcredit.reward.verifiers.math.mv_sets import _set_reading

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
def _mv_parse_cached(s: str) -> tuple[Any, ...]:
    """math-verify's default reading of ``s`` (``LatexExtractionConfig`` + ``ExprExtractionConfig``),
    cached: a gold is read once per group of responses."""
    return tuple(_mv_parse(s)) if s.strip() else ()


_DELIMITED_RE = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox|####")


def _fitted(s: str) -> str | None:
    r"""The spelling math-verify reads best for an answer written without math delimiters: a plain
    number as its normalised digits ("1,200" is 1200, not the set {1, 200}), other LaTeX inside
    ``$...$`` (its documented use for gold answers: bare, ``2\sqrt{3}`` reads as 2); None when ``s``
    has delimiters or anchors already (then its own reading is the fitted one)."""
    s = s.strip()
    if not s or _DELIMITED_RE.search(s) or len(s) > 400:
        return None
    n = normalize(s)
    if to_number(n) is not None and not re.search(r"\d,\d", s.replace(" ", "")) and "\\times" not in n:
        return n  # scientific notation ("1.2\\times10^{5}") stays LaTeX: bare, math-verify reads 1.2
    return f"${s}$"


# A plain exact number as math-verify reads it without doubt: an integer, a decimal with a point, or
# a fraction of two integers (``\frac``, ``\dfrac``, ``\tfrac``), with an optional minus sign.
_PLAIN_NUMBER_RE = re.compile(
    r"^\s*(?P<neg>-?)\s*(?:(?P<num>\d+(?:\.\d+)?|\.\d+)"
    r"|\\[dt]?frac\s*\{\s*(?P<p>\d+)\s*\}\s*\{\s*(?P<q>[1-9]\d*)\s*\})\s*$"
)
# math-verify's reading of a LaTeX environment that ends in "= N" (latex2sympy_extended): the whole
# chain is parsed; an equation (or a chain of them, an ``And``) against a gold that is no equation is
# compared by its last right side (``math_verify.grader.sympy_expr_eq``), and a chain of three or more
# parts that does not parse is cut to its last part (``parse_latex_cached``, ``get_last_eq``). So N is
# what it compares, when the left side surely parses (one letter, a product of capital letters, or
# exact arithmetic) or the chain has three parts or more; no comma, semicolon or other relation.
_EQ_SPLIT_RE = re.compile(r"(?<![\\<!>])=")
_CHAIN_PART_RE = re.compile(
    r"(?:[0-9A-Za-z\s+\-*/^().!{}\[\]]|_[0-9A-Za-z]|\\(?:[dt]?frac|cdot|times|div|sqrt|left|right|pi)(?![A-Za-z]))*"
)
_SIMPLE_LHS_RE = re.compile(r"\s*(?:[a-zA-Z]|[A-Z]{2,3})\s*")


def _chain_tail(content: str) -> str | None:
    """The last part of a LaTeX environment's content when math-verify compares exactly that part with
    a gold number (see above), the content itself when it has no "=", else None."""
    c = content.strip()
    stop = re.search(r"(?<![\\{])\b\d+(?:\.\d+)?\.$", c) is not None
    if stop:
        c = c[:-1]  # "$28.$", "$2.5.$": a closing full stop after digits, read as 28 and 2.5
    elif c.endswith("."):
        return None  # "$\frac{1}{2}.$" does not parse: math-verify would try another match
    parts = _EQ_SPLIT_RE.split(c)
    if len(parts) == 1:
        return c
    if stop and len(parts) == 2:
        return None  # "$x = 5.$" does not parse whole, and two parts are not cut: another match is tried
    if "==" in c or any(not p.strip() for p in parts):
        return None
    for part in parts[:-1]:
        if not _CHAIN_PART_RE.fullmatch(part):
            return None
        # words would be rewritten by math-verify's normalisation ("or" -> ",", "inf", "percent")
        if any(not w.isupper() for w in re.findall(r"[a-zA-Z]{2,}", re.sub(r"\\[a-zA-Z]+", " ", part))):
            return None
    if len(parts) == 2:
        lhs = parts[0]
        if not (_SIMPLE_LHS_RE.fullmatch(lhs) or to_number(normalize(lhs)) is not None):
            return None  # a left side that may not parse: math-verify would try an earlier match
    return parts[-1]


def _plain_number(s: str) -> tuple[Fraction, bool] | None:
    """The exact value of a plain number (``_PLAIN_NUMBER_RE``) and whether it was written as a decimal."""
    m = _PLAIN_NUMBER_RE.match(s)
    if m is None:
        return None
    sign = -1 if m.group("neg") else 1
    if m.group("num") is not None:
        return sign * Fraction(m.group("num")), "." in m.group("num")
    return sign * Fraction(int(m.group("p")), int(m.group("q"))), False


_MV_REGEX_MAX_CHARS = 4000
"""Longest response text on which the fast path runs math-verify's extraction regexes inline. Some of
them scan to the end of the text from every unclosed opener (``\\[`` without ``\\]``): quadratic in
the worst case (0.6 s at 4,000 characters of openers, 12 s at 20,000), so longer texts go to the pool,
where a hung reading is killed."""


@functools.lru_cache(maxsize=1)
def _mv_pattern_groups() -> tuple[tuple[tuple[Any, bool, Any], ...], ...]:
    """math-verify's own extraction regexes for its default configuration (``LatexExtractionConfig`` +
    ``ExprExtractionConfig``), grouped by priority, strongest first: (pattern, whether it is a LaTeX one,
    the extraction target its ``extract_match`` takes)."""
    try:
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, get_extraction_regexes
    except ImportError:  # another layout: no shortcut, math-verify decides everything it is asked
        return ()
    by_priority: dict[int, list[tuple[Any, bool, Any]]] = {}
    for patterns, target in get_extraction_regexes((LatexExtractionConfig(), ExprExtractionConfig())):
        is_latex = isinstance(target, LatexExtractionConfig)
        for pattern, priority in patterns:
            by_priority.setdefault(priority, []).append((pattern, is_latex, target))
    return tuple(tuple(by_priority[k]) for k in sorted(by_priority))


@functools.lru_cache(maxsize=64)
def _mv_group_matches(text: str, index: int) -> tuple[tuple[Any, bool, Any], ...]:
    """The matches of priority group ``index`` in ``text`` in the order math-verify tries them
    (``extract_target_from_pred``: the match that ends last first, the earliest start on a tie, and
    otherwise the order of its patterns). Cached for the last texts: the fast path's shortcut and the
    slow path's reading (:func:`_mv_parse_text`) of one response run the regexes once."""
    found = [
        (m, is_latex, target)
        for pattern, is_latex, target in _mv_pattern_groups()[index]
        for m in pattern.finditer(text)
    ]
    return tuple(sorted(found, key=lambda x: (x[0].end(), -x[0].start()), reverse=True))


def _mv_parse_text(text: str) -> list[Any]:
    """``math_verify.parse(text)`` (its default configuration and timeout), on the regex matches the
    fast path found already (:func:`_mv_group_matches`): its ``extract_target_from_pred`` step by
    step, each priority group's matches in its order until one parses, plus the first match's text
    (``fallback_mode="first_match"``); any error or timeout reads nothing, as in ``parse``.
    ``test_parse_on_shared_matches_equals_parse`` holds the two equal. Texts past
    :data:`_MV_REGEX_MAX_CHARS`, or a math-verify of another layout, go to ``parse`` itself."""
    if len(text) > _MV_REGEX_MAX_CHARS or not _mv_pattern_groups():
        return _mv_parse(text)
    from math_verify.errors import TimeoutException
    from math_verify.parser import extract_match
    from math_verify.utils import timeout

    def read() -> list[Any]:
        found: list[Any] = []
        fallbacks: list[str] = []
        for index in range(len(_mv_pattern_groups())):
            for m, _, target in _mv_group_matches(text, index):
                got, fallback = extract_match(m, target)
                if fallback:
                    fallbacks.append(fallback)
                if got is not None:
                    found.append(got)
                    break
            if found:
                break
        return found + fallbacks[:1]

    try:
        return timeout(timeout_seconds=5 if _mv_timeouts() else None)(read)()
    except (Exception, TimeoutException):
        return []


def _mv_first_number(text: str) -> tuple[Fraction | complex, bool, str, bool] | None:
    """The answer ``math_verify.parse(text)`` returns, when it is certainly a plain number, found
    without its LaTeX parser: the match it tries first (its own regexes; the strongest priority group
    with a match; in it the match that ends last, the earliest start on a tie, as
    ``extract_target_from_pred`` orders them) is one LaTeX environment or one number with nothing but
    a plain number in it (no percent sign, no second environment, no thousands separator, no
    expression), which its parser always reads, so that match is the answer, or a LaTeX environment
    that math-verify compares as its last part (:func:`_chain_tail`). None in every other case.
    An exact constant (:func:`_mv_const`) is read the same way, as a complex value.
    (value, written as a decimal, the number as written, whether it ends a chain of equations)."""
    for index in range(len(_mv_pattern_groups())):
        ordered = _mv_group_matches(text, index)
        if not ordered:
            continue
        m, is_latex, _ = ordered[0]
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        if any("percent" in k for k in groups):
            return None
        if is_latex:
            latex = [(k, v) for k, v in groups.items() if "_latex" in k]
            if len(latex) != 1 or latex[0][0].endswith("latexBoxed"):
                return None
            tail = _chain_tail(latex[0][1])
            if tail is None:
                return None
            chain = tail != latex[0][1].strip().removesuffix(".")
            content = tail
        else:
            if "expr" in groups or any(k.startswith("integer1") or k.startswith("decimal1") for k in groups):
                return None
            if "," in groups.get("decimal2", ""):
                return None  # a decimal comma: left to math-verify
            content = groups.get("integer2", "") + groups.get("decimal2", "") + groups.get("decimal3", "")
            content = content or groups.get("integer3", "")
            chain = False
        got = _plain_number(content)
        if got is not None:
            return got[0], got[1], content.strip(), chain
        const = _mv_const(content) if is_latex else None
        return None if const is None else (const, False, content.strip(), chain)
    return None


# An exact constant math-verify's parser reads as its value: digits, roots, fractions, pi, products and
# sums, integer powers; no letter (a variable, i, e), no decimal point, no percent or degree sign.
_CONST_TEXT_RE = re.compile(r"(?:[0-9\s+\-(){}^]|\\(?:[dt]?frac|sqrt|pi|cdot|times|left|right)(?![a-zA-Z]))+")


def _mv_const(content: str) -> complex | None:
    """The value of an exact constant written in LaTeX (``3\\sqrt{13}``, ``-\\frac{\\pi}{6}``) when
    both we and math-verify's parser read it surely (:data:`_CONST_TEXT_RE`), else None."""
    if not _CONST_TEXT_RE.fullmatch(content) or content.count("{") != content.count("}"):
        return None
    return _exact_const(normalize(content))


def _reads_whole(parsed: tuple[Any, ...], s: str) -> bool:
    """Whether math-verify's reading of ``s`` matched all of it (its string fallback is ``s`` itself)."""
    text = [x for x in parsed if isinstance(x, str)]
    return bool(text) and re.sub(r"\s+", "", text[-1]) == re.sub(r"\s+", "", s)


@functools.lru_cache(maxsize=4096)
def _fitted_readings(fit: str) -> tuple[Any, ...]:
    """math-verify's reading of a fitted gold (:func:`_fitted`), built directly where
    :func:`_set_reading` knows the form, else parsed (cached: a group shares its gold)."""
    if fit.startswith("$") and fit.endswith("$"):
        direct = _set_reading(fit[1:-1])
        if direct is not None:
            return direct
    return _mv_parse_cached(fit)


def _gold_readings(gold: str) -> tuple[Any, ...]:
    """math-verify's readings of a gold answer: its default reading (``parse(gold)``) when that reads
    the whole gold, else (a bare ``2\\sqrt{3}`` reads as 2) the fitted one (:func:`_fitted`: inside
    ``$...$``, its documented use for LaTeX golds, or plain digits); a worked solution both as
    math-verify reads it and as its extracted answer; "2,5" both ways (it may be a decimal comma)."""
    raw = _mv_parse_cached(gold)
    answer = extract_gold(gold)
    if answer != gold:
        fit = _fitted(answer)
        return raw + (_fitted_readings(fit) if fit else _mv_parse_cached(answer))
    if _reads_whole(raw, gold):
        return raw
    fit = _fitted(gold)
    if fit is None:
        return raw
    if _DECIMAL_COMMA_RE.match(gold.strip()):
        return _fitted_readings(fit) + raw
    return _fitted_readings(fit) or raw
