"""Breaking out of zero pass rate: prompts whose group once had no passing response, and how many of
them a later group solved (issue 16's "prompts solved later")."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from stepcredit.config import from_dict
from stepcredit.trainer import train
from stepcredit.trainer.metrics import ZeroPassTracker
from stepcredit.types import RewardResult, Sample, Status


def never(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return 0.0


def _batch(groups: dict[str, list[float]]) -> Any:
    samples, rewards = [], []
    for uid, scores in groups.items():
        for s in scores:
            samples.append(Sample(prompt=({"role": "user", "content": uid},), ground_truth="1", uid=uid))
            rewards.append(RewardResult(score=s, status=Status.OK))
    return SimpleNamespace(samples=samples, rewards=rewards)


def test_counts_by_hand() -> None:
    t = ZeroPassTracker()
    # a and c have no passing response; b passes
    assert t.update(_batch({"a": [0, 0], "b": [0, 1], "c": [0, 0]})) == {
        "prompts/zero_pass": 2.0,
        "prompts/zero_pass_revisited": 0.0,
        "prompts/zero_pass_solved_later": 0.0,
    }
    # a comes back and one response passes; c comes back still stuck; d is new and stuck;
    # b (never stuck) fails now: it joins the stuck ones, it was not stuck before
    m = t.update(_batch({"a": [1, 0], "c": [0, 0], "d": [0, 0], "b": [0, 0]}))
    assert m == {
        "prompts/zero_pass": 4.0,  # a, b, c, d
        "prompts/zero_pass_revisited": 2.0,  # a, c
        "prompts/zero_pass_solved_later": 1.0,  # a
    }
    # an error result is not a pass even with a positive score field
    m = t.update(
        SimpleNamespace(
            samples=[Sample(prompt=({"role": "user", "content": "c"},), ground_truth="1", uid="c")],
            rewards=[RewardResult(score=1.0, status=Status.ERROR)],
        )
    )
    assert m["prompts/zero_pass_solved_later"] == 1.0
    back = ZeroPassTracker()
    back.load_state_dict(json.loads(json.dumps(t.state_dict())))  # checkpoints carry it
    assert back.update(_batch({"d": [1]}))["prompts/zero_pass_solved_later"] == 2.0


def test_a_run_counts_prompts_that_come_back(tmp_path: Path) -> None:
    cfg = from_dict(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
            "data": {"train_size": 4, "val_size": 4},
            "sft": {"steps": 0},
            "rollout": {"prompts_per_step": 4, "n": 2, "max_new_tokens": 8},
            "reward": {
                "agent": {"backend": "thread"},
                "custom": {"path": f"{__file__}:never", "isolate": False},
            },
            "trainer": {"steps": 3, "val_every": 0, "save_every": 0, "progress": False, "tensorboard": False},
        }
    )
    train(cfg, tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "prompts/zero_pass" in r]
    # 4 training prompts, every step draws all 4, nothing ever passes
    assert [r["prompts/zero_pass"] for r in rows] == [4.0, 4.0, 4.0]
    assert [r["prompts/zero_pass_revisited"] for r in rows] == [0.0, 4.0, 4.0]
    assert [r["prompts/zero_pass_solved_later"] for r in rows] == [0.0, 0.0, 0.0]
