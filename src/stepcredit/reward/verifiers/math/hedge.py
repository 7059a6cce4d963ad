"""Responses that hedge their final answer: sure "incorrect" verdicts the fast path gives before comparing.

Found by red-teaming the verifier with responses written to game it (``tests/reward/verifiers/test_math_redteam.py``).
A careful grader marks each of these wrong, and without this module each got credit on some truth:

* **two final-answer markers that disagree**: a ``\\boxed{}`` and GSM8K's ``#### N`` naming different
  values ("\\boxed{5} ... #### 2"). The fast path read the later marker and math-verify the box, so either
  truth was credited and a policy could write one candidate in each. Several boxes that differ are left
  to math-verify, which reads them as one set of answers: equal to neither truth, so wrong for either
  (stricter than VeRL's last-box rule, ``last_boxed_only_string``, which would credit the last one).
* **a box retracted by a later answer phrase**: "The answer is \\boxed{3}. Wait, that's wrong. The answer is 4."
  Both VeRL (the last box) and math-verify (a box outranks "the answer is") read 3, so a policy was paid
  for a box it then disowned. A careful grader sees two final answers and marks it wrong for either truth,
  as for a box and a ``####``. Only two exact numbers that surely differ count (``fast._sure_different``):
  "\\boxed{2\\sqrt{3}} ... the answer is about 3.46" and "the answer is 12 square units" stay right. A
  "final answer is" after the box is no rival: it is the answer (``extract_answer``, as math-verify ranks it).
* **a hedge against a number**: "2 or 3", "2, 3, 4", "\\geq 2", "at least 2", "2 or more", "2 (or 3)". Only when every
  truth is a plain number: where the truth is itself a pair of roots or a bound, the same words are the answer.

Each check is a substring test on short text in the common case (no ``####``, no " or ", no bound sign, no
"answer" after the last box).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from stepcredit.reward.verifiers.latex import normalize
from stepcredit.reward.verifiers.math.extract import (
    _ANSWER_WORD_RE,
    _HASH_RE,
    _PHRASE_RES,
    _balanced,
    _clean_phrase,
    last_boxed,
)
from stepcredit.reward.verifiers.math.fast import _sure_different, fast_verdict
from stepcredit.reward.verifiers.math.mv_read import _plain_number

# "or"/"and" followed by another number ("2 or 3", "2 \text{ (or 3)}", "2 and 3"); a list ("2, 3, 4": a comma then a
# space, so "1,234" stays one number); a bound with no left side ("\geq 2",
# "< 3"); words that make a bound of a number ("at least 2", "2 or more"). "approximately 2" is not here:
# it qualifies one value.
_HEDGE_RE = re.compile(
    r"(?i)\b(?:or|and)\b[^0-9\n]{0,24}\d"
    r"|\d\s*,\s+[-−+]?\d"
    r"|^\s*(?:\\[lg]eq?(?:slant)?(?![a-zA-Z])|\\[lg]t(?![a-zA-Z])|[<>≤≥])"
    r"|\b(?:at\s+(?:least|most)|(?:more|less|fewer)\s+than|or\s+(?:more|less|fewer))\b"
)
# what every hedge holds: one C-level scan rules out the common answer ("18", "\\frac{1}{2}") at once
_CHEAP_RE = re.compile(r"(?i)[,<>≤≥]|\\[lg]|or|and|at\s|than")


def hedges(pred: str, golds: Sequence[str]) -> bool:
    """Whether ``pred`` hedges ("2 or 3", "\\geq 2", "at least 2") while every truth is a plain number."""
    if not _CHEAP_RE.search(pred) or not _HEDGE_RE.search(pred):
        return False
    return all(_plain_number(g.strip()) is not None for g in golds)


def markers_disagree(body: str, boxes: Sequence[str]) -> bool:
    """Whether a ``\\boxed{}`` and a ``#### N`` of ``body`` name values that surely differ."""
    if not boxes or "####" not in body:
        return False
    hashes = [_clean_phrase(h) or h.strip() for h in _HASH_RE.findall(body)]
    return any(h and fast_verdict(b, h) is False for b in set(boxes) for h in set(hashes))


# The answer-word phrases of extract._PHRASE_RES ("final answer", "the answer is", "Answer:"), not GSM8K's
# "A: 26", which a model also writes when it runs on into an invented next few-shot question.
_ANSWER_PHRASE_RES = _PHRASE_RES[:3]
_APPROX_RE = re.compile(
    r"(?i)approx|≈|\\sim(?![a-zA-Z])|\b(?:about|around|roughly|nearly|almost|close\s+to)\b"
)


def box_retracted(body: str) -> bool:
    """Whether an answer phrase after the last ``\\boxed{}`` of ``body`` names a number that surely
    differs from the box's ("\\boxed{3}. Wait, that's wrong. The answer is 4."): two final answers."""
    last = last_boxed(body)
    if last is None:
        return False
    pos, content = last
    brace = body.find("{", pos)
    got = _balanced(body, brace) if brace >= 0 else None
    if got is None or got[0] != content:
        return False  # "\\boxed 5": no rival read
    end = got[1]
    if _ANSWER_WORD_RE.search(body, end) is None:
        return False  # the common case: nothing after the box names an answer
    box = normalize(content)
    for rx in _ANSWER_PHRASE_RES:
        for m in rx.finditer(body, end):
            tail = m.group(1)
            if _APPROX_RE.search(tail):
                continue
            cand = _clean_phrase(tail)
            # the raw tail goes in too: "the answer is 50%" reads as 50, but its sign says 0.5
            if cand and _sure_different(content, tail, box, normalize(cand)):
                return True
    return False
