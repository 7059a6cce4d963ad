"""Marginal utility of each episode: pure arithmetic on the stored V(prefix) values.

U_i = V_i - V_(i-1), with V_0 the value of the empty response: how much episode i moved the policy's
belief that it will reach the gold answer (the "progress" reward of Setlur et al. 2024, "Rewarding
Progress", arXiv:2410.08146, with the policy itself as the prover). U_i sits at the last token of
episode i in the process channel; every other token gets 0.

The last episode gets U_S = V_S - V_(S-1) like the others (``last_episode="utility"``): V_S is the
value after the whole response, so U_S credits the final step (usually the answer) for its own move.
The outcome reward sits on the same token in its own channel; ``last_episode="zero"`` leaves the final
step to the outcome reward alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from stepcredit.config import ProcessConfig
from stepcredit.ops import check_shape
from stepcredit.types import Batch


def marginal_utilities(
    values: Sequence[float], *, clip: float = 0.0, scale: float = 1.0, zero_last: bool = False
) -> list[float]:
    """[U_1, ..., U_S] from [V_0, V_1, ..., V_S]: U_i = scale * clip(V_i - V_(i-1), -c, c).

    ``clip=0`` disables clipping; ``zero_last`` gives the last episode 0.
    """
    out = []
    for i in range(1, len(values)):
        u = float(values[i]) - float(values[i - 1])
        if clip > 0:
            u = min(max(u, -clip), clip)
        out.append(u * scale)
    if zero_last and out:
        out[-1] = 0.0
    return out


def utilities_to_tokens(batch: Batch, cfg: ProcessConfig) -> torch.Tensor:
    """The process channel ``process_BT``: U_i at episode i's last token, 0 elsewhere (float32)."""
    if batch.episode_ends is None or batch.prefix_values is None:
        raise ValueError(
            "utilities_to_tokens: batch has no episode_ends/prefix_values (run compute_prefix_values)"
        )
    resp = batch.response_ids_BT
    B, T = resp.shape
    check_shape("response_mask_BT", batch.response_mask_BT, (B, T))
    if len(batch.episode_ends) != B or len(batch.prefix_values) != B:
        raise ValueError(f"utilities_to_tokens: expected {B} episode lists, got {len(batch.episode_ends)}")
    process_BT = torch.zeros(B, T, dtype=torch.float32, device=resp.device)
    for b, (ends, values) in enumerate(zip(batch.episode_ends, batch.prefix_values, strict=True)):
        if len(values) != len(ends) + 1:
            raise ValueError(
                f"response {b}: {len(ends)} episodes need {len(ends) + 1} values, got {len(values)}"
            )
        us = marginal_utilities(values, clip=cfg.clip, scale=cfg.scale, zero_last=cfg.last_episode == "zero")
        for e, u in zip(ends, us, strict=True):
            if not 0 <= e < T:
                raise ValueError(f"response {b}: episode end {e} outside [0, {T})")
            process_BT[b, e] = u
    return process_BT
