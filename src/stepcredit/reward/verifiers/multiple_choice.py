"""The multiple-choice verifier: one option letter (A-Z) read from a response, compared with the key.

Extraction works on the text after the last ``</think>`` and takes the **last** place that names an
option (a response discusses options in its reasoning before it answers):

* a ``\\boxed{...}`` (``\\boxed{C}``, ``\\boxed{\\text{C}}``, ``\\boxed{(C)}``);
* an answer phrase: "The answer is (C)", "Answer: C", "Final answer: **C**", "the correct option is C",
  "the closest options are (G)", "My choice is D", "I would choose C", "I'll go with C". Every phrase is
  found, also several on one line ("... the answer should be the patient. So the answer is (A)."), and
  each reads the rest of **its own line**; a phrase that ends its line ("The answer is:") reads the next
  non-empty line when that line is an option alone;
* weaker phrases ("corresponds to option (E)", "which matches (E)") only when no answer phrase or box names
  an option;
* else the last line when it is an option alone: "(C)", "C.", "Option (C).", "**C**", "C: Paris",
  "(B) Paris, because ..." or the option's text.

What such a place holds is read as a letter in the forms models write (``(C)``, ``C.``, ``C)``, ``**C**``,
``option C``, ``$C$``, ``\\( C \\)``, ``\\[ C \\]``, ``$$C$$``, ``\\text{C}``) or, when the row gives the
options, as one option's text. A bare ``A`` or ``I`` followed by a lower-case word is English ("I think",
"A neutron star") unless that word joins options ("A or B") or the row's option text follows; a lower-case
letter counts when named ("option b"), bracketed ("(b)", never the roman "(i)", "(v)", "(x)") or alone as
the whole answer ("Answer: b", "b.": no English word, so not "a", "i", "v", "x").
**One answer only**: a final answer naming several different options ("A or B", "either A or C", "A and
C", "A, C", "A (or possibly C)", "A; B", "(A)(B)", "A (Paris) or B (London)", "Paris or London",
"A. B. C. D.", ``\\boxed{AC}``, boxes side by side or joined as in ``$\\boxed{A}$ or $\\boxed{B}$``, "B, but
it could also be A", "B, though C is also possible") is wrong (score 0, ``info["multiple"]``), never a lucky match. Nothing found is
``unparseable``: the verifier abstains rather than guess ("A-B" and "A–B", ranges, name no option).

Every pattern is compiled once and runs in time linear in the response (no nested unbounded repeats; a
phrase's rest of line is read at most ``_REST`` characters far; box braces are paired in one pass). The
reading goes from the end and stops at the first phrase that names an option; a pattern runs only over
the stretches of the text that can hold one of its matches (see ``_stretches_from_end``), which gives
the same extractions as scanning the whole text (``tests/reward/verifiers/test_mc_speed.py``).

The key is ``reward_model.ground_truth``: a letter (``"C"``, ``"(C)"``), a 0-based index (MMLU's
``answer`` field), the option's text, or a dict with ``answer`` (and ``options``). The options, when
given, come from the ground-truth dict or ``extra_info`` (``options`` or ``choices``: a list, or a
dict letter -> text, read in letter order); they bound the valid letters (four options: A-D), else A-Z
are valid.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Iterator
from typing import Any

from stepcredit.reward.base import register_reward
from stepcredit.types import RewardResult, Status

LETTERS = string.ascii_uppercase
_REST = 240  # how far a phrase's rest of line is read: an answer follows its phrase closely

# A letter standing alone as an option: (C)  [C]  C.  C)  C:  never inside a word ("Cat", "C-3", "C's").
# "A-B" and "A–B" (en dash) are ranges of options, never the letter A
_LETTER = r"[\(\[]?[ \t]*([A-Z])[ \t]*[\)\]]?(?![A-Za-z0-9'’\-–])(?![ \t]*[=^_×·])"  # "F = ma" is maths
_LEAD = (
    r"^(?:(?:either|both|option|options|choice|choices|letter|probably|clearly|definitely|"
    r"most\s+likely|likely|therefore|thus|so|hence|indeed|simply|the|number|no\.|closest\s+to|nearest\s+to|"
    r"approximately|roughly|about)\s*[:.]?\s+)*"
)
_FIRST_RE = re.compile(_LEAD + _LETTER, re.IGNORECASE)
_JOIN = r"(?:,|/|&|\bor\b|\band\b|\bnor\b|\+|\bvs\.?|\bversus\b|\bas\s+well\s+as\b|\bthen\b)"
# a join may open a bracket and carry a hedging word: "A (or possibly C)", "A, or perhaps B", "A; B", "A | B"
_MORE_RE = re.compile(
    r"^[ \t]*[.):]?[ \t]*[(\[]?[ \t]*(?:" + _JOIN + r"|;|\|)(?:[ \t]*(?:or|and)\b)?"
    r"(?:[ \t]+(?:maybe|possibly|perhaps|probably|alternatively|potentially|even|also))?"
    r"[ \t]*(?:(?:option|choice)[ \t]+)?" + _LETTER
)
_ADJACENT_RE = re.compile(r"^[\(\[]([A-Z])[\)\]]")  # "(A)(B)", "[A][B]": two bracketed letters side by side
# the rest of an answer that is only more letters: "A. B. C. D.", "(A) (B) (C)", "A) B)"
_LIST_TAIL_RE = re.compile(r"^[.)]?((?:[ \t]+(?:\([A-Z]\)|\[[A-Z]\]|[A-Z][.)]?))+)[ \t]*$")
# "\s*(?:[,/&]\s*)?", not "\s*[,/&]?\s*": the same strings, but a long run of spaces splits one way only
_LETTERS_ONLY_RE = re.compile(r"^[\(\[]?([A-Z](?:\s*(?:[,/&]\s*)?[A-Z])+)[\)\]]?\.?$")
# a word after a bare "A" or "I" that still reads as an option letter ("A or B", "I because ...")
_JOIN_WORDS = frozenset(
    [
        "or",
        "and",
        "nor",
        "is",
        "was",
        "because",
        "since",
        "as",
        "which",
        "for",
        "with",
        "vs",
        "versus",
        "then",
        "but",
        "seems",
        "appears",
        "would",
        "should",
        "best",
        "correct",
        "right",
    ]
)
_NEXT_WORD_RE = re.compile(r"[ \t]+([a-z]+)")
# A lower-case letter that is the whole answer ("Answer: b", "b.", "**c**"): no English word, so the option.
# Not "a" or "i" (words), nor "v" or "x" (roman numerals, as for "(v)" below).
_LOWER_ALONE_RE = re.compile(r"^[\(\[]?([b-hj-uwyz])[\)\]]?[.!]?$")

_VERB = (
    r"(?:[ \t]*(?:is|are|was|would[ \t]+be|should[ \t]+be|must[ \t]+be|will[ \t]+be|shall[ \t]+be|"
    r"has[ \t]+to[ \t]+be|seems[ \t]+to[ \t]+be|appears[ \t]+to[ \t]+be|remains|stands|=|:|：)"
    r"(?:[ \t]+(?:therefore|thus|then|clearly|definitely|indeed))?)?[ \t]*[:：]?[ \t]*"
)
# answer phrases: their rest of line holds the answer
_PHRASE_RE = re.compile(
    r"(?i)(?:\b(?:final|correct|best|right|closest|most[ \t]+(?:likely|appropriate|accurate|plausible|"
    r"suitable|reasonable)|only|my|true|valid)[ \t]+(?:answer|option|choice|selection|response|statement|"
    r"conclusion)s?(?:[ \t]+(?:choice|option))?"
    r"|\b(?:the[ \t]+)?answers?(?:[ \t]+(?:choice|option))?"
    r"|\bmy[ \t]+(?:final[ \t]+)?(?:choice|pick|selection)"
    r"|\bI(?:[ \t]*(?:would|will|'d|’d|'ll|’ll|shall|must|should|can|)[ \t]*)(?:choose|pick|select|go[ \t]+with|"
    r"opt[ \t]+for|answer|say)"
    r"|\b(?:we|you)[ \t]+(?:should[ \t]+|can[ \t]+|must[ \t]+)?(?:choose|pick|select|go[ \t]+with))" + _VERB
)
# weaker phrases: used only when no answer phrase or box names an option
_WEAK_RE = re.compile(
    r"(?i)\b(?:corresponds?[ \t]+to|corresponding[ \t]+to|matches|which[ \t]+is|that[ \t]+is|aligns[ \t]+with|"
    r"consistent[ \t]+with|points[ \t]+to|leads[ \t]+(?:us[ \t]+)?to|closest[ \t]+to)(?:[ \t]+(?:the[ \t]+)?"
    r"(?:answer|option|choice))?[ \t]*[:：]?[ \t]*(?=(?:option|choice)\b|[\(\[][A-Z][\)\]]|\*\*\(?[A-Z]\b|\\\([ \t]*[A-Z][ \t]*\\\)|"
    r"\$[A-Z]\$|[A-Z][.)]?(?:[ \t,;]|$))"
    r"|\b(?:is|are|be|as|to|by|list|of)[ \t]+(?=(?:option[ \t]+)?\([A-Z]\)[ \t]*[.,;]?[ \t]*(?:\n|$))"  # "... is (B)": a bracketed letter only
)
# "C. logical behaviorism", "(E) children with hearing impairments": a letter followed by its option's text
_CITED_RE = re.compile(r"(?<=[ \t:*])(?:\(([A-Z])\)|([A-Z])\.)[ \t]+")
# a later option in the same sentence: "(E) ... or (D) ...", "(H) wage inflation and (I) cost-push inflation"
# "... or B (London)": after "or" a bare letter counts when a bracket or the sentence's end follows it
_HEDGE_RE = re.compile(
    r"\b(?:or|and|nor|vs\.?|versus)[ \t]+(?:(?:option|choice)[ \t]+)?[\(\[]([A-Z])[\)\]]"
    r"|\b(?:or|nor|vs\.?|versus)[ \t]+(?:(?:option|choice)[ \t]+)?([A-Z])(?=\)|[ \t]*\(|[ \t]*[.,;]?[ \t]*$)"
    # "B, but it could also be A": a second answer offered in the same sentence
    r"|\b(?:could|might|may)[ \t]+(?:also[ \t]+|equally[ \t]+)?be[ \t]+(?:(?:option|choice)[ \t]+)?"
    r"\(?([A-Z])\)?(?=[ \t]*[.,;!?(]|[ \t]*$)"
    # "B, though C is also possible", "B (A is also acceptable)"
    r"|(?:^|(?<=[ \t(]))(?:(?:option|choice)[ \t]+)?\(?([A-Z])\)?[ \t]+(?:is|would[ \t]+be|could[ \t]+be|seems)[ \t]+"
    r"also[ \t]+(?:possible|correct|acceptable|plausible|valid|right|true|defensible)\b"
)
_ALONE_RE = (
    re.compile(  # a line that is only an option: "(C)", "C.", "Option (C).", "C: Paris", "(B) Paris, ..."
        r"^(?:(?:the[ \t]+)?(?:option|choice|answer|letter)[ \t]*[:.]?[ \t]*)?"
        r"(?:\([A-Z]\)|\[[A-Z]\]|[A-Z](?:[.):]|$))(?:[ \t]*(.*))?$",
        re.IGNORECASE,
    )
)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# what lies between two boxes that answer together: "$\boxed{A}$ or $\boxed{B}$", "\boxed{A}, \boxed{B}"
_BOX_GAP_RE = re.compile(
    r"(?:\s|\$|\\[()\[\],;]|\\q?quad\b|[,;/&|]|\bor\b|\band\b|\bvs\b\.?)*", re.IGNORECASE
)
_BOX_GAP_MAX = 40
_BRACE_RE = re.compile(r"[{}]")
_MARKUP_RE = re.compile(
    r"\\(?:text|textbf|mathrm|mathbf|mbox|textit|mathit|operatorname|bf|it|rm)\s*\{([^{}]*)\}"
)
_MATH_DELIM_RE = re.compile(r"\\[()\[\]]|\$\$?|\\displaystyle|\\quad|\\,|\\;|\\ ")
_DECOR_RE = re.compile(r"[*_`#~>\"“”]")
# an answer phrase that says no option is right: weak phrases before it do not count
_NONE_RE = re.compile(
    r"(?i)[ \t(*]*(?:none|not|cannot|can't|unable|n/?a\b|no[ \t]+(?:correct|option|answer|single))"
)
_NEGATIVE_RE = re.compile(
    r"(?i)\b(?:incorrect|wrong|false|not|unlikely|eliminat\w*|rule[ds]?\s+out|except)\b"
)


def _box_contents(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every ``\\boxed{...}`` with balanced braces."""
    boxes = list(_BOXED_RE.finditer(text))
    if not boxes:
        return []
    # each brace's partner in one pass (a box's content ends at the partner of its opening brace), so
    # many unclosed boxes cost no more than one
    partner: dict[int, int] = {}
    open_at: list[int] = []
    for b in _BRACE_RE.finditer(text, boxes[0].end() - 1):
        if b.group() == "{":
            open_at.append(b.start())
        elif open_at:
            partner[open_at.pop()] = b.start()
    out = []
    for m in boxes:
        end = partner.get(m.end() - 1)
        if end is not None:
            out.append((m.start(), end + 1, text[m.end() : end]))
    return out


def _clean(s: str) -> str:
    """Markup off: LaTeX text commands and math delimiters, Markdown emphasis, quotes."""
    if "\\" in s or "$" in s:
        s = _MARKUP_RE.sub(r"\1", _MARKUP_RE.sub(r"\1", s))
        s = _MATH_DELIM_RE.sub(" ", s)
    return _DECOR_RE.sub("", s).strip()


_ASCII_ALNUM = (string.ascii_letters + string.digits).encode()
_NON_TEXT_RE = re.compile(r"[^\w\s.-]")
_SPACES_RE = re.compile(r"\s+")
_UPPER_RE = re.compile(r"[A-Z]")
_CONDITION_RE = re.compile(r"[ \t]*[.,)]?[ \t]*(?:if|only[ \t]+if|assuming|provided|were)\b")


@functools.lru_cache(maxsize=8192)  # the same option texts come back with every response to a row
def _norm_text(s: str) -> str:
    return _SPACES_RE.sub(" ", _NON_TEXT_RE.sub("", s.lower())).strip(" .")


_TEXT_JOIN_RE = re.compile(r"^ (?:or|and|nor|vs\.?|versus) ")


def _text_hits(s: str, options: dict[str, str]) -> list[str]:
    """The options whose text ``s`` is or starts with (the longest when one text is a prefix of another);
    with another option's text joined after it ("Paris or London"), both: a hedge."""
    t = _norm_text(s)
    hits = [k for k, v in options.items() if (n := _norm_text(v)) and (t == n or t.startswith(n + " "))]
    if len(hits) > 1:
        hits = [max(hits, key=lambda k: len(options[k]))]
    if hits and (j := _TEXT_JOIN_RE.match(t[len(_norm_text(options[hits[0]])) :])):
        rest = t[len(_norm_text(options[hits[0]])) + j.end() :]
        return list(dict.fromkeys(hits + _text_hits(rest, options)))
    return hits


def read_letters(content: str, letters: str, options: dict[str, str] | None) -> list[str]:
    """The distinct option letters ``content`` names as its answer (empty: none; two or more: a hedge)."""
    s = _clean(content)
    if not s:
        return []
    m = _LETTERS_ONLY_RE.match(s)
    if m:  # "AC", "A, C", "(A/B)": several letters and nothing else
        found = list(dict.fromkeys(_UPPER_RE.findall(m.group(1))))
        if all(c in letters for c in found):
            return found
    m = _LOWER_ALONE_RE.match(s)
    if m and m.group(1).upper() in letters:
        return [m.group(1).upper()]
    m = _FIRST_RE.match(s)
    if m and m.group(1).upper() in letters:
        c, lead = m.group(1), s[: m.start(1)].lower()
        named = any(w in lead for w in ("option", "choice", "letter"))
        # "(b)": a bracketed lower-case letter is an option, never the article "a" (nor a roman "(i)")
        bracketed = s[m.start(1) - 1 : m.start(1)] in ("(", "[") and s[m.end(1) : m.end(1) + 1] in (")", "]")
        if c.isupper() or named or (bracketed and c not in "ivx"):
            c = c.upper()
            rest = s[m.end() :]
            bare = m.end() == m.end(1)  # no bracket or punctuation closes the letter
            # "I think ...", "A neutron star": English, unless a joining word or the option's text follows
            w = _NEXT_WORD_RE.match(rest) if bare and c in "AI" and not named else None
            if (
                w
                and w.group(1) not in _JOIN_WORDS
                and not (options and _text_hits(s[m.start(1) + 1 :], options))
            ):
                return _text_hits(s, options) if options else []
            if _CONDITION_RE.match(rest):
                return []  # "(B) if the profit were higher": a condition, not an answer
            found = [c]
            while (more := _MORE_RE.match(rest) or _ADJACENT_RE.match(rest)) and more.group(1) in letters:
                found.append(more.group(1))
                rest = rest[more.end() :]
            tail = _LIST_TAIL_RE.match(rest)
            if tail:  # every option listed as the answer
                found += [x for x in _UPPER_RE.findall(tail.group(1)) if x in letters]
            sentence = rest.split(". ", 1)[0]
            found += [
                h
                for hm in _HEDGE_RE.finditer(sentence)
                if (h := hm.group(1) or hm.group(2) or hm.group(3) or hm.group(4)) in letters
            ]
            return list(dict.fromkeys(found))
    return _text_hits(s, options) if options else []


def _rest_of_line(text: str, start: int) -> str:
    end = text.find("\n", start, start + _REST)
    return text[start : end if end >= 0 else start + _REST]


def _next_line(text: str, start: int) -> str:
    """The next non-empty line after the one holding ``start`` (for "The answer is:" ending its line)."""
    i = text.find("\n", start)
    while 0 <= i < len(text) - 1:
        j = text.find("\n", i + 1)
        line = text[i + 1 : j if j >= 0 else len(text)]
        if line.strip():
            return line[:_REST]
        if j < 0:
            break
        i = j
    return ""


def _alone(line: str, letters: str, options: dict[str, str] | None) -> list[str]:
    """The letter of a line that is only an option ("(C)", "Option (C).", "C: Paris", "(B) Paris, because
    ..."), else []. Trailing text must be the option's text when the row gives it; without options it must
    be short and say nothing negative ("A) is wrong because ..." is reasoning, not an answer)."""
    s = _clean(line)
    m = _ALONE_RE.match(s)
    if m is None:
        if not options:
            return []
        texts = {_norm_text(v) for v in options.values()}
        # the normal form keeps every ASCII letter and digit: a line with more of them than the longest
        # option text is none of them (counted in C: a long last line is the common case)
        b = s.encode("utf-8", "surrogatepass")
        if len(b) - len(b.translate(None, _ASCII_ALNUM)) > max(map(len, texts)):
            return []
        return _text_hits(s, options) if _norm_text(s) in texts else []
    tail = (m.group(1) or "").strip(" \t.;,!")
    got = read_letters(s[: len(s) - len(m.group(1) or "")], letters, options)
    if len(got) != 1 or not tail:
        return got
    if options:
        return got if got == _text_hits(tail, options) else []
    return got if len(tail) <= 80 and not _NEGATIVE_RE.search(tail) else []


# Reading from the end. A phrase that names an option ends the search, so the reading goes backwards and
# runs a pattern only over stretches of the text where it can match. Every answer phrase holds one of
# _PHRASE_KEYS (lower case) and none holds a _PHRASE_STOPS character, so each match lies inside one stretch
# between two stops that holds a key; every weak phrase holds one of _WEAK_KEYS and lies inside one line.
# A stretch scanned alone gives the matches a scan of the whole text gives in it: the scan before it ends
# at a stop, which no match crosses, and the pattern's \b sees the character before the stretch.
_PHRASE_KEYS = (
    "answer",
    "opt",  # option, opt for
    "choice",
    "select",  # selection
    "response",
    "statement",
    "conclusion",
    "pick",
    "choose",
    "say",  # I'd say
    "go ",  # go with
    "go\t",
)
_PHRASE_STOPS = ("\n", ".", ",", "(", ")", "*", "$", ";", "?", "!")
_PHRASE_STOP_RE = re.compile(r"[\n.,()*$;?!]")
_NEWLINE_RE = re.compile(r"\n")
# A weak phrase's first word ("corresponds to", "which is", ...); the other kind ("... is (B)") needs a line
# that ends with a bracket.
_WEAK_WORDS = (
    "correspond",
    "matches",
    "which",
    "that",
    "aligns",
    "consistent",
    "points",
    "leads",
    "closest",
)
_WEAK_KEYS = (*_WEAK_WORDS, ")")
# The characters other than A-Z and a-z that IGNORECASE matches to an ASCII letter; ``str.lower`` leaves
# some of them alone (and turns U+0130 into two characters), so a text holding one is read unfiltered.
_FOLDS_TO_ASCII = ("\u0130", "\u0131", "\u017f", "\u212a")
_SCAN_WHOLE_BELOW = 160  # characters: below this a scan of the whole text is cheaper than finding stretches


def _stretches_from_end(
    low: str, keys: tuple[str, ...], stops: tuple[str, ...], stop_re: re.Pattern[str], start: int
) -> Iterator[tuple[int, int]]:
    """(first, end) of each stretch of ``low[start:]`` between two ``stops`` that holds one of ``keys``,
    the last first (the first stretch begins at ``start``). Linear in the text: each key's and each stop's
    backward searches cover the text once, and each forward search for a stretch's end stops at the stretch
    given before."""
    last = {k: low.rfind(k, start) for k in keys}  # the last place of each key before the stretches given
    before = {c: low.rfind(c, start) for c in stops}
    end = len(low)
    while (p := max(last.values())) >= 0:
        for c, q in before.items():
            if q >= p:
                before[c] = low.rfind(c, start, p)
        first = max(max(before.values()) + 1, start)
        stop = stop_re.search(low, p, end)
        yield first, stop.start() if stop else end
        end = first
        for k, q in last.items():
            if q >= first:
                last[k] = low.rfind(k, start, first)


def _weak_matches(text: str, low: str, ls: int, le: int) -> list[re.Match[str]]:
    """The matches of _WEAK_RE that a scan of the whole text finds in its line ``text[ls:le]``."""
    # The scan ends two characters past the line's \n: a weak phrase's look-ahead reads up to that \n,
    # and ``$`` then matches only where it matches in the whole text (at a \n that ends it).
    endpos = min(le + 2, len(text))
    if text[ls:le].rstrip(" \t.,;").endswith(")"):  # "... is (B).": either kind can match: scan the line
        return [m for m in _WEAK_RE.finditer(text, ls, endpos) if m.start() < le]
    # Only the first kind can match, and it starts where one of its first words does: trying the pattern
    # there, left to right past each match, finds what the scan finds.
    starts = []
    for w in _WEAK_WORDS:
        i = low.find(w, ls, le)
        while i >= 0:
            starts.append(i)
            i = low.find(w, i + 1, le)
    out: list[re.Match[str]] = []
    pos = ls
    for i in sorted(starts):
        if i >= pos and (m := _WEAK_RE.match(text, i, endpos)):
            out.append(m)
            pos = m.end()
    return out


def _lines_from_end(text: str, low: str, keys: tuple[str, ...], start: int) -> Iterator[tuple[int, int]]:
    """(first, end) of each line of ``text[start:]`` that holds one of ``keys`` in ``low``, the last first
    (the first line begins at ``start``)."""
    return _stretches_from_end(low, keys, ("\n",), _NEWLINE_RE, start)


def extract_choice(
    response: str, *, letters: str = LETTERS, options: dict[str, str] | None = None
) -> tuple[list[str], str]:
    """(letters of the final answer, how it was found): the last box or answer phrase that names an
    option, else the last weak phrase, else the last line when it is an option alone; ``([], "none")``
    when nothing is found."""
    text = response.rsplit("</think>", 1)[1] if "</think>" in response else response
    box: tuple[int, list[str]] | None = None
    if "boxed" in text or "fbox" in text:
        box_end = -1
        for pos, end, content in _box_contents(text):
            got = read_letters(content, letters, options)
            if got:
                # a box right after another, alone or joined by "or"/"and"/a comma, answers with it: a hedge
                # when they differ (a later box after other text is a correction and stands alone)
                if (
                    box is not None
                    and 0 <= pos - box_end <= _BOX_GAP_MAX
                    and _BOX_GAP_RE.fullmatch(text, box_end, pos)
                ):
                    got = list(dict.fromkeys(box[1] + got))
                box, box_end = (pos, got), end
    box_pos = box[0] if box is not None else -1
    # ``low`` None: the patterns scan the whole text, which is what the stretches stand for: a short text
    # costs less that way, and one holding a character IGNORECASE folds to ASCII must be read so
    whole = len(text) < _SCAN_WHOLE_BELOW or (not text.isascii() and any(c in text for c in _FOLDS_TO_ASCII))
    low = None if whole else text.lower()
    # weak phrases count only after the line of the last answer phrase that names no option
    strong_end: int | None = None
    spans = (
        _stretches_from_end(low, _PHRASE_KEYS, _PHRASE_STOPS, _PHRASE_STOP_RE, 0)
        if low is not None
        else iter([(0, len(text))])
    )
    for ls, le in spans:
        if le <= box_pos:
            break  # a phrase before the last box does not count
        for m in reversed(list(_PHRASE_RE.finditer(text, ls, le))):
            if m.start() < box_pos:
                break
            rest = _rest_of_line(text, m.end())
            if strong_end is None and _NONE_RE.match(rest):
                strong_end = m.end() + len(rest)
            got = (
                read_letters(rest, letters, options)
                if rest.strip()
                else _alone(_next_line(text, m.end()), letters, options)
            )
            if got:
                return got, "phrase"
    if box is not None:
        return box[1], "boxed"
    last_par = max(text.rstrip().rfind("\n\n"), 0)  # weak phrases count in the final paragraph only
    weak_from = max(last_par, strong_end or 0)
    lines = (
        _lines_from_end(text, low, _WEAK_KEYS, weak_from)
        if low is not None
        else iter([(weak_from, len(text))])
    )
    for ls, le in lines:
        found = _weak_matches(text, low, ls, le) if low is not None else list(_WEAK_RE.finditer(text, ls))
        for m in reversed(found):
            got = read_letters(_rest_of_line(text, m.end()), letters, options)
            if got:
                return got, "weak_phrase"
    stripped = text.rstrip()
    last = stripped[stripped.rfind("\n") + 1 :]
    if options:  # the last line cites an option with its text: "... is known as C. logical behaviorism."
        cited = [
            c
            for m in _CITED_RE.finditer(last)
            if (c := m.group(1) or m.group(2)) in letters
            and _text_hits(_clean(last[m.end() : m.end() + _REST]), options) == [c]
        ]
        if cited:  # two options cited with their texts are a hedge
            return list(dict.fromkeys(cited)), "cited"
    got = _alone(last, letters, options)
    before = stripped[: len(stripped) - len(last)].rstrip()
    if got and not _ALONE_RE.match(
        _clean(before[before.rfind("\n") + 1 :])
    ):  # not the end of a list of options
        return got, "last_line"
    return [], "none"


def _options(ground_truth: Any, extra_info: dict[str, Any] | None) -> dict[str, str] | None:
    for src in (ground_truth if isinstance(ground_truth, dict) else {}, extra_info or {}):
        opts = src.get("options", src.get("choices"))
        if isinstance(opts, dict) and opts:
            # letter order, not the dict's: an index key counts from A whatever order the row lists them in
            return dict(sorted((str(k).strip().upper(), str(v)) for k, v in opts.items()))
        if isinstance(opts, (list, tuple)) and opts:
            if len(opts) > len(LETTERS):
                raise ValueError(f"{len(opts)} options: at most {len(LETTERS)} (A-Z) are supported")
            return {LETTERS[i]: str(v) for i, v in enumerate(opts)}
    return None


def gold_letter(ground_truth: Any, options: dict[str, str] | None) -> str:
    """The key as a letter; ValueError when it names no valid option."""
    letters = "".join(options) if options else LETTERS
    gt = (
        ground_truth.get("answer", ground_truth.get("label"))
        if isinstance(ground_truth, dict)
        else ground_truth
    )
    tolist = getattr(gt, "tolist", None)
    if callable(tolist) and not isinstance(gt, str):
        gt = tolist()  # a numpy integer or array, as a VeRL batch or a parquet row carries it
    if isinstance(gt, (list, tuple)) and len(gt) == 1:
        gt = gt[0]
    if isinstance(gt, int) and not isinstance(gt, bool):
        if 0 <= gt < len(letters):
            return letters[gt]
        raise ValueError(f"answer index {gt} is out of range for {len(letters)} options")
    if isinstance(gt, str):
        got = read_letters(gt, letters, options)
        if len(got) == 1:
            return got[0]
    raise ValueError(f"ground truth {ground_truth!r} names no single option among {letters[0]}-{letters[-1]}")


def mc_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    format_score: float = 0.0,
    **kwargs: Any,
) -> RewardResult:
    """1 when the response's one final answer is the key's option; ``format_score`` (default 0) for a
    wrong or several answers; ``unparseable`` (score 0) when it names no option."""
    try:
        options = _options(ground_truth, extra_info)
        gold = gold_letter(ground_truth, options)
    except ValueError as e:
        return RewardResult.failure(Status.ERROR, f"multiple choice: {e}")
    letters = "".join(options) if options else LETTERS
    got, how = extract_choice(solution_str, letters=letters, options=options)
    if not got:
        return RewardResult(score=0.0, status=Status.UNPARSEABLE, info={"how": how, "gold": gold})
    ok = len(got) == 1 and got[0] == gold
    return RewardResult(
        score=1.0 if ok else float(format_score),
        status=Status.OK,
        extracted=",".join(got),
        info={"how": how, "gold": gold, "multiple": len(got) > 1},
    )


register_reward(
    "multiple_choice",
    "mc",
    "arith_mc",
    "mmlu*",
    "cais/mmlu",
    "TIGER-Lab/MMLU-Pro",
    "gpqa*",
    "Idavidrein/gpqa",
    "supergpqa",
    "m-a-p/SuperGPQA",
    "ability:multiple_choice",
    fast=mc_compute_score,  # the whole verifier, inline (regexes over one response)
)(mc_compute_score)
