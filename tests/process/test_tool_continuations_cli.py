"""The tools preset through the command line with continuation values: ``monte_carlo`` and
``greedy_continuation`` continue the tool rollouts' turn prefixes as tool rollouts, through the run's
reward-agent tool runner, and give values in [0, 1]."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import stepcredit.process.continuation as continuation
import stepcredit.trainer.rollout as trainer_rollout
from stepcredit.cli.main import main
from stepcredit.reward.tools import AgentCallRunner


@pytest.mark.parametrize("estimator", ["monte_carlo", "greedy_continuation"])
def test_tools_preset_with_continuation_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, estimator: str, tools_smoke: list[str]
) -> None:
    runners: list[Any] = []
    values: list[list[float]] = []
    run_turns, with_values = continuation.run_turns, trainer_rollout.with_values

    def spy_turns(model: Any, tok: Any, rows: Any, tools: Any, **kw: Any) -> Any:
        runners.append(tools.runner)
        return run_turns(model, tok, rows, tools, **kw)

    def spy_values(*a: Any, **kw: Any) -> Any:
        batch, unscored = with_values(*a, **kw)
        values.extend(v for v in batch.prefix_values or [] if v)
        return batch, unscored

    monkeypatch.setattr(continuation, "run_turns", spy_turns)
    monkeypatch.setattr(trainer_rollout, "with_values", spy_values)
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
            f"process.value_estimator={estimator}",
            "process.mc_samples=2",
            "process.mc_max_new_tokens=40",
            "trainer.steps=2",
            "trainer.val_every=0",
            "trainer.save_every=0",
            "trainer.threads=1",
            "--out",
            str(out),
        ]
    )
    assert code in (0, None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows][-1] == 2
    # the continuations ran as tool rollouts, through the trainer's reward-agent runner
    assert runners and all(isinstance(r, AgentCallRunner) for r in runners)
    # every response got V_0..V_S, each a mean verifier score in [0, 1]
    assert len(values) >= 2 * 2 * 2
    assert all(0.0 <= v <= 1.0 and not math.isnan(v) for vs in values for v in vs), values
