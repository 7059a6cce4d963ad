"""The critic: values stored at rollout, the clipped value loss, and warm-up that leaves the policy alone."""

from __future__ import annotations

import torch

from stepcredit.config import from_dict
from stepcredit.data import PromptStream, load_task
from stepcredit.losses import KLController
from stepcredit.losses.value import clipped_value_loss
from stepcredit.models import load_policy
from stepcredit.trainer.loop import _build_critic, rollout
from stepcredit.trainer.steps import policy_update, reward_channels
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
        }
    )
    model, tok = load_policy(cfg.model, seed=0)
    critic = _build_critic(model, cfg, None)
    assert critic is not None
    train, _ = load_task(cfg.data)
    batch = rollout(model, tok, PromptStream(train, seed=0), cfg, 1, critic=critic)
    assert batch.values_BT is not None and batch.values_BT.shape == batch.response_mask_BT.shape
    batch.rewards = [RewardResult(score=float(i % 2)) for i in range(len(batch))]
    mb, ch = reward_channels(batch, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    policy0 = {k: v.clone() for k, v in model.state_dict().items()}
    critic0 = {k: v.clone() for k, v in critic.model.state_dict().items()}
    kl = KLController.from_config(cfg.loss)
    m = policy_update(model, None, opt, mb, ch, cfg, kl, critic=critic, update_policy=False)
    assert all(torch.equal(policy0[k], v) for k, v in model.state_dict().items())
    assert not all(torch.equal(critic0[k], v) for k, v in critic.model.state_dict().items())
    assert m["critic/value_loss"] > 0 and "loss" not in m
    # after the warm-up both train
    policy_update(model, None, opt, mb, ch, cfg, kl, critic=critic, update_policy=True)
    assert not all(torch.equal(policy0[k], v) for k, v in model.state_dict().items())
