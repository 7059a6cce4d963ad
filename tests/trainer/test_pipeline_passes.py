"""The pipelined runs pay no log-prob pass that the result does not need (issue 27, part 4).

* The proximal policy of the decoupled loss is the weights an update starts from, i.e. the training
  forward pass's: without dropout its detached log-probs are the proximal ones, and no pass runs.
* The behaviour log-probs come from the sampling loop's own logits (float32, flat rollouts).

Both must leave what is learned unchanged: a pipelined, one-step off-policy run with the passes
removed equals the run with both passes, on the same seed, to float rounding; and the decoupled loss
is still applied there (stale data, behaviour weights pi_prox / pi_behav away from 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import stepcredit.trainer.update as update_mod
from stepcredit.config import ModelConfig, TinyModelConfig, from_dict
from stepcredit.models import load_policy
from stepcredit.trainer import train
from stepcredit.trainer.update import train_mode_is_eval_mode


def length_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """A reward with signal even for an untrained model (responses differ in length)."""
    return len(solution_str) / 16


def config(**rollout: Any) -> Any:
    return from_dict(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
            "data": {"train_size": 64, "val_size": 4},
            "sft": {"steps": 2, "batch_size": 8},
            "rollout": {"prompts_per_step": 4, "n": 4, "max_new_tokens": 16, **rollout},
            "optim": {"lr": 1e-3, "warmup_steps": 0},
            "loss": {"name": "decoupled_ppo", "kl_coef": 0.05},
            "pipeline": {"mini_batch": 8, "one_step_off_policy": True},
            "reward": {
                "agent": {"backend": "thread", "max_concurrency": 1},  # in order: the same mini-batches
                "custom": {"path": f"{__file__}:length_score", "isolate": False},
            },
            "trainer": {
                "steps": 3,
                "threads": 1,
                "val_every": 0,
                "save_every": 0,
                "progress": False,
                "tensorboard": False,
            },
        }
    )


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["step"] > 0]


def test_train_mode_is_eval_mode() -> None:
    tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model, _ = load_policy(ModelConfig(tiny=tiny), seed=0)
    assert train_mode_is_eval_mode(model)
    model.config.attention_dropout = 0.1  # what the attention layers read in train mode
    assert not train_mode_is_eval_mode(model)
    model.config.attention_dropout = 0.0
    model.lm_head = torch.nn.Sequential(torch.nn.Dropout(0.1), model.lm_head)
    assert not train_mode_is_eval_mode(model)


def test_without_the_passes_the_run_trains_as_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train(config(), tmp_path / "lean")
    lean = _rows(tmp_path / "lean")
    # the reference: behaviour log-probs from their own pass, the proximal ones from theirs
    monkeypatch.setattr(update_mod, "train_mode_is_eval_mode", lambda model: False)
    train(config(logprobs_from_sampling=False), tmp_path / "full")
    full = _rows(tmp_path / "full")
    assert [r["step"] for r in lean] == [1, 2, 3]
    for a, b in zip(lean, full, strict=True):
        assert a["time/proximal_s"] == 0.0 < b["time/proximal_s"]
        assert ("time/generation_s" in a) == ("time/generation_s" in b)
        if "time/generation_s" in b:  # (not the last step: there is nothing to generate ahead)
            assert a["time/behaviour_logp_s"] == 0.0 < b["time/behaviour_logp_s"]
        # the same draws and rewards, the same loss, gradient and decoupled weights
        assert a["reward/mean"] == b["reward/mean"]
        assert a["response_length/mean"] == b["response_length/mean"]
        for key in ("pg_loss", "grad_norm", "behav_weight", "kl"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert a["proximal"] == b["proximal"]
    # step 1: the second of two mini-batches follows an update; later steps: every one is stale
    assert [r["proximal"] for r in lean] == [0.5, 1.0, 1.0]
    # the decoupled loss is applied: on 1-step-stale data pi_prox / pi_behav moved away from 1
    assert any(abs(r["behav_weight"] - 1.0) > 1e-4 for r in lean[1:])
