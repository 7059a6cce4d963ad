"""The rollout skips its behaviour log-prob pass when the training pass is the behaviour pass.

Plain on-policy training (one update per batch, from the weights that generated it) needs no separate
pass: the training forward pass's detached log-probs are the ratio's denominator. Every switch that
trains a batch after the policy moved (mini-batches, PPO epochs, off-policy) or reads the pass
(KL in the reward, process values continuing from its cache) keeps it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import stepcredit.rollout.flat_mode as rollout_mode
import stepcredit.trainer.rollout as trainer_rollout
from stepcredit.config import from_dict
from stepcredit.trainer import train
from stepcredit.trainer.update import needs_behaviour_logp


def length_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """A reward with signal even for an untrained model (responses differ in length)."""
    return len(solution_str) / 16


def config(**over: Any) -> Any:
    d: dict[str, Any] = {
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
        "data": {"train_size": 64, "val_size": 4},
        "sft": {"steps": 2, "batch_size": 8},
        "rollout": {"prompts_per_step": 4, "n": 4, "max_new_tokens": 16},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
        "loss": {"kl_coef": 0.05},
        "reward": {
            "agent": {"backend": "thread"},
            "custom": {"path": f"{__file__}:length_score", "isolate": False},
        },
        "trainer": {"steps": 2, "val_every": 0, "save_every": 0, "progress": False, "tensorboard": False},
    }
    for key, value in over.items():
        section, field = key.split("__")
        d.setdefault(section, {})[field] = value
    return from_dict(d)


@pytest.mark.parametrize(
    ("over", "needed"),
    [
        ({}, False),
        ({"pipeline__mini_batch": 16}, False),  # the mini-batch is the whole batch: one update
        ({"pipeline__mini_batch": 8}, True),  # the second mini-batch is trained by moved weights
        ({"pipeline__ppo_epochs": 2}, True),
        ({"pipeline__one_step_off_policy": True, "loss__name": "decoupled_ppo"}, True),
        ({"loss__kl_in_reward": True}, True),  # KL(behaviour || ref) shapes the reward
        ({"process__enabled": True, "algorithm__advantage": "grpo_process"}, True),  # reuses its cache
    ],
)
def test_which_configs_need_the_pass(over: dict[str, Any], needed: bool) -> None:
    assert needs_behaviour_logp(config(**over)) is needed


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["step"] > 0]


def test_skipping_the_pass_trains_as_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real = rollout_mode.generate  # the flat rollout mode's generation

    def recording(model: Any, tok: Any, samples: Any, spec: Any = None, **kwargs: Any) -> Any:
        calls.append(bool(spec.with_logprobs if spec is not None else kwargs.get("with_logprobs", True)))
        batch = real(model, tok, samples, spec, **kwargs)
        assert (batch.behaviour_logp_BT is None) == (not calls[-1])
        return batch

    monkeypatch.setattr(rollout_mode, "generate", recording)
    train(config(), tmp_path / "skip")
    assert calls == [False, False]
    monkeypatch.setattr(trainer_rollout, "needs_behaviour_logp", lambda cfg: True)
    train(config(), tmp_path / "full")
    assert calls[2:] == [True, True]

    skip, full = _rows(tmp_path / "skip"), _rows(tmp_path / "full")
    assert [r["step"] for r in skip] == [1, 2]
    for a, b in zip(skip, full, strict=True):
        # same samples (generation draws the same random numbers), same loss and gradient: the
        # separate pass's log-probs equal the training pass's up to float rounding
        assert a["reward/mean"] == b["reward/mean"]
        assert a["response_length/mean"] == b["response_length/mean"]
        assert a["pg_loss"] == pytest.approx(b["pg_loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] > 0
