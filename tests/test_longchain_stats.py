"""Issue 38's statistics in benchmarks/longchain_experiment.py: the paired t-test (no scipy in the
project's environment, so the t distribution is computed) and the estimators.json summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import longchain_experiment as L


def test_t_distribution_against_tabulated_values() -> None:
    # scipy.stats.t.sf(2.0, 4) * 2 = 0.11611652351681556; t.ppf(0.975, 4) = 2.7764451051977987,
    # t.ppf(0.975, 7) = 2.3646242510102993; with 1 df the t is Cauchy: p(1) = 1 - 2 atan(1) / pi = 0.5
    assert L.t_two_sided_p(2.0, 4) == pytest.approx(0.11611652351681556, rel=1e-9)
    assert L.t_two_sided_p(-2.0, 4) == pytest.approx(0.11611652351681556, rel=1e-9)
    assert L.t_two_sided_p(1.0, 1) == pytest.approx(0.5, rel=1e-12)
    assert L.t_quantile(0.975, 4) == pytest.approx(2.7764451051977987, rel=1e-9)
    assert L.t_quantile(0.975, 7) == pytest.approx(2.3646242510102993, rel=1e-9)


def test_paired_test_by_hand() -> None:
    # differences 1, 1, 2, 4: mean 2, sample sd sqrt((1 + 1 + 0 + 4) / 3) = sqrt 2, SE = sqrt(2) / 2,
    # t = 2 / (sqrt(2) / 2) = 2 sqrt 2 with 3 df (scipy.stats.ttest_rel: p = 0.06627560...)
    tt = L.paired_test([1.0, 2.0, 3.0, 5.0], [0.0, 1.0, 1.0, 1.0])
    assert tt["mean_diff"] == 2.0 and tt["df"] == 3
    assert tt["se"] == pytest.approx(2**0.5 / 2) and tt["t"] == pytest.approx(2 * 2**0.5)
    assert tt["p"] == pytest.approx(0.0662756027, rel=1e-6)
    half = L.t_quantile(0.975, 3) * tt["se"]
    assert tt["ci95"] == pytest.approx([2.0 - half, 2.0 + half])


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
