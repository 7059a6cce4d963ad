"""``sft`` and ``eval`` name their files absolutely, as ``train`` does: from a relative ``--out`` and
``--model`` the printed paths and the JSON line's hold from any directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepcredit.cli.main import main


def test_sft_and_eval_print_absolute_paths(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tiny_train: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    small = [*tiny_train, "data.val_size=2", "rollout.max_new_tokens=8"]
    assert main(["sft", "--preset", "smoke", *small, "sft.steps=1", "--out", "sft"]) == 0
    printed = capsys.readouterr().out
    assert f"model saved to {tmp_path / 'sft' / 'model'} " in printed
    assert (tmp_path / "sft" / "model" / "config.json").is_file()

    argv = [
        "eval",
        "--preset",
        "smoke",
        *small,
        "--model",
        "sft/model",
        "--data",
        "arith",
        "--out",
        "answers.jsonl",
    ]
    assert main([*argv, "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(f"model {tmp_path / 'sft' / 'model'} (directory)")
    assert f"samples: {tmp_path / 'answers.jsonl'}" in lines
    summary = json.loads(lines[-1])
    assert summary["out"] == str(tmp_path / "answers.jsonl") and Path(summary["out"]).is_file()
    assert summary["model"] == str(tmp_path / "sft" / "model")
    assert summary["data"] == "arith"  # a dataset's name stays a name
