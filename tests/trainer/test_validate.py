"""Validation accuracy per tag equals a manual count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from stepcredit.cli.main import main
from stepcredit.reward import Rewarder
from stepcredit.trainer import validate as val_mod
from stepcredit.types import Sample


def test_per_tag_accuracy_matches_a_manual_count(monkeypatch: pytest.MonkeyPatch) -> None:
    tags = ["easy", "easy", "easy", "hard", "hard", "gsm"]
    truths = ["1", "2", "3", "4", "5", "6"]
    answers = ["1", "2", "0", "4", "0", "0"]  # easy 2/3, hard 1/2, gsm 0/1; overall 3/6
    samples = [
        Sample(prompt=({"role": "user", "content": f"q{i}"},), ground_truth=t, data_source="arith", tag=g)
        for i, (g, t) in enumerate(zip(tags, truths, strict=True))
    ]
    texts = [f"So it is. The answer is {a}." for a in answers]

    class Out:
        def __init__(self, n: int, start: int) -> None:
            self.texts = texts[start : start + n]
            self.response_mask_BT = torch.ones(n, 3, dtype=torch.bool)

    calls: list[int] = []

    def fake_generate(model: Any, tok: Any, part: list[Sample], **kw: Any) -> Out:
        start = sum(calls)
        calls.append(len(part))
        return Out(len(part), start)

    monkeypatch.setattr(val_mod, "generate", fake_generate)
    with Rewarder() as r:
        m, rows = val_mod.validate(None, None, samples, r, max_new_tokens=8, chunk=4)
    manual: dict[str, list[bool]] = {}
    for g, t, a in zip(tags, truths, answers, strict=True):
        manual.setdefault(g, []).append(t == a)
    for g, v in manual.items():
        assert m[f"val/accuracy/{g}"] == pytest.approx(sum(v) / len(v))
    assert m["val/accuracy"] == pytest.approx(0.5)
    assert [row["score"] for row in rows] == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    # Status counts next to accuracy: every answer here was scored (wrong answers are ok, not errors).
    assert m["val/status/ok"] == 6.0 and not any(
        k.startswith("val/status/") and k != "val/status/ok" for k in m
    )
    assert [row["status"] for row in rows] == ["ok"] * 6


def test_sampled_validation_uses_common_random_numbers(tmp_path: Path, tiny_train: list[str]) -> None:
    """Sampled validation draws from its own generator seeded by (seed, step): validating more often
    leaves the training run's random stream alone, and the same step is scored with the same draws."""
    common = [
        *tiny_train,
        "sft.steps=2",
        "trainer.steps=4",
        "trainer.save_every=0",
        "rollout.val_temperature=1.0",
    ]
    common += ["data.val_size=16"]
    rows = {}
    for every in (1, 2):
        out = tmp_path / f"every{every}"
        assert main(["train", *common, f"trainer.val_every={every}", "--out", str(out)]) == 0
        rows[every] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    by_step = {e: {r["step"]: r for r in rs if "reward/mean" in r} for e, rs in rows.items()}
    assert by_step[1].keys() == by_step[2].keys() == {1, 2, 3, 4}
    for step in (1, 2, 3, 4):  # the same training samples whatever the validation schedule
        assert by_step[1][step]["reward/mean"] == by_step[2][step]["reward/mean"]
    for step in (2, 4):  # the same validation answers at the steps both validated
        assert by_step[1][step]["val/accuracy_sampled"] == by_step[2][step]["val/accuracy_sampled"]
        assert by_step[1][step]["val/response_length/mean"] == by_step[2][step]["val/response_length/mean"]
