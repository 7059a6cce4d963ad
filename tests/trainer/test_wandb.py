"""``trainer.wandb=true`` logs each step to Weights & Biases; offline mode needs no network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepcredit.config import from_dict
from stepcredit.trainer import train

pytest.importorskip("wandb")  # the wandb extra, part of the test install (make setup-test)


def config(**trainer: Any) -> Any:
    return from_dict(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
            "data": {"train_size": 32, "val_size": 4},
            "sft": {"steps": 1, "batch_size": 8},
            "rollout": {"prompts_per_step": 2, "n": 2, "max_new_tokens": 8},
            "reward": {"agent": {"backend": "thread"}},
            "trainer": {
                "steps": 2,
                "val_every": 0,
                "save_every": 1,
                "progress": False,
                "tensorboard": False,
                "wandb": True,
                **trainer,
            },
        }
    )


def test_offline_run_records_every_step_and_resume_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    run = tmp_path / "run"
    train(config(stop_after_steps=1), run)
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    run_id = (run / "wandb_id").read_text().strip()
    assert files[0].name == f"run-{run_id}.wandb"
    data = files[0].read_bytes()
    # the history records carry the metric names and the run's config
    assert b"reward/mean" in data and b"samples/trained" in data and b"prompts_per_step" in data

    train(config(), run, resume=run)
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2 and all(f.name == f"run-{run_id}.wandb" for f in files)


def test_missing_wandb_is_one_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from stepcredit.errors import ConfigError

    real_import = builtins.__import__

    def no_wandb(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "wandb":
            raise ImportError("no wandb")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ConfigError, match=r"trainer\.wandb=true needs"):
        train(config(), tmp_path / "run")


def test_sampled_completions_reach_a_wandb_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    run = tmp_path / "run"
    train(config(val_every=2, generations_every=1, generations_to_log=2), run)
    data = next((run / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    assert b"samples/val" in data and b"samples/train" in data  # verl's val_generations_to_log table
