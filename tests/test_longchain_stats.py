"""Issue 38's statistics in benchmarks/longchain_experiment.py: the paired t-test (over the seeds where
both arms have a figure; the t distribution is stepcredit.recipes.stats's) and the estimators.json
summary."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from stepcredit.recipes.stats import t_quantile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import longchain_experiment as L


def test_paired_test_by_hand() -> None:
    # differences 1, 1, 2, 4: mean 2, sample sd sqrt((1 + 1 + 0 + 4) / 3) = sqrt 2, SE = sqrt(2) / 2,
    # t = 2 / (sqrt(2) / 2) = 2 sqrt 2 with 3 df (scipy.stats.ttest_rel: p = 0.06627560...)
    tt = L.paired_test([1.0, 2.0, 3.0, 5.0], [0.0, 1.0, 1.0, 1.0])
    assert tt["mean_diff"] == 2.0 and tt["df"] == 3
    assert tt["se"] == pytest.approx(2**0.5 / 2) and tt["t"] == pytest.approx(2 * 2**0.5)
    assert tt["p"] == pytest.approx(0.0662756027, rel=1e-6)
    half = t_quantile(0.975, 3) * tt["se"]
    assert tt["ci95"] == pytest.approx([2.0 - half, 2.0 + half])
    # a seed without a figure (NaN: the run died) leaves the pairing: differences 1, 2 of seeds 0 and 2
    gap = L.paired_test([1.0, math.nan, 3.0], [0.0, 1.0, 1.0])
    assert gap["n"] == 2 and gap["df"] == 1 and gap["mean_diff"] == 1.5


def test_estimators_json_from_run_directories(tmp_path: Path) -> None:
    # two seeds, validation at steps 0, 1, 2 with 10 samples per step. Baseline finals 0.3, 0.5: target
    # 0.4. The oracle variant reaches 0.4 at step 1 on seed 0 (10 samples) and never on seed 1 (the whole
    # budget, 2 x 10 = 20 samples).
    def write(name: str, accs: list[float]) -> Path:
        run = tmp_path / name
        run.mkdir()
        rows = [{"step": i, "val/accuracy": a, "time/step_s": 1.0} for i, a in enumerate(accs)]
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        return run

    runs = {
        "mid_grpo": [write("g0", [0.2, 0.25, 0.3]), write("g1", [0.2, 0.3, 0.5])],
        "mid_oracle": [write("o0", [0.2, 0.4, 0.45]), write("o1", [0.2, 0.3, 0.35])],
    }
    out = L.estimators_json(runs, [0, 1], per_step=10, steps=2, baseline="mid_grpo")
    assert out["baseline"] == "mid_grpo" and out["target_accuracy"] == pytest.approx(0.4)
    o = out["variants"]["mid_oracle"]
    assert o["oracle"] and not out["variants"]["mid_grpo"]["oracle"]
    assert o["seeds"] == [0, 1] and o["final"] == [0.45, 0.35] and o["samples_to_target"] == [10.0, 20.0]
    assert out["variants"]["mid_grpo"]["samples_to_target"] == [20.0, 20.0]
    # paired final differences 0.15, -0.15: mean 0, t = 0 with 1 df, p = 1
    tt = o["vs_baseline"]["final"]
    assert tt["mean_diff"] == pytest.approx(0.0) and tt["df"] == 1 and tt["p"] == pytest.approx(1.0)
