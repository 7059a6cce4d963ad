"""The tools preset end to end through the command line, smoke-sized: SFT on the tool traces, then RL
with multi-turn tool rollouts, per-turn oracle credit and validation that calls tools."""

from __future__ import annotations

import json
from pathlib import Path

from stepcredit.cli.main import main


def test_tools_preset_trains_through_the_cli(tmp_path: Path, tools_smoke: list[str]) -> None:
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "tools",
            *tools_smoke,
            "rollout.prompts_per_step=2",
            "rollout.n=2",
            "rollout.max_new_tokens=40",
            "trainer.steps=1",
            "trainer.val_every=1",
            "trainer.save_every=0",
            "--out",
            str(out),
        ]
    )
    assert code in (0, None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    last = rows[-1]
    for key in (
        "tools/calls_per_response",
        "tools/turns_per_response",
        "tools/failed_calls_per_response",
        "tools/turn_limit_reached",
        "process/u_abs_mean",
        "val/accuracy",
    ):
        assert isinstance(last[key], (int, float)), key
    # every response has at least its final turn; a call adds one
    assert last["tools/turns_per_response"] == 1 + last["tools/calls_per_response"]
    assert (out / "config.yaml").read_text().count("mode: tools") == 1
