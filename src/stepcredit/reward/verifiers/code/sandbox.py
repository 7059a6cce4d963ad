"""Code rewards: a response's program run against its ground truth's test cases, aggregated into one reward; the scorer for code rows."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from stepcredit.config import SandboxConfig
from stepcredit.sandbox.bwrap import Sandbox
from stepcredit.sandbox.cases import (
    TestCase,
    extract_code,
    outputs_match,
    parse_tests,
    values_match,
)
from stepcredit.sandbox.executors import get_sandbox, make_executor
from stepcredit.sandbox.jail import UID_BASE, UID_COUNT
from stepcredit.sandbox.judging import (
    ERROR,
    FAILED,
    PASSED,
    SANDBOX_ERROR,
    TIMEOUT,
    CaseOutcome,
    Executor,
    judge_report,
    verdict,
)
from stepcredit.types import RewardResult, Sample, Status

__all__ = [  # the names callers imported from here before the split (the executors and judging moved out)
    "ERROR",
    "FAILED",
    "PASSED",
    "SANDBOX_ERROR",
    "TIMEOUT",
    "UID_BASE",
    "UID_COUNT",
    "CaseOutcome",
    "CodeScorer",
    "Executor",
    "Sandbox",
    "TestCase",
    "aggregate",
    "extract_code",
    "get_sandbox",
    "judge_report",
    "make_executor",
    "outputs_match",
    "parse_tests",
    "score_code",
    "score_code_batch",
    "values_match",
    "verdict",
]


_ALL_CASES = {"all": True, "fraction": False}
"""``reward.sandbox.scoring`` -> whether a program must pass every case to score (else the fraction passed)."""


def aggregate(outcomes: Sequence[CaseOutcome], *, scoring: str) -> RewardResult:
    """Turn case verdicts into one reward; any sandbox failure makes the whole result ``sandbox_error``."""
    info: dict[str, Any] = {"cases": [o.to_json() for o in outcomes]}
    bad = [o for o in outcomes if o.status == SANDBOX_ERROR]
    if bad:
        return RewardResult.failure(Status.SANDBOX_ERROR, bad[0].message, **info)
    n_pass = sum(o.status == PASSED for o in outcomes)
    if _ALL_CASES.get(scoring, False):
        score = 1.0 if outcomes and n_pass == len(outcomes) else 0.0
    else:
        score = n_pass / len(outcomes) if outcomes else 0.0
    statuses = {o.status for o in outcomes}
    # the program's own failures have their own statuses: ``timeout``/``error`` mean the reward failed
    status = (
        Status.PROGRAM_TIMEOUT
        if TIMEOUT in statuses
        else Status.PROGRAM_ERROR
        if ERROR in statuses
        else Status.OK
    )
    info["passed"] = n_pass
    info["total"] = len(outcomes)
    first = next((o for o in outcomes if o.status in (TIMEOUT, ERROR)), None)
    if first is not None:
        info["message"] = first.message
    # A program that crashed or hung is the model's fault: a real (low) score, not a masked failure.
    return RewardResult(score=score, status=status, info=info, verdict=True)


def score_code(
    solution_str: str,
    ground_truth: Any,
    *,
    cfg: SandboxConfig | None = None,
    sandbox: Executor | None = None,
) -> RewardResult:
    """Reward of one response: run its last fenced Python block against the ground truth's test cases."""
    return score_code_batch([solution_str], [ground_truth], cfg=cfg, sandbox=sandbox)[0]


def score_code_batch(
    solutions: Sequence[str],
    ground_truths: Sequence[Any],
    *,
    cfg: SandboxConfig | None = None,
    sandbox: Executor | None = None,
) -> list[RewardResult]:
    """Rewards of many responses, their test cases run ``cfg.concurrency`` at a time."""
    sb = sandbox or get_sandbox(cfg or SandboxConfig())
    cfg = sb.cfg
    t0 = time.monotonic()
    results: list[RewardResult | None] = [None] * len(solutions)
    jobs: list[tuple[str, list[TestCase]]] = []
    where: list[int] = []
    for i, (text, gt) in enumerate(zip(solutions, ground_truths, strict=True)):
        code = extract_code(text)
        if code is None:
            results[i] = RewardResult(0.0, Status.UNPARSEABLE, info={"message": "no fenced Python block"})
            continue
        try:
            cases = parse_tests(gt)
        except ValueError as e:
            results[i] = RewardResult.failure(Status.ERROR, str(e))
            continue
        if cfg.max_cases:
            cases = cases[: cfg.max_cases]
        jobs.append((code, cases))
        where.append(i)
    if jobs:
        why = sb.unavailable()
        if why is not None:
            for i in where:
                results[i] = RewardResult.failure(Status.SANDBOX_ERROR, why)
        else:
            verdicts = sb.check_many(jobs, stop_on_failure=_ALL_CASES[cfg.scoring])
            for i, (code, _), outs in zip(where, jobs, verdicts, strict=True):
                res = aggregate(outs, scoring=cfg.scoring)
                res.extracted = code
                results[i] = res
    elapsed = time.monotonic() - t0
    final = []
    for r in results:
        assert r is not None
        r.source = r.source or "code"
        r.latency_s = r.latency_s or elapsed
        final.append(r)
    return final


# ------------------------------------------------------------------------------------ routing
class CodeScorer:
    """The rewarder's scorer for code rows: one executor (``cfg.backend``), its concurrency bound shared by
    the whole batch."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.sandbox = make_executor(cfg)

    def score_batch(self, samples: list[Sample], responses: list[str]) -> list[RewardResult]:
        try:
            return score_code_batch(responses, [s.ground_truth for s in samples], sandbox=self.sandbox)
        except Exception as e:  # a bug of ours must not be scored as the model's fault, nor crash a run
            return [
                RewardResult.failure(Status.SANDBOX_ERROR, f"{type(e).__name__}: {e}", source="code")
            ] * len(samples)

    @staticmethod
    def probe() -> tuple[Any, str, float]:
        """A known-good program for the start-up check (``reward.run.health``): ground truth, response
        and the score it must get. Two assert cases, each in its own child."""
        gt = {"assert_case": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]}
        return gt, "```python\ndef add(a, b):\n    return a + b\n```\n", 1.0


def _register() -> None:
    from stepcredit.reward.base import register_scorer

    # VeRL's code data sources (verl.utils.reward_score.default_compute_score) plus our own "code".
    @register_scorer(
        "code",
        "codecontests",
        "apps",
        "codeforces",
        "taco",
        "primeintellect",
        "livecodebench",
        "ability:code",
    )
    def make_code_scorer(cfg: Any) -> CodeScorer:
        return CodeScorer(cfg.sandbox)


_register()
