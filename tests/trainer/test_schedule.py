"""The RL learning-rate schedules (optim.schedule): values by hand, start-up checks, a run through train."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stepcredit.cli.main import main
from stepcredit.trainer.schedule import LR_SCHEDULES, lr_factor


def test_cosine_by_hand() -> None:
    # m + (1 - m)(1 + cos(pi t/T))/2 with m = 0.1, T = 100: t = 0 -> 1, t = 50 -> 0.1 + 0.9 * 0.5 = 0.55,
    # t = 100 -> 0.1, and it stays at the floor after T (a resumed run with more steps)
    cos = LR_SCHEDULES.get("cosine")
    assert cos(0, 100, 0.1) == pytest.approx(1.0)
    assert cos(50, 100, 0.1) == pytest.approx(0.55)
    assert cos(25, 100, 0.1) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)
    assert cos(100, 100, 0.1) == pytest.approx(0.1)
    assert cos(150, 100, 0.1) == pytest.approx(0.1)
    assert LR_SCHEDULES.get("constant")(73, 100, 0.1) == 1.0


def test_warmup_multiplies_the_schedule() -> None:
    # step 5 of a 10-step warm-up: 0.5 x the cosine at 5/100
    want = 0.5 * (0.1 + 0.9 * (1 + math.cos(math.pi * 0.05)) / 2)
    assert lr_factor(5, total=100, warmup=10, schedule="cosine", min_ratio=0.1) == pytest.approx(want)
    assert lr_factor(5, total=100, warmup=10, schedule="constant", min_ratio=0.1) == pytest.approx(0.5)
    assert lr_factor(20, total=100, warmup=0, schedule="constant", min_ratio=0.1) == 1.0


def test_a_run_logs_the_decayed_learning_rate(tmp_path: Path, tiny_train: list[str]) -> None:
    args = [*tiny_train, "sft.steps=2", "trainer.steps=4", "trainer.val_every=0", "trainer.save_every=0"]
    args += ["optim.lr=1e-3", "optim.warmup_steps=1", "optim.schedule=cosine", "optim.min_lr_ratio=0.2"]
    assert main(["train", *args, "--out", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["optim/lr"] for r in rows if "optim/lr" in r]
    want = [1e-3 * (0.2 + 0.8 * (1 + math.cos(math.pi * t / 4)) / 2) for t in range(1, 5)]
    assert lrs == pytest.approx(want)


@pytest.mark.parametrize(
    ("override", "key"),
    [("optim.schedule=cosin", "optim.schedule"), ("optim.min_lr_ratio=2", "optim.min_lr_ratio")],
)
def test_a_bad_schedule_fails_at_start_up(
    tmp_path: Path, tiny_train: list[str], override: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *tiny_train, override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]
