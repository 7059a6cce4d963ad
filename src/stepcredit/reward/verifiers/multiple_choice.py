"""The multiple-choice verifier: one option letter (A-Z) read from a response, compared with the key.

Extraction works on the text after the last ``</think>``, and takes the **last** of these that names
an option (a response may discuss options in its reasoning before it answers):

* a ``\\boxed{...}`` (``\\boxed{C}``, ``\\boxed{\\text{C}}``, ``\\boxed{(C)}``);
* an answer phrase: "The answer is (C)", "Answer: C", "Final answer: **C**", "the correct option is C",
  "I choose C"; its rest of line is read;
* the last line when it is only an option: "(C)", "C.", "C)", "**C**", "C: Paris" or the option's text.

What such a place holds is read as a letter in the forms models write (``(C)``, ``C.``, ``C)``,
``**C**``, ``option C``, ``$C$``) or, when the row gives the options, as one option's text.
**One answer only**: a final answer naming several different options ("A or B", "A and C", "A, C",
``\\boxed{AC}``) is wrong (score 0, ``info["multiple"]``), never a lucky match. Nothing found is
``unparseable``.

The key is ``reward_model.ground_truth``: a letter (``"C"``, ``"(C)"``), a 0-based index (MMLU's
``answer`` field), the option's text, or a dict with ``answer`` (and ``options``). The options, when
given, come from the ground-truth dict or ``extra_info`` (``options`` or ``choices``: a list, or a
dict letter -> text); they bound the valid letters (four options: A-D), else A-Z are valid.
"""

from __future__ import annotations

import re
import string
from typing import Any

from stepcredit.reward.base import register_reward
from stepcredit.types import RewardResult, Status

LETTERS = string.ascii_uppercase

# A letter standing alone as an option: (C)  [C]  C.  C)  C:  **C**  $C$  \text{C}; never inside a word.
_LETTER = r"[\(\[]?\s*([A-Z])\s*[\)\]]?(?![A-Za-z0-9'])"
_LEAD = r"^(?:(?:either|both|option|options|choice|choices|letter|probably|clearly|definitely)\s+)*"
_FIRST_RE = re.compile(_LEAD + _LETTER, re.IGNORECASE)
_MORE_RE = re.compile(
    r"^\s*[.):]?\s*(?:,|/|&|\bor\b|\band\b|\bnor\b|\+)\s*(?:(?:option|choice)\s+)?" + _LETTER
)
_LETTERS_ONLY_RE = re.compile(r"^[\(\[]?([A-Z](?:\s*[,/&]?\s*[A-Z])+)[\)\]]?\.?$")
_PHRASE_RE = re.compile(
    r"(?i)(?:\b(?:final|correct|best|right)\s+(?:answer|option|choice)|\bthe\s+answer|\banswer|"
    r"\bI\s+(?:choose|pick|select|go\s+with|would\s+choose|would\s+pick|'d\s+choose|'d\s+pick))"
    r"\s*(?:is|would\s+be|should\s+be|must\s+be|will\s+be|=|:|：)?\s*[:：]?\s*([^\n]*)"
)
_LAST_LINE_RE = re.compile(r"^[\(\[]?[A-Z][\)\]]?(?:[.):]\s*.{0,80})?$")
_BOXED_RE = re.compile(r"\\boxed\s*\{")
_MARKUP_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|textit)\s*\{([^{}]*)\}")


def _box_contents(text: str) -> list[tuple[int, str]]:
    """(position, content) of every ``\\boxed{...}`` with balanced braces."""
    out = []
    for m in _BOXED_RE.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append((m.start(), text[m.end() : i - 1]))
    return out


def _clean(s: str) -> str:
    s = _MARKUP_RE.sub(r"\1", s)
    return re.sub(r"[*_`$#]", "", s).strip()


def _norm_text(s: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s.-]", "", s.lower())).strip(" .")


def read_letters(content: str, letters: str, options: dict[str, str] | None) -> list[str]:
    """The distinct option letters ``content`` names as its answer (empty: none; two or more: a hedge)."""
    s = _clean(content)
    if not s:
        return []
    m = _LETTERS_ONLY_RE.match(s)
    if m:  # "AC", "A, C", "(A/B)": several letters and nothing else
        found = [c for c in dict.fromkeys(re.findall(r"[A-Z]", m.group(1)))]
        if all(c in letters for c in found):
            return found
    m = _FIRST_RE.match(s)
    if (
        m
        and m.group(1).upper() in letters
        and (m.group(1).isupper() or s[: m.end()].lower().startswith(("option", "choice", "letter")))
    ):
        found = [m.group(1).upper()]
        rest = s[m.end() :]
        while (more := _MORE_RE.match(rest)) and more.group(1) in letters:
            found.append(more.group(1))
            rest = rest[more.end() :]
        return list(dict.fromkeys(found))
    if options:  # the option's text itself ("The answer is Paris.")
        t = _norm_text(s)
        hits = [
            k
            for k, v in options.items()
            if _norm_text(v) and (t == _norm_text(v) or t.startswith(_norm_text(v) + " "))
        ]
        if len(hits) > 1:  # one option's text is a prefix of another's: the longest is meant
            hits = [max(hits, key=lambda k: len(options[k]))]
        return hits
    return []


def _options(ground_truth: Any, extra_info: dict[str, Any] | None) -> dict[str, str] | None:
    for src in (ground_truth if isinstance(ground_truth, dict) else {}, extra_info or {}):
        opts = src.get("options", src.get("choices"))
        if isinstance(opts, dict) and opts:
            return {str(k).strip().upper(): str(v) for k, v in opts.items()}
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


def extract_choice(
    response: str, *, letters: str = LETTERS, options: dict[str, str] | None = None
) -> tuple[list[str], str]:
    """(letters of the final answer, how it was found): the last box or answer phrase that names an
    option, else the last line when it is an option alone; ``([], "none")`` when nothing is found."""
    text = response.rsplit("</think>", 1)[1] if "</think>" in response else response
    found: list[tuple[int, list[str], str]] = []
    for pos, content in _box_contents(text):
        got = read_letters(content, letters, options)
        if got:
            found.append((pos, got, "boxed"))
    for m in _PHRASE_RE.finditer(text):
        got = read_letters(m.group(1), letters, options)
        if got:
            found.append((m.start(), got, "phrase"))
    if found:
        _, got, how = max(found, key=lambda f: f[0])
        return got, how
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    last = _clean(lines[-1]) if lines else ""
    # the last line alone: a letter ("(C)", "C.", "**C**"), a letter with its option's text ("C: Paris"),
    # or an option's text; never a sentence that happens to start with "A"
    if _LAST_LINE_RE.match(last) or (
        options and _norm_text(last) in {_norm_text(v) for v in options.values()}
    ):
        got = read_letters(last, letters, options)
        if got:
            return got, "last_line"
    return [], "none"


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


def mc_fast(*args: Any, **kwargs: Any) -> RewardResult:
    """The whole verifier, inline (regexes over one response)."""
    return mc_compute_score(*args, **kwargs)


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
    fast=mc_fast,
)(mc_compute_score)
