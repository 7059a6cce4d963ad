"""``stepcredit sft`` with a tools config: SFT masks the results, and the printed validation answers
with the tool rollout (calls run through the reward layer), as ``stepcredit train`` validates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepcredit.cli.main import main

SMALL = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "data.train_size=32",
    "data.val_size=3",
    "sft.steps=1",
    "sft.batch_size=8",
    "rollout.max_new_tokens=24",
    "trainer.threads=1",
]


@pytest.mark.parametrize("mode", ["tools", "flat"])
def test_sft_validates_with_the_tool_rollout(tmp_path: Path, monkeypatch: Any, mode: str) -> None:
    import stepcredit.trainer.validate as validate

    seen: list[Any] = []
    real = validate.tools_rollout

    def spy(model: Any, tok: Any, request: Any) -> Any:
        seen.append((request.tools.config, request.tools.runner))
        return real(model, tok, request)

    monkeypatch.setattr(validate, "tools_rollout", spy)
    out = tmp_path / "sft"
    assert main(["sft", "--preset", "tools", "--out", str(out), f"rollout.mode={mode}", *SMALL]) in (0, None)
    m = json.loads((out / "sft_metrics.json").read_text())
    assert sum(v for k, v in m.items() if k.startswith("val/status/")) == 3.0  # every prompt scored
    if mode == "flat":
        assert seen == []
        return
    assert len(seen) == 1
    tools, runner = seen[0]
    assert tools.names == ("calculator",) and tools.parser == "fenced"
    assert runner is not None  # the reward layer's runner, not an in-process fallback


def test_train_on_the_noisy_tool_teacher_with_turn_credit_and_dynamic_sampling(tmp_path: Path) -> None:
    # the noisy tool teacher (data.arith.teacher_error_prob on arith_tools) through `stepcredit train`, with
    # the switches experiments/tools_noisy.yaml meets: tools rollout, dynamic sampling (tools_rl), greedy-
    # continuation turn values and their placebo, the process advantage
    out = tmp_path / "run"
    args = ["train", "--preset", "tools_rl", "--out", str(out), *SMALL, "data.arith.teacher_error_prob=0.3",
            "trainer.steps=2", "trainer.val_every=2", "trainer.save_every=0", "rollout.prompts_per_step=2",
            "rollout.n=2", "process.enabled=true", "process.value_estimator=greedy_continuation",
            "process.mc_prefixes=0", "algorithm.advantage=grpo_vineppo", "process.placebo=shuffle_within_response"]  # fmt: skip
    assert main(args) in (0, None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]
    assert max(r["step"] for r in rows) == 2 and all(r.get("reward/failed", 0) == 0 for r in rows)
