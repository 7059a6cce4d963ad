"""The critic's loss."""

from __future__ import annotations

import torch

from stepcredit.ops import check_shape, masked_mean


def clipped_value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip: float,
) -> torch.Tensor:
    """PPO's clipped value loss (Schulman et al. 2017; as verl's ``compute_value_loss``):

        V_clip = V_old + clip(V - V_old, -c, c)
        L = 1/2 * mean_t max((V - R)^2, (V_clip - R)^2)        over the counted tokens

    ``clip=0`` disables clipping (plain 1/2 (V - R)^2).
    """
    B, T = values_BT.shape
    for name, x in (("old_values_BT", old_values_BT), ("returns_BT", returns_BT), ("mask_BT", mask_BT)):
        check_shape(name, x, (B, T))
    err = (values_BT - returns_BT) ** 2
    if clip > 0:
        v_clip = old_values_BT + (values_BT - old_values_BT).clamp(-clip, clip)
        err = torch.maximum(err, (v_clip - returns_BT) ** 2)
    return 0.5 * masked_mean(err, mask_BT)
