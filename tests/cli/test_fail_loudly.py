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
    assert len(err) == 1 and "reward source 'judge'" in err[0] and "error=" in err[0], err
    steps = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if r.strip()]
    assert 1 <= max(r.get("step", 0) for r in steps) < 8, "stopped mid-run, after some good steps"
