"""The pieces of one training step that the loop in :mod:`stepcredit.trainer.loop` calls in order.

Each function does one stage's work on a :class:`~stepcredit.types.Batch`: turn typed reward results
into the two reward channels, compute advantages (registry lookup, no branching on names), and take
one optimiser step with the policy loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stepcredit.advantages import AdvantageInputs, AdvantageOutputs, compute_advantages
from stepcredit.config import AlgorithmConfig, Config
from stepcredit.losses import KLController, compute_policy_loss
from stepcredit.losses.kl import apply_kl_penalty
from stepcredit.losses.value import clipped_value_loss
from stepcredit.models import token_logprobs
from stepcredit.models.critic import ValueModel
from stepcredit.ops import last_token_index, masked_mean
from stepcredit.process import process_channel
from stepcredit.reward import apply_failure_policy
from stepcredit.reward.postprocess import RunningStats, process_outcomes
from stepcredit.types import Batch


@dataclass
class Channels:
    """A batch's reward channels and masks, ready for an estimator."""

    outcome_BT: torch.Tensor
    process_BT: torch.Tensor | None
    process_mask_BT: torch.Tensor | None
    score_B: torch.Tensor
    valid_B: torch.Tensor


@dataclass
class Critic:
    """The value model and its optimiser (``algorithm.use_critic``)."""

    model: ValueModel
    opt: torch.optim.Optimizer


def reward_channels(batch: Batch, cfg: Config, running: RunningStats | None = None) -> tuple[Batch, Channels]:
    """Failure policy (drop groups, mask failed samples), each domain's outcome processing (mask
    truncated, normalise, clip, scale: ``cfg.postprocess``), then outcome and process channels.

    Returns the batch without dropped groups and its channels. The outcome score sits on the last
    response token; process utilities U_i at episode ends (arithmetic on stored V(prefix) only).
    ``running`` holds the per-domain running statistics (updated here when a domain uses them).
    """
    assert batch.rewards is not None, "rewards must be scored before reward_channels"
    score_B, valid_B, keep_B = apply_failure_policy(batch.rewards, batch.group_B, cfg.reward)
    if not bool(keep_B.all()):
        idx = keep_B.nonzero().flatten().tolist()
        batch = batch.select(idx)
        score_B, valid_B = score_B[idx], valid_B[idx]
    score_B, valid_B = process_outcomes(
        score_B,
        valid_B,
        group_B=batch.group_B,
        domain_B=[s.domain for s in batch.samples],
        truncated_B=batch.truncated_B,
        cfg=cfg.postprocess,
        eps=cfg.algorithm.eps,
        running=running if running is not None else RunningStats(),
    )
    mask = batch.response_mask_BT
    outcome_BT = torch.zeros(mask.shape, dtype=torch.float32)
    if len(batch):
        outcome_BT[torch.arange(len(batch)), last_token_index(mask)] = score_B
    process_BT = process_mask_BT = None
    if cfg.process.enabled:
        if batch.episode_ends is None or batch.prefix_values is None:
            raise ValueError("process rewards enabled but the batch has no V(prefix) values")
        process_BT, process_mask_BT = process_channel(
            batch.episode_ends, batch.prefix_values, mask, cfg.process
        )
    return batch, Channels(outcome_BT, process_BT, process_mask_BT, score_B, valid_B)


def policy_update(
    model: Any,
    ref_model: Any | None,
    opt: torch.optim.Optimizer,
    batch: Batch,
    ch: Channels,
    cfg: Config,
    kl_ctl: KLController,
    *,
    proximal: bool = False,
    critic: Critic | None = None,
    update_policy: bool = True,
) -> dict[str, float]:
    """Advantages for one mini-batch (whole groups), then one optimiser step on the policy loss.

    ``proximal``: the policy has moved since the batch was generated (stale data, a later epoch);
    the current policy's log-probs are then computed first, as the proximal policy of the decoupled
    PPO objective (losses that do not use it ignore it). ``critic``: one step of the clipped value
    loss on the estimator's returns. ``update_policy=False`` (critic warm-up): the policy is untouched.
    """
    temperature = cfg.rollout.temperature
    mask = batch.response_mask_BT
    ids = torch.cat([batch.prompt_ids_BP, batch.response_ids_BT], 1)
    attn = torch.cat([batch.prompt_mask_BP, mask], 1).long()
    T = mask.shape[1]
    ref_logp = None
    metrics: dict[str, float] = {}
    if ref_model is not None:
        with torch.no_grad():
            ref_logp, _ = token_logprobs(ref_model, ids, attn, n_response=T, temperature=temperature)
    prox_logp = None
    if proximal:
        with torch.no_grad():
            prox_logp, _ = token_logprobs(model, ids, attn, n_response=T, temperature=temperature)
    outcome_BT = ch.outcome_BT
    if cfg.loss.kl_in_reward and ref_logp is not None:
        outcome_BT, kl_now = apply_kl_penalty(
            outcome_BT,
            logp_BT=batch.behaviour_logp_BT,
            ref_logp_BT=ref_logp,
            mask_BT=mask,
            coef=kl_ctl.value,
            kind=cfg.loss.kl_estimator,
        )
        metrics["kl_in_reward"] = kl_now
    adv = advantages_by_domain(
        cfg.algorithm,
        AdvantageInputs(
            outcome_BT=outcome_BT,
            mask_BT=mask,
            group_B=batch.group_B,
            valid_B=ch.valid_B,
            process_BT=ch.process_BT,
            process_mask_BT=ch.process_mask_BT,
            values_BT=batch.values_BT,
        ),
        [s.domain for s in batch.samples],
    )
    live = mask & ch.valid_B[:, None]
    if critic is not None:
        metrics.update(critic_update(critic, ids, attn, batch.values_BT, adv.ret_BT, live, cfg))
    metrics["adv/mean"] = float(masked_mean(adv.adv_BT, live))
    metrics["adv/abs_mean"] = float(masked_mean(adv.adv_BT.abs(), live))
    metrics.update(outcome_free_signal(batch, ch, adv.adv_BT, live))
    if not update_policy:
        return metrics
    model.train()
    logp, ent = token_logprobs(model, ids, attn, n_response=T, temperature=temperature, with_entropy=True)
    out = compute_policy_loss(
        cfg.loss,
        logp_BT=logp,
        old_logp_BT=batch.behaviour_logp_BT,
        adv_BT=adv.adv_BT,
        mask_BT=live,
        ref_logp_BT=ref_logp,
        entropy_BT=ent,
        prox_logp_BT=prox_logp,
        kl_coef=kl_ctl.value,
    )
    opt.zero_grad(set_to_none=True)
    if bool(live.any()):
        out.loss.backward()
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        opt.step()
    else:  # every sample of this mini-batch was masked: nothing to learn from
        gn = 0.0
    metrics.update(out.metrics)
    metrics["grad_norm"] = gn
    if "kl_ref" in metrics:
        metrics["kl"] = metrics["kl_ref"]
    if "kl_in_reward" in metrics or "kl_ref" in metrics:
        kl_ctl.update(metrics.get("kl_in_reward", metrics.get("kl_ref", 0.0)), n_steps=len(batch))
    return metrics


def outcome_free_signal(
    batch: Batch, ch: Channels, adv_BT: torch.Tensor, live_BT: torch.Tensor
) -> dict[str, float]:
    """How many groups carry no outcome signal (all valid outcome scores equal) and still get a
    non-zero advantage on some token, as fractions of the groups of this mini-batch.

    Outcome-only estimators give such groups exactly zero advantage; process rewards are what can
    move them (``groups/all_equal_nonzero_adv_frac`` / ``groups/all_equal_frac`` is the share).
    """
    assert batch.rewards is not None
    raw = torch.tensor([r.score for r in batch.rewards], dtype=torch.float64)
    moved_B = ((adv_BT.abs() > 1e-8) & live_BT).any(1)
    n_groups = n_equal = n_moved = 0
    for g in batch.group_B.unique().tolist():
        idx = ((batch.group_B == g) & ch.valid_B).nonzero().flatten()
        n_groups += 1
        if len(idx) == 0 or float(raw[idx].max() - raw[idx].min()) > 1e-6:
            continue
        n_equal += 1
        n_moved += int(bool(moved_B[idx].any()))
    if n_groups == 0:
        return {}
    return {
        "groups/all_equal_adv_frac": n_equal / n_groups,
        "groups/all_equal_nonzero_adv_frac": n_moved / n_groups,
    }


def advantages_by_domain(cfg: AlgorithmConfig, inp: AdvantageInputs, domain_B: list[str]) -> AdvantageOutputs:
    """The estimator run on each domain's responses apart, so batch-level statistics (whitening in
    ``reinforce_pp``, ``gae``) are per domain; groups never span domains, so per-group estimators
    give the same result either way. One domain: a single call."""
    domains = list(dict.fromkeys(domain_B))
    if len(domains) <= 1:
        return compute_advantages(cfg, inp)
    adv_BT = torch.zeros_like(inp.outcome_BT)
    ret_BT = torch.zeros_like(inp.outcome_BT)
    for d in domains:
        idx = torch.tensor([i for i, x in enumerate(domain_B) if x == d], dtype=torch.long)

        def pick(x: torch.Tensor | None, idx: torch.Tensor = idx) -> torch.Tensor | None:
            return None if x is None else x.index_select(0, idx)

        out = compute_advantages(
            cfg,
            AdvantageInputs(
                outcome_BT=inp.outcome_BT.index_select(0, idx),
                mask_BT=inp.mask_BT.index_select(0, idx),
                group_B=inp.group_B.index_select(0, idx),
                valid_B=pick(inp.valid_B),
                process_BT=pick(inp.process_BT),
                process_mask_BT=pick(inp.process_mask_BT),
                values_BT=pick(inp.values_BT),
            ),
        )
        adv_BT[idx] = out.adv_BT.to(adv_BT.dtype)
        ret_BT[idx] = out.ret_BT.to(ret_BT.dtype)
    return AdvantageOutputs(adv_BT=adv_BT, ret_BT=ret_BT)


@torch.no_grad()
def critic_values(critic: Critic, batch: Batch) -> torch.Tensor:
    """V(s_t) of every response token of ``batch`` under the current critic (stored as ``values_BT``)."""
    ids = torch.cat([batch.prompt_ids_BP, batch.response_ids_BT], 1)
    attn = torch.cat([batch.prompt_mask_BP, batch.response_mask_BT], 1).long()
    critic.model.eval()
    v = critic.model(ids, attn, n_response=batch.response_ids_BT.shape[1])
    return v * batch.response_mask_BT


def critic_update(
    critic: Critic,
    ids: torch.Tensor,
    attn: torch.Tensor,
    old_values_BT: torch.Tensor | None,
    returns_BT: torch.Tensor,
    live_BT: torch.Tensor,
    cfg: Config,
) -> dict[str, float]:
    """One optimiser step of the clipped value loss towards the estimator's returns."""
    T = live_BT.shape[1]
    critic.model.train()
    v = critic.model(ids, attn, n_response=T)
    old = old_values_BT if old_values_BT is not None else v.detach()
    loss = clipped_value_loss(v, old, returns_BT.detach().float(), live_BT, clip=cfg.critic.value_clip)
    critic.opt.zero_grad(set_to_none=True)
    gn = 0.0
    if bool(live_BT.any()):
        loss.backward()
        clip = cfg.critic.grad_clip if cfg.critic.grad_clip > 0 else float("inf")
        gn = float(torch.nn.utils.clip_grad_norm_(critic.model.parameters(), clip))
        critic.opt.step()
    return {
        "critic/value_loss": float(loss.detach()),
        "critic/grad_norm": gn,
        "critic/values_mean": float(masked_mean(v.detach(), live_BT)),
        "critic/returns_mean": float(masked_mean(returns_BT.float(), live_BT)),
    }
