"""End to end: a broken reward backend stops a run with one line (exit 2) instead of training silently.

Both tests need the trainer's wiring of ``stepcredit.reward.run.health`` (``probe_routes`` after the
rewarder is built and before SFT; ``CircuitBreaker.update`` on every step's scored results).
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from stepcredit.cli.main import main

TINY_CHANGES = ["trainer.val_every=0", "trainer.save_every=0"]
"""What this file's runs change in the tiny run's overrides (``tiny_train``, tests/conftest.py)."""


def _track_sft(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import stepcredit.trainer.loop as loop
    import stepcredit.trainer.sft as sft

    calls: list[int] = []
    real = sft.run_sft

    def tracked(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(sft, "run_sft", tracked)
    monkeypatch.setattr(loop, "run_sft", tracked, raising=False)
    return calls


def test_multidomain_without_bubblewrap_stops_before_sft(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_train: list[str]
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k)
    )
    sft_calls = _track_sft(monkeypatch)
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "multidomain",
            "--out",
            str(out),
            *tiny_train,
            *TINY_CHANGES,
            "sft.steps=2",
            "trainer.steps=1",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and "'code'" in err[0] and "bubblewrap" in err[0], err
    assert sft_calls == [], "the run reached SFT with a broken sandbox"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_judge_failing_mid_run_stops_at_the_breaker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], loopback_judge: Any, tiny_train: list[str]
) -> None:
    seen = itertools.count(1)  # the start-up probe and the first steps' arith rows get Score: 5, then 500s
    judge = loopback_judge(lambda body: (200 if next(seen) <= 9 else 500, "Score: 5"))
    out = tmp_path / "run"
    args = [
        *tiny_train,
        *TINY_CHANGES,
        "sft.steps=2",
        "trainer.steps=8",
        "reward.domains.arith.fn=judge",
        f"reward.judge.base_url={judge.url}",
        "reward.judge.max_retries=0",
        "reward.judge.backoff_s=0.01",
        "reward.judge.deadline_s=10",
        "reward.breaker.window_steps=3",
        "reward.breaker.min_samples=4",
    ]
    try:
        code = main(["train", "--preset", "multidomain", "--out", str(out), *args])
    finally:
        judge.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    # the judge's error is shown once when it first appears; the stop is the last line and names it
    assert "reward source 'judge'" in err[-1] and "error=" in err[-1] and " x " in err[-1], err
    assert sum(ln.startswith("reward 'judge' failed at step") for ln in err) == 1, err
    steps = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if r.strip()]
    assert 1 <= max(r.get("step", 0) for r in steps) < 8, "stopped mid-run, after some good steps"


ODD_RAISES = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "boxed" not in solution_str and len(solution_str) % 2:  # the start-up probe is boxed: it passes
        raise ValueError(f"cannot read a response of odd length {len(solution_str)}")
    return 1.0 if str(ground_truth) in solution_str else 0.0
"""


@pytest.mark.parametrize("breaker", [True, False])
def test_a_custom_reward_that_raises_is_shown_counted_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_train: list[str], breaker: bool
) -> None:
    fn = tmp_path / "odd.py"
    fn.write_text(ODD_RAISES)
    out = tmp_path / "run"
    args = [*tiny_train, *TINY_CHANGES, "sft.steps=2", "trainer.steps=3", "trainer.progress=true"]
    args += [f"reward.custom.path={fn}", f"reward.breaker.enabled={str(breaker).lower()}"]
    args += [
        "reward.breaker.min_samples=1",
        "reward.breaker.max_failure_share=0.1",
        "reward.breaker.window_steps=1",
    ]
    code = main(["train", "--preset", "smoke", "--out", str(out), *args])
    cap = capsys.readouterr()
    err = cap.err.splitlines()
    rows = [json.loads(x) for x in (out / "reward_errors.jsonl").read_text().splitlines()]
    # every failure in the run directory with its message, traceback (the user's raise) and row
    assert rows and all(
        r["message"].startswith("ValueError: cannot read a response of odd length") for r in rows
    )
    assert all(f'File "{fn}", line 4' in r["traceback"] and len(r["response"]) % 2 for r in rows)
    # shown once on stderr with the raising line
    assert sum(ln.startswith("reward 'custom' failed at step 1 on row ") for ln in err) == 1, err
    assert any("raise ValueError" in ln for ln in err), err
    steps = [ln for ln in cap.out.splitlines() if ln.startswith("step ")]
    assert "reward_failed " in steps[1], steps  # step 1's line counts them
    if breaker:
        assert code == 2
        assert err[-1].startswith("stepcredit train: error: reward source 'custom' failed"), err
        assert f"{len(rows)} x ValueError: cannot read a response of odd length" in err[-1], err
    else:
        assert code == 0
        warnings = [ln for ln in err if ln.startswith("warning: step ")]
        failed_steps = sorted({r["step"] for r in rows})
        assert [int(w.split()[2].rstrip(":")) for w in warnings] == failed_steps
        assert all("x ValueError: cannot read" in w for w in warnings)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["reward_failures"]["failed"] == len(rows)
        assert any(ln.startswith(f"reward failures: {len(rows)} ") for ln in cap.out.splitlines())
