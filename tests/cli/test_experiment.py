"""``stepcredit experiment``: a smoke-size run through the command line (2 arms x 2 seeds x 2 steps, a
tiny validation), the summary's shape, a t statistic recomputed from its lists, resuming, and a file
with a mistake ending in one line."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from stepcredit.cli.main import main

TINY = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
    "data.train_size=64",
    "data.val_size=6",
    "rollout.prompts_per_step=4",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "rollout.val_temperature=1.0",
    "trainer.tensorboard=false",
    "reward.agent.backend=thread",
]
GREEDY = {
    "preset": "smoke",
    "overrides": [
        "process.enabled=true",
        "process.value_estimator=greedy_continuation",
        "algorithm.advantage=grpo_vineppo",
    ],
}
ORACLE = [
    "process.enabled=true",
    "process.value_estimator=step_oracle",
    "process.min_episode_tokens=2",
    "algorithm.advantage=grpo_vineppo",
]


def _file(tmp_path: Path, **over: object) -> Path:
    spec = {
        "name": "smoke",
        "purpose": "search",
        "baseline": "grpo",
        "seeds": [3, 4],
        "endpoint": {"primary": "last_validations", "last": 2},
        "final_greedy_prompts": 5,
        "sft": {"preset": "smoke", "overrides": [*TINY, "sft.steps=2"]},
        # a large learning rate, so that the arms' models (and their validations) part after step 0
        "common": [*TINY, "trainer.steps=2", "trainer.val_every=1", "optim.lr=0.01", "optim.warmup_steps=0"],
        "arms": {
            "grpo": {"preset": "smoke"},
            "oracle": {"preset": "smoke", "oracle": True, "overrides": ORACLE},
        },
        **over,
    }
    f = tmp_path / "smoke.yaml"
    f.write_text(yaml.safe_dump(spec, sort_keys=False))
    return f


def test_smoke_experiment_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    f = _file(tmp_path)
    # options after the file, then an override of every run (here one that changes nothing)
    assert main(["experiment", str(f), "--out", str(out), "--jobs", "2", "trainer.tensorboard=false"]) == 0
    s = json.loads((out / "replication.json").read_text())
    assert set(s) == {"endpoint", "seeds", "arms", "comparisons"}
    assert s["seeds"] == [3, 4] and "last 2 validations" in s["endpoint"]
    for name, a in s["arms"].items():
        assert set(a) == {
            "oracle",
            "placebo_of",
            "equal_compute_of",
            "compute",
            "curves",
            "primary",
            "final_greedy",
        }
        assert a["oracle"] is (name == "oracle") and a["placebo_of"] is None and a["equal_compute_of"] is None
        assert set(a["compute"]) == {"generated_tokens", "seconds"}
        assert len(a["curves"]) == len(a["primary"]) == len(a["final_greedy"]) == 2
        for curve, primary, run_seed in zip(a["curves"], a["primary"], s["seeds"], strict=True):
            assert len(curve) == 3  # validations at steps 0, 1, 2
            assert primary == pytest.approx(statistics.fmean(curve[-2:]))  # the endpoint, recomputed
            # the curve is the run's own validation log
            rows = [
                json.loads(x)
                for x in (out / name / f"s{run_seed}" / "metrics.jsonl").read_text().splitlines()
            ]
            assert curve == [r["val/accuracy"] for r in rows if "val/accuracy" in r]
            last = [r for r in rows if "generated_tokens" in r][-1]
            assert a["compute"]["generated_tokens"][s["seeds"].index(run_seed)] == last["generated_tokens"]
        # step 0 is the shared SFT model validated with the same per-row random streams: every arm of a
        # seed starts from the very same figure
        assert all(0.0 <= x <= 1.0 for x in a["final_greedy"])
        assert all(t > 0 for t in a["compute"]["generated_tokens"]) and all(
            x > 0 for x in a["compute"]["seconds"]
        )
    for i in range(2):
        assert s["arms"]["grpo"]["curves"][i][0] == s["arms"]["oracle"]["curves"][i][0]
    # 5 held-out prompts, none of them a validation prompt
    held = [json.loads(x) for x in (out / "heldout.jsonl").read_text().splitlines()]
    assert len(held) == 5
    samples = [json.loads(x) for x in (out / "grpo" / "s3" / "samples.jsonl").read_text().splitlines()]
    val_prompts = {r["prompt"] for r in samples if r.get("split", "val") == "val"}
    assert len(val_prompts) == 6 and not val_prompts & {h["prompt"][-1]["content"] for h in held}
    # the comparison recomputed from the lists: d = oracle - grpo per seed, t = mean(d) / (sd(d) / sqrt(2))
    c = next(c for c in s["comparisons"] if c["endpoint"] == "primary")
    assert (c["arm"], c["against"], c["kind"], c["df"]) == ("oracle", "grpo", "grpo", 1)
    d = [x - y for x, y in zip(s["arms"]["oracle"]["primary"], s["arms"]["grpo"]["primary"], strict=True)]
    assert c["mean_diff"] == pytest.approx(statistics.fmean(d))
    if statistics.stdev(d) > 0:
        assert c["t"] == pytest.approx(statistics.fmean(d) / (statistics.stdev(d) / math.sqrt(2)))
        # with df = 1 the t distribution is Cauchy: two-sided p = 1 - 2 atan(|t|) / pi
        assert c["p"] == pytest.approx(1 - 2 * math.atan(abs(c["t"])) / math.pi, rel=1e-6)
    assert c["p_holm"] == pytest.approx(c["p"]) or c["p"] is None  # a family of one comparison
    assert {x["endpoint"] for x in s["comparisons"]} == {"primary", "final_greedy", "auc"}
    assert (out / "replication.md").read_text().count("\n| oracle | oracle |") == 1
    assert (out / "curves.png").stat().st_size > 0
    details = json.loads((out / "details.json").read_text())
    assert details["arms"]["grpo"]["process_continuation_tokens"] == [
        0.0,
        0.0,
    ]  # GRPO samples no continuations
    assert details["arms"]["oracle"]["devices"] == ["cpu", "cpu"]  # trainer.device of each run's config
    # the file's own seeds, but a command-line override: not the file as written
    assert details["complete"] is False and details["command_line_overrides"] == ["trainer.tensorboard=false"]
    # resume: every (arm, seed) is done, nothing runs again and the summary is the same
    logs = {p: p.stat().st_mtime_ns for p in (out / "logs").iterdir()}
    capsys.readouterr()
    copy = tmp_path / "docs" / "replication.json"
    assert main(["experiment", str(f), "--out", str(out), "--jobs", "2", "--summary", str(copy)]) == 0
    assert "start " not in capsys.readouterr().out
    assert json.loads(copy.read_text()) == json.loads((out / "replication.json").read_text())
    assert {p: p.stat().st_mtime_ns for p in (out / "logs").iterdir()} == logs
    assert json.loads((out / "replication.json").read_text())["arms"] == s["arms"]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"seeds": [1, 1]}, "seeds: a seed is listed twice"),
        ({"baseline": "gpro"}, "baseline: 'gpro' is not an arm"),
        ({"purpose": "confirm"}, r"seeds: a confirmatory file pairs >= 16 seeds"),
        ({"endpoint": {"last": 5}}, r"fewer than the primary endpoint's last 5"),
        ({"arms": {"grpo": {"preset": "smoke"}, "b": {"preset": "smoke", "overrides": ["trainer.sed=1"]}}},
         r"arm b: unknown config key trainer\.sed"),
        ({"arms": {"grpo": {"preset": "smoke"}, "b": {"preset": "smoke", "placebo_of": "grpo",
                                                       "overrides": ["process.placebo=shuffle_within_response"]}}},
         r"arm b: .*process\.placebo"),
        ({"common": ["trainer.seed=1"]}, "the recipe sets"),
        # a confirmatory file: 16 seeds, and a process-credit arm needs its placebo, a costly one its
        # equal-compute GRPO arm; a placebo differs from its arm only in process.placebo
        ({"purpose": "confirm", "seeds": list(range(16)), "arms": {"grpo": {"preset": "smoke"}, "g": GREEDY}},
         r"arms\.g: a process-credit arm needs a placebo arm"),
        ({"purpose": "confirm", "seeds": list(range(16)),
          "arms": {"grpo": {"preset": "smoke"}, "g": GREEDY, "p": {**GREEDY, "placebo_of": "g", "overrides": [
              *GREEDY["overrides"], "process.placebo=shuffle_within_response"]}}},
         r"arms\.g: greedy_continuation generates; it needs an equal-compute GRPO arm"),
        ({"arms": {"grpo": {"preset": "smoke"}, "g": GREEDY, "p": {**GREEDY, "placebo_of": "g", "overrides": [
              *GREEDY["overrides"], "process.placebo=shuffle_within_response", "process.clip=0.5"]}}},
         r"arms\.p\.placebo_of: its settings must be g's but for process\.placebo"),
        ({"arms": {"grpo": {"preset": "smoke"}, "g": GREEDY, "e": {**GREEDY, "equal_compute_of": "g"}}},
         r"arms\.e\.equal_compute_of: an equal-compute arm is outcome GRPO"),
    ],
)  # fmt: skip
def test_a_file_with_a_mistake_ends_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], over: dict[str, object], message: str
) -> None:
    import re

    f = _file(tmp_path, **over)
    assert main(["experiment", str(f), "--out", str(tmp_path / "out"), "--summarize-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(f) in err and re.search(message, err), err


def test_arms_run_first_and_the_whole_file_resumes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    f = _file(tmp_path, seeds=[3])
    assert main(["experiment", str(f), "--out", str(out), "--arms", "grpo"]) == 0
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["grpo-s3.log", "sft.log"]
    s = json.loads((out / "replication.json").read_text())
    assert list(s["arms"]) == ["grpo"] and s["comparisons"] == []
    details = json.loads((out / "details.json").read_text())
    assert details["complete"] is False and details["arms_left_out"] == ["oracle"]
    first = (out / "logs" / "grpo-s3.log").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["experiment", str(f), "--out", str(out)]) == 0
    ran = capsys.readouterr().out
    assert "start oracle seed 3" in ran and "start grpo" not in ran  # the first part is reused
    assert (out / "logs" / "grpo-s3.log").stat().st_mtime_ns == first
    whole = json.loads((out / "replication.json").read_text())
    assert whole["arms"]["grpo"] == s["arms"]["grpo"]
    assert json.loads((out / "details.json").read_text())["arms_left_out"] == []


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ("grpo,orcale", r"--arms: orcale not arms of .*\(grpo, oracle, p\)"),
        ("oracle,p", "the baseline arm grpo must be one of them"),
        ("grpo,p", "p is compared with oracle, which must be one of them too"),
    ],
)
def test_bad_arms_end_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arms: str, message: str
) -> None:
    import re

    placebo = {"preset": "smoke", "placebo_of": "oracle",
               "overrides": [*ORACLE, "process.placebo=shuffle_within_response"]}  # fmt: skip
    f = _file(tmp_path, arms={"grpo": {"preset": "smoke"}, "oracle": {"preset": "smoke", "overrides": ORACLE},
                              "p": placebo})  # fmt: skip
    assert (
        main(["experiment", str(f), "--out", str(tmp_path / "out"), "--summarize-only", "--arms", arms]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_a_part_of_a_confirmatory_file_ends_without_comparisons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--seeds (or --arms) on a ``purpose: confirm`` file as written runs its part and prints how many
    runs of the file are done, no table: each interim table is another look. A smoke run (an override)
    and --summarize-only print one, and a file run on two devices says which runs ran where."""
    out = tmp_path / "out"
    more = {"preset": "smoke", "overrides": ["optim.lr=0.02"]}  # an outcome arm: no placebo needed
    arms = {"grpo": {"preset": "smoke"}, "lr": more}
    f = _file(tmp_path, purpose="confirm", seeds=list(range(3, 19)), arms=arms)
    part = ["experiment", str(f), "--out", str(out), "--seeds", "4,3", "--jobs", "2"]
    assert main([*part, "--summary", str(tmp_path / "r.json"), "trainer.device=cpu"]) == 0
    printed = capsys.readouterr().out
    assert f"4 of 32 runs of {f} are done; its comparisons wait for the whole file" in printed
    assert "--summary not written" in printed and not (tmp_path / "r.json").exists()
    assert "| arm |" not in printed and not (out / "replication.json").exists()
    fg = json.loads((out / "grpo" / "s3" / "final_greedy.json").read_text())
    assert fg["device"] == "cpu"  # where the runner ran it
    assert fg["code"] and fg["code"] != "unknown"  # the commit it ran (or the installed version)
    # an override that is not the device makes it a smoke run: its table is printed (nothing reruns)
    assert main([*part, "trainer.tensorboard=false"]) == 0
    printed = capsys.readouterr().out
    assert "start " not in printed and "| lr | grpo | grpo |" in printed
    # as if grpo's seed-4 run had run on a GPU machine
    fg = json.loads((out / "grpo" / "s4" / "final_greedy.json").read_text())
    (out / "grpo" / "s4" / "final_greedy.json").write_text(json.dumps(fg | {"device": "cuda (NVIDIA H200)"}))
    assert main([*part, "--summarize-only"]) == 0
    details = json.loads((out / "details.json").read_text())
    assert details["arms"]["grpo"]["devices"] == ["cuda (NVIDIA H200)", "cpu"]  # seeds 4, 3
    table = (out / "replication.md").read_text()
    assert "Runs on cpu: 3 (seeds 3, 4)" in table and "Runs on cuda (NVIDIA H200): 1 (seeds 4)" in table
    assert "Seeds whose arms ran on more than one device: 4 (" in table


def test_a_part_run_elsewhere_comes_back_as_finished_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``benchmarks/gpu_experiment_part.sh`` (the lent GPU machine's side; here on the CPU) packs each
    finished run of its part without checkpoints; unpacked into the first machine's ``--out`` they
    complete the file, nothing running again."""
    import os
    import shutil
    import subprocess
    import sys
    import tarfile

    repo = Path(__file__).resolve().parents[2]
    f = _file(tmp_path, common=[*TINY, "trainer.steps=1", "trainer.val_every=1"], endpoint={"last": 1})
    home = tmp_path / "home"  # the first machine's --out: the SFT model, the held-out prompts, seed 3
    assert main(["experiment", str(f), "--out", str(home), "--seeds", "3", "--jobs", "2"]) == 0
    part = tmp_path / "elsewhere"  # the other machine's: the same SFT model and held-out prompts
    part.mkdir()
    shutil.copytree(home / "sft", part / "sft")
    shutil.copy(home / "heldout.jsonl", part)
    ret = tmp_path / "returned"
    env = {**os.environ, "OUT": str(ret), "GPU_PART": str(part), "GPU_PART_DEVICE": "cpu",
           "GPU_PART_POLL": "1", "PYTHON": sys.executable}  # fmt: skip
    script = repo / "benchmarks" / "gpu_experiment_part.sh"
    done = subprocess.run(
        ["bash", str(script), str(f), "4", "", "600", "2"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "runner exit 0" in done.stdout, done.stdout + done.stderr
    with tarfile.open(ret / "runs_s4.tgz") as t:
        names = t.getnames()
        assert {"grpo/s4/final_greedy.json", "oracle/s4/final_greedy.json", "grpo/s4/metrics.jsonl"} <= set(
            names
        )
        assert not [n for n in names if "/checkpoints" in n or n.startswith("sft")]
        t.extractall(home, filter="data")
    assert (ret / "logs.tgz").is_file() and (ret / "experiment.log").is_file()
    capsys.readouterr()
    assert main(["experiment", str(f), "--out", str(home)]) == 0  # the whole file: nothing runs again
    assert "start " not in capsys.readouterr().out
    details = json.loads((home / "details.json").read_text())
    assert details["complete"] is True and details["arms"]["grpo"]["devices"] == ["cpu", "cpu"]


def test_an_archive_outlives_the_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--archive``: each finished run's record, the SFT model and the held-out prompts are copied there
    as they finish; a fresh machine (another ``--out``, nothing in it) restores them first, runs only
    what the archive lacks, and summarises the same numbers; an ``--out`` with another SFT model, or the
    archive as ``--out``, ends in one line."""
    f = _file(tmp_path)
    archive = tmp_path / "archive"
    first = tmp_path / "machine1"
    assert main(["experiment", str(f), "--out", str(first), "--seeds", "3", "--archive", str(archive)]) == 0
    for arm in ("grpo", "oracle"):
        kept = sorted(p.name for p in (archive / arm / "s3").iterdir())
        assert kept == ["config.yaml", "final_greedy.json", "metrics.jsonl", "validation.jsonl"]
    assert (archive / "sft" / "model" / "config.json").is_file() and (archive / "heldout.jsonl").is_file()
    assert not list(archive.rglob("checkpoints")) and not list(archive.rglob("*.tmp"))
    second = tmp_path / "machine2"
    capsys.readouterr()
    assert main(["experiment", str(f), "--out", str(second), "--archive", str(archive)]) == 0
    ran = capsys.readouterr().out
    assert "restored 2 finished runs" in ran and "SFT:" not in ran
    assert "start grpo seed 4" in ran and "start grpo seed 3" not in ran and "start oracle seed 3" not in ran
    assert (archive / "oracle" / "s4" / "final_greedy.json").is_file()
    whole = json.loads((second / "replication.json").read_text())
    for arm in ("grpo", "oracle"):  # seed 3 read from the restored record, as the first machine ran it
        got = json.loads((first / arm / "s3" / "final_greedy.json").read_text())["accuracy"]
        assert whole["arms"][arm]["final_greedy"][0] == pytest.approx(got)
    third = tmp_path / "machine3"  # summarise only, from the archive alone
    assert (
        main(["experiment", str(f), "--out", str(third), "--archive", str(archive), "--summarize-only"]) == 0
    )
    assert json.loads((third / "replication.json").read_text())["arms"] == whole["arms"]
    other = tmp_path / "machine4"
    (other / "sft" / "model").mkdir(parents=True)
    (other / "sft" / "model" / "config.json").write_text("{}")
    assert main(["experiment", str(f), "--out", str(other), "--archive", str(archive)]) == 2
    err = capsys.readouterr().err.strip()
    assert "its SFT model differs" in err and len(err.splitlines()) == 1, err
    assert main(["experiment", str(f), "--out", str(archive), "--archive", str(archive)]) == 2
    assert "another directory than --out" in capsys.readouterr().err
