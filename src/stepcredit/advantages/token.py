"""Token-level estimators: a token's advantage depends on the rewards that come at or after it.

The outcome and process channels are normalised separately and only then combined with
``process_weight`` (normalising a 0/1 outcome together with process rewards of size ~0.03 would
make the process signal vanish). ``gae`` is the exception: its critic predicts the return of the
combined reward, so the channels are added before the TD errors are formed.
"""

from __future__ import annotations

from typing import Any

import torch

from stepcredit.advantages.core import AdvantageInputs, AdvantageOutputs, register_estimator
from stepcredit.advantages.outcome import grpo_advantage_B, outcome_score_B, rloo, spread_B
from stepcredit.ops import (
    discounted_reverse_cumsum,
    group_index,
    group_token_stats,
    is_right_padded,
    last_token_index,
    masked_sum,
    whiten_zeroed,
)


def _compaction(live_BT: torch.Tensor) -> torch.Tensor | None:
    """None for right-padded masks; else a per-row gather index that moves counted tokens to the
    front (order kept), so a recurrence over counted tokens skips masked gaps (verl's convention
    for observation tokens inside a response)."""
    if is_right_padded(live_BT):
        return None
    return torch.argsort((~live_BT).to(torch.uint8), dim=1, stable=True)


def discounted_returns(r_BT: torch.Tensor, live_BT: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """G_t = sum_{k >= 0} gamma^k r_{t+k} over counted tokens only; 0 on the others.

    Rewards on tokens that do not count are ignored; masked gaps inside a row are skipped (not
    discounted). Blocked scan of :func:`stepcredit.ops.discounted_reverse_cumsum`: stable at any T.
    """
    order = _compaction(live_BT)
    if order is None:
        # right padding: rewards zeroed after the end keep the returns there exactly 0
        return discounted_reverse_cumsum(torch.where(live_BT, r_BT, 0.0), discount=gamma, overwrite=True)
    r_BT, live_c = r_BT.gather(1, order), live_BT.gather(1, order)
    g_BT = discounted_reverse_cumsum(torch.where(live_c, r_BT, 0.0), discount=gamma, overwrite=True)
    return torch.empty_like(g_BT).scatter_(1, order, g_BT)


def process_rewards_BT(inp: AdvantageInputs) -> torch.Tensor | None:
    """The process channel restricted to its step tokens (0 elsewhere), or None."""
    steps = inp.steps_BT
    if inp.process_BT is None or steps is None:
        return None
    return torch.where(steps, inp.process_BT, 0.0)


@register_estimator("gae", needs_values=True, token_level=True)
def gae(
    inp: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, process_weight: float = 1.0, **_hp: Any
) -> AdvantageOutputs:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16).

        r_t = outcome_t + w * process_t
        delta_t = r_t + gamma V_{t+1} - V_t              (V after the last token = 0)
        A_t = sum_{k >= 0} (gamma lambda)^k delta_{t+k},   R_t = A_t + V_t
        adv = whiten(A) over the counted tokens of the batch (as verl)

    ``ret_BT`` holds R_t, the critic's target. Masked gaps inside a response are skipped (V_{t+1}
    is the next counted token's value). Token-level rewards: preserved.
    """
    if inp.values_BT is None:
        raise ValueError("gae needs values_BT")
    live_BT = inp.live_BT
    r_BT = inp.outcome_BT
    p_BT = process_rewards_BT(inp)
    if p_BT is not None:
        r_BT = r_BT + process_weight * p_BT
    v_BT = inp.values_BT.to(r_BT.dtype)
    order = _compaction(live_BT)
    live_c = live_BT
    if order is not None:
        r_BT, v_BT, live_c = r_BT.gather(1, order), v_BT.gather(1, order), live_BT.gather(1, order)
    # in place where possible: at B x T = 1024 x 4096 allocating a tensor costs more than the maths
    v_BT = torch.where(live_c, v_BT, 0.0)
    delta_BT = torch.where(live_c, r_BT, 0.0)
    delta_BT.sub_(v_BT)
    delta_BT[:, :-1].add_(v_BT[:, 1:], alpha=gamma)  # V after the last counted token is 0
    a_BT = discounted_reverse_cumsum(delta_BT, discount=gamma * lam, overwrite=True)  # delta: ours
    ret_BT = v_BT.add_(a_BT)  # 0 after the end: delta, hence A, is 0 there
    if order is not None:
        a_BT = torch.empty_like(a_BT).scatter_(1, order, a_BT)
        ret_BT = torch.empty_like(ret_BT).scatter_(1, order, ret_BT)
    return AdvantageOutputs(adv_BT=whiten_zeroed(a_BT, live_BT), ret_BT=ret_BT)


@register_estimator("reinforce_pp", token_level=True, process_batch_centred=True)
def reinforce_pp(
    inp: AdvantageInputs, *, gamma: float = 1.0, process_weight: float = 1.0, **_hp: Any
) -> AdvantageOutputs:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): discounted returns whitened over the batch.

        G^c_t = sum_{k >= 0} gamma^k r^c_{t+k}             for each channel c (outcome o, process p)
        A_t = whiten(G^o)_t + w * whiten(G^p)_t            (whiten over the counted tokens of the batch)

    With no process channel this is exactly REINFORCE++. ``ret_BT`` = G^o + w G^p.
    Token-level rewards: preserved.
    """
    live_BT = inp.live_BT
    g_BT = discounted_returns(inp.outcome_BT, live_BT, gamma=gamma)
    adv_BT = whiten_zeroed(g_BT, live_BT)
    p_BT = process_rewards_BT(inp)
    if p_BT is not None:
        gp_BT = discounted_returns(p_BT, live_BT, gamma=gamma)
        g_BT.add_(gp_BT, alpha=process_weight)
        adv_BT.add_(whiten_zeroed(gp_BT, live_BT), alpha=process_weight)
    return AdvantageOutputs(adv_BT=adv_BT, ret_BT=g_BT)


@register_estimator("grpo_process", needs_process=True, token_level=True, process_std_normalised=True)
def grpo_process(
    inp: AdvantageInputs,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    process_weight: float = 1.0,
    **_hp: Any,
) -> AdvantageOutputs:
    """GRPO with process supervision (Shao et al. 2024, DeepSeekMath, section 4.1.3), plus the outcome.

        r~_{i,j} = (r_{i,j} - mean(R)) / (std(R) + eps)      R = every step reward of every response
                                                              of the group (pooled, unbiased std)
        A^p_{i,t} = sum_{j : index(j) >= t} r~_{i,j}          (steps ending at or after token t)
        A^o_{i,t} = GRPO outcome advantage of response i     (normalised over the group's scores)
        A_{i,t} = A^o_{i,t} + w * A^p_{i,t}

    ``norm_by_std=False`` drops both divisions (Dr. GRPO). A group with <= 1 step uses mean 0, std 1.
    Without a process channel this equals ``grpo``; an outcome placed in the process channel at the
    last token (with ``process_mask_BT`` marking it) also gives ``grpo``'s advantages.
    Token-level rewards: preserved (step rewards keep their positions).
    """
    live_BT = inp.live_BT
    adv_B = grpo_advantage_B(outcome_score_B(inp), inp.group_B, inp.live_B, norm_by_std=norm_by_std, eps=eps)
    adv_BT = spread_B(adv_B, live_BT)
    steps_BT = inp.steps_BT
    if inp.process_BT is not None and steps_BT is not None:
        mean_B, std_B, _ = group_token_stats(inp.process_BT, steps_BT, inp.group_B)
        z_BT = inp.process_BT - mean_B[:, None]
        if norm_by_std:
            z_BT = z_BT / (std_B[:, None] + eps)
        z_BT = torch.where(steps_BT, z_BT, 0.0)
        adv_BT.add_(discounted_returns(z_BT, live_BT, gamma=1.0), alpha=process_weight)
    return AdvantageOutputs(adv_BT=adv_BT, ret_BT=adv_BT)


def step_fill(process_BT: torch.Tensor, steps_BT: torch.Tensor, live_BT: torch.Tensor) -> torch.Tensor:
    """Every token gets the step reward of the step it belongs to: the reward at the first step-end
    token at or after it (0 after the last step end and on dead tokens)."""
    B, T = process_BT.shape
    pos_BT = torch.arange(T, device=process_BT.device).expand(B, T)
    idx_BT = torch.where(steps_BT, pos_BT, T)
    nxt_BT = torch.flip(torch.cummin(torch.flip(idx_BT, [1]), dim=1).values, [1])
    got_BT = process_BT.gather(1, nxt_BT.clamp(max=T - 1))
    return torch.where((nxt_BT < T) & live_BT, got_BT, 0.0)


@register_estimator("vineppo", needs_process=True, token_level=True, needs_reward_values=True)
def vineppo(
    inp: AdvantageInputs, *, norm_by_std: bool = True, eps: float = 1e-6, **_hp: Any
) -> AdvantageOutputs:
    """VinePPO's step advantage (Kazemnejad et al. 2024, arXiv:2410.01679, eq. 3 with Monte Carlo values):

        A_{i,t} = r_j + V(s_j) - V(s_(j-1)) = U_{i,j}      t in step j of response i

    every token of a step gets that step's change of value; the last value is the response's reward
    (``terminal_is_reward`` value estimators: ``monte_carlo``, ``greedy_continuation``), so the outcome
    enters through the last step and a response's step advantages add up to R - V_0 (with
    ``process.mc_v0=group``: the RLOO advantage). Unlike ``grpo_process`` (a step's advantage is the sum
    of all later step rewards, i.e. R - V_(j-1)), a step that left the value unchanged gets 0 even in a
    failed response: credit goes to the step that lost it. A response without process rewards (a domain
    left out of ``process.domains``) gets its RLOO outcome advantage.

    ``norm_by_std``: divided by the root mean square over the batch's live tokens (PPO's advantage
    whitening without the mean shift, so a zero stays zero). Token-level rewards: preserved.
    """
    live_BT = inp.live_BT
    adv_BT = torch.zeros_like(inp.outcome_BT)
    has_B = torch.zeros(live_BT.shape[0], dtype=torch.bool, device=live_BT.device)
    if inp.process_BT is not None and inp.steps_BT is not None:
        if inp.process_mask_BT is None:
            raise ValueError("vineppo needs process_mask_BT: a step whose utility is 0 still owns its tokens")
        steps_BT = inp.steps_BT & live_BT
        has_B = steps_BT.any(1)
        adv_BT = step_fill(inp.process_BT, steps_BT, live_BT)
    if not bool(has_B.all()):
        adv_BT = torch.where(has_B[:, None], adv_BT, rloo(inp).adv_BT)
    if norm_by_std and bool(live_BT.any()):
        rms = adv_BT[live_BT].pow(2).mean().sqrt()
        adv_BT = adv_BT / (rms + eps)
    adv_BT = torch.where(live_BT, adv_BT, 0.0)
    return AdvantageOutputs(adv_BT=adv_BT, ret_BT=adv_BT)


@register_estimator(
    "grpo_vineppo",
    needs_process=True,
    token_level=True,
    needs_reward_values=True,
    process_std_normalised=True,
)
def grpo_vineppo(
    inp: AdvantageInputs,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    process_weight: float = 1.0,
    **_hp: Any,
) -> AdvantageOutputs:
    """GRPO's outcome advantage on every token plus VinePPO's step advantage on the tokens of its step.

        A^o_i     = (R_i - mean(R_group)) / (std(R_group) + eps)       GRPO (Shao et al. 2024, DeepSeekMath)
        U_{i,j}   = V_j - V_(j-1)                                     VinePPO (Kazemnejad et al. 2024,
                                                                      arXiv:2410.01679, eq. 3)
        A_{i,t}   = A^o_i + w * U_{i,j} / rms(U)                      t in step j of response i

    The two are normalised apart and then added, as the outcome and process channels are everywhere
    in this package (DeepSeekMath's process supervision adds its step returns to the outcome the same
    way). ``vineppo`` alone replaces the outcome by the step utilities: with a few noisy Monte Carlo
    values most steps get ~0 and the dense, well-estimated outcome signal is lost (docs/results.md,
    the mid-chain experiment). Here every token keeps it, and the step whose value dropped or rose
    gets extra credit. rms(U) is the root mean square of U over the live tokens of the responses that
    have steps (no mean shift, so a step that did not move the value adds nothing); ``norm_by_std=False``
    drops both divisions. A response without process rewards gets the outcome advantage alone.

    The outcome enters twice, on purpose: in A^o on every token, and through the step utilities, whose
    sum over a response is R - V_0 (the RLOO advantage with ``process.mc_v0=group``). The second copy
    is what localises: it sits on the steps whose value moved. Like ``vineppo`` it needs values that
    end at the reward (``needs_reward_values``), so verl's ``stepcredit_sync`` (forced-answer values
    only) refuses it with process rewards on; without them it is GRPO. Token-level rewards: preserved.
    """
    live_BT = inp.live_BT
    adv_B = grpo_advantage_B(outcome_score_B(inp), inp.group_B, inp.live_B, norm_by_std=norm_by_std, eps=eps)
    adv_BT = spread_B(adv_B, live_BT)
    if inp.process_BT is not None and inp.steps_BT is not None:
        if inp.process_mask_BT is None:
            raise ValueError(
                "grpo_vineppo needs process_mask_BT: a step whose utility is 0 still owns its tokens"
            )
        steps_BT = inp.steps_BT & live_BT
        u_BT = step_fill(inp.process_BT, steps_BT, live_BT)
        has_BT = steps_BT.any(1)[:, None] & live_BT
        if norm_by_std and bool(has_BT.any()):
            u_BT = u_BT / (u_BT[has_BT].pow(2).mean().sqrt() + eps)
        adv_BT = adv_BT + process_weight * torch.where(has_BT, u_BT, 0.0)
    adv_BT = torch.where(live_BT, adv_BT, 0.0)
    return AdvantageOutputs(adv_BT=adv_BT, ret_BT=adv_BT)


def prime_rloo_rewards(
    r_BT: torch.Tensor, at_BT: torch.Tensor, group_B: torch.Tensor, valid_B: torch.Tensor
) -> torch.Tensor:
    """PRIME's per-channel leave-one-out token rewards (Cui et al. 2025, arXiv 2502.01456, eq. 5).

        m_j = mean of r_j over its reward tokens;  r~_{i,t} = r_{i,t} n/(n-1) - (sum_{j in G} m_j)/(n-1)

    on the reward tokens ``at_BT`` (0 elsewhere). For a one-token channel this is r_i - mean_{j!=i} r_j.
    n counts the valid members of the group (an invalid one contributes no m_j); a singleton group
    keeps its raw rewards. A response with no reward token has m = 0.
    """
    cnt_B = at_BT.sum(1)
    m_B = masked_sum(r_BT, at_BT, dim=1) / cnt_B.clamp(min=1).to(r_BT.dtype)
    gid, k = group_index(group_B)
    s_G = torch.zeros(k, dtype=r_BT.dtype, device=r_BT.device).index_add_(
        0, gid, torch.where(valid_B, m_B, 0.0)
    )
    n_G = torch.zeros(k, dtype=r_BT.dtype, device=r_BT.device).index_add_(0, gid, valid_B.to(r_BT.dtype))
    n_B, s_B = n_G[gid], s_G[gid]
    denom_B = (n_B - 1).clamp(min=1)
    loo_BT = r_BT * (n_B / denom_B)[:, None] - (s_B / denom_B)[:, None]
    out_BT = torch.where((n_B > 1)[:, None], loo_BT, r_BT)
    return torch.where(at_BT, out_BT, 0.0)


@register_estimator("prime_rloo", needs_process=True, token_level=True)
def prime_rloo(inp: AdvantageInputs, *, process_weight: float = 1.0, **_hp: Any) -> AdvantageOutputs:
    """PRIME's token-level RLOO (Cui et al. 2025, "Process Reinforcement through Implicit Rewards").

        r~^c = PRIME leave-one-out rewards of channel c          (see :func:`prime_rloo_rewards`;
                                                                  outcome at the last token, process
                                                                  at the step tokens)
        G_t = sum_{t' >= t} (r~^o_{t'} + w r~^p_{t'})           (undiscounted return)
        A = whiten(G) over the counted tokens of the batch

    ``ret_BT`` = G. Token-level rewards: preserved.
    """
    live_BT = inp.live_BT
    live_B = inp.live_B
    last_B = last_token_index(live_BT)
    end_BT = torch.zeros_like(live_BT).scatter_(1, last_B[:, None], True) & live_BT
    total_BT = prime_rloo_rewards(inp.outcome_BT, end_BT, inp.group_B, live_B)
    steps_BT = inp.steps_BT
    if inp.process_BT is not None and steps_BT is not None:
        total_BT = total_BT + process_weight * prime_rloo_rewards(
            inp.process_BT, steps_BT, inp.group_B, live_B
        )
    g_BT = discounted_returns(total_BT, live_BT, gamma=1.0)
    return AdvantageOutputs(adv_BT=whiten_zeroed(g_BT, live_BT), ret_BT=g_BT)
