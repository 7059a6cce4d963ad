"""The pieces of one training step that the loop in :mod:`stepcredit.trainer.loop` calls in order.

Each function does one stage's work on a :class:`~stepcredit.types.Batch`: turn typed reward results
into the two reward channels, compute advantages (registry lookup, no branching on names), and take
one optimiser step with the policy loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stepcredit.advantages import AdvantageInputs, compute_advantages
from stepcredit.config import Config
from stepcredit.losses import KLController, compute_policy_loss
from stepcredit.losses.kl import apply_kl_penalty
from stepcredit.models import token_logprobs
from stepcredit.ops import last_token_index, masked_mean
from stepcredit.process import utilities_to_tokens
from stepcredit.reward import apply_failure_policy
from stepcredit.types import Batch


@dataclass
class Channels:
    """A batch's reward channels and masks, ready for an estimator."""

    outcome_BT: torch.Tensor
    process_BT: torch.Tensor | None
    process_mask_BT: torch.Tensor | None
    score_B: torch.Tensor
    valid_B: torch.Tensor


def reward_channels(batch: Batch, cfg: Config) -> tuple[Batch, Channels]:
    """Failure policy (drop groups, mask failed samples), then outcome and process channels.

    Returns the batch without dropped groups and its channels. The outcome score sits on the last
    response token; process utilities U_i at episode ends (arithmetic on stored V(prefix) only).
    """
    assert batch.rewards is not None, "rewards must be scored before reward_channels"
    score_B, valid_B, keep_B = apply_failure_policy(batch.rewards, batch.group_B, cfg.reward)
    if not bool(keep_B.all()):
        idx = keep_B.nonzero().flatten().tolist()
        batch = batch.select(idx)
        score_B, valid_B = score_B[idx], valid_B[idx]
    mask = batch.response_mask_BT
    outcome_BT = torch.zeros(mask.shape, dtype=torch.float32)
    if len(batch):
        outcome_BT[torch.arange(len(batch)), last_token_index(mask)] = score_B
    process_BT = process_mask_BT = None
    if cfg.process.enabled:
        process_BT = utilities_to_tokens(batch, cfg.process)
        process_mask_BT = torch.zeros(mask.shape, dtype=torch.bool)
        for b, ends in enumerate(batch.episode_ends or []):
            for e in ends:
                if 0 <= e < mask.shape[1]:
                    process_mask_BT[b, e] = True
        process_mask_BT &= mask
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
) -> dict[str, float]:
    """Advantages for one mini-batch (whole groups), then one optimiser step on the policy loss.

    ``proximal``: the policy has moved since the batch was generated (stale data, a later epoch);
    the current policy's log-probs are then computed first, as the proximal policy of the decoupled
    PPO objective (losses that do not use it ignore it).
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
    adv = compute_advantages(
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
    )
    live = mask & ch.valid_B[:, None]
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
    metrics["adv/mean"] = float(masked_mean(adv.adv_BT, live))
    metrics["adv/abs_mean"] = float(masked_mean(adv.adv_BT.abs(), live))
    if "kl_ref" in metrics:
        metrics["kl"] = metrics["kl_ref"]
    if "kl_in_reward" in metrics or "kl_ref" in metrics:
        kl_ctl.update(metrics.get("kl_in_reward", metrics.get("kl_ref", 0.0)), n_steps=len(batch))
    return metrics
