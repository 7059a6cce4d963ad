"""The math verifier's scoring: fast verdict first, math-verify for the rest; registered for the math data sources."""

from __future__ import annotations

import re
from typing import Any

from stepcredit.data.prepare import MATH_SOURCES
from stepcredit.reward.base import register_reward
from stepcredit.reward.verifiers.latex import normalize
from stepcredit.reward.verifiers.math.extract import (
    _HASH_RE,
    _STRICT,
    MODES,
    Anchor,
    _boxes,
    _clean_phrase,
    _phrase_hits,
    extract_answer,
    extract_gold,
    strip_think,
)
from stepcredit.reward.verifiers.math.fast import fast_verdict
from stepcredit.reward.verifiers.math.hedge import box_retracted, hedges, markers_disagree
from stepcredit.reward.verifiers.math.mv import (
    _mv_sure_wrong,
    _number_surely_wrong,
    math_verify_verdict,
    reads_alone,
)
from stepcredit.reward.verifiers.math.mv_read import _MV_REGEX_MAX_CHARS, _plain_number
from stepcredit.reward.verifiers.math.mv_scan import mv_reads_only_wrong
from stepcredit.types import RewardResult, Status

# An answer followed by the reason for it: "10, since 2x = 20", "10 (because 2 * 10 = 20)"
_REASON_RE = re.compile(r"(?i)^([^,(]{1,60}?)\s*(?:,|\()?\s*(?:since|because|as|given\s+that)\b")


def _result(ok: bool, extracted: str | None, how: Anchor, *, format_score: float, path: str) -> RewardResult:
    return RewardResult(
        score=1.0 if ok else float(format_score),
        status=Status.OK,
        extracted=extracted,
        info={"how": how.value, "path": path},
    )


def _unparseable(how: Anchor) -> RewardResult:
    return RewardResult(score=0.0, status=Status.UNPARSEABLE, extracted=None, info={"how": how.value})


def _golds(ground_truth: Any) -> list[str]:
    if isinstance(ground_truth, (list, tuple)):
        return [extract_gold(g) for g in ground_truth]
    return [extract_gold(ground_truth)]


def _raw_golds(ground_truth: Any) -> list[str]:
    items = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    return [str(g).strip() for g in items if str(g).strip()]


def sure_candidate(text: str, pred: str, how: Anchor, *, mode: str = "flexible") -> bool:
    """Whether ``pred`` is surely the response's one final answer, so that a mismatch may be called
    "incorrect" without math-verify: found by a strong anchor (``\\boxed{}``, ``#### N``, an answer
    phrase whose whole tail is the answer), with no other candidate (every box, every ``####`` the
    same answer; no box beside a ``####`` or a phrase). Unanchored extractions (the last math, a bare
    response, the last number) and unfinished ``<think>`` blocks are never sure."""
    body = strip_think(text, strict=_STRICT.get(mode, False))
    if body is None or ("<think>" in text and "</think>" not in text):
        return False
    boxes = {normalize(b) for b in _boxes(body)}
    hashes = {normalize(_clean_phrase(h) or h) for h in _HASH_RE.findall(body)}
    want = normalize(pred)
    if how == Anchor.BOXED:
        return boxes == {want} and hashes <= {want}
    if how == Anchor.HASH:
        return hashes == {want} and boxes <= {want}
    if how == Anchor.PHRASE and not boxes and not hashes:
        # the tail of the last phrase, read whole ("18 dollars.", "$\frac{1}{2}$", "**26**"), or the answer
        # before its reason ("10, since 2x = 20": the 20 inside the reason is no second answer)
        last = max(_phrase_hits(body), default=None)
        if last is None:
            return False
        tail = last[1].strip(" *_")
        reason = _REASON_RE.match(tail)
        return normalize(tail) == want or (reason is not None and normalize(reason.group(1)) == want)
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
) -> tuple[RewardResult | None, str | None, Anchor]:
    """:func:`math_fast`'s verdict with the answer it extracted and how (the slow path reads them too)."""
    if mode not in MODES:
        raise ValueError(f"math verifier mode must be one of {MODES}, got {mode!r}")
    golds = [g for g in _golds(ground_truth) if g]
    if not golds:
        return RewardResult.failure(Status.ERROR, f"empty ground truth {ground_truth!r}"), None, Anchor.NONE
    strict = _STRICT[mode]
    pred, how = extract_answer(solution_str, mode=mode)
    if how in (Anchor.LAST_NUMBER, Anchor.NONE) and solution_str.rstrip().endswith("="):
        # cut off before its answer ("She makes 9 * 2 ="): no answer stated, though math-verify reads the
        # left side as one (VeRL's and lm-eval's last number, 2, is no answer either)
        return _unparseable(how), None, how
    body = strip_think(solution_str, strict=strict) or ""
    if pred is None:
        if how is Anchor.NONE and not strict and re.search(r"[\d$\\]", body):
            # math-verify's anchor-free extraction may still read something; without a digit, a
            # dollar sign or a backslash it reads nothing (its readings need one of them)
            return None, pred, how
        return _unparseable(how), pred, how
    boxes = _boxes(body)
    if hedges(pred, golds) or markers_disagree(body, boxes) or (how is Anchor.BOXED and box_retracted(body)):
        # two final answers, or a bound for a number: wrong whatever the truth (see .hedge)
        result = _result(False, pred, how, format_score=format_score, path="fast")
        result.info["hedged"] = True
        return result, pred, how
    several = len({normalize(b) for b in boxes}) > 1
    verdicts = [fast_verdict(g, pred) for g in golds]
    if any(v is True for v in verdicts) and not several:
        return _result(True, pred, how, format_score=format_score, path="fast"), pred, how
    if all(v is False for v in verdicts) and sure_candidate(solution_str, pred, how, mode=mode):
        return _result(False, pred, how, format_score=format_score, path="fast"), pred, how
    if (
        not reads_alone(how, pred)
        and len(body) <= _MV_REGEX_MAX_CHARS
        and not _boxes(body)
        and not any(v is True for v in verdicts)
    ):
        # math-verify would read the response itself (math_verify_verdict): when what it reads first
        # is a plain number, its verdict is known without its parser
        raw = _raw_golds(ground_truth)
        read = _mv_sure_wrong(body, raw) or mv_reads_only_wrong(body, raw)
        if read is not None:
            return _result(False, read, how, format_score=format_score, path="fast"), pred, how
    if how is Anchor.BOXED and not several and not any(v is True for v in verdicts):
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
    strict = _STRICT[mode]  # a known mode: _fast checked it
    if pred is None and strict:
        return _unparseable(how)
    body = strip_think(solution_str, strict=strict) or ""
    extracted: str | None = None
    read_any = False
    for gold in _raw_golds(ground_truth):
        # the reply alone: an answer inside the thinking is not one the reply gives ("<think>so it is
        # 34</think> Sorry, I cannot answer." answers nothing)
        verdict, got = math_verify_verdict(gold, body, pred, how)
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
    *MATH_SOURCES,
    "math_dapo",
    "aime*",
    "arith",
    fast=math_fast,
    # what the fast reader is unsure of goes to math-verify: without it those rows could not be scored
    requires=("math_verify", "latex2sympy2_extended", "antlr4"),
)(math_compute_score)
