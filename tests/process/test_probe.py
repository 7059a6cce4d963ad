"""The signal probe: injected traces keep their format; its figures by hand; the command end to end."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from stepcredit.config import ArithConfig
from stepcredit.data.arith import make_rows
from stepcredit.data.wrong_step import inject_wrong_step
from stepcredit.process.probe import (
    ProbeCase,
    case_indicators,
    credit_indicators,
    solvable_figures,
    verdict,
)
from stepcredit.process.values import PrefixRequest
from stepcredit.stats import spearman, wilson_interval
from stepcredit.types import Sample


def _template(text: str) -> str:
    return re.sub(r"\d+", "N", text)


def test_injection_by_hand() -> None:
    text = "Let me start with 5. So 5 + 3 = 8. But 8 - 2 = 6. Hmm, 6 pens so far. The answer is 6."
    inj = inject_wrong_step(text, random.Random(0), deltas=(1,))
    assert inj is not None
    # the first equation (not the last one) gets 8 -> 9; then 9 - 2 = 7, and 6 -> 7 everywhere after
    assert (
        inj.text == "Let me start with 5. So 5 + 3 = 9. But 9 - 2 = 7. Hmm, 7 pens so far. The answer is 7."
    )
    assert (inj.old, inj.new, text[inj.position]) == ("8", "9", "8")


def test_injection_keeps_a_slip_and_skips_its_correction() -> None:
    text = "So 4 + 7 = 12. Wait, 4 + 7 = 11. So 11 + 2 = 13. The answer is 13."
    # candidates: "11 + 2 = 13" only (4 + 7 = 12 is wrong, "Wait, 4 + 7 = 11" corrects it) -> 13 -> 15
    inj = inject_wrong_step(text, random.Random(0), deltas=(2,))
    assert (
        inj is not None and inj.text == "So 4 + 7 = 12. Wait, 4 + 7 = 11. So 11 + 2 = 15. The answer is 15."
    )
    # a slip after the wrong step keeps its offset: 9 + 1 = 10 written 11 (+1), carried 10 -> 12 gives 13
    text = "So 3 + 6 = 9. So 9 + 1 = 11. Wait, 9 + 1 = 10. The answer is 10."
    inj = inject_wrong_step(text, random.Random(0), deltas=(2,))
    assert (
        inj is not None and inj.text == "So 3 + 6 = 11. So 11 + 1 = 13. Wait, 11 + 1 = 12. The answer is 12."
    )


def test_injection_on_gsm8k_format() -> None:
    text = "She sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72 clips.\n#### 72"
    inj = inject_wrong_step(text, random.Random(0), deltas=(-2,))
    # 24 -> 22 inside the calculator annotation, the number after it, and carried: 48+22 = 70
    assert inj is not None
    assert inj.text == "She sold 48/2 = <<48/2=22>>22 clips.\nIn all 48+22 = <<48+22=70>>70 clips.\n#### 70"
    assert inject_wrong_step("No numbers here.", random.Random(0)) is None


def test_injected_arith_traces_keep_the_format() -> None:
    cfg = ArithConfig(
        min_steps=6, max_steps=10, max_operand=30, mistake_prob=0.3, slip_prob=0.1, waste_prob=0.2
    )
    rng = random.Random(1)
    for row in make_rows(cfg, 40, seed=3, split="val"):
        text = row["extra_info"]["solution"]
        inj = inject_wrong_step(text, rng)
        assert inj is not None
        assert _template(inj.text) == _template(text)  # same words, only numbers differ
        assert inj.text[: inj.position] == text[: inj.position]
        final = int(inj.text.rsplit(" ", 1)[1].rstrip("."))
        assert final != int(row["reward_model"]["ground_truth"])  # the error reached the answer
        # every equation after the wrong one is right again about its own operands, or off by its slip
        for clean, bad in zip(
            re.findall(r"(\d+) ([-+]) (\d+) = (\d+)", text),
            re.findall(r"(\d+) ([-+]) (\d+) = (\d+)", inj.text),
            strict=True,
        ):
            err = lambda a, s, b, r: int(r) - (int(a) + int(b) if s == "+" else int(a) - int(b))  # noqa: E731
            if bad != clean and bad[3] != inj.new:
                assert err(*bad) == err(*clean)


def _case(step: int, n: int) -> ProbeCase:
    req = PrefixRequest(Sample(prompt=(), ground_truth="1"), [], [], list(range(n + 1)), "1")
    return ProbeCase(req, req, step, step)


def test_indicators_by_hand() -> None:
    clean = [0.5, 0.5, 0.75, 1.0]  # U = 0, 0.25, 0.25
    bad = [0.5, 0.5, 0.0, 0.0]  # U = 0, -0.5, 0: the wrong step is episode 1
    got = case_indicators(clean, bad, _case(1, 3))
    assert got == {
        "lower": 1.0,
        "argmin": 1.0,
        "chance": pytest.approx(1 / 3),
        "argmin_next": 1.0,  # the step or the next (episodes 1, 2): 2 of 3 episodes
        "chance_next": pytest.approx(2 / 3),
        "final_drop": 1.0,
        "v_before": 0.5,  # V_1, before episode 1
        "v_after": 0.0,  # V_2
    }
    # the minimum shared by two episodes: half a hit; U equal to the clean one: not lower
    got = case_indicators([0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], _case(2, 3))
    assert got["lower"] == 0.0 and got["argmin"] == 0.0 and got["final_drop"] == 0.0
    # bad U = -0.5, -0.5: the minimum is shared by two episodes, so a hit counts 1/2; both are within
    # the wrong step (0) or the next (1), so argmin_next is 1
    got = case_indicators([1.0, 1.0, 1.0], [1.0, 0.5, 0.0], _case(0, 2))
    assert got["argmin"] == 0.5 and got["argmin_next"] == 1.0 and got["chance_next"] == 1.0


def test_credit_indicators_by_hand() -> None:
    clean = [0.5, 0.5, 0.75, 1.0]  # U = 0, 0.25, 0.25
    bad = [0.5, 0.75, 0.25, 0.5]  # U = 0.25, -0.5, 0.25: the wrong step is episode 1
    case = _case(1, 3)
    # difference: c = U; bad c_1 = -0.5 is the unique minimum and below the clean 0.25
    got = credit_indicators(clean, bad, case, form="difference")
    assert got == {"lower": 1.0, "argmin": 1.0, "chance": pytest.approx(1 / 3)}
    # min_form (PURE): G_t = min_{i >= t} U_i, c_t = G_t - G_(t+1), G_3 = 0.
    #   bad:   G = [-0.5, -0.5, 0.25] -> c = [0, -0.75, 0.25]
    #   clean: G = [0, 0.25, 0.25]    -> c = [-0.25, 0, 0.25]; bad c_1 = -0.75 < clean c_1 = 0
    got = credit_indicators(clean, bad, case, form="min_form")
    assert got == {"lower": 1.0, "argmin": 1.0, "chance": pytest.approx(1 / 3)}
    # watermark (MIG): W = running max of V, c_i = W_i - W_(i-1) >= 0.
    #   bad: W = 0.5, 0.75, 0.75, 0.75 -> c = [0.25, 0, 0]: the minimum 0 ties over episodes 1 and 2
    #   clean: c = [0, 0.25, 0.25]; bad c_1 = 0 < 0.25
    got = credit_indicators(clean, bad, case, form="watermark")
    assert got == {"lower": 1.0, "argmin": 0.5, "chance": pytest.approx(1 / 3)}
    # where the forms disagree: V = 0.5, 0.2, 0.0, 0.0 (U = -0.3, -0.2, 0), wrong step 1. The largest
    # single drop is episode 0, but min-form's c = G_t - G_(t+1) with G = [-0.3, -0.2, 0] gives
    # c = [-0.1, -0.2, 0]: the step after which the trace never recovers its worst level is episode 1
    bad = [0.5, 0.2, 0.0, 0.0]
    assert credit_indicators(clean, bad, case, form="difference")["argmin"] == 0.0
    assert credit_indicators(clean, bad, case, form="min_form")["argmin"] == 1.0
    # thirds: U = -1/3 three times, equal up to the last bit of the float: a three-way tie, 1/3 of a hit
    assert credit_indicators(clean, [1.0, 2 / 3, 1 / 3, 0.0], case, form="difference")[
        "argmin"
    ] == pytest.approx(1 / 3)
    assert case_indicators(clean, [1.0, 2 / 3, 1 / 3, 0.0], case)["argmin"] == pytest.approx(1 / 3)
    # clipping (process.clip) is applied before the form: |U| <= 0.1 ties episodes 0 and 1 at -0.1
    assert credit_indicators(clean, bad, case, form="difference", clip=0.1)["argmin"] == 0.5


def test_solvable_figures_by_hand() -> None:
    # trace 0 (3 episodes): hit; trace 1 (2 episodes): a tie over both, half a hit; trace 2 unsolvable
    by_case = {
        0: case_indicators([0.5, 0.5, 0.75, 1.0], [0.5, 0.5, 0.0, 0.0], _case(1, 3)),
        1: case_indicators([1.0, 1.0, 1.0], [1.0, 0.5, 0.0], _case(0, 2)),
        2: case_indicators([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], _case(0, 2)),
    }
    got = solvable_figures(by_case, {0, 1})
    # argmin (1 + 0.5) / 2 = 0.75; chance (1/3 + 1/2) / 2 = 5/12; ratio 0.75 / (5/12) = 1.8
    assert got is not None and got.n == 2 and got.argmin == 0.75
    assert got.chance == pytest.approx(5 / 12) and got.argmin_vs_chance == pytest.approx(1.8)
    assert got.v_before == 0.75 and got.v_after == 0.25  # (0.5 + 1.0) / 2, (0.0 + 0.5) / 2
    # two traces cannot rule chance out: Wilson's interval of 0.75 at n=2 reaches below 5/12
    assert got.argmin_ci.low < got.chance and got.verdict == "too few traces"
    assert solvable_figures(by_case, set()) is None and solvable_figures(by_case, None) is None


def test_wilson_interval_and_verdict_by_hand() -> None:
    # p = 0.5, n = 20, z = 1.96: centre (0.5 + z^2/40) / (1 + z^2/20) = 0.5;
    # half-width z sqrt(0.25/20 + z^2/1600) / (1 + z^2/20) = 1.96 * 0.122069 / 1.19208 = 0.200704
    ci = wilson_interval(0.5, 20)
    assert ci.low == pytest.approx(0.299296, abs=1e-5) and ci.high == pytest.approx(0.700704, abs=1e-5)
    # n = 40: half-width 1.96 * sqrt(0.25/40 + z^2/6400) / (1 + z^2/40) = 0.148010
    ci40 = wilson_interval(0.5, 40)
    assert ci40.low == pytest.approx(0.351990, abs=1e-5)
    # all hits or none: the interval stays inside [0, 1] and is one-sided at the observed end
    assert wilson_interval(0.0, 10).low == 0.0 and wilson_interval(1.0, 10).high == pytest.approx(1.0)
    assert verdict(ci, 0.2, 20) == "signal"  # 0.299 > 0.2: the whole interval above chance
    assert verdict(ci, 0.35, 20) == "too few traces"  # reaches chance with n < 30
    assert verdict(ci40, 0.4, 40) == "no signal"  # reaches chance with enough traces
    assert all(math.isnan(x) for x in wilson_interval(0.3, 0))  # no traces: no interval


def test_spearman_by_hand() -> None:
    # ranks of x: 0, 1, 2, 3; of y: 0, 2, 1, 3 -> d^2 = 0 + 1 + 1 + 0 = 2 -> 1 - 6*2/(4*15) = 0.8
    assert spearman([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0]) == pytest.approx(0.8)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman([1.0, 1.0], [0.0, 1.0]) != spearman([1.0, 1.0], [0.0, 1.0])  # nan: no spread


def test_probe_command_on_a_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stepcredit.cli.main import main

    png = tmp_path / "probe.png"
    argv = ["probe", "--model", "tiny", "--data", "arith", "--n", "3", "--png", str(png), "--json"]
    argv += ["--estimators", "forced_answer_logprob,monte_carlo", "trainer.threads=1"]
    argv += ["process.mc_samples=2", "process.mc_max_new_tokens=6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["n"] == 3 and set(summary["estimators"]) == {"forced_answer_logprob", "monte_carlo"}
    for m in summary["estimators"].values():
        assert 0.0 <= m["argmin"] <= 1.0 and m["s_per_trace"] > 0
    assert 0.0 < summary["chance"] <= 1.0
    # which V is compared with which is read from the registry: the one without a verifier against the
    # reference (the first that needs one)
    assert summary["rank_correlation"]["x"] == "forced_answer_logprob"
    assert summary["rank_correlation"]["y"] == "monte_carlo"
    assert summary["solvable_by"] == "monte_carlo" and 0 <= summary["n_solvable"] <= 3
    assert summary["not_correct"] == 0  # every clean solution is verified correct before it is corrupted
    # every registered credit form is scored beside each estimator; difference is the table's plain U
    from stepcredit.process import CREDIT_FORMS, VALUE_ESTIMATORS

    for name, m in summary["estimators"].items():
        # a form that compares V with a certain success is scored only on values that are chances of it
        spec = VALUE_ESTIMATORS.get(name)
        forms = {
            f
            for f in CREDIT_FORMS
            if spec.success_probability or not CREDIT_FORMS.get(f).needs_success_probability
        }
        assert set(m["credits"]) == forms and ("blame" in forms) == spec.success_probability
        assert m["credits"]["difference"]["all"]["argmin"] == pytest.approx(m["argmin"])
        assert m["credits"]["difference"]["all"]["lower"] == pytest.approx(m["lower"])
        # three traces: an interval around the hit rate, and too few traces for a verdict either way
        assert m["argmin_ci"]["low"] <= m["argmin"] <= m["argmin_ci"]["high"]
        assert m["vs_chance_ci"]["low"] == pytest.approx(m["argmin_ci"]["low"] / m["chance"])
        assert m["verdict"] in ("signal", "too few traces")
    assert "credit form" in out
    # a noisy teacher (every SFT trace with an uncorrected slip) does not leak into the probe's solutions
    argv = ["probe", "--model", "tiny", "--data", "arith", "--n", "3", "--json"]
    argv += [
        "--estimators",
        "forced_answer_logprob",
        "trainer.threads=1",
        "data.arith.teacher_error_prob=1.0",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n"] == 3 and summary["not_correct"] == 0
    assert "x chance" in out and png.stat().st_size > 1000
    assert "verdict" in out and "[95%" in out
    # three arith traces of as many episodes: the position baseline is reported beside chance
    assert all("same_length" in m for m in summary["estimators"].values())


def test_probe_command_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stepcredit.cli.main import main

    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"data_source": "x", "prompt": "q", "reward_model": {"ground_truth": "1"}}) + "\n"
    )
    assert main(["probe", "--model", "tiny", "--data", str(rows)]) == 2
    assert f"{rows}:1: no solution text" in capsys.readouterr().err
    assert main(["probe", "--model", "tiny", "--data", "arith", "--estimators", "oracle"]) == 2
    assert "unknown 'oracle'" in capsys.readouterr().err
    assert main(["probe", "--model", "tiny", "--data", "arith", "--credits", "sum_of_squares"]) == 2
    assert "--credits: unknown 'sum_of_squares'" in capsys.readouterr().err


def _figures_of(name: str, hits: int, n: int, *, solvable_hits: int = 0, n_solvable: int = 0, s: float = 1.0):
    """An estimator's figures from ``hits`` of ``n`` traces whose argmin fell on the wrong step, with
    4 episodes per trace (chance 0.25), and the same on ``n_solvable`` of them."""
    from stepcredit.process.probe import EstimatorFigures, locating

    def rows(k: int, m: int) -> list[dict[str, float]]:
        return [{"lower": 1.0, "argmin": float(i < k), "chance": 0.25} for i in range(m)]

    return EstimatorFigures(
        name=name, all=locating(rows(hits, n)),
        solvable=locating(rows(solvable_hits, n_solvable)) if n_solvable else None,
        argmin_next=0.0, chance_next=0.5, argmin_next_vs_chance=0.0, final_drop=0.0, s_per_trace=s,
        unscored=0, credits={},
    )  # fmt: skip


def test_the_probe_ends_with_one_recommendation_consistent_with_its_verdicts() -> None:
    from stepcredit.process.probe import recommend

    # 24 of 40 hits: rate 0.6, Wilson 95 % [0.446, 0.737] -> 1.78x-2.95x chance, wholly above 1: signal.
    # 16 of 40: 0.4, [0.264, 0.554] -> 1.06x-2.22x: a signal too, with a lower lower bound.
    strong = _figures_of("monte_carlo", 24, 40, solvable_hits=3, n_solvable=6)
    weak = _figures_of("forced_answer_logprob", 16, 40)
    assert strong.all.verdict == weak.all.verdict == "signal"
    # the subset (3 of 6 solvable traces: [0.188, 0.812] reaches 0.25) is "too few traces" on its own:
    # quoted, not a contradiction
    assert strong.solvable is not None and strong.solvable.verdict == "too few traces"
    rec = recommend({"forced_answer_logprob": weak, "monte_carlo": strong})
    assert rec.estimator == "monte_carlo"
    assert "1.78-2.95x" in rec.reason and "also: forced_answer_logprob" in rec.reason
    assert "too few for a verdict of their own" in rec.reason
    # 10 of 40: 0.25 = chance, interval [0.142, 0.404] reaches it with n >= 30: no signal -> none
    none = recommend({"forced_answer_logprob": _figures_of("forced_answer_logprob", 10, 40)})
    assert none.estimator is None and none.reason.startswith("none: ")
    # 3 of 10: too few traces to tell: none yet, and the advice to probe more
    few = recommend({"monte_carlo": _figures_of("monte_carlo", 3, 10)})
    assert few.estimator is None and few.reason.startswith("none yet") and "--n" in few.reason


def test_a_signal_that_the_wrong_steps_position_explains_is_not_recommended() -> None:
    from dataclasses import replace

    from stepcredit.process.probe import PositionBaseline, recommend
    from stepcredit.stats import Interval

    strong = _figures_of("monte_carlo", 24, 40)
    # against the wrong steps of other traces as long it hits as often as against its own
    same = PositionBaseline(40, 0.6, 0.58, Interval(-0.05, 0.09))
    rec = recommend({"monte_carlo": replace(strong, same_length=same)})
    assert rec.estimator is None and "points at a position" in rec.reason and "0.580" in rec.reason
    beats = PositionBaseline(40, 0.6, 0.3, Interval(0.15, 0.45))
    rec = recommend({"monte_carlo": replace(strong, same_length=beats)})
    assert rec.estimator == "monte_carlo" and "(0.600 against 0.300 on 40)" in rec.reason


def test_the_tables_position_and_recommendation_lines() -> None:
    from stepcredit.process.probe import PositionBaseline, Recommendation, position_lines
    from stepcredit.stats import Interval

    assert position_lines({"a": None}, "anything") == []
    b = PositionBaseline(12, 0.5, 0.25, Interval(0.1, 0.4))
    lines = position_lines({"a": None, "monte_carlo": b}, "the label of every other trace")
    assert len(lines) == 2 and "against the label of every other trace, beside the own" in lines[0]
    assert lines[1].split()[0] == "monte_carlo" and "own 0.500, swapped 0.250 on 12 traces" in lines[1]
    assert "+0.250 [95% +0.100, +0.400] -> beats position" in lines[1]
    use = Recommendation("greedy_continuation", "it hits")
    assert use.describe() == "recommendation: process.value_estimator=greedy_continuation: it hits"
    assert Recommendation(None, "none: x").describe() == "recommendation: no process rewards: none: x"


def test_figures_are_written_headless_into_a_new_folder(tmp_path: Path) -> None:
    from stepcredit.plotting import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    out = save(fig, tmp_path / "new" / "dir" / "f.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)  # closed, not left open in a long run
