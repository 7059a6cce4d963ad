"""The value model: a separate copy of the policy's backbone with a scalar head (PPO's critic).

``values(ids, attn, n_response)`` returns V(s_t) for every response token, aligned like the policy's
log-probs: the value of token t is read from the hidden state that predicts it (as verl's critic).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class ValueModel(nn.Module):
    """Backbone (deep copy of ``policy.base_model``, so the critic trains apart) + ``Linear(hidden, 1)``."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(policy.base_model)
        self.backbone.train()
        for p in self.backbone.parameters():
            p.requires_grad_(True)
        # on the backbone's device (the policy is already on trainer.device when the critic is built),
        # in float32 like every trained parameter; the critic computes in float32 also in a
        # model.dtype=bfloat16 run (autocast wraps the policy's forward, not this copy of its backbone)
        device = next(self.backbone.parameters()).device
        self.head = nn.Linear(policy.config.hidden_size, 1, device=device, dtype=torch.float32)
        # a zero head starts every value at 0, so the first advantages are the plain returns
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, n_response: int
    ) -> torch.Tensor:
        """``values_BT`` [B, n_response] (float32) for prompt (left-padded) + response (right-padded)."""
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False
        )
        h = out.last_hidden_state[:, -n_response - 1 : -1, :]
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1).float()
