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


def process_channel(
    episode_ends: Sequence[Sequence[int]],
    prefix_values: Sequence[Sequence[float]],
    response_mask_BT: torch.Tensor,
    cfg: ProcessConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The process channel: (process_BT float32, process_mask_BT bool) on a right-padded response layout.

        U_i = scale * clip(V_i - V_(i-1))  at the last token of episode i   (see marginal_utilities)

    ``process_mask_BT`` is True at the episode ends that carry a U_i. Ends outside the response or on
    tokens ``response_mask_BT`` does not count carry nothing. A row with no episodes (a padding row of
    verl's batch, a domain without process rewards) gets an all-zero channel. The one version used by
    the trainer and the verl plugin.
    """
    mask_BT = response_mask_BT.bool()
    B, T = mask_BT.shape
    if len(episode_ends) != B or len(prefix_values) != B:
        raise ValueError(f"expected {B} rows of episode ends and values, got {len(episode_ends)}")
    process_BT = torch.zeros(B, T, dtype=torch.float32)
    steps_BT = torch.zeros(B, T, dtype=torch.bool)
    for b, (ends, values) in enumerate(zip(episode_ends, prefix_values, strict=True)):
        if not ends:
            continue
        if len(values) != len(ends) + 1:
            raise ValueError(f"row {b}: {len(ends)} episodes need {len(ends) + 1} values, got {len(values)}")
        us = marginal_utilities(values, clip=cfg.clip, scale=cfg.scale, zero_last=cfg.last_episode == "zero")
        for e, u in zip(ends, us, strict=True):
            if 0 <= e < T:
                process_BT[b, e] = u
                steps_BT[b, e] = True
    steps_BT &= mask_BT
    return process_BT.to(response_mask_BT.device), steps_BT.to(response_mask_BT.device)
