"""The critic: values stored at rollout, the clipped value loss, and warm-up that leaves the policy alone."""

from __future__ import annotations

from dataclasses import replace

import torch

from stepcredit.config import from_dict
from stepcredit.data import PromptStream, load_task
from stepcredit.losses.value import clipped_value_loss
from stepcredit.models import load_policy
from stepcredit.reward import with_failure_policy
from stepcredit.rollout import generate
from stepcredit.trainer.critic import critic_values
from stepcredit.trainer.state import build_state
from stepcredit.trainer.update import train_on, update
from stepcredit.types import RewardResult


def test_clipped_value_loss_by_hand() -> None:
    # token 0: V=2, V_old=0, R=1, clip 0.5 -> V_clip=0.5: max((2-1)^2, (0.5-1)^2) = 1
    # token 1: V=0.2, V_old=0, R=1 -> V_clip=0.2: max(0.64, 0.64) = 0.64; token 2 masked
    v = torch.tensor([[2.0, 0.2, 9.0]])
    loss = clipped_value_loss(
        v, torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[True, True, False]]), clip=0.5
    )
    assert torch.isclose(loss, torch.tensor(0.5 * (1.0 + 0.64) / 2))


def test_critic_warmup_leaves_the_policy_unchanged_and_trains_the_critic() -> None:
    cfg = from_dict(
        {
            "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
            "data": {"train_size": 8, "val_size": 0},
            "rollout": {"prompts_per_step": 2, "n": 2, "max_new_tokens": 8},
            "algorithm": {"advantage": "gae", "use_critic": True},
            "critic": {"warmup": 1, "lr": 0.01},
            "loss": {"kl_coef": 0.0},
            "optim": {"lr": 0.01, "warmup_steps": 0},
        }
    )
    model, tok = load_policy(cfg.model, seed=0)
    train, _ = load_task(cfg.data)
    state = build_state(cfg, model, tok, PromptStream(train, seed=0))
    state.start_rl()
    assert state.critic is not None
    batch = generate(model, tok, state.stream.take(2), n=2, max_new_tokens=8)
    batch = replace(batch, values_BT=critic_values(state.critic, batch))
    assert batch.values_BT is not None and batch.values_BT.shape == batch.response_mask_BT.shape
    batch = batch.with_rewards([RewardResult(score=float(i % 2)) for i in range(len(batch))])
    policy0 = {k: v.clone() for k, v in model.state_dict().items()}
    critic0 = {k: v.clone() for k, v in state.critic.model.state_dict().items()}
    p, m = train_on(state, with_failure_policy(batch, cfg.reward), train_policy=False)
    assert all(torch.equal(policy0[k], v) for k, v in model.state_dict().items())
    assert not all(torch.equal(critic0[k], v) for k, v in state.critic.model.state_dict().items())
    assert m["critic/value_loss"] > 0 and "loss" not in m and state.updates == 0
    # after the warm-up both train
    update(state, p, train_policy=True)
    assert not all(torch.equal(policy0[k], v) for k, v in model.state_dict().items())
    assert state.updates == 1


def test_the_value_model_lives_where_the_policy_lives() -> None:
    """The head is made on the backbone's device (the GPU check caught a CPU head on a cuda policy:
    "mat2 is on cpu"); the meta device stands in for cuda on a CPU machine."""
    from stepcredit.config import TinyModelConfig
    from stepcredit.models.critic import ValueModel
    from stepcredit.models.tiny import build_tiny_model

    tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    policy = build_tiny_model(tiny, vocab_size=64).to("meta")
    vm = ValueModel(policy)
    assert {p.device.type for p in vm.parameters()} == {"meta"}
    assert {p.dtype for p in vm.parameters()} == {torch.float32}
    assert vm.head.weight.shape == (1, 32)
