"""Reward failures named where the user looks: grouping and counting of errors, the run's record
(stderr once per error, ``reward_errors.jsonl``, a warning per step with the breaker off), the breaker's
stop message, and the traceback a failing function leaves in its result."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from stepcredit.config import BreakerConfig
from stepcredit.reward.run.failures import (
    ERRORS_FILE,
    FailureLog,
    failure_kind,
    format_top,
    top_failures,
    user_traceback,
)
from stepcredit.reward.run.health import CircuitBreaker, RewardBackendError
from stepcredit.reward.run.pool import run_items
from stepcredit.types import RewardResult, Sample, Status


def row(uid: str) -> Sample:
    return Sample(prompt=({"role": "user", "content": "2+2?"},), ground_truth="4", uid=uid)


def failed(message: str, source: str = "custom", status: Status = Status.ERROR, **info: str) -> RewardResult:
    r = RewardResult.failure(status, message, **info)
    r.source = source
    return r


def _raise_on_odd(data_source: str, solution_str: str, ground_truth: str, extra_info: object = None) -> float:
    if len(solution_str) % 2:
        raise ValueError(f"odd length {len(solution_str)}")
    return 1.0


def test_same_error_counts_once_whatever_its_numbers() -> None:
    # Without a traceback, numbers are blanked: "request 17" and "request 18" are one error (2 of them),
    # the other message is another (1); a verdict is no failure. Most frequent first.
    rs = [
        failed("HTTP 500 on request 17", "judge"),
        RewardResult(1.0, source="judge"),
        failed("ImportError: No module named math_verify", "math"),
        failed("HTTP 500 on request 18", "judge"),
    ]
    assert top_failures(rs) == [
        (2, "HTTP 500 on request 17"),
        (1, "ImportError: No module named math_verify"),
    ]
    assert format_top(top_failures(rs, n=1)) == "2 x HTTP 500 on request 17"
    # the same message from two sources is two errors
    assert failure_kind(failed("x", "a")) != failure_kind(failed("x", "b"))
    # with a traceback, the raising line decides: two messages from one line are one error
    tb = 'Traceback (most recent call last):\n  File "/u/r.py", line 3, in f\n    raise ValueError(n)\nValueError: 1\n'
    a, b = failed("ValueError: 1", traceback=tb), failed("ValueError: 2", traceback=tb.replace(": 1", ": 2"))
    assert failure_kind(a) == failure_kind(b) == ("custom", "error", "ValueError", "/u/r.py", "3")


def test_a_raising_function_leaves_its_own_frames_in_the_result() -> None:
    out = run_items(
        _raise_on_odd,
        [("arith", "abc", "4"), ("arith", "ab", "4")],
        {},
        source="custom",
        batched=False,
        out=[],
    )
    bad, good = out
    assert good.ok and good.score == 1.0
    assert bad.status == Status.ERROR and bad.info["message"] == "ValueError: odd length 3"
    tb = bad.info["traceback"]
    # the user's frame (this file, the raise) is there; stepcredit's worker loop is not
    assert __file__ in tb and "raise ValueError" in tb and "pool.py" not in tb
    assert tb.rstrip().endswith("ValueError: odd length 3")
    # batched functions get theirs too
    (b,) = run_items(lambda *a: 1 / 0, [("arith", "ab", "4")], {}, source="custom", batched=True, out=[])
    assert "ZeroDivisionError" in b.info["message"] and "1 / 0" in b.info["traceback"]


def test_user_traceback_keeps_the_last_frames() -> None:
    def inner() -> None:
        raise KeyError("k")

    def outer() -> None:
        inner()

    try:
        outer()
    except KeyError as e:
        text = user_traceback(e, frames=1)
    assert "in inner" in text and "in outer" not in text and text.endswith("KeyError: 'k'\n")


def test_failure_log_prints_each_error_once_and_writes_every_failure(tmp_path: Path) -> None:
    err = io.StringIO()
    log = FailureLog(tmp_path, stream=err)
    tb = 'Traceback (most recent call last):\n  File "/u/r.py", line 3, in f\n    raise ValueError(n)\nValueError: 1\n'
    step1 = [
        failed("ValueError: 1", traceback=tb),
        RewardResult(0.0, source="custom"),
        failed("timeout", status=Status.TIMEOUT),
    ]
    m = log.record([row("r:0"), row("r:1"), row("r:2")], ["a", "b", "c"], step1, step=1)
    assert m == {"reward/failed": 2.0, "reward/failed_frac": pytest.approx(2 / 3)}
    step2 = [failed("ValueError: 2", traceback=tb)] * 3
    assert log.record([row("r:3")] * 3, ["d"] * 3, step2, step=2)["reward/failed"] == 3.0
    text = err.getvalue()
    # two distinct errors, each printed once (the second step's ValueErrors are the first's), with the
    # raising frame and the row; no warning lines with the breaker on
    assert text.count("reward 'custom' failed") == 2 and "warning" not in text
    assert 'File "/u/r.py", line 3' in text and "row r:0" in text and "ground_truth='4'" in text
    rows = [json.loads(x) for x in (tmp_path / ERRORS_FILE).read_text().splitlines()]
    assert [(r["step"], r["row"], r["status"]) for r in rows] == [
        (1, "r:0", "error"),
        (1, "r:2", "timeout"),
        (2, "r:3", "error"),
        (2, "r:3", "error"),
        (2, "r:3", "error"),
    ]
    assert rows[0]["traceback"] == tb and rows[0]["response"] == "a" and rows[0]["prompt"] == "2+2?"
    assert log.summary() == {
        "failed": 5,
        "top": [{"count": 4, "message": "ValueError: 1"}, {"count": 1, "message": "timeout"}],
        "file": ERRORS_FILE,
    }


def test_failure_log_warns_every_step_with_the_breaker_off(tmp_path: Path) -> None:
    err = io.StringIO()
    log = FailureLog(tmp_path, warn=True, stream=err, max_records=2)
    for step in (1, 2):
        log.record([row("r")] * 4, ["x"] * 4, [failed("E: a")] * 3 + [RewardResult(1.0)], step=step)
    log.record([row("r")], ["x"], [RewardResult(1.0)], step=3)  # no failure: no warning
    warnings = [x for x in err.getvalue().splitlines() if x.startswith("warning")]
    assert [w.split(":")[0] for w in warnings] == ["warning", "warning"]
    assert warnings[1].startswith("warning: step 2: 3/4 rewards failed (3 x E: a)")
    assert len((tmp_path / ERRORS_FILE).read_text().splitlines()) == 2  # max_records


def test_breaker_stop_message_names_the_most_frequent_errors() -> None:
    b = CircuitBreaker(BreakerConfig(window_steps=2, max_failure_share=0.5, min_samples=4))
    imp = failed("ImportError: No module named math_verify", "math")
    with pytest.raises(RewardBackendError) as e:
        b.update(
            [imp] * 110
            + [failed("timeout", "math", Status.TIMEOUT)] * 3
            + [RewardResult(1.0, source="math")] * 15,
            step=1,
        )
    msg = str(e.value)
    assert "\n" not in msg and "failed 113/128" in msg
    assert "110 x ImportError: No module named math_verify; 3 x timeout" in msg
