"""End to end through the command line: the multidomain preset, dynamic sampling's refill, running
statistics across a resume, and bad multi-domain config (one line, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stepcredit.cli.main import main

EXE = [sys.executable, "-m", "stepcredit.cli.main"]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_multidomain_preset_logs_per_domain_and_per_tag(tmp_path: Path, tiny_train: list[str]) -> None:
    out = tmp_path / "run"
    args = [*tiny_train, "sft.steps=2", "trainer.steps=2", "trainer.val_every=2", "trainer.save_every=0"]
    assert main(["train", "--preset", "multidomain", "--out", str(out), *args]) == 0
    rows = _metrics(out)
    assert {"val/accuracy/arith", "val/accuracy/code"} <= set(rows[0])
    for r in rows[1:]:
        for d in ("arith", "code"):
            assert isinstance(r[f"{d}/reward/mean"], float)
            assert isinstance(r[f"{d}/response_length/mean"], float)
            assert f"{d}/status/ok" in r and f"{d}/status/unparseable" in r
        # half the prompts of every drawn batch from each domain (n=2 responses each)
        drawn = 1 + r["sampling/extra_batches"]
        assert r["arith/count"] == r["code/count"] == 2 * 2 * drawn
        assert r["sampling/drawn_prompts"] == 4 * drawn
    assert "val/accuracy/code" in rows[-1]


def test_dynamic_sampling_drops_all_zero_groups_and_refills(tmp_path: Path, tiny_train: list[str]) -> None:
    # a reward that is 0 for every response: every group has zero variance and is dropped, and the
    # step draws its max_extra_batches refills before giving up
    fn = tmp_path / "zero.py"
    fn.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0.0\n"
    )
    out = tmp_path / "ds"
    ds = ["postprocess.dynamic_sampling.enabled=true", "postprocess.dynamic_sampling.max_extra_batches=2"]
    reward = [f"reward.custom.path={fn}:compute_score", "reward.custom.isolate=false"]
    args = [
        *tiny_train,
        "sft.steps=0",
        "trainer.steps=1",
        "trainer.val_every=0",
        "trainer.save_every=0",
        *ds,
        *reward,
    ]
    assert main(["train", "--preset", "smoke", "--out", str(out), *args]) == 0
    r = _metrics(out)[-1]
    assert r["sampling/extra_batches"] == 2 and r["sampling/drawn_prompts"] == 12
    assert r["sampling/dropped_groups"] == 12 and r["sampling/kept_groups"] == 0
    assert "loss" not in r  # nothing left to learn from
    # bounds that keep every group: nothing dropped, no refill
    out2 = tmp_path / "keep"
    keep = ["postprocess.dynamic_sampling.criterion=mean_bounds", "postprocess.dynamic_sampling.mean_low=-1"]
    assert main(["train", "--preset", "smoke", "--out", str(out2), *args, *keep]) == 0
    r = _metrics(out2)[-1]
    assert r["sampling/extra_batches"] == 0 and r["sampling/dropped_groups"] == 0
    assert r["sampling/kept_groups"] == 4 and "loss" in r


def test_running_statistics_survive_a_resume(tmp_path: Path, tiny_train: list[str]) -> None:
    run = ["postprocess.outcome.mean=running", "postprocess.outcome.std=running", "sft.steps=2"]
    base = [*tiny_train, *run, "trainer.val_every=0", "trainer.save_every=1"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["train", "--preset", "smoke", "--out", str(full), *base, "trainer.steps=3"]) == 0
    assert main(["train", "--preset", "smoke", "--out", str(part), *base, "trainer.steps=2"]) == 0
    assert main(["train", "--resume", str(part), "trainer.steps=3"]) == 0

    def stats(run_dir: Path) -> dict:
        return torch.load(run_dir / "checkpoints" / "step_000003" / "state.pt", weights_only=False)[
            "outcome_stats"
        ]

    a, b = stats(full), stats(part)
    assert a["default"][0] == 3 * 4 * 2  # every valid score of three steps (4 prompts x 2 responses)
    assert a == b


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["data.domain_interleave_probs={arith: 0.7, code: 0.5}"], "must sum to 1"),
        (["data.domains.code.task="], "data.domains.code"),
        (
            ["data.domains.code.tag=poems", "reward.domains={}", "data.domains.code.task=files"],
            "data.domains.code",
        ),
    ],
)
def test_bad_multidomain_config_is_one_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [*EXE, "train", "--preset", "multidomain", "--out", str(tmp_path / "r"), *args],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_tag_without_reward_route_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "poems.jsonl"
    row = {
        "data_source": "poetry",
        "ability": "poetry",
        "prompt": [{"role": "user", "content": "a poem"}],
        "reward_model": {"style": "rule", "ground_truth": "x"},
    }
    f.write_text(json.dumps(row) + "\n")
    proc = subprocess.run(
        [
            *EXE,
            "train",
            "--preset",
            "multidomain",
            "--out",
            str(tmp_path / "r"),
            f"data.domains.poems={{train_files: [{f}], tag: verse}}",
            "data.domain_interleave_probs={arith: 0.4, code: 0.4, poems: 0.2}",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "tag 'verse'" in lines[0] and "no reward route" in lines[0], proc.stderr
