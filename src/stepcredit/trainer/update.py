"""``train_on(mini_batch)``: the DESIGN's four lines for one mini-batch of whole, scored groups.

    channels = reward_channels(mb)        # failure policy's drops, per-domain outcome processing, process channel
    prepared = prepare(state, mb)         # + KL shaping, advantages (registry lookup by name)
    metrics  = update(state, prepared)    # critic step, policy-loss step
    train_on = prepare + update           # (later PPO epochs call update again on the same prepared)

``mb`` is a :class:`~stepcredit.reward.Scored` mini-batch: the failure policy's verdicts were computed
once, when its rewards arrived (``trainer.sampling.step_stream``). Each function returns what it
computed (a new sub-batch, :class:`Channels`, :class:`Prepared`, a metrics dict); nothing is written
into the batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import torch

from stepcredit.advantages import AdvantageInputs, AdvantageOutputs, compute_advantages
from stepcredit.config import AlgorithmConfig, Config
from stepcredit.losses import compute_policy_loss
from stepcredit.losses.kl import apply_kl_penalty
from stepcredit.models import token_logprobs
from stepcredit.ops import last_token_index, masked_mean
from stepcredit.process import (
    VALUE_ESTIMATORS,
    batch_token_ids,
    credited_rows,
    group_prefix_values,
    outcome_values,
    process_channel,
    shared_prefix_share,
    step_cost_outcome_B,
    tree_credits,
)
from stepcredit.reward import (
    RunningStats,
    Scored,
    length_penalty_metrics,
    process_outcomes,
    shape_lengths,
)
from stepcredit.rollout import engines
from stepcredit.trainer.critic import critic_update
from stepcredit.trainer.metrics import outcome_free_signal
from stepcredit.types import Batch

if TYPE_CHECKING:
    from stepcredit.trainer.state import TrainState


@dataclass(frozen=True)
class Channels:
    """A mini-batch's two reward channels (kept apart until the estimator combines them) and masks."""

    outcome_BT: torch.Tensor
    """The processed outcome score at each response's last token, 0 elsewhere."""
    process_BT: torch.Tensor | None
    """U_i at episode ends (None without process rewards)."""
    process_mask_BT: torch.Tensor | None
    """True at the tokens that carry a U_i."""
    score_B: torch.Tensor
    """Processed outcome scores."""
    valid_B: torch.Tensor
    """False where the reward failed or the response is masked (no loss, not in any baseline)."""
    length_penalty_B: torch.Tensor | None = None
    """The length term added to each raw score (0 where none was; None when no domain shapes)."""
    verdict_B: torch.Tensor | None = None
    """True where the score is a real verdict (the responses length shaping may touch)."""
    shared_prefix_frac: float | None = None
    """Values from the group (``from_group`` estimators): the share of inner episode ends whose prefix more
    than one response of the group shares (None otherwise, or with no inner episode end)."""

    def to(self, device: torch.device) -> Channels:
        """Every tensor field on ``device``; the other fields as they are."""
        now = {f.name: getattr(self, f.name) for f in fields(self)}
        moved: dict[str, Any] = {k: v.to(device) for k, v in now.items() if isinstance(v, torch.Tensor)}
        return replace(self, **moved)


@dataclass(frozen=True)
class Prepared:
    """A mini-batch ready for one or more optimiser steps: advantages are fixed across PPO epochs."""

    batch: Batch
    """The mini-batch after the failure policy (groups dropped by ``drop_group`` removed)."""
    channels: Channels
    adv: AdvantageOutputs
    ref_logp_BT: torch.Tensor | None
    """Log-probs under the frozen reference (None without a KL term)."""
    live_BT: torch.Tensor
    """Response tokens of valid samples: what the losses count."""
    metrics: dict[str, float]
    """Figures of the preparation (KL in reward, advantage statistics, outcome-free signal)."""
    dropped: int
    """Responses removed by the failure policy's ``drop_group``."""


U_NEAR_ZERO = 0.05
"""|U| below this counts as no step credit in ``process/u_near_zero_frac`` (in U's own units: a
probability for verifier values, nats for forced-answer log-probs)."""


def needs_behaviour_logp(cfg: Config) -> bool:
    """Must the rollout provide the behaviour log-probs (from the sampling loop where
    ``rollout.logprobs_from_sampling`` allows, else from a pass of their own)?

    Not when each batch gets exactly one optimiser step from the weights that generated it (on-policy,
    one PPO epoch, one mini-batch per step, no KL shaping of the reward, no process values that
    continue from that pass's cache): the training forward pass is then the behaviour pass, and its
    detached log-probs are the ratio's denominator (ratio 1, the plain policy gradient, as in GRPO with
    one iteration). Everything else needs them: a later mini-batch or epoch, or stale data, is trained
    by weights that have moved.
    """
    p = cfg.pipeline
    one_update = p.mini_batch == 0 or p.mini_batch >= cfg.rollout.prompts_per_step * cfg.rollout.n
    return not (
        one_update
        and p.ppo_epochs == 1
        and not p.one_step_off_policy
        and not cfg.loss.kl_in_reward
        and not reads_rollout_cache(cfg)
    )


def reads_rollout_cache(cfg: Config) -> bool:
    """Do the process values run the policy over the batch at rollout time (and so continue from the
    behaviour pass's KV cache)? Not when they come from the group's outcomes (a tree's node values)."""
    spec = VALUE_ESTIMATORS.get(cfg.process.value_estimator)
    return cfg.process.enabled and not (spec.from_outcomes or spec.from_group)


def reward_channels(mb: Scored, cfg: Config, running: RunningStats | None = None) -> tuple[Batch, Channels]:
    """The failure policy's verdicts (drop the groups it drops, mask failed samples), each domain's
    outcome processing (``cfg.postprocess``: mask truncated, normalise, clip, scale), then the outcome
    channel (score at the last token) and the process channel
    (:func:`stepcredit.process.process_channel`, arithmetic on stored V(prefix) only). Returns the batch
    without dropped groups and its channels."""
    batch, (score_B, valid_B, keep_B) = mb.batch, mb.verdicts
    if not bool(keep_B.all()):
        idx = keep_B.nonzero().flatten().tolist()
        batch = batch.select(idx)
        score_B, valid_B = score_B[idx], valid_B[idx]
    assert batch.rewards is not None
    outcome_B = score_B.clone()  # the verdicts' scores before any shaping (process.credit_groups reads them)
    # a reward term before normalisation, on real verdicts only (a failed reward is never shaped)
    verdict_B = torch.tensor([r.ok for r in batch.rewards], dtype=torch.bool)
    score_B, length_penalty_B = shape_lengths(
        score_B,
        verdict_B,
        batch.response_mask_BT.sum(1).cpu(),
        domain_B=[s.domain for s in batch.samples],
        cfg=cfg.postprocess,
        max_new_tokens=cfg.rollout.max_new_tokens,
    )
    if cfg.process.enabled and batch.episode_ends is not None:
        # process.step_cost_as=outcome: c x episodes off the real verdicts, before group normalisation
        cost_B = step_cost_outcome_B(batch.episode_ends, cfg.process).to(score_B)
        score_B = torch.where(verdict_B.to(score_B.device), score_B - cost_B, score_B)
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
    mask_BT = batch.response_mask_BT
    score_B = score_B.to(mask_BT.device)
    valid_B = valid_B.to(mask_BT.device)
    outcome_BT = torch.zeros(mask_BT.shape, dtype=torch.float32, device=mask_BT.device)
    if len(batch):
        outcome_BT[torch.arange(len(batch), device=mask_BT.device), last_token_index(mask_BT)] = score_B
    process_BT = process_mask_BT = None
    shared_frac = None
    if cfg.process.enabled:
        values = batch.prefix_values
        credits = None  # the credit form's, from the values
        if VALUE_ESTIMATORS.get(cfg.process.value_estimator).from_outcomes and batch.episode_ends is not None:
            assert batch.tree_nodes is not None and batch.rewards is not None
            rewards = batch.rewards
            # the leaves' verified outcomes: a failed reward (whatever score the failure policy gives it)
            # is not a sample of the policy's value; a truncated leaf is (its outcome is what it earned)
            leaves = (batch.group_B.tolist(), batch.tree_nodes, batch.episode_ends)
            score, ok = [r.score for r in rewards], [r.ok for r in rewards]
            values = outcome_values(*leaves, score, ok)
            credits = tree_credits(*leaves, score, ok, cfg.process)  # process.treerl (None: off)
        elif VALUE_ESTIMATORS.get(cfg.process.value_estimator).from_group and batch.episode_ends is not None:
            assert batch.rewards is not None
            # the group's responses that share a prefix value it from their verified outcomes (a failed
            # reward is not a sample of the policy's value, as for a tree's leaves)
            _, responses = batch_token_ids(batch)
            score, ok = [r.score for r in batch.rewards], [r.ok for r in batch.rewards]
            values = group_prefix_values(batch.group_B.tolist(), responses, batch.episode_ends, score, ok)
            # how much of the group's step credit rests on more than one outcome (logged by prepare)
            shared_frac = shared_prefix_share(batch.group_B.tolist(), responses, batch.episode_ends)
        if batch.episode_ends is None or values is None:
            raise ValueError("process rewards are enabled but the batch has no V(prefix) values")
        process_BT, process_mask_BT = process_channel(
            batch.episode_ends, values, mask_BT, cfg.process, credits=credits, row_keys=group_ranks(batch)
        )
        if cfg.process.credit_groups != "all":
            # only the chosen groups' responses carry step credit: equal outcomes as GRPO sees them (the
            # verdicts' scores of the responses that stay valid after outcome processing)
            keep = credited_rows(
                batch.group_B.tolist(), outcome_B.tolist(), valid_B.tolist(), cfg.process.credit_groups
            )
            keep_BT = torch.tensor(keep, dtype=torch.bool, device=process_mask_BT.device)[:, None]
            process_mask_BT = process_mask_BT & keep_BT
            process_BT = torch.where(keep_BT, process_BT, 0.0)
    return batch, Channels(
        outcome_BT, process_BT, process_mask_BT, score_B, valid_B, length_penalty_B, verdict_B, shared_frac
    )


def group_ranks(batch: Batch) -> list[int]:
    """One key per response that does not depend on the mini-batch it is in: its group id and its rank
    within the group, ``group * 65536 + rank`` (seeds ``process.placebo``'s permutation)."""
    seen: dict[int, int] = {}
    keys = []
    for g in batch.group_B.tolist():
        keys.append(int(g) * 65536 + seen.get(g, 0))
        seen[g] = seen.get(g, 0) + 1
    return keys


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
        idx = idx.to(inp.outcome_BT.device)

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


def _sequences(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt + response ids and attention mask, ``[B, P + T]``."""
    ids_BL = torch.cat([batch.prompt_ids_BP, batch.response_ids_BT], 1)
    attn_BL = torch.cat([batch.prompt_mask_BP, batch.attention_BT()], 1).long()
    return ids_BL, attn_BL


def prepare(state: TrainState, mb: Scored) -> Prepared:
    """Reward channels, the reference log-probs, KL in the reward (when configured) and advantages."""
    cfg = state.cfg
    n_in = len(mb)
    batch, ch = reward_channels(mb, cfg, state.running)  # on the CPU, where the batch lives
    dev = next(state.model.parameters()).device
    batch, ch = batch.to(dev), ch.to(dev)
    mask_BT = batch.response_mask_BT
    T = mask_BT.shape[1]
    metrics: dict[str, float] = {}
    ref_logp_BT = None
    if state.ref is not None:
        ids_BL, attn_BL = _sequences(batch)
        with torch.no_grad():
            ref_logp_BT, _ = token_logprobs(
                state.ref, ids_BL, attn_BL, n_response=T, temperature=cfg.rollout.temperature
            )
    outcome_BT = ch.outcome_BT
    if cfg.loss.kl_in_reward and ref_logp_BT is not None:
        if batch.behaviour_logp_BT is None:
            raise RuntimeError("KL in the reward needs the rollout's behaviour log-probs")
        # KL shaping: -beta * KL(behaviour || ref) per token joins the outcome channel (Ziegler et al. 2019)
        outcome_BT, kl_now = apply_kl_penalty(
            outcome_BT,
            logp_BT=batch.behaviour_logp_BT,
            ref_logp_BT=ref_logp_BT,
            mask_BT=mask_BT,
            coef=state.kl_ctl.value,
            kind=cfg.loss.kl_estimator,
        )
        metrics["kl_in_reward"] = kl_now
    adv = advantages_by_domain(
        cfg.algorithm,
        AdvantageInputs(
            outcome_BT=outcome_BT,
            mask_BT=mask_BT,
            group_B=batch.group_B,
            valid_B=ch.valid_B,
            process_BT=ch.process_BT,
            process_mask_BT=ch.process_mask_BT,
            values_BT=batch.values_BT,
        ),
        [s.domain for s in batch.samples],
    )
    live_BT = mask_BT & ch.valid_B[:, None]
    metrics["adv/mean"] = float(masked_mean(adv.adv_BT, live_BT))
    metrics["adv/abs_mean"] = float(masked_mean(adv.adv_BT.abs(), live_BT))
    assert batch.rewards is not None
    metrics.update(outcome_free_signal(batch.rewards, batch.group_B, ch.valid_B, adv.adv_BT, live_BT))
    if ch.length_penalty_B is not None and ch.verdict_B is not None:
        metrics.update(length_penalty_metrics(ch.length_penalty_B, ch.verdict_B))
    if ch.process_BT is not None and ch.process_mask_BT is not None:
        u = ch.process_BT[ch.process_mask_BT & ch.valid_B[:, None]].float()
        if u.numel():
            # step credit as trained on: how large, and how many episodes get ~none (wasted steps)
            metrics["process/u_abs_mean"] = float(u.abs().mean())
            metrics["process/u_near_zero_frac"] = float((u.abs() < U_NEAR_ZERO).float().mean())
            metrics["process/episodes_per_response"] = u.numel() / max(1, int(ch.valid_B.sum()))
    if ch.shared_prefix_frac is not None:  # None: no inner episode end, no share to average in
        metrics["process/shared_prefix_frac"] = ch.shared_prefix_frac
    return Prepared(batch, ch, adv, ref_logp_BT, live_BT, metrics, dropped=n_in - len(batch))


def update(state: TrainState, p: Prepared, *, train_policy: bool = True) -> dict[str, float]:
    """One critic step (with a critic) and one policy-loss step on a prepared mini-batch.

    When the policy has moved since the batch was generated (an optimiser step since then: stale
    data, an earlier mini-batch or epoch), its current log-probs are the proximal policy of the
    decoupled objective (losses that do not use it ignore it). The proximal policy is the weights this
    step starts from, the weights of the training forward pass: where that pass computes the same
    function as a no-grad pass (no dropout active, :func:`train_mode_is_eval_mode`) its detached
    log-probs are the proximal ones and no pass of their own runs; otherwise one runs in eval mode.
    ``train_policy=False`` (critic warm-up): only the critic learns. Durations go in ``time/...``
    (the step sums them).
    """
    cfg = state.cfg
    proximal = state.updates > p.batch.policy_updates
    batch = p.batch
    T = batch.response_mask_BT.shape[1]
    ids_BL, attn_BL = _sequences(batch)
    temperature = cfg.rollout.temperature
    metrics = dict(p.metrics)
    if state.critic is not None:
        metrics.update(
            critic_update(state.critic, ids_BL, attn_BL, batch.values_BT, p.adv.ret_BT, p.live_BT, cfg)
        )
    if not train_policy:
        return metrics
    engines.release(state.model)  # vLLM's sleep mode on a GPU: its memory is the update's until it generates
    prox_logp_BT = None
    prox_pass = proximal and not train_mode_is_eval_mode(state.model)
    t0 = time.perf_counter()
    if prox_pass:
        state.model.eval()
        with torch.no_grad():
            prox_logp_BT, _ = token_logprobs(
                state.model, ids_BL, attn_BL, n_response=T, temperature=temperature
            )
    t1 = time.perf_counter()
    state.model.train()
    logp_BT, entropy_BT = token_logprobs(
        state.model, ids_BL, attn_BL, n_response=T, temperature=temperature, with_entropy=True
    )
    if proximal and not prox_pass:
        prox_logp_BT = logp_BT.detach()
    old_logp_BT = batch.behaviour_logp_BT
    if old_logp_BT is None:  # the rollout skipped the pass: these weights generated the batch
        if proximal:
            raise RuntimeError("a batch without behaviour log-probs was trained after the policy moved")
        old_logp_BT = logp_BT.detach()
    out = compute_policy_loss(
        cfg.loss,
        logp_BT=logp_BT,
        old_logp_BT=old_logp_BT,
        adv_BT=p.adv.adv_BT,
        mask_BT=p.live_BT,
        ref_logp_BT=p.ref_logp_BT,
        entropy_BT=entropy_BT,
        prox_logp_BT=prox_logp_BT,
        engine_logp_BT=batch.engine_logp_BT,  # an external engine sampled: truncated IS (loss.tis_cap)
        kl_coef=state.kl_ctl.value,
    )
    state.opt.zero_grad(set_to_none=True)
    grad_norm = 0.0
    if bool(p.live_BT.any()):  # else every sample of this mini-batch was masked: nothing to learn
        out.loss.backward()
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(state.model.parameters(), clip))
        state.opt.step()
        state.updates += 1
    metrics["time/proximal_s"] = t1 - t0 if prox_pass else 0.0
    metrics["time/policy_update_s"] = time.perf_counter() - t1
    metrics.update(out.metrics)
    metrics["grad_norm"] = grad_norm
    metrics["proximal"] = float(proximal)
    if "kl_ref" in metrics:
        metrics["kl"] = metrics["kl_ref"]
    kl_seen = metrics.get("kl_in_reward", metrics.get("kl_ref"))
    if kl_seen is not None:
        state.kl_ctl.update(kl_seen, n_steps=len(batch))
    return metrics


def train_mode_is_eval_mode(model: torch.nn.Module) -> bool:
    """Does ``model`` compute the same function in train and eval mode (no dropout with p > 0, in a
    module or in the config's attention/hidden dropout)? Then a training forward pass's detached
    outputs are the no-grad pass's (same kernels, same order: bit for bit on the CPU)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return False
    config = getattr(model, "config", None)
    rates = [v for k, v in vars(config).items() if "dropout" in k or k.endswith("_pdrop")] if config else []
    return all(not isinstance(v, (int, float)) or v == 0 for v in rates)


def train_on(
    state: TrainState, mb: Scored, *, train_policy: bool = True
) -> tuple[Prepared, dict[str, float]]:
    """Reward post-processing -> process channel -> advantages -> critic -> loss, for one mini-batch."""
    p = prepare(state, mb)
    return p, update(state, p, train_policy=train_policy)
