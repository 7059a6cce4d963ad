"""Math answer extraction: where a response states its final answer, and how it was found (:class:`Anchor`)."""

from __future__ import annotations

import itertools
import re
from enum import Enum
from typing import Any

from stepcredit.reward.verifiers.latex import (
    Relation,
    Seq,
    is_simple_lhs,
    normalize,
    parse_answer,
)

MODES = ("strict", "flexible")
_STRICT = {"strict": True, "flexible": False}
"""Whether a mode needs an explicit answer marker (an unknown mode reads as ``flexible`` here; the verifier rejects it)."""


class Anchor(str, Enum):
    """How :func:`extract_answer` found the answer, strongest first; the value is what ``info["how"]`` reports."""

    BOXED = "boxed"
    HASH = "####"
    PHRASE = "phrase"
    LATEX = "latex"
    BARE = "bare"
    LAST_NUMBER = "last_number"
    NONE = "none"
    UNFINISHED_THINK = "unfinished_think"


# ---------------------------------------------------------------------------------- extraction
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")
# An answer follows its marker closely: each marker's rest of line is read at most _TAIL characters far,
# so a response of many markers on one long line is read in linear time (it was quadratic: 33 s for
# 4,000 phrases on a 100k-character line).
_TAIL = 1000
_REST = rf"([^\n]{{0,{_TAIL}}})"
_HASH_RE = re.compile(r"####\s*" + _REST)
# Answer phrases, weakest after the boxed / #### markers. Each captures the rest of its line.
_PHRASE_RES = (
    re.compile(r"(?i)\bfinal\s+answer\s*(?:is|:|：)?\s*[:：]?\s*" + _REST),
    re.compile(r"(?i)\b(?:the\s+)?(?:correct\s+)?answer\s+is\s*[:：]?\s*" + _REST),
    # "Answer: 35" opening a line or following a sentence ("So it is 34. **Answer:** 35", DAPO's marker)
    re.compile(r"(?im)(?:^|(?<=[.!?;。]))[\s*#>_-]*answer\s*[*_]*\s*[:：]\s*[*_]*\s*" + _REST),
    re.compile(r"(?m)^\s*A\s*[:：]\s*" + _REST),
)
# A number as a person writes it: thousands separated by a comma or a (thin) space, a decimal point
# or comma, or a leading dot.
# LaTeX writes the separator "{,}", "\\," or ",\\!" ("10,\\!080", as MATH's golds do).
_NUMBER_BODY = (
    r"(?:\d{1,3}(?:(?:,\\!|\{,\}|\\,|,|[ \u00a0\u2009\u202f])\d{3})+(?![\d])(?:\.\d+)?|\d+(?:[.,]\d+)?|\.\d+)"
)
# "1.5e6": E notation is one number (latex.normalize reads it), not 1.5 followed by a unit "e6"
_NUMBER_TOKEN = rf"[-+−]?\$?\s*{_NUMBER_BODY}(?:[eE][-+]?\d+(?![\w.]))?(?:\s*/\s*\d+)?"
_LEADING_NUMBER_RE = re.compile(rf"^({_NUMBER_TOKEN})(?![\d.]*\s*[+\-*/^=(])")
# A number in scientific notation written in text or LaTeX ("1.2 x 10^5", "3 × 10^{-4}", "6.02 \\times 10^{23}"):
# one number, never its mantissa (which the leading-number reading would take: "1.2 x 10^5" read as 1.2 was
# right for a gold 1.2). Read as "M \\times 10^{E}", the form latex.normalize evaluates.
_SCIENTIFIC_RE = re.compile(
    r"^([-+−]?\$?\s*(?:\d+(?:\.\d+)?|\.\d+))\s*(?:[x×*·]|\\times|\\cdot)\s*10\s*\^\s*"
    r"(?:\{\s*([-+−]?\d+)\s*\}|([-+−]?\d+))(?!\d|\.\d)(?!\s*[+\-*/^=(\\])"
)
# A calculation after an answer phrase ("40 - 10 = 30 pages left", "3 × 5 = 15", "20% of 50 = 10"): its
# result, the last side of the chain, is what the response answers (math-verify and VeRL's last number
# read it so), never its first operand, which the sentence reading below would take.
_OPERAND = rf"{_NUMBER_TOKEN}%?"
_OPERATOR = r"\s*(?:[-+*/×x÷^−]|\\times|\\cdot|\\div|of)\s*"
_SIDE = rf"{_OPERAND}(?:{_OPERATOR}{_OPERAND})*"
_CALCULATION_RE = re.compile(rf"^{_SIDE}(?:\s*=\s*({_SIDE}))+(?![\d.]*\s*[+\-*/^(=\\])")
# What after a leading number makes it part of a larger expression ("2\\sqrt2", "5\\pi", "12 \\times 10^3",
# "1\\frac{4}{5}", "2x+3", "6i", "52_8"): a LaTeX command other than a unit's wrapper, a percent, degree or
# space; a subscript; a letter glued to the number and followed by more math, or "i" ending the answer.
_MATH_GOES_ON_RE = re.compile(
    r"\s*\\(?!(?:text\w*|mbox|mathrm|hbox|degree|circ|quad|qquad)(?![a-zA-Z])|[%$,;:!\s])"
    r"|\s*_|[a-zA-Z](?=\s*[+\-*/^=_\\(\d])|i$"
)
# Where the expression that an answer phrase starts with ends: a full stop before a space, or an English
# word, after a comma or not ("3\\sqrt{13}, which is about 10.8", "2\\pi units"); never at "or" / "and"
# or a comma before more math ("2\\sqrt2 or 3", "2\\sqrt2, -2\\sqrt2" are read whole: several answers).
_EXPRESSION_END_RE = re.compile(r"\.\s|[,;]?\s+(?!(?:or|and)(?![a-zA-Z]))(?=[a-zA-Z]{2,}(?![a-zA-Z]*\{))")
_DOLLAR_RE = re.compile(r"(?<!\\)\$")
# Several numbers joined after an answer phrase ("2 or 3", "2, 3, 4", "2 and 3"): read together, never
# the first alone (a hedge is not its first candidate). With "or" anything may follow ("2 or 3 apples");
# a list joined by commas or "and" must end the clause ("5, 2 more than 3" is 5 and a remark). A comma
# joins only before a space: "1,234" is one number.
_SEP = r"(?:\s*,\s+|\s+and\s+|\s*,\s+and\s+)"
_LEADING_LIST_RE = re.compile(
    rf"^({_NUMBER_TOKEN}(?:{_SEP}{_NUMBER_TOKEN})*(?:\s*,?\s+or\s+){_NUMBER_TOKEN})(?![\d.]*\s*[+\-*/^=(])"
    rf"|^({_NUMBER_TOKEN}(?:{_SEP}{_NUMBER_TOKEN})+)(?=\s*[.;!]?\s*$)"
)
# "$2$ or $3$": several math spans joined after an answer phrase, read together
_JOINED_SPANS_RE = re.compile(r"^\s*(?:,|,?\s*(?:or|and))\s*\$")
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
_FINAL_IS_RE = re.compile(r"(?i)\bfinal\s+answer\s+is\s*:?\s*" + _REST)
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


def _final_is_hits(body: str) -> list[re.Match[str]]:
    """Every "final answer is" phrase (:data:`_FINAL_IS_RE`). The case-insensitive scan was the largest
    single cost of a GSM8K verdict in a profile; an ASCII text without "final" in any case has none, which one lower-case
    copy tells (outside ASCII, case folding has more spellings: the scan decides)."""
    if body.isascii() and "final" not in body.lower():
        return []
    return list(_FINAL_IS_RE.finditer(body))


def _balanced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at ``text[start]`` (a ``{``) and the index after it."""
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
        if text.startswith("{", end):
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
    dollars = [m.start() for m in itertools.islice(_DOLLAR_RE.finditer(s), 2)]
    if len(dollars) >= 2:
        inner = s[dollars[0] + 1 : dollars[1]].strip()
        # "$\frac12$" is LaTeX; "$18 a day, or $126" is money around English words.
        if inner and _is_math(inner, s[dollars[1] + 1 : dollars[1] + 2]):
            if _JOINED_SPANS_RE.match(s[dollars[1] + 1 :]):
                return s.rstrip(" .;!")  # "$2$ or $3$": every span (a hedge or a list), not the first
            return inner
    s = s.rstrip(" .;!")
    m = _SCIENTIFIC_RE.match(s)
    if m:
        exponent = (m.group(2) or m.group(3)).replace("−", "-")
        return f"{m.group(1).replace('−', '-').replace('$', '').replace(' ', '')} \\times 10^{{{exponent}}}"
    m = _CALCULATION_RE.match(s)
    if m:
        return m.group(1).strip()
    m = _LEADING_LIST_RE.match(s)
    if m:
        return (m.group(1) or m.group(2)).strip()
    m = _LEADING_NUMBER_RE.match(s)
    if m:
        if _MATH_GOES_ON_RE.match(s, m.end()):
            # the number starts an expression: the expression is the answer, never its first number
            end = _EXPRESSION_END_RE.search(s, m.end())
            return s[: end.start() if end else len(s)].strip()
        return m.group(1).strip()
    if not _is_math(s, "", whole=True):
        # an English sentence: its first number within 50 characters, as math-verify's "answer" anchor
        num = _BARE_NUMBER_RE.search(s[:50])
        if num:
            return num.group(0)
    if len(s) <= 60:
        return s
    return None


def starts_expression(pred: str | None) -> bool:
    """Whether ``pred`` is a number that starts a larger expression ("2\\sqrt2", "5\\pi", "2x+3"): what
    :func:`_clean_phrase` reads whole where it would otherwise read the leading number. math-verify,
    given the response, reads such an answer after a phrase as its leading number."""
    if pred is None:
        return False
    m = _LEADING_NUMBER_RE.match(pred)
    return m is not None and _MATH_GOES_ON_RE.match(pred, m.end()) is not None


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
            set(part.ops) <= {"="} and len(part.parts) == 2 and is_simple_lhs(part.parts[0])
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


def extract_answer(text: str, *, mode: str = "flexible") -> tuple[str | None, Anchor]:
    """The final answer of a response and how it was found (an :class:`Anchor`: ``boxed``, ``####``, ``phrase``, ``latex``,
    ``bare``, ``last_number``, ``none``). ``None`` when nothing answer-like was found (the response is unparseable).

    Without a boxed answer, ``####`` or an answer phrase, ``flexible`` mode takes the last math
    expression (as math-verify does); a short response that is math without delimiters as a whole;
    and the last number (or plain fraction) only when the text holds no math at all."""
    strict = _STRICT.get(mode, False)
    body = strip_think(text, strict=strict)
    if body is None:
        return None, Anchor.UNFINISHED_THINK
    boxed = last_boxed(body)
    hashes = list(_HASH_RE.finditer(body))
    hash_hit = (hashes[-1].start(), hashes[-1].group(1)) if hashes else None
    final = _final_is_hits(body) if boxed is not None else []
    if final and boxed is not None and final[-1].start() > boxed[0]:
        # "\boxed{200} ... The final answer is $10,455$.": math-verify ranks "final answer is"
        # with the boxed answer and takes the later of the two
        cand = _clean_phrase(final[-1].group(1))
        if cand:
            return cand, Anchor.PHRASE
    strong = [h for h in (boxed, hash_hit) if h is not None]
    if strong:
        pos, content = max(strong, key=lambda h: h[0])
        how = Anchor.BOXED if boxed is not None and pos == boxed[0] else Anchor.HASH
        cleaned = content.strip()
        if how is Anchor.HASH:
            cleaned = _clean_phrase(cleaned) or cleaned
        if cleaned:
            return cleaned, how
    best: tuple[int, str] | None = None
    for start, tail in _phrase_hits(body):
        cand = _clean_phrase(tail)
        if cand and (best is None or start > best[0]):
            best = (start, cand)
    if best is not None:
        return best[1], Anchor.PHRASE
    if strict:
        return None, Anchor.NONE
    anchored = _answer_then_math(body)
    if anchored is not None:
        return anchored, Anchor.PHRASE
    latex = last_math(body)
    if latex is not None:
        return latex, Anchor.LATEX
    bare = body.strip().rstrip(".").strip()
    if bare and len(bare) <= 80 and "\n" not in bare and _is_math(bare, "", whole=True):
        return (
            bare,
            Anchor.BARE,
        )  # the whole response is an answer without delimiters: "\frac{1}{3}", "x \ge 5"
    num = last_number(body)
    if num is not None:
        return num, Anchor.LAST_NUMBER
    return None, Anchor.NONE


def marked_answer(text: str) -> str | None:
    """The final answer of ``text`` only where it is marked plainly (a ``\\boxed{}``, ``####`` or an
    answer phrase); None otherwise, never a last number or loose expression. What a labelled trace's own
    answer may stand for when the row marks it correct (``stepcredit probe --traces``)."""
    answer, how = extract_answer(text)
    return answer if answer and how in (Anchor.BOXED, Anchor.HASH, Anchor.PHRASE) else None


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


def _boxes(body: str) -> list[str]:
    """The contents of every complete ``\\boxed{}`` / ``\\fbox{}`` in ``body``, in order."""
    out = []
    for m in _BOXED_RE.finditer(body):
        end = m.end()
        if body.startswith("{", end):
            got = _balanced(body, end)
            if got is not None:
                out.append(got[0])
        else:
            out.append(body[end : end + 8])  # "\boxed 5": counted, never the same as a braced one
    return out
