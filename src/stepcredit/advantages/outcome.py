"""Outcome estimators: each response is reduced to one score, its advantage spread over its tokens.

These read only the outcome channel (``outcome_BT``, the score at the last token); a process channel,
if present, is ignored -- use a token-level estimator to train on it.
"""

from __future__ import annotations

from typing import Any

import torch

from stepcredit.advantages.core import AdvantageInputs, AdvantageOutputs, register_estimator
from stepcredit.ops import group_stats, masked_sum, whiten_zeroed


def outcome_score_B(inp: AdvantageInputs) -> torch.Tensor:
    """Each response's score: the sum of its outcome channel over its tokens (one nonzero entry)."""
    return masked_sum(inp.outcome_BT, inp.mask_BT, dim=1)


def spread_B(x_B: torch.Tensor, live_BT: torch.Tensor) -> torch.Tensor:
    """Give every counted token of response b the value x_B[b]; 0 elsewhere."""
    return torch.where(live_BT, x_B[:, None], 0.0)


def grpo_advantage_B(
    score_B: torch.Tensor, group_B: torch.Tensor, valid_B: torch.Tensor, *, norm_by_std: bool, eps: float
) -> torch.Tensor:
    """A_i = (r_i - mean_G r) / (std_G r + eps), or r_i - mean_G r when ``norm_by_std`` is False.

    Group statistics use valid members only; a singleton group has mean 0 and std 1 (verl's rule).
    """
    mean_B, std_B, _ = group_stats(score_B, group_B, valid_B)
    adv_B = score_B - mean_B
    if norm_by_std:
        adv_B = adv_B / (std_B + eps)
    return adv_B


@register_estimator("grpo")
def grpo(
    inp: AdvantageInputs, *, norm_by_std: bool = True, eps: float = 1e-6, **_hp: Any
) -> AdvantageOutputs:
    """GRPO with outcome supervision (Shao et al. 2024, DeepSeekMath, section 4.1.2).

        A_{i,t} = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)      for every token t of response i

    With ``norm_by_std=False`` the division is dropped: Dr. GRPO (Liu et al. 2025, arXiv 2503.20783).
    std is the unbiased (Bessel) std; singleton groups use mean 0, std 1. Returns equal advantages.
    Token-level rewards: not preserved (one score per response).
    """
    live_BT = inp.live_BT
    adv_B = grpo_advantage_B(outcome_score_B(inp), inp.group_B, inp.live_B, norm_by_std=norm_by_std, eps=eps)
    adv_BT = spread_B(adv_B, live_BT)
    return AdvantageOutputs(adv_BT=adv_BT, ret_BT=adv_BT)


@register_estimator("rloo")
def rloo(inp: AdvantageInputs, **_hp: Any) -> AdvantageOutputs:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740).

        A_i = r_i - 1/(n-1) sum_{j != i} r_j = n/(n-1) (r_i - mean_G r)

    n counts the valid members of the group; a singleton keeps its raw score (no baseline), as verl.
    Token-level rewards: not preserved (one score per response).
    """
    score_B = outcome_score_B(inp)
    mean_B, _, n_B = group_stats(score_B, inp.group_B, inp.live_B)
    adv_B = torch.where(n_B > 1, (score_B - mean_B) * n_B / (n_B - 1).clamp(min=1), score_B)
    adv_BT = spread_B(adv_B, inp.live_BT)
    return AdvantageOutputs(adv_BT=adv_BT, ret_BT=adv_BT)


@register_estimator("reinforce_pp_baseline")
def reinforce_pp_baseline(inp: AdvantageInputs, **_hp: Any) -> AdvantageOutputs:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv 2501.03262).

        a_i = r_i - mean_G r;   A_{i,t} = (a_i - mu) / sqrt(sigma^2 + 1e-8)

    where mu, sigma^2 are the mean and unbiased variance of a over all counted tokens of the batch
    (token-weighted batch whitening). Token-level rewards: not preserved (one score per response).
    """
    live_BT = inp.live_BT
    score_B = outcome_score_B(inp)
    mean_B, _, _ = group_stats(score_B, inp.group_B, inp.live_B)
    adv_BT = whiten_zeroed(spread_B(score_B - mean_B, live_BT), live_BT)
    return AdvantageOutputs(adv_BT=adv_BT, ret_BT=adv_BT)
