"""``benchmarks/gpu_experiment_part.sh``: a part of an experiment file run elsewhere (on the lent GPU
machine; here on the CPU) packs each finished run without checkpoints, and the packed runs unpacked
into the first machine's ``--out`` complete the file without running again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from stepcredit.cli.main import main

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_experiment_part.sh"
TINY = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
    "data.train_size=64",
    "data.val_size=6",
    "rollout.prompts_per_step=4",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "trainer.tensorboard=false",
    "reward.agent.backend=thread",
]


def test_a_part_run_elsewhere_comes_back_as_finished_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        "name": "part",
        "purpose": "search",
        "baseline": "grpo",
        "seeds": [3, 4],
        "endpoint": {"primary": "last_validations", "last": 1},
        "final_greedy_prompts": 3,
        "sft": {"preset": "smoke", "overrides": [*TINY, "sft.steps=2"]},
        "common": [*TINY, "trainer.steps=1", "trainer.val_every=1"],
        "arms": {"grpo": {"preset": "smoke"}, "lr": {"preset": "smoke", "overrides": ["optim.lr=0.02"]}},
    }
    f = tmp_path / "part.yaml"
    f.write_text(yaml.safe_dump(spec, sort_keys=False))
    home = tmp_path / "home"  # the first machine's --out: the SFT model, the held-out prompts, seed 3
    assert main(["experiment", str(f), "--out", str(home), "--seeds", "3", "--jobs", "2"]) == 0
    part = tmp_path / "elsewhere"  # the other machine's: the same SFT model and held-out prompts
    part.mkdir()
    shutil.copytree(home / "sft", part / "sft")
    shutil.copy(home / "heldout.jsonl", part)
    ret = tmp_path / "returned"
    env = {**os.environ, "OUT": str(ret), "GPU_PART": str(part), "GPU_PART_DEVICE": "cpu",
           "GPU_PART_POLL": "1", "PYTHON": sys.executable}  # fmt: skip
    done = subprocess.run(
        ["bash", str(SCRIPT), str(f), "4", "", "600", "2"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "runner exit 0" in done.stdout
    with tarfile.open(ret / "runs_s4.tgz") as t:
        names = t.getnames()
        assert {"grpo/s4/final_greedy.json", "lr/s4/final_greedy.json", "grpo/s4/metrics.jsonl"} <= set(names)
        assert not [n for n in names if "/checkpoints" in n or n.startswith("sft")]
        t.extractall(home, filter="data")
    assert (ret / "logs.tgz").is_file() and (ret / "experiment.log").is_file()
    capsys.readouterr()
    assert main(["experiment", str(f), "--out", str(home)]) == 0  # the whole file: nothing runs again
    assert "start " not in capsys.readouterr().out
    details = yaml.safe_load((home / "details.json").read_text())
    assert details["complete"] is True and details["arms"]["grpo"]["devices"] == ["cpu", "cpu"]
