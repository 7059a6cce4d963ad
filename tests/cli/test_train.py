"""End to end through the command line: the smoke preset, bad input, and resume equality."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from stepcredit.cli.main import main

EXE = [sys.executable, "-m", "stepcredit.cli.main"]
# Tiny and fast: a few SFT steps, three RL steps, a checkpoint after every step.
FAST = [
    "--preset",
    "smoke",
    "sft.steps=4",
    "data.val_size=8",
    "rollout.max_new_tokens=24",
    "trainer.steps=3",
    "trainer.save_every=1",
]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_smoke_preset_writes_the_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [*EXE, "train", "--preset", "smoke", "--out", str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0 = right after SFT
    required = [
        "reward/mean",
        "response_length/mean",
        "kl",
        "entropy",
        "grad_norm",
        "time/step_s",
        "time/generation_s",
        "time/reward_s",
        "time/update_s",
        "tokens_per_s",
        "memory/peak_rss_mb",
    ]
    for r in rows[1:]:
        for k in required:
            assert isinstance(r[k], (int, float)), k
    assert 0.0 <= rows[0]["val/accuracy"] <= 1.0 and "val/accuracy" in rows[-1]
    assert (out / "config.yaml").exists() and (out / "curves.png").stat().st_size > 1000
    assert (out / "checkpoints" / "step_000003" / "state.pt").exists()
    assert (out / "checkpoints" / "final" / "model" / "config.json").exists()
    assert any((out / "tb").iterdir())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["no.such.key=1"], "no.such.key"),
        (["trainer.stepz=3"], "trainer.steps"),
        (["rollout.n=zero"], "rollout.n"),
        (["model.path=/does/not/exist"], "/does/not/exist"),
        (["algorithm.advantage=nope"], "nope"),
        (
            ["model.path=Qwen/Qwen2.5-0.5B-Instruct"],
            "hub downloads are not supported here; pass a local directory",
        ),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [*EXE, "train", "--preset", "smoke", "--out", str(tmp_path / "r"), *args],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_malformed_row_names_file_and_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": "1+1?"}],
        "reward_model": {"style": "rule", "ground_truth": "2"},
    }
    bad = {"data_source": "arith", "prompt": [{"role": "user", "content": "2+2?"}], "reward_model": {}}
    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    code = main(
        [
            "train",
            "--preset",
            "smoke",
            "--out",
            str(tmp_path / "r"),
            "data.task=files",
            f"data.train_files=[{f}]",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"{f}:2" in err[0] and "ground_truth" in err[0]


def test_resume_continues_exactly(tmp_path: Path) -> None:
    """Interrupt after step 2, resume, and compare step 3 with an uninterrupted run (CPU, same seed)."""
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["train", *FAST, "--out", str(full)]) == 0
    assert main(["train", *FAST, "trainer.steps=2", "--out", str(part)]) == 0
    assert main(["train", "--resume", str(part), "trainer.steps=3"]) == 0
    a = {r["step"]: r for r in _metrics(full)}
    b = {r["step"]: r for r in _metrics(part)}
    assert sorted(b) == [0, 1, 2, 3]
    for key in ("reward/mean", "response_length/mean", "loss", "kl", "entropy", "grad_norm", "adv/abs_mean"):
        x, y = a[3][key], b[3][key]
        assert (x is None and y is None) or math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9), (key, x, y)


def test_saved_config_paths_are_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_train: list[str]
) -> None:
    import yaml

    from stepcredit.cli.paths import absolute_paths
    from stepcredit.config import from_dict

    work = tmp_path / "work"
    (work / "rewards").mkdir(parents=True)
    (work / "rewards" / "mine.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    (work / "model").mkdir()
    monkeypatch.chdir(work)
    cfg = from_dict(
        {
            "model": {"path": "model"},
            "data": {"task": "files", "train_files": ["t.jsonl"], "val_files": ["sub/v.parquet"]},
            "reward": {
                "custom": {"path": "rewards/mine.py:compute_score,pkg.mod:fn", "style": "trl"},
                "domains": {"a": {"fn": "math"}, "b": {"fn": "rewards/mine.py"}},
            },
            "rollout": {"tools": {"modules": ["my_tools.py", "pkg.tools"]}},
        }
    )
    got = absolute_paths(cfg, work)
    # files and directories from the working directory; module specs and registered names as written
    assert got.model.path == str(work / "model")
    assert got.data.train_files == (str(work / "t.jsonl"),) and got.data.val_files == (
        str(work / "sub/v.parquet"),
    )
    assert got.reward.custom.path == f"{work}/rewards/mine.py:compute_score,pkg.mod:fn"
    assert got.reward.domains["a"].fn == "math" and got.reward.domains["b"].fn == f"{work}/rewards/mine.py"
    assert got.rollout.tools.modules == (str(work / "my_tools.py"), "pkg.tools")
    assert absolute_paths(from_dict({}), work).model.path == "tiny"  # the built-in model is a name
    # through train: the saved config.yaml names the file absolutely, so it loads from anywhere
    run = tmp_path / "run"
    args = [*tiny_train, "sft.steps=0", "trainer.steps=1", "trainer.val_every=0", "trainer.save_every=0"]
    assert (
        main(["train", "--preset", "smoke", *args, "reward.custom.path=rewards/mine.py", "--out", str(run)])
        == 0
    )
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["reward"]["custom"]["path"] == str(work / "rewards" / "mine.py")
