"""The experiment recipe's parts without training anything: the file's checks end in one line naming the
file and the key, every arm's config is checked before a run starts, and the summary of finished runs
(fabricated ``metrics.jsonl`` files) matches figures computed by hand. The run through the command line is
``tests/cli/test_experiment.py``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from stepcredit.errors import ConfigError, UserError
from stepcredit.recipes import experiment, plan, runs, spec, summary

MC = ["process.enabled=true", "process.value_estimator=monte_carlo", "algorithm.advantage=grpo_vineppo"]


def _good() -> dict[str, Any]:
    return {
        "name": "parts",
        "purpose": "search",
        "baseline": "grpo",
        "seeds": [1, 2],
        "endpoint": {"primary": "last_validations", "last": 2},
        "final_greedy_prompts": 5,
        "sft_model": "/m",
        "common": ["trainer.steps=2", "trainer.val_every=1"],
        "arms": {
            "grpo": {"preset": "smoke"},
            "mc": {"preset": "smoke", "overrides": MC},
            "eq": {"preset": "smoke", "equal_compute_of": "mc", "overrides": ["trainer.steps=4"]},
        },
    }


def _write(tmp_path: Path, raw: Any) -> Path:
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    return f


def _plan(f: Path, out: Path, extra: tuple[str, ...] = ()) -> plan.Plan:
    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict

    def build(preset: str, overrides: list[str]) -> Any:  # what the command builds
        return from_dict(apply_overrides(load_preset(preset), overrides))

    return plan.Plan(spec.load_spec(f), out, Path("/m"), build, extra=extra)


def test_the_public_names_stay_importable_from_experiment() -> None:
    # every public name experiment.py defined before the split (and the archive's since), each the very
    # object of its home
    homes = {
        spec: ["Purpose", "MIN_CONFIRM_SEEDS", "Arm", "Spec", "load_spec"],
        plan: ["Plan", "check", "only_arms"],
        runs: [
            "metrics_rows",
            "run_one",
            "write_heldout",
            "train_sft",
            "run_all",
            "RECORD",
            "archive_run",
            "archive_shared",
            "restore",
        ],
        summary: ["RunResult", "read_run", "comparisons", "summarize", "markdown", "plot", "write_outputs"],
    }
    for mod, names in homes.items():
        for name in names:
            assert getattr(experiment, name) is getattr(mod, name), name
    assert sorted(experiment.__all__) == sorted(n for names in homes.values() for n in names)


def test_a_good_file_parses_with_its_defaults(tmp_path: Path) -> None:
    raw = _good()
    del raw["endpoint"], raw["final_greedy_prompts"], raw["purpose"]
    s = spec.load_spec(_write(tmp_path, raw))
    assert (s.purpose, s.last, s.final_greedy_prompts, s.seeds, s.baseline) == (
        "confirm",
        4,
        2000,
        (1, 2),
        "grpo",
    )
    assert [a.name for a in s.arms] == ["grpo", "mc", "eq"] and s.arm("eq").equal_compute_of == "mc"
    assert s.arm("mc").overrides == tuple(MC) and s.common == ("trainer.steps=2", "trainer.val_every=1")


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"seeds": [1, 1]}, "key seeds: a seed is listed twice"),
        ({"seeds": []}, "key seeds: expected a non-empty list"),
        ({"zzz": 1}, "key zzz: unknown; valid keys: arms, baseline"),
        ({"arms": {"grpo": {"preset": "smoke"}}}, "key arms: expected a mapping of at least two arms"),
        ({"arms": {"grpo": {"preset": "smoke"}, "b": {"preset": "smoke", "x": 1}}}, "key arms.b.x: unknown"),
        (
            {"arms": {"grpo": {"preset": "smoke"}, "b": {"preset": "smoke", "placebo_of": "b"}}},
            "arms.b.placebo_of",
        ),
        ({"baseline": "zz"}, "key baseline: 'zz' is not an arm (grpo, mc, eq)"),
        ({"purpose": "maybe"}, "key purpose: confirm or search"),
        ({"endpoint": {"primary": "auc"}}, "key endpoint.primary"),
        ({"endpoint": {"last": 0}}, "key endpoint.last: a number of validations >= 1"),
        ({"final_greedy_prompts": -1}, "key final_greedy_prompts"),
        ({"common": ["no-equals-sign"]}, "key common: expected a list of key=value strings"),
        ({"sft_model": ""}, "key sft: name the SFT model every arm starts from"),
    ],
)
def test_a_mistake_in_the_file_is_one_line_naming_the_key(
    tmp_path: Path, change: dict[str, Any], key: str
) -> None:
    f = _write(tmp_path, _good() | change)
    with pytest.raises(ConfigError) as e:
        spec.load_spec(f)
    assert str(e.value).startswith(f"{f}: ") and key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("change", "extra", "expected"),
    [
        ({}, ("trainer.seed=3",), "override trainer.seed=3: the recipe sets model.path"),
        (
            {"common": ["trainer.steps=4", "trainer.val_every=3"]},
            (),
            "arm grpo: trainer.steps (4) must be a multiple",
        ),
        (
            {"endpoint": {"last": 3}},
            (),
            "arm grpo: 2 validations after SFT, fewer than the primary endpoint's last 3",
        ),
        (
            {"common": ["trainer.steps=2", "trainer.val_every=1", "rollout.n=0"]},
            (),
            "arm grpo: config key rollout.n",
        ),
        ({"purpose": "confirm"}, (), "seeds: a confirmatory file pairs >= 16 seeds"),
        (
            {"purpose": "confirm", "seeds": list(range(16))},
            (),
            "arms.mc: a process-credit arm needs a placebo arm",
        ),
    ],
)
def test_every_arm_is_checked_before_a_run_starts(
    tmp_path: Path, change: dict[str, Any], extra: tuple[str, ...], expected: str
) -> None:
    raw = _good() | change
    with pytest.raises(ConfigError) as e:
        plan.check(_plan(_write(tmp_path, raw), tmp_path / "out", extra))
    assert expected in str(e.value) and "\n" not in str(e.value)


def _run(
    out: Path,
    arm: str,
    seed: int,
    curve: list[float],
    tokens: list[float],
    greedy: float,
    device: str = "cpu",
    code: str = "abc",
) -> None:
    """A finished run's files: validations at steps 0..len(curve)-1, RL steps of 2 s less 0.5 s of
    validation each, ``generated_tokens`` the running total given, run on ``device`` at ``code``."""
    rows: list[dict[str, Any]] = [{"step": 0, "val/accuracy": curve[0]}]
    for step, (acc, total) in enumerate(zip(curve[1:], tokens, strict=True), start=1):
        rows.append({"step": step, "val/accuracy": acc, "time/step_s": 2.0, "time/val_s": 0.5,
                     "generated_tokens": total, "generated/step_tokens": 10.0})  # fmt: skip
    d = out / arm / f"s{seed}"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "final_greedy.json").write_text(json.dumps({"accuracy": greedy, "device": device, "code": code}))


def test_seconds_compare_only_between_runs_on_one_device(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _plan(_write(tmp_path, _good()), out)
    cfgs = plan.check(p)
    for seed, eq_device in ((1, "cpu"), (2, "cuda (NVIDIA H200)")):
        _run(out, "grpo", seed, [0.0, 0.2, 0.4], [50, 100], 0.1)
        _run(out, "mc", seed, [0.0, 0.5, 0.7], [100, 200], 0.3)
        _run(out, "eq", seed, [0.0, 0.1, 0.2, 0.3, 0.4], [25, 50, 75, 100], 0.2, device=eq_device)
    s, d = summary.summarize(p, cfgs)
    assert d["arms"]["eq"]["devices"] == ["cpu", "cuda (NVIDIA H200)"]
    assert d["arms"]["eq"]["token_ratio_to_costly_arm"] == [0.5, 0.5]  # tokens compare across devices
    assert d["arms"]["eq"]["seconds_ratio_to_costly_arm"] == [2.0, None]  # seconds do not
    table = summary.markdown(s, d)
    assert "Runs on cuda (NVIDIA H200): 1 (seeds 2)" in table
    assert "Seeds whose arms ran on more than one device: 2 (" in table


def test_the_summary_of_finished_runs_by_hand(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _plan(_write(tmp_path, _good()), out)
    cfgs = plan.check(p)
    _run(out, "grpo", 1, [0.0, 0.2, 0.4], [50, 100], 0.1)
    _run(out, "grpo", 2, [0.0, 0.4, 0.4], [50, 100], 0.2)
    _run(out, "mc", 1, [0.0, 0.5, 0.7], [100, 200], 0.3)
    _run(out, "mc", 2, [0.0, 0.6, 0.6], [100, 0], 0.3)  # no tokens: the ratio to it is undefined
    _run(out, "eq", 1, [0.0, 0.1, 0.2, 0.3, 0.4], [25, 50, 75, 100], 0.2)
    _run(out, "eq", 2, [0.0, 0.1, 0.2, 0.3, 0.4], [25, 50, 75, 100], 0.2)
    s, d = summary.summarize(p, cfgs)
    # primary = mean of the last 2 validations: grpo (0.2+0.4)/2 = 0.3, (0.4+0.4)/2 = 0.4; mc 0.6, 0.6
    assert s["arms"]["grpo"]["primary"] == pytest.approx([0.3, 0.4])
    assert s["arms"]["mc"]["primary"] == pytest.approx([0.6, 0.6])
    # compute: the last running total; seconds = 2 RL steps x (2 - 0.5) s = 3 s (eq: 4 steps, 6 s)
    assert s["arms"]["mc"]["compute"] == {"generated_tokens": [200.0, 0.0], "seconds": [3.0, 3.0]}
    assert s["arms"]["eq"]["compute"]["seconds"] == [6.0, 6.0]
    # eq / mc tokens: 100 / 200 = 0.5, then 100 / 0 undefined: null in JSON, never NaN
    assert d["arms"]["eq"]["token_ratio_to_costly_arm"] == [0.5, None]
    assert d["arms"]["eq"]["seconds_ratio_to_costly_arm"] == [2.0, 2.0]
    # AUC, trapezoid mean of [0, .2, .4] over 2 intervals: (0.2 + (0 + 0.4) / 2) / 2 = 0.2
    assert d["arms"]["grpo"]["auc"][0] == pytest.approx(0.2)
    assert d["arms"]["eq"]["validation_steps"] == [0, 1, 2, 3, 4] and d["arms"]["eq"]["steps"] == 4
    # rollout tokens = the steps' sampled tokens (2 x 10) less process continuations (none logged)
    assert d["arms"]["grpo"]["rollout_tokens"] == [20.0, 20.0]
    assert (d["complete"], d["baseline"], d["file_seeds"]) == (True, "grpo", [1, 2])
    # mc against grpo, paired: d = [0.3, 0.2], mean 0.25, sd = 0.05 * sqrt(2), se = sd / sqrt(2) = 0.05,
    # t = 5 with df = 1, whose t distribution is Cauchy: p = 1 - 2 atan(5) / pi
    c = next(
        c for c in s["comparisons"] if (c["arm"], c["against"], c["endpoint"]) == ("mc", "grpo", "primary")
    )
    assert (c["kind"], c["df"]) == ("grpo", 1)
    assert c["mean_diff"] == pytest.approx(0.25) and c["t"] == pytest.approx(5.0)
    assert c["p"] == pytest.approx(1 - 2 * math.atan(5) / math.pi, rel=1e-6)
    # per endpoint: mc-grpo, mc-eq (equal compute), eq-grpo; Holm within each endpoint's family
    assert [(c["arm"], c["against"], c["kind"]) for c in s["comparisons"] if c["endpoint"] == "primary"] == [
        ("mc", "grpo", "grpo"),
        ("mc", "eq", "equal_compute"),
        ("eq", "grpo", "grpo"),
    ]
    assert [c["endpoint"] for c in s["comparisons"]].count("final_greedy") == 3
    table = summary.markdown(s, d)
    assert "| grpo | baseline |" in table and "| eq | equal compute of mc |" in table


def test_every_arm_against_its_sft_start_joins_the_primary_family(tmp_path: Path) -> None:
    raw = _good() | {"endpoint": {"primary": "last_validations", "last": 2, "against_sft": True}}
    out = tmp_path / "out"
    p = _plan(_write(tmp_path, raw), out)
    cfgs = plan.check(p)
    # step 0 is the SFT model's validation: 0.3 on seed 1, 0.5 on seed 2, the same in every arm
    _run(out, "grpo", 1, [0.3, 0.2, 0.4], [50, 100], 0.1)
    _run(out, "grpo", 2, [0.5, 0.4, 0.4], [50, 100], 0.2)
    _run(out, "mc", 1, [0.3, 0.5, 0.7], [100, 200], 0.3)
    _run(out, "mc", 2, [0.5, 0.7, 0.7], [100, 200], 0.3)
    _run(out, "eq", 1, [0.3, 0.1, 0.2, 0.3, 0.4], [25, 50, 75, 100], 0.2)
    _run(out, "eq", 2, [0.5, 0.1, 0.2, 0.3, 0.4], [25, 50, 75, 100], 0.2)
    s, d = summary.summarize(p, cfgs)
    primary = [c for c in s["comparisons"] if c["endpoint"] == "primary"]
    sft = {c["arm"]: c for c in primary if c["kind"] == "sft"}
    assert set(sft) == {"grpo", "mc", "eq"} and all(c["against"] == summary.SFT for c in sft.values())
    # grpo: primary (0.2+0.4)/2 = 0.3 and 0.4 against 0.3 and 0.5: d = [0, -0.1], mean -0.05,
    # sd = 0.1 / sqrt(2), se = 0.05, t = -1, df = 1 (Cauchy): p = 1 - 2 atan(1) / pi = 0.5
    g = sft["grpo"]
    assert (g["n"], g["df"]) == (2, 1)
    assert g["mean_diff"] == pytest.approx(-0.05) and g["t"] == pytest.approx(-1.0)
    assert g["p"] == pytest.approx(0.5, rel=1e-6)
    # 95 % interval: mean +- t_(0.975, 1) se, t_(0.975, 1) = tan(0.475 pi) = 12.706
    half = math.tan(0.475 * math.pi) * 0.05
    assert g["ci95"] == pytest.approx([-0.05 - half, -0.05 + half], rel=1e-5)
    # mc: 0.6 and 0.7 against 0.3 and 0.5: d = [0.3, 0.2], mean 0.25, se 0.05, t = 5
    assert sft["mc"]["t"] == pytest.approx(5.0)
    # Holm over the primary family: 3 comparisons between arms + 3 against SFT = 6 p-values;
    # the smallest p is multiplied by 6
    ps = sorted(c["p"] for c in primary)
    assert len(primary) == 6
    smallest = min(primary, key=lambda c: c["p"])
    assert smallest["p_holm"] == pytest.approx(min(1.0, 6 * ps[0]))
    # the secondary endpoints keep their own families, without an SFT figure to compare with
    assert not [c for c in s["comparisons"] if c["kind"] == "sft" and c["endpoint"] != "primary"]
    assert d["against_sft"] is True
    assert f"| mc | {summary.SFT} | sft | primary | +25.00 |" in summary.markdown(s, d)


def test_the_final_greedy_accuracy_as_the_primary_endpoint(tmp_path: Path) -> None:
    # endpoint.primary: final_greedy makes the final model's held-out greedy accuracy the claim (the
    # primary lists and family) and the validation mean a secondary endpoint with its own family
    raw = _good() | {"endpoint": {"primary": "final_greedy", "last": 2}}
    out = tmp_path / "out"
    p = _plan(_write(tmp_path, raw), out)
    assert p.spec.primary == "final_greedy"
    cfgs = plan.check(p)
    _run(out, "grpo", 1, [0.0, 0.2, 0.4], [50, 100], 0.1)
    _run(out, "grpo", 2, [0.0, 0.4, 0.4], [50, 100], 0.2)
    _run(out, "mc", 1, [0.0, 0.5, 0.7], [100, 200], 0.4)
    _run(out, "mc", 2, [0.0, 0.6, 0.6], [100, 200], 0.4)
    _run(out, "eq", 1, [0.0, 0.1, 0.2, 0.3, 0.4], [25, 50, 75, 100], 0.2)
    _run(out, "eq", 2, [0.0, 0.1, 0.2, 0.3, 0.4], [25, 50, 75, 100], 0.2)
    s, d = summary.summarize(p, cfgs)
    assert s["arms"]["mc"]["primary"] == pytest.approx([0.4, 0.4]) == s["arms"]["mc"]["final_greedy"]
    assert d["arms"]["grpo"]["last_validations"] == pytest.approx([0.3, 0.4])
    assert s["endpoint"].startswith("greedy accuracy of each run's final model on 5 held-out prompts")
    assert {c["endpoint"] for c in s["comparisons"]} == {"primary", "last_validations", "auc"}
    # mc against grpo on the final greedy accuracy: d = [0.3, 0.2], mean 0.25, se 0.05, t = 5, df 1
    c = next(
        c for c in s["comparisons"] if (c["arm"], c["against"], c["endpoint"]) == ("mc", "grpo", "primary")
    )
    assert c["mean_diff"] == pytest.approx(0.25) and c["t"] == pytest.approx(5.0) and c["df"] == 1
    # the validation means keep their own family: mc 0.6, 0.6 against grpo 0.3, 0.4
    v = next(
        c
        for c in s["comparisons"]
        if (c["arm"], c["against"], c["endpoint"]) == ("mc", "grpo", "last_validations")
    )
    assert v["mean_diff"] == pytest.approx(0.25)
    assert (d["primary_endpoint"], d["secondary_endpoints"]) == ("final_greedy", ["last_validations", "auc"])
    # a held-out figure needs held-out prompts, and the SFT start has no greedy held-out figure
    with pytest.raises(ConfigError, match=r"endpoint\.primary: final_greedy needs final_greedy_prompts"):
        spec.load_spec(_write(tmp_path, raw | {"final_greedy_prompts": 0}))
    both = raw | {"endpoint": {"primary": "final_greedy", "against_sft": True}}
    with pytest.raises(ConfigError, match=r"endpoint\.against_sft"):
        spec.load_spec(_write(tmp_path, both))
    with pytest.raises(ConfigError, match=r"endpoint\.primary"):
        spec.load_spec(_write(tmp_path, raw | {"endpoint": {"primary": "auc"}}))


def test_against_sft_is_off_unless_the_file_sets_it_to_a_boolean(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _plan(_write(tmp_path, _good()), out)
    assert p.spec.against_sft is False
    with pytest.raises(ConfigError, match=r"endpoint\.against_sft"):
        spec.load_spec(_write(tmp_path, _good() | {"endpoint": {"last": 2, "against_sft": "yes"}}))


def test_a_smoke_run_may_shorten_the_runs_but_the_file_may_not(tmp_path: Path) -> None:
    raw = _good() | {"common": ["trainer.steps=4", "trainer.val_every=1"], "endpoint": {"last": 4}}
    raw["arms"]["eq"]["overrides"] = ["trainer.steps=8"]
    out = tmp_path / "out"
    # the command line's trainer.steps=2 leaves 2 validations after SFT, fewer than endpoint.last
    p = _plan(_write(tmp_path, raw), out, ("trainer.steps=2",))
    cfgs = plan.check(p)
    for arm in ("grpo", "mc", "eq"):
        for seed in (1, 2):
            _run(out, arm, seed, [0.1, 0.2, 0.4], [50, 100], 0.1)
    s, _ = summary.summarize(p, cfgs)
    # the endpoint averages the validations after step 0 it has: (0.2 + 0.4) / 2
    assert s["arms"]["grpo"]["primary"] == pytest.approx([0.3, 0.3])
    raw["common"] = ["trainer.steps=2", "trainer.val_every=1"]
    with pytest.raises(ConfigError, match="fewer than the primary endpoint's last 4"):
        plan.check(_plan(_write(tmp_path, raw), out))


def test_a_run_without_metrics_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no finished run here"):
        summary.read_run(tmp_path / "grpo" / "s1")


@pytest.mark.parametrize("extra", [(), ("trainer.steps=2", "trainer.val_every=1", "data.val_size=50")])
def test_the_shipped_tool_file_is_a_valid_claim_and_smoke_run(extra: tuple[str, ...]) -> None:
    f = Path(__file__).resolve().parents[2] / "experiments" / "tools_rl.yaml"
    p = _plan(f, Path("/unused"), extra)
    cfgs = plan.check(p)  # a confirmatory file: 16 seeds, a placebo and an equal-compute arm
    assert p.spec.purpose == "confirm" and p.spec.against_sft and len(p.spec.seeds) == 16
    assert cfgs["tools_greedy"].process.value_estimator == "greedy_continuation"
    assert cfgs["tools_grpo"].postprocess.dynamic_sampling.enabled


@pytest.mark.parametrize(
    "f", sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.yaml")), ids=lambda f: f.stem
)
def test_every_shipped_experiment_file_builds(f: Path) -> None:
    # every arm of every committed file builds as `stepcredit train` would, with the file's own data
    p = _plan(f, Path("/unused"))
    cfgs = plan.check(p)
    assert set(cfgs) == {a.name for a in p.spec.arms} and p.spec.baseline in cfgs
    datas = {repr(c.data) for c in cfgs.values()}
    assert len(datas) == 1  # the arms share prompts


def test_the_noisy_tool_file_trains_on_the_noisy_teacher() -> None:
    f = Path(__file__).resolve().parents[2] / "experiments" / "tools_noisy.yaml"
    p = _plan(f, Path("/unused"))
    cfgs = plan.check(p)
    assert p.spec.against_sft and "data.arith.teacher_error_prob=0.3" in p.spec.sft["overrides"]
    assert all(c.data.arith.teacher_error_prob == 0.3 and c.rollout.mode == "tools" for c in cfgs.values())
    assert cfgs["tools_grpo_eq_greedy"].trainer.steps == 50 and cfgs["tools_grpo"].trainer.steps == 40


def test_a_seed_whose_arms_ran_on_different_code_is_named(tmp_path: Path) -> None:
    """A file run over sessions: each run records the commit it started with; the details list them and
    the table names the seeds whose arms' code differs (their differences include the change)."""
    out = tmp_path / "out"
    p = _plan(_write(tmp_path, _good()), out)
    cfgs = plan.check(p)
    for seed, eq_code in ((1, "abc"), (2, "def+dirty")):
        _run(out, "grpo", seed, [0.0, 0.2, 0.4], [50, 100], 0.1)
        _run(out, "mc", seed, [0.0, 0.5, 0.7], [100, 200], 0.3)
        _run(out, "eq", seed, [0.0, 0.1, 0.2, 0.3, 0.4], [25, 50, 75, 100], 0.2, code=eq_code)
    s, d = summary.summarize(p, cfgs)
    assert d["arms"]["eq"]["codes"] == ["abc", "def+dirty"] and d["arms"]["grpo"]["codes"] == ["abc", "abc"]
    table = summary.markdown(s, d)
    assert "Runs at code abc: 5 (seeds 1, 2)." in table and "Runs at code def+dirty: 1 (seeds 2)." in table
    assert "Seeds whose arms ran on more than one code version: 2 (" in table
    assert "Runs on " not in table  # one device: nothing said of devices
    _run(out / "same", "grpo", 1, [0.0, 0.2], [50], 0.1)  # one code: nothing said of code
    assert "code" not in "".join(summary._parts(d | {"arms": {"grpo": {"codes": ["abc", "abc"]}}}, [1, 2],
                                                "codes", "at code", "code version", "", "x"))  # fmt: skip
