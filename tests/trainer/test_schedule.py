"""The RL learning-rate schedules (optim.schedule): values by hand, start-up checks, a run through train."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stepcredit.cli.main import main
from stepcredit.trainer.schedule import LR_SCHEDULES, lr_factor, short_run_warning


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


def test_warmup_then_the_schedule_from_the_configured_lr() -> None:
    # 10 warm-up steps of 100: step s <= 10 gets s/10 (step 10 is the peak, exactly lr); then the cosine
    # runs over the 90 steps left: step 10 + t gets m + (1 - m)(1 + cos(pi t / 90))/2, m = 0.1
    def f(s: int) -> float:
        return lr_factor(s, total=100, warmup=10, schedule="cosine", min_ratio=0.1)

    assert [f(s) for s in (1, 5, 10)] == pytest.approx([0.1, 0.5, 1.0])
    assert f(55) == pytest.approx(0.1 + 0.9 * 0.5)  # t = 45 of 90: halfway down
    assert f(11) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 90)) / 2)
    assert f(100) == pytest.approx(0.1) and f(120) == pytest.approx(0.1)
    # the peak is the configured lr whatever the length: the largest factor of a 12-step run is 1
    assert (
        max(lr_factor(s, total=12, warmup=10, schedule="cosine", min_ratio=0.0) for s in range(1, 13)) == 1.0
    )
    assert lr_factor(5, total=100, warmup=10, schedule="constant", min_ratio=0.1) == pytest.approx(0.5)
    assert lr_factor(20, total=100, warmup=0, schedule="constant", min_ratio=0.1) == 1.0


def test_a_run_shorter_than_its_warmup_is_warned_at_start_up() -> None:
    # 3 steps of a 10-step warm-up: the lr peaks at 3/10 of 3e-5 = 9e-6
    w = short_run_warning(steps=3, warmup=10, lr=3.0e-5)
    assert w is not None and "peaks at 9e-06, not optim.lr=3e-05" in w
    assert short_run_warning(steps=10, warmup=10, lr=3.0e-5) is None  # step 10 reaches lr


def test_a_run_logs_the_decayed_learning_rate(tmp_path: Path, tiny_train: list[str]) -> None:
    args = [*tiny_train, "sft.steps=2", "trainer.steps=4", "trainer.val_every=0", "trainer.save_every=0"]
    args += ["optim.lr=1e-3", "optim.warmup_steps=1", "optim.schedule=cosine", "optim.min_lr_ratio=0.2"]
    assert main(["train", *args, "--out", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["optim/lr"] for r in rows if "optim/lr" in r]
    # step 1 ends the 1-step warm-up at lr; steps 2-4 are t = 1, 2, 3 of the 3 cosine steps left
    want = [1e-3] + [1e-3 * (0.2 + 0.8 * (1 + math.cos(math.pi * t / 3)) / 2) for t in range(1, 4)]
    assert lrs == pytest.approx(want)
    assert lrs[-1] == pytest.approx(0.2e-3)  # the floor at the last step


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
