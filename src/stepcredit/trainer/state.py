"""Everything the loop trains and carries from step to step, built once and saved in checkpoints."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stepcredit.config import Config
from stepcredit.data import PromptStream
from stepcredit.data.domains import MixedStream
from stepcredit.errors import ConfigError
from stepcredit.losses import KLController
from stepcredit.models import save_pretrained
from stepcredit.models.lora import (
    AdapterOffView,
    attach_lora,
    base_source,
    check_lora,
    export_lora,
    load_lora_state_dict,
    lora_enabled,
    lora_state_dict,
)
from stepcredit.reward import RunningStats
from stepcredit.trainer.critic import Critic, build_critic
from stepcredit.trainer.metrics import ZeroPassTracker
from stepcredit.trainer.schedule import lr_factor


@dataclass
class TrainState:
    """The policy, its optimiser, the reference, the critic, the KL controller, the running outcome
    statistics and the data position, plus the two clocks of the policy:

    ``step`` counts completed RL steps (a batch's staleness is ``step - batch.policy_version``) and
    ``updates`` counts optimiser steps (the policy moved since a batch was generated exactly when
    ``updates > batch.policy_updates``: the decoupled loss then needs its proximal log-probs).
    """

    cfg: Config
    model: Any
    tok: Any
    opt: torch.optim.Optimizer
    kl_ctl: KLController
    running: RunningStats
    stream: PromptStream | MixedStream
    ref: Any | None = None
    critic: Critic | None = None
    step: int = 0
    updates: int = 0
    zero_pass: ZeroPassTracker = field(default_factory=ZeroPassTracker)
    generated_tokens: float = 0.0
    """Tokens sampled from the policy so far (rollouts and process continuations; ``generated_tokens``)."""

    def set_lr(self, step: int) -> None:
        """Linear warm-up (Adam's first steps move every weight by ~lr whatever the gradient's size),
        then ``optim.schedule`` from the configured lr (:func:`~stepcredit.trainer.schedule.lr_factor`)."""
        o = self.cfg.optim
        lr = o.lr * lr_factor(
            step,
            total=self.cfg.trainer.steps,
            warmup=o.warmup_steps,
            schedule=o.schedule,
            min_ratio=o.min_lr_ratio,
        )
        for g in self.opt.param_groups:
            g["lr"] = lr

    @property
    def lora(self) -> bool:
        """Does RL train LoRA adapters (``model.lora.rank`` > 0)?"""
        return lora_enabled(self.cfg.model.lora)

    @property
    def _lora_with_base(self) -> bool:
        # after SFT the base weights are no longer what the config rebuilds: checkpoints keep them
        return self.cfg.sft.steps > 0

    def start_rl(self, ckpt: dict[str, Any] | None = None) -> None:
        """After SFT (or from a checkpoint): the critic, the frozen reference (the SFT policy) and,
        with LoRA, the adapters (then the reference is the policy with them off, no copy) and an
        optimiser over them alone."""
        self.critic = build_critic(self.model, self.cfg, ckpt)  # a copy of the backbone without adapters
        if self.lora:
            self.model = attach_lora(self.model, self.cfg.model.lora)
            self.opt = build_optimizer(self.cfg, self.model)
            if ckpt is not None:
                load_lora_state_dict(self.model, ckpt["model"], with_base=self._lora_with_base)
                self.opt.load_state_dict(ckpt["optimizer"])
            self.ref = AdapterOffView(self.model) if self.cfg.loss.kl_coef > 0 else None
        elif self.cfg.loss.kl_coef > 0:
            self.ref = frozen_copy(self.model, ckpt["ref_model"] if ckpt else None)

    def export(self, final_dir: Path) -> None:
        """The trained policy: ``final_dir/model`` (a model directory); with LoRA the adapters (and
        their base, and the merged model on request, :func:`~stepcredit.models.lora.export_lora`)."""
        if not self.lora:
            save_pretrained(self.model, self.tok, final_dir / "model")
            return
        src = base_source(self.cfg.model.path, sft_steps=self.cfg.sft.steps)
        export_lora(self.model, self.tok, final_dir, self.cfg.model.lora, base_source=src)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": (
                lora_state_dict(self.model, with_base=self._lora_with_base)
                if self.lora
                else self.model.state_dict()
            ),
            "optimizer": self.opt.state_dict(),
            "data": self.stream.state_dict(),
            "kl_ctl": self.kl_ctl.state_dict(),
            "outcome_stats": self.running.state_dict(),
            "critic": self.critic.model.state_dict() if self.critic is not None else None,
            "critic_opt": self.critic.opt.state_dict() if self.critic is not None else None,
            "ref_model": self.ref.state_dict() if isinstance(self.ref, torch.nn.Module) else None,
            "policy_step": self.step,
            "policy_updates": self.updates,
            "zero_pass": self.zero_pass.state_dict(),
            "generated_tokens": self.generated_tokens,
        }

    def load_state_dict(self, ckpt: dict[str, Any]) -> None:
        """Restore from a checkpoint (before :meth:`start_rl`, which restores reference and critic, and
        with LoRA the policy and its optimiser: the adapters are attached there)."""
        if not self.lora:
            self.model.load_state_dict(ckpt["model"])
            self.opt.load_state_dict(ckpt["optimizer"])
        self.stream.load_state_dict(ckpt["data"])
        self.kl_ctl.load_state_dict(ckpt["kl_ctl"])
        self.running.load_state_dict(ckpt.get("outcome_stats") or {})
        self.step = int(ckpt.get("policy_step", ckpt["step"]))
        self.updates = int(ckpt.get("policy_updates", 0))
        self.zero_pass.load_state_dict(ckpt.get("zero_pass") or {})
        self.generated_tokens = float(ckpt.get("generated_tokens", 0.0))


def build_state(cfg: Config, model: Any, tok: Any, stream: PromptStream | MixedStream) -> TrainState:
    if lora_enabled(cfg.model.lora):
        check_lora(model, cfg.model.lora)  # before SFT: a layer name that is not there fails at start-up
    opt = build_optimizer(cfg, model)
    return TrainState(cfg, model, tok, opt, KLController.from_config(cfg.loss), RunningStats(), stream)


def build_optimizer(cfg: Config, model: Any) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (with LoRA: the adapters alone)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params, lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay
    )


def frozen_copy(model: Any, state: dict[str, Any] | None = None) -> Any:
    ref = copy.deepcopy(model)
    if state is not None:
        ref.load_state_dict(state)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


_DEVICE_ALIASES: dict[str, Callable[[], str]] = {
    "auto": lambda: "cuda" if torch.cuda.is_available() else "cpu",
}
"""``trainer.device`` values that are not torch device names -> the device they pick (when asked)."""


def resolve_device(name: str) -> torch.device:
    """``trainer.device``: ``auto`` is the GPU when there is one, else the CPU; asking for a GPU that
    is not there fails at start-up with one line."""
    alias = _DEVICE_ALIASES.get(name)
    dev = torch.device(alias() if alias is not None else name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"config key trainer.device: {name!r} but torch sees no CUDA device (use cpu or auto)"
        )
    return dev
