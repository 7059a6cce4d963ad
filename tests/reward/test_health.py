"""Fail loudly: the start-up check of reward routes, the per-source circuit breaker, status counts."""

from __future__ import annotations

import shutil

import pytest

from stepcredit.config import BreakerConfig, RewardConfig, SandboxConfig
from stepcredit.errors import ConfigError
from stepcredit.reward import Rewarder
from stepcredit.reward.run.health import (
    CircuitBreaker,
    RewardBackendError,
    format_counts,
    probe_routes,
    status_counts,
)
from stepcredit.types import RewardResult, Sample, Status


def row(uid: str, **kw: object) -> Sample:
    return Sample(prompt=({"role": "user", "content": "q"},), uid=uid, **kw)  # type: ignore[arg-type]


def ok(source: str, score: float = 1.0) -> RewardResult:
    return RewardResult(score=score, source=source)


def failed(source: str, status: Status = Status.ERROR) -> RewardResult:
    r = RewardResult.failure(status, "down")
    r.source = source
    return r


def test_status_counts_and_format() -> None:
    rs = [ok("math"), ok("math", 0.0), failed("judge"), failed("judge", Status.TIMEOUT), failed("judge")]
    assert status_counts(rs) == {"ok": 2, "error": 2, "timeout": 1}
    assert format_counts(status_counts(rs)) == "error=2 ok=2 timeout=1"


def test_probe_routes_passes_working_math_route() -> None:
    with Rewarder() as r:
        got = probe_routes(r, [row("a", ground_truth="4"), row("b", ground_truth="7")])
    assert list(got) == ["math"] and got["math"].ok


def test_probe_routes_stops_on_a_broken_sandbox_with_one_line() -> None:
    cfg = RewardConfig(sandbox=SandboxConfig(python="/nonexistent/python3"))
    rows = [row("m:0", ground_truth="4"), row("c:1", ground_truth='["assert f() == 1"]', data_source="code")]
    with Rewarder(cfg) as r, pytest.raises(RewardBackendError) as e:
        probe_routes(r, rows)
    msg = str(e.value)
    assert "\n" not in msg and "'code'" in msg and "c:1" in msg and "sandbox_error" in msg


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_probe_routes_runs_the_known_good_program_in_the_sandbox() -> None:
    with Rewarder() as r:
        got = probe_routes(r, [row("c", ground_truth='["assert f() == 1"]', data_source="code")])
    assert got["code"].score == 1.0 and got["code"].info["passed"] == 2


def test_breaker_window_and_threshold() -> None:
    b = CircuitBreaker(BreakerConfig(window_steps=2, max_failure_share=0.5, min_samples=4))
    b.update([failed("judge")] * 3 + [ok("math")] * 4, step=1)  # 3 < min_samples: no trip
    b.update([ok("judge")] * 3 + [ok("math")] * 4, step=2)  # judge 3/6 = 0.5, not above
    b.update([ok("judge")] * 3, step=3)  # step 1 left the window: judge 0/6
    assert b.window_counts()["judge"] == {"ok": 6}
    with pytest.raises(RewardBackendError) as e:
        b.update([failed("judge", Status.TIMEOUT)] * 4, step=4)  # judge 4/7 > 0.5
    msg = str(e.value)
    assert "\n" not in msg and "'judge'" in msg and "4/7" in msg and "timeout=4" in msg and "ok=3" in msg
    assert "step 4" in msg


def test_breaker_ignores_program_faults_and_can_be_disabled() -> None:
    program_crash = RewardResult(score=0.0, status=Status.PROGRAM_ERROR, source="code")
    b = CircuitBreaker(BreakerConfig(min_samples=1))
    assert b.update([program_crash] * 10)["code"] == {"program_error": 10}
    off = CircuitBreaker(BreakerConfig(enabled=False, min_samples=1))
    assert off.update([failed("judge")] * 10)["judge"] == {"!error": 10}


def test_breaker_config_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"reward\.breaker\.max_failure_share"):
        BreakerConfig(max_failure_share=1.0)
    assert RewardConfig().breaker.enabled
