"""The critic (``algorithm.use_critic``): a value head on a copy of the policy's backbone, its values at
rollout time and one clipped value-loss step per policy update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stepcredit.config import Config
from stepcredit.losses.value import clipped_value_loss
from stepcredit.models.critic import ValueModel
from stepcredit.ops import masked_mean
from stepcredit.types import Batch


@dataclass
class Critic:
    """The value model and its optimiser."""

    model: ValueModel
    opt: torch.optim.Optimizer


def build_critic(model: Any, cfg: Config, state: dict[str, Any] | None = None) -> Critic | None:
    """The value model (a copy of the policy's backbone after SFT, or the checkpoint's) and its optimiser;
    None without ``algorithm.use_critic``."""
    if not cfg.algorithm.use_critic:
        return None
    vm = ValueModel(model)
    opt = torch.optim.AdamW(vm.parameters(), lr=cfg.critic.lr, betas=cfg.optim.betas, weight_decay=0.0)
    if state is not None and state.get("critic") is not None:
        vm.load_state_dict(state["critic"])
        opt.load_state_dict(state["critic_opt"])
    return Critic(vm, opt)


@torch.no_grad()
def critic_values(critic: Critic, batch: Batch) -> torch.Tensor:
    """V(s_t) of every response token of ``batch`` under the current critic (stored as ``values_BT``)."""
    dev = next(critic.model.parameters()).device
    ids_BL = torch.cat([batch.prompt_ids_BP, batch.response_ids_BT], 1).to(dev)
    attn_BL = torch.cat([batch.prompt_mask_BP, batch.attention_BT()], 1).long().to(dev)
    critic.model.eval()
    values_BT = critic.model(ids_BL, attn_BL, n_response=batch.response_ids_BT.shape[1]).float().cpu()
    return values_BT * batch.response_mask_BT


def critic_update(
    critic: Critic,
    ids_BL: torch.Tensor,
    attn_BL: torch.Tensor,
    old_values_BT: torch.Tensor | None,
    returns_BT: torch.Tensor,
    live_BT: torch.Tensor,
    cfg: Config,
) -> dict[str, float]:
    """One optimiser step of the clipped value loss towards the estimator's returns."""
    T = live_BT.shape[1]
    critic.model.train()
    values_BT = critic.model(ids_BL, attn_BL, n_response=T)
    old_BT = old_values_BT if old_values_BT is not None else values_BT.detach()
    loss = clipped_value_loss(
        values_BT, old_BT, returns_BT.detach().float(), live_BT, clip=cfg.critic.value_clip
    )
    critic.opt.zero_grad(set_to_none=True)
    grad_norm = 0.0
    if bool(live_BT.any()):
        loss.backward()
        clip = cfg.critic.grad_clip if cfg.critic.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(critic.model.parameters(), clip))
        critic.opt.step()
    return {
        "critic/value_loss": float(loss.detach()),
        "critic/grad_norm": grad_norm,
        "critic/values_mean": float(masked_mean(values_BT.detach(), live_BT)),
        "critic/returns_mean": float(masked_mean(returns_BT.float(), live_BT)),
    }
