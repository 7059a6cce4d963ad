"""The math verifier: answer extraction, normalisation, an exact fast path, math-verify for LaTeX.

Scoring a response against a ground truth goes in three steps:

1. **Extraction** (:func:`extract_answer`): the text after the last ``</think>`` is searched for, in
   order of strength, the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces) or GSM8K's ``#### N``
   (whichever comes last; a later "The final answer is ..." wins over a box), then the last answer
   phrase (``Final answer: ...``, ``The answer is ...``, an ``Answer: ...`` line, GSM8K's ``A: 26``,
   "answer" followed by math). In ``flexible`` mode a response without any of these gives its last
   math expression (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``, as math-verify reads them),
   else the whole response when it is short math without delimiters, else its last number standing on
   its own; ``strict`` mode calls it unparseable, and an unfinished ``<think>`` block is unparseable too.
2. **Fast path** (:func:`fast_verdict`, with :mod:`~stepcredit.reward.verifiers.latex`): both answers are
   normalised (delimiters, units, ``%``, thousands separators, ``\\dfrac``, ``\\left``/``\\right`` ...)
   and read as structures (numbers compared exactly as :class:`fractions.Fraction`, constant closed
   forms as floats, relations, intervals, sets, tuples, matrices, lists of answers); the verdict is
   given where the structures make it certain. This decides GSM8K answers and most MATH answers
   without sympy.
3. **Slow path**: everything else goes to the ``math-verify`` library (``parse`` + ``verify``), which
   can hang on adversarial input; the :class:`~stepcredit.reward.run.rewarder.Rewarder` therefore runs it
   in the kill-safe pool. We never parse LaTeX into sympy ourselves.

The functions registered here follow VeRL's signature
``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``.
"""

from __future__ import annotations

import functools
import re
import threading
from fractions import Fraction
from typing import Any

from stepcredit.reward.base import register_reward
from stepcredit.reward.verifiers.latex import (
    _DECIMAL_COMMA_RE,
    Relation,
    Seq,
    Union,
    compare_structures,
    const_value,
    is_simple_lhs,
    normalize,
    numbers_equal,
    parse_answer,
    to_complex,
    to_number,
)
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
# A number as a person writes it: thousands separated by a comma or a (thin) space, a decimal point
# or comma, or a leading dot.
_NUMBER_BODY = r"(?:\d{1,3}(?:(?:,|[ \u00a0\u2009\u202f])\d{3})+(?![\d])(?:\.\d+)?|\d+(?:[.,]\d+)?|\.\d+)"
_NUMBER_TOKEN = rf"[-+−]?\$?\s*{_NUMBER_BODY}(?:\s*/\s*\d+)?"
_LEADING_NUMBER_RE = re.compile(rf"^({_NUMBER_TOKEN})(?![\d.]*\s*[+\-*/^=(])")
# Never a digit glued inside a word ("AZYUK2A") or to another number; a unit may follow ("5cm"). A
# plain fraction counts as one number ("1/3", "\frac{1}{3}", as math-verify's latexFraction and expr).
_BARE_NUMBER_RE = re.compile(
    r"(?<![A-Za-z0-9_.,\\])(?:[-−]?\\[dtc]?frac\{\d+\}\{\d+\}|[-−]?\d+\s*/\s*\d+(?![\d.])"
    rf"|[-−]?{_NUMBER_BODY}(?![\d]))"
)
# The math environments math-verify reads (math_verify/parser.py, make_latex_env_pattern): display
# $$...$$ and \[...\], inline $...$ (one line, not after a digit: "$5" is money) and \(...\). Unlike
# math-verify's patterns, a \[ or \( environment never holds another opener of its kind: the scan from
# an unclosed opener stops at the next one, so a text of openers is read in linear time (it was
# quadratic: 8 s on 20,000 characters of "\[").
_MATH_ENV_RE = re.compile(
    r"(?<!\\)\$\$(?P<dd>(?:[^$]|\$(?!\$))+?)(?<!\\)\$\$"
    r"|(?<!\\)\\\[(?P<db>(?:[^\\]|\\(?![\]\[]))+?)(?<!\\)\\\]"
    r"|(?<![\\\d])\$(?P<id>(?:\\\$|[^\n$])+?)(?<!\\)\$"
    r"|(?<!\\)\\\((?P<ip>(?:[^\\\n]|\\(?![\)\(]))+?)(?<!\\)\\\)",
    re.DOTALL,
)
# A math span that is no answer: emphasis, or one variable named in prose ("values of $x.$").
_PROSE_MATH_RE = re.compile(r"^\s*(?:\\emph\s*\{[^{}]*\}|[a-zA-Z]\s*[.,;]?)\s*$")
_FINAL_IS_RE = re.compile(r"(?i)\bfinal\s+answer\s+is\s*:?\s*([^\n]*)")
# "The largest $n$ is 34": the clause before "is", within one sentence of at most 100 characters.
_IS_CLAUSE_RE = re.compile(r"^(?:(?![.!?]\s)[^\n]){0,100}?\s+is\s*:?\s+(.*)$", re.IGNORECASE)
_ANSWER_WORD_RE = re.compile(r"(?i)\banswer\b")
# Between two math environments that together give several answers ("$x=1$ or $x=2$").
_JOINER_RE = re.compile(r"^\s*(?:,|,?\s*and|,?\s*or)\s*$")
_STOP_WORDS = frozenset(
    "a an and are as at be but by each for from he her his in is it of on or per she so than that the"  # noqa: SIM905
    " then there they this to was we were which with you".split()
)
"""Words that mark a ``$...$`` span as prose: "or" and "and" between answers belong outside math."""
_ENGLISH_RE = re.compile(r"(?<![\\a-zA-Z{])[a-zA-Z]{2,}\s+[a-zA-Z]{2,}")


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


def _phrase_hits(body: str) -> list[tuple[int, str]]:
    """Every answer phrase in ``body`` as (start, the rest of its line), overlapping ones included: in
    "The answer is $720$. So the answer is $4$." the second phrase is the final answer, though the
    first one's tail runs over it."""
    hits = []
    for rx in _PHRASE_RES:
        pos = 0
        while (m := rx.search(body, pos)) is not None:
            hits.append((m.start(), m.group(1)))
            pos = m.start() + 1
    return hits


def _clean_phrase(s: str) -> str | None:
    """The answer inside the tail of an answer phrase ("18 dollars.", "$\\frac12$.", "**26**",
    "The largest $n$ is 34.", "Jane started growing Sphere 3 hours ago.")."""
    s = s.strip().strip("*_").strip()
    if not s:
        return None
    clause = _IS_CLAUSE_RE.match(s)  # "The final answer is $X$", "the largest $n$ is 34"
    if clause and clause.group(1).strip() and not re.match(r"[-$\\\d.(\[]", s):
        s = clause.group(1).strip()
    dollars = [i for i, c in enumerate(s) if c == "$" and (i == 0 or s[i - 1] != "\\")]
    if len(dollars) >= 2:
        inner = s[dollars[0] + 1 : dollars[1]].strip()
        # "$\frac12$" is LaTeX; "$18 a day, or $126" is money around English words.
        if inner and _is_math(inner, s[dollars[1] + 1 : dollars[1] + 2]):
            return inner
    s = s.rstrip(" .;!")
    m = _LEADING_NUMBER_RE.match(s)
    if m:
        return m.group(1).strip()
    if not _is_math(s, "", whole=True):
        # an English sentence: its first number within 50 characters, as math-verify's "answer" anchor
        num = _BARE_NUMBER_RE.search(s[:50])
        if num:
            return num.group(0)
    if len(s) <= 60:
        return s
    return None


def _is_math(content: str, after: str, *, whole: bool = False) -> bool:
    """Whether a ``$...$`` span is mathematics rather than text between two dollar amounts
    ("$18 a day, or $126", "$5 each, so $15"): a closing sign right before a number, a number then
    a space at the very end, or English words mean text. ``whole``: the span is the whole response,
    where "or"/"and" may join answers and one letter may be the answer ("B")."""
    if not content.strip() or after[:1].isdigit():
        return False
    if content[:1].isdigit() and content[-1:].isspace():
        return False
    if not whole and _PROSE_MATH_RE.match(
        content
    ):  # "$\emph{do}$", "$x.$": prose in math mode, a variable named
        return False
    text = re.sub(r"\\[a-zA-Z]+\s*\{[^{}]*\}|\\[a-zA-Z]+", " ", content)
    if _ENGLISH_RE.search(text):
        return False
    if whole and any(w.lower() not in ("or", "and") for w in re.findall(r"(?<![a-zA-Z])[a-zA-Z]{2,}", text)):
        return False  # a whole response with a word in it is prose ("Soucis : 2,74 $ a.."), not an answer
    words = re.findall(r"(?<![a-zA-Z])[a-zA-Z]{2,}(?![a-zA-Z])", text)
    stop = _STOP_WORDS - {"or", "and"} if whole else _STOP_WORDS
    hits = [w for w in words if w.lower() in stop]
    # One two-letter word can be a product of variables ("$ax + by = c$"); a longer one, or two, is prose.
    return not (len(hits) >= 2 or any(len(w) >= 3 for w in hits))


def last_math(text: str) -> str | None:
    """The last mathematical expression in ``$...$``, ``$$...$$``, ``\\(...\\)`` or ``\\[...\\]``; when
    the last few are joined by commas, "and" or "or", all of them, comma-separated (several answers)."""
    spans: list[tuple[int, int, str]] = []
    pos = 0
    while (m := _MATH_ENV_RE.search(text, pos)) is not None:
        content = next(g for g in m.groups() if g is not None)
        if m.group("id") is not None and not _is_math(content, text[m.end() : m.end() + 1]):
            # Not math: its closing sign may open the next span ("... 12=$1250$ dollars").
            pos = m.end() - 1
            continue
        spans.append((m.start(), m.end(), content.strip().rstrip(".,;").strip()))
        pos = m.end()
    if not spans:
        return None
    picked = [spans[-1]]
    for prev in reversed(spans[:-1]):
        if len(picked) >= 6 or not _JOINER_RE.match(text[prev[1] : picked[-1][0]]):
            break
        picked.append(prev)
    if len(picked) > 1 and not all(_joinable(c) for _, _, c in picked):
        # math-verify reads a joined group only when every part parses, else it falls back to the
        # last expression alone ("$x \ge \frac{11}{10} = 1.1$, and $r = 10\%$" -> "r = 10\%").
        return picked[0][2]
    return ", ".join(c for _, _, c in reversed(picked))


def _joinable(content: str) -> bool:
    """Whether one of several joined answers is a value, a set, a matrix or an assignment ``x = ...``
    (not an inequality, nor an equation chain with a compound left side such as ``AB = 5/4 = 1.25``)."""
    parsed = parse_answer(normalize(content))
    parts = parsed.items if isinstance(parsed, Seq) else (parsed,)
    for part in parts:
        if isinstance(part, Relation) and not (
            all(op == "=" for op in part.ops) and len(part.parts) == 2 and is_simple_lhs(part.parts[0])
        ):
            return False
    return True


def _answer_then_math(text: str) -> str | None:
    """The math expression within 50 characters after the last word "answer" that has one ("the
    answer $t=17$ satisfies ..."); math-verify ranks this anchor above a plain last expression."""
    found = None
    for m in _ANSWER_WORD_RE.finditer(text):
        env = _MATH_ENV_RE.search(text, m.end(), min(len(text), m.end() + 50 + 200))
        if env is None or env.start() - m.end() > 50:
            continue
        content = next(g for g in env.groups() if g is not None)
        if env.group("id") is None or _is_math(content, text[env.end() : env.end() + 1]):
            found = content.strip().rstrip(".,;").strip()
    return found


def last_number(text: str) -> str | None:
    """The last number standing on its own (never one glued inside a word such as ``AZYUK2A``)."""
    nums = _BARE_NUMBER_RE.findall(text)
    return nums[-1] if nums else None


def extract_answer(text: str, *, mode: str = "flexible") -> tuple[str | None, str]:
    """The final answer of a response and how it was found (``boxed``, ``####``, ``phrase``, ``latex``,
    ``bare``, ``last_number``, ``none``). ``None`` when nothing answer-like was found (the response is unparseable).

    Without a boxed answer, ``####`` or an answer phrase, ``flexible`` mode takes the last math
    expression (as math-verify does); a short response that is math without delimiters as a whole;
    and the last number (or plain fraction) only when the text holds no math at all."""
    strict = mode == "strict"
    body = strip_think(text, strict=strict)
    if body is None:
        return None, "unfinished_think"
    boxed = last_boxed(body)
    hashes = list(_HASH_RE.finditer(body))
    hash_hit = (hashes[-1].start(), hashes[-1].group(1)) if hashes else None
    final = list(_FINAL_IS_RE.finditer(body))
    if final and boxed is not None and final[-1].start() > boxed[0]:
        # "\boxed{200} ... The final answer is $10,455$.": math-verify ranks "final answer is"
        # with the boxed answer and takes the later of the two
        cand = _clean_phrase(final[-1].group(1))
        if cand:
            return cand, "phrase"
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
    for start, tail in _phrase_hits(body):
        cand = _clean_phrase(tail)
        if cand and (best is None or start > best[0]):
            best = (start, cand)
    if best is not None:
        return best[1], "phrase"
    if strict:
        return None, "none"
    anchored = _answer_then_math(body)
    if anchored is not None:
        return anchored, "phrase"
    latex = last_math(body)
    if latex is not None:
        return latex, "latex"
    bare = body.strip().rstrip(".").strip()
    if bare and len(bare) <= 80 and "\n" not in bare and _is_math(bare, "", whole=True):
        return bare, "bare"  # the whole response is an answer without delimiters: "\frac{1}{3}", "x \ge 5"
    num = last_number(body)
    if num is not None:
        return num, "last_number"
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


def _number_vs_many(gold: str, pred: str, g: str, p: str) -> bool:
    """Whether one side is one exact number and the other a tuple, interval or set of several
    different elements (or a union): never equal (``4`` against ``(-\\sqrt{3}, \\sqrt{3})``). A
    decimal comma ("1,5") and percentages are left to math-verify."""
    if "%" in gold or "%" in pred:
        return False
    for num, raw, other, other_raw in ((g, gold, p, pred), (p, pred, g, gold)):
        if to_number(num) is not None and not re.search(r"\d\s*,\s*\d", raw):
            # "(1,000)" may be a number with a thousands separator
            thousands = re.search(r"\d\s*,\s*\d{3}(?!\d)", other_raw)
            return not thousands and _bracketed_many(parse_answer(other))
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


def fast_verdict(gold: str, pred: str) -> bool | None:
    """True/False when the answers can be compared without sympy and the verdict is sure, else None
    (math-verify decides).

    True (see :mod:`~stepcredit.reward.verifiers.latex`): equal normalised strings; exact numbers
    (rationals, small arithmetic, Gaussian rationals with ``i``) and constant closed forms (roots, pi)
    equal to 1e-12; assignments and chains by their last exact right-hand side; single-variable
    inequalities either way round; tuples and intervals (ends must match), sets and lists of answers
    (in any order), matrices in any environment; a percentage and its value.
    False: only :func:`_sure_different` (two exact numbers, one reading each) and
    :func:`_number_vs_many` (one exact number against a tuple, interval or set of several elements)
    and :func:`_consts_differ` (two exact constants without decimals, far apart).
    """
    g, p = normalize(gold), normalize(pred)
    if not g or not p:
        return None
    if g == p:
        return True
    readings = _pred_readings(p, g)
    verdicts = [compare_structures(parse_answer(g), parse_answer(y)) for y in readings]
    if any(v is True for v in verdicts) or _percent_eq(gold, pred):
        return True
    if len(readings) == 1 and (
        _sure_different(gold, pred, g, p)
        or _number_vs_many(gold, pred, g, p)
        or _consts_differ(gold, pred, g, p)
    ):
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
    if to_number(n) is not None and not re.search(r"\d,\d", s.replace(" ", "")):
        return n
    return f"${s}$"


def _mv_sure_false(g: tuple[Any, ...], p: tuple[Any, ...]) -> bool:
    """True when ``math_verify.verify(g, p)`` is certainly False without running it: every pair of
    readings is two different strings, a string and an expression, two different exact rationals, or
    a number against a set, tuple or interval of several elements or a non-constant polynomial, or a
    gold constant more than 1e-6 (relative) away from an exact rational or a decimal
    (:func:`_const_sure_false`), or a gold rational against an equation whose last right side is
    surely not it.

    Why: ``verify`` runs ``sympy.simplify`` on each expression pair, most of the cost of a wrong
    MATH answer. For two rationals ``a != b`` each of its comparisons (string, numeric, symbolic)
    is False, so this skips work and never changes a verdict."""
    import sympy

    for a in g:
        for b in p:
            if isinstance(a, str) and isinstance(b, str):
                if a.strip() == b.strip():
                    return False
            elif isinstance(a, str) or isinstance(b, str):
                continue
            elif isinstance(a, sympy.Rational) and isinstance(b, sympy.Rational):
                if a == b:
                    return False
            elif _number_vs_other(a, b) or _number_vs_other(b, a):
                continue
            elif isinstance(b, sympy.Number) and _is_assignment(a):
                # a gold assignment "x = 5" against a number is compared by its right side
                # (math_verify.grader.sympy_expr_eq)
                if not _mv_sure_false((_last_rhs(a),), (b,)):
                    return False
            elif isinstance(b, sympy.Rational) and _const_sure_false((a,), complex(b)):
                # a gold constant ("2\sqrt{5}") far from an exact rational answer (see there)
                continue
            elif (
                isinstance(b, sympy.Float)
                and b.is_finite
                and isinstance(a, sympy.Expr)
                and not a.free_symbols
                and _const_sure_false((a,), complex(b))
            ):
                # a gold constant far from a decimal answer: its numeric check rounds both to 6
                # decimals, more than 1e-6 apart they differ; the symbolic one never cancels
                continue
            elif isinstance(a, sympy.Rational) and _is_equation(b):
                # an equation (or a chain of them) against a gold number is compared by its last
                # right side (math_verify.grader.sympy_expr_eq)
                if not _mv_sure_false((a,), (_last_rhs(b),)):
                    return False
            else:
                return False
    return True


def _grader_says(test: str, x: Any) -> bool:
    """math-verify's own predicate ``math_verify.grader.<test>`` on ``x``; False where it is missing
    (another layout) or cannot read ``x``: no shortcut then."""
    try:
        import math_verify.grader as grader

        return bool(getattr(grader, test)(x))
    except Exception:
        return False


def _is_assignment(x: Any) -> bool:
    return _grader_says("is_assignment_relation", x)


def _is_equation(x: Any) -> bool:
    return _grader_says("is_equation", x)


def _last_rhs(x: Any) -> Any:
    from math_verify.grader import take_last_relation

    return take_last_relation(x).rhs


def _number_vs_other(a: Any, b: Any) -> bool:
    """Whether math-verify's comparison of the number ``a`` with ``b`` is certainly False: ``b`` is a
    set, tuple or interval of several elements or a union (its set comparison makes a number a
    one-element set), or a polynomial that is not constant (``simplify(a - b)`` keeps its variables)."""
    import sympy

    if not isinstance(a, sympy.Number):
        return False
    try:
        if isinstance(b, (sympy.FiniteSet, sympy.Tuple)):
            return len(set(b.args)) >= 2
        if isinstance(b, sympy.Interval):
            return bool(b.start != b.end)
        if isinstance(b, sympy.Union):
            return True
        if isinstance(b, sympy.Expr) and b.free_symbols and b.is_polynomial():
            return not sympy.Poly(b).is_ground
    except Exception:  # any doubt leaves it to verify
        return False
    return False


def _mv_verify(g: tuple[Any, ...], p: tuple[Any, ...]) -> bool:
    from math_verify import verify

    if not g or not p or _mv_sure_false(g, p):
        return False
    t = 5 if _mv_timeouts() else None
    return bool(verify(list(g), list(p), timeout_seconds=t))  # type: ignore[arg-type]


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
def _mv_pattern_groups() -> tuple[tuple[tuple[Any, str, Any], ...], ...]:
    """math-verify's own extraction regexes for its default configuration (``LatexExtractionConfig`` +
    ``ExprExtractionConfig``), grouped by priority, strongest first: (pattern, ``latex`` or ``expr``,
    the extraction target its ``extract_match`` takes)."""
    try:
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, get_extraction_regexes
    except ImportError:  # another layout: no shortcut, math-verify decides everything it is asked
        return ()
    by_priority: dict[int, list[tuple[Any, str, Any]]] = {}
    for patterns, target in get_extraction_regexes((LatexExtractionConfig(), ExprExtractionConfig())):
        kind = "latex" if isinstance(target, LatexExtractionConfig) else "expr"
        for pattern, priority in patterns:
            by_priority.setdefault(priority, []).append((pattern, kind, target))
    return tuple(tuple(by_priority[k]) for k in sorted(by_priority))


@functools.lru_cache(maxsize=64)
def _mv_group_matches(text: str, index: int) -> tuple[tuple[Any, str, Any], ...]:
    """The matches of priority group ``index`` in ``text`` in the order math-verify tries them
    (``extract_target_from_pred``: the match that ends last first, the earliest start on a tie, and
    otherwise the order of its patterns). Cached for the last texts: the fast path's shortcut and the
    slow path's reading (:func:`_mv_parse_text`) of one response run the regexes once."""
    found = [
        (m, kind, target)
        for pattern, kind, target in _mv_pattern_groups()[index]
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
        m, kind, _ = ordered[0]
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        if any("percent" in k for k in groups):
            return None
        if kind == "latex":
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
        const = _mv_const(content) if kind == "latex" else None
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


def _mv_sure_wrong(text: str, golds: list[str]) -> str | None:
    """The number math-verify reads in ``text`` when its verdict against every gold is certainly
    "incorrect", else None. :func:`_mv_first_number` is what it compares (a chain of equations by its
    last right side, against a gold that is no equation). Against each gold, either :func:`fast_verdict`
    is sure the two differ (two exact numbers apart by more than math-verify's float rounding can
    bridge, a number against a tuple, interval or set of several elements, an exact constant far from
    it), or, for an exact number that is no decimal, :func:`_mv_sure_false` is sure of it against
    math-verify's own readings of the gold (:func:`_gold_readings`, parsed once per gold and cached: a
    group shares its gold), the readings the slow path would compare. Golds that are worked solutions
    are left to math-verify (it reads the whole solution too)."""
    got = _mv_first_number(text)
    if got is None:
        return None
    return got[2] if _number_surely_wrong(*got, golds) else None


def _number_surely_wrong(
    value: Fraction | complex, decimal: bool, written: str, chain: bool, golds: list[str]
) -> bool:
    """Whether math-verify's verdict on an answer it reads as the number ``value`` (``written``; the
    last part of a chain of equations when ``chain``) is "incorrect" against every gold (see
    :func:`_mv_sure_wrong`)."""
    if not golds:
        return False
    for gold in golds:
        if extract_gold(gold) != gold:
            return False
        if fast_verdict(gold, written) is False:
            continue
        if decimal:
            return False
        readings = _gold_readings(gold)
        if not readings or not _mv_reads_as_number(readings, written, chain):
            return False
        if isinstance(value, complex):
            if not _const_sure_false(readings, value):
                return False
            continue
        import sympy

        if not _mv_sure_false(readings, (sympy.Rational(value.numerator, value.denominator),)):
            return False
    return True


def _const_sure_false(readings: tuple[Any, ...], value: complex) -> bool:
    """Whether math-verify's comparison of every gold reading with an exact constant of this value is
    certainly False (``math_verify.grader.sympy_expr_eq``): a gold assignment is compared by its right
    side; a set, tuple or interval of several elements never equals a number; a constant more than
    1e-6 (relative) away fails its numeric check (15 digits) and its symbolic one (a nonzero difference
    never simplifies to zero); a non-constant polynomial keeps its variables. Texts were checked by
    :func:`_mv_reads_as_number`. Anything else (relations, matrices, other expressions) is not sure."""
    import sympy

    for a in readings:
        if isinstance(a, str):
            continue
        if isinstance(a, sympy.Basic) and a.has(sympy.UnevaluatedExpr):
            return False  # a percentage (X * 1/100 unevaluated): compared by X where the other is an integer
        try:
            if _is_assignment(a):
                a = _last_rhs(a)
            if isinstance(a, (sympy.FiniteSet, sympy.Tuple)) and len(set(a.args)) >= 2:
                continue
            if (isinstance(a, sympy.Interval) and a.start != a.end) or isinstance(a, sympy.Union):
                continue
            if not isinstance(a, sympy.Expr) or isinstance(a, sympy.core.relational.Relational):
                return False
            if a.free_symbols:
                if a.is_polynomial() and not sympy.Poly(a).is_ground:
                    continue
                return False
            c = complex(a.evalf(30))
        except Exception:  # any doubt leaves it to math-verify
            return False
        if not abs(c - value) > 1e-6 * max(1.0, abs(c), abs(value)):
            return False
    return True


def _mv_reads_as_number(readings: tuple[Any, ...], written: str, chain: bool) -> bool:
    """Whether math-verify compares a response whose answer is the number ``written`` with these gold
    readings as that number alone: no gold reading is a text equal to the answer's (its string
    comparison), and after a chain of equations no gold reading is a relation (it would compare the
    chain, not its last part)."""
    import sympy

    for a in readings:
        if isinstance(a, str):
            t = re.sub(r"\s+", "", a)
            if t == re.sub(r"\s+", "", written) or _plain_number(t.strip("$").removesuffix(".")) is not None:
                return False
        elif chain and isinstance(a, (sympy.core.relational.Relational, sympy.And)):
            return False
    return True


def _reads_whole(parsed: tuple[Any, ...], s: str) -> bool:
    """Whether math-verify's reading of ``s`` matched all of it (its string fallback is ``s`` itself)."""
    text = [x for x in parsed if isinstance(x, str)]
    return bool(text) and re.sub(r"\s+", "", text[-1]) == re.sub(r"\s+", "", s)


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
        lo, ro = left == "(", right == ")"
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


def math_verify_verdict(gold: str, text: str, pred: str | None, how: str) -> tuple[bool | None, str | None]:
    r"""math-verify's verdict on the response ``text`` against ``gold`` and the answer it read; None when
    it read nothing in the response.

    The response is read as math-verify reads it by default (``parse(text)``: its own extraction, the
    same configuration ``LatexExtractionConfig`` + ``ExprExtractionConfig``), except where the answer
    is unambiguous and math-verify's default reading of it is known to be lossy: one distinct
    ``\boxed{}`` (read as ``$\boxed{...}$``; bare, ``\boxed{2m}`` reads as 2) and a response that is
    only a bare answer. The gold is read by :func:`_gold_readings`; any reading that matches counts."""
    g = _gold_readings(gold)
    if how in ("boxed", "bare") and pred is not None and len({normalize(b) for b in _boxes(text)}) <= 1:
        fit = f"$\\boxed{{{pred}}}$" if how == "boxed" else _fitted(pred)
        if fit is not None:
            p = _mv_parse_cached(fit)
            if p:
                return _mv_verify(g, p), pred
    p = tuple(_mv_parse_text(text))
    if not p:
        return None, None
    got = next((x for x in p if isinstance(x, str)), None)
    return _mv_verify(g, p), got


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


def _raw_golds(ground_truth: Any) -> list[str]:
    items = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    return [str(g).strip() for g in items if str(g).strip()]


def _boxes(body: str) -> list[str]:
    """The contents of every complete ``\\boxed{}`` / ``\\fbox{}`` in ``body``, in order."""
    out = []
    for m in _BOXED_RE.finditer(body):
        end = m.end()
        if end < len(body) and body[end] == "{":
            got = _balanced(body, end)
            if got is not None:
                out.append(got[0])
        else:
            out.append(body[end : end + 8])  # "\boxed 5": counted, never the same as a braced one
    return out


def sure_candidate(text: str, pred: str, how: str, *, mode: str = "flexible") -> bool:
    """Whether ``pred`` is surely the response's one final answer, so that a mismatch may be called
    "incorrect" without math-verify: found by a strong anchor (``\\boxed{}``, ``#### N``, an answer
    phrase whose whole tail is the answer), with no other candidate (every box, every ``####`` the
    same answer; no box beside a ``####`` or a phrase). Unanchored extractions (the last math, a bare
    response, the last number) and unfinished ``<think>`` blocks are never sure."""
    body = strip_think(text, strict=mode == "strict")
    if body is None or ("<think>" in text and "</think>" not in text):
        return False
    boxes = {normalize(b) for b in _boxes(body)}
    hashes = {normalize(_clean_phrase(h) or h) for h in _HASH_RE.findall(body)}
    want = normalize(pred)
    if how == "boxed":
        return boxes == {want} and hashes <= {want}
    if how == "####":
        return hashes == {want} and boxes <= {want}
    if how == "phrase" and not boxes and not hashes:
        # the tail of the last phrase, read whole ("18 dollars.", "$\frac{1}{2}$", "**26**")
        last = max(_phrase_hits(body), default=None)
        return last is not None and normalize(last[1].strip(" *_")) == want
    return False


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
    """The verdict when the fast path is sure of it (run inline), else None (run
    :func:`math_compute_score`, which asks math-verify). "Correct" needs an equality our structures
    prove; "incorrect" needs :func:`sure_candidate` and two exact numbers that differ."""
    return _fast(solution_str, ground_truth, mode=mode, format_score=format_score)[0]


def _fast(
    solution_str: str, ground_truth: Any, *, mode: str, format_score: float
) -> tuple[RewardResult | None, str | None, str]:
    """:func:`math_fast`'s verdict with the answer it extracted and how (the slow path reads them too)."""
    if mode not in MODES:
        raise ValueError(f"math verifier mode must be one of {MODES}, got {mode!r}")
    golds = [g for g in _golds(ground_truth) if g]
    if not golds:
        return RewardResult.failure(Status.ERROR, f"empty ground truth {ground_truth!r}"), None, "none"
    pred, how = extract_answer(solution_str, mode=mode)
    if pred is None:
        if how == "none" and mode == "flexible" and re.search(r"[\d$\\]", solution_str):
            # math-verify's anchor-free extraction may still read something; without a digit, a
            # dollar sign or a backslash it reads nothing (its readings need one of them)
            return None, pred, how
        return _unparseable(how), pred, how
    body = strip_think(solution_str, strict=mode == "strict") or ""
    several = len({normalize(b) for b in _boxes(body)}) > 1
    verdicts = [fast_verdict(g, pred) for g in golds]
    if any(v is True for v in verdicts) and not several:
        return _result(True, pred, how, format_score=format_score, path="fast"), pred, how
    if all(v is False for v in verdicts) and sure_candidate(solution_str, pred, how, mode=mode):
        return _result(False, pred, how, format_score=format_score, path="fast"), pred, how
    if (
        how not in ("boxed", "bare")
        and len(body) <= _MV_REGEX_MAX_CHARS
        and not _boxes(body)
        and not any(v is True for v in verdicts)
    ):
        # math-verify would read the response itself (math_verify_verdict): when what it reads first
        # is a plain number, its verdict is known without its parser
        read = _mv_sure_wrong(body, _raw_golds(ground_truth))
        if read is not None:
            return _result(False, read, how, format_score=format_score, path="fast"), pred, how
    if how == "boxed" and not several and not any(v is True for v in verdicts):
        # the slow path reads one distinct box as "$\boxed{pred}$": a plain number, read as that number
        plain = _plain_number(pred)
        if plain is not None and _number_surely_wrong(*plain, pred.strip(), False, _raw_golds(ground_truth)):
            return _result(False, pred, how, format_score=format_score, path="fast"), pred, how
    return None, pred, how


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
    """The full math verifier: the fast path, then math-verify for everything it is not sure of.

    ``mode``: ``strict`` needs an explicit answer marker, ``flexible`` falls back to the last number.
    ``format_score``: the score of a well-formed but wrong answer (VeRL's ``format_score``).
    ``info["path"]`` says which decided: ``fast`` or ``math_verify``.
    """
    fast, pred, how = _fast(solution_str, ground_truth, mode=mode, format_score=format_score)
    if fast is not None:
        return fast
    if pred is None and mode == "strict":
        return _unparseable(how)
    body = strip_think(solution_str, strict=mode == "strict") or ""
    extracted: str | None = None
    read_any = False
    for gold in _raw_golds(ground_truth):
        verdict, got = math_verify_verdict(gold, body, pred, how)
        if verdict is None and body != solution_str:
            # nothing readable after </think>: math-verify reads the whole text, as it would alone
            verdict, got = math_verify_verdict(gold, solution_str, pred, how)
        if verdict is None:
            continue
        read_any = True
        extracted = extracted or got
        if verdict:
            return _result(True, got, how, format_score=format_score, path="math_verify")
    if not read_any:
        return _unparseable(how)
    return _result(False, extracted or pred, how, format_score=format_score, path="math_verify")


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
