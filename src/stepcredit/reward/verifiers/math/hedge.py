"""Responses that hedge their final answer: sure "incorrect" verdicts the fast path gives before comparing.

Found by red-teaming the verifier with responses written to game it (``tests/reward/verifiers/test_math_redteam.py``).
A careful grader marks each of these wrong, and without this module each got credit on some truth:

* **two final-answer markers that disagree**: a ``\\boxed{}`` and GSM8K's ``#### N`` naming different
  values ("\\boxed{5} ... #### 2"). The fast path read the later marker and math-verify the box, so either
  truth was credited and a policy could write one candidate in each. Several boxes alone keep VeRL's rule
  (the last box is the answer: ``last_boxed_only_string``), which credits one candidate only.
* **a hedge against a number**: "2 or 3", "2, 3, 4", "\\geq 2", "at least 2", "2 or more", "2 (or 3)". Only when every
  truth is a plain number: where the truth is itself a pair of roots or a bound, the same words are the answer.

Both checks are a substring test on short text in the common case (no ``####``, no " or ", no bound sign).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from stepcredit.reward.verifiers.math.extract import _HASH_RE, _clean_phrase
from stepcredit.reward.verifiers.math.fast import fast_verdict
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
