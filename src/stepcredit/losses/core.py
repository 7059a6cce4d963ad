"""Policy losses (one registry, one signature), loss aggregation modes and the entry point.

A policy loss is a pure function with keyword-only arguments

    fn(*, logp_BT, old_logp_BT, adv_BT, mask_BT, prox_logp_BT, clip_low, clip_high, dual_clip_c,
       behav_weight_cap, **_) -> (loss_BT, metrics)

returning the per-token loss (aggregated afterwards by the configured mode) and tensor metrics.
Every loss receives every hyperparameter and ignores the ones it does not use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from stepcredit.errors import ConfigError
from stepcredit.losses.kl import KL_ESTIMATORS, kl_estimate
from stepcredit.ops import check_shape, masked_mean
from stepcredit.registry import Registry

if TYPE_CHECKING:
    from stepcredit.config import Config, LossConfig

# ------------------------------------------------------------------------------------ aggregation
AggFn = Callable[..., torch.Tensor]
AGGREGATIONS: Registry[AggFn] = Registry("loss aggregation")


def _seq_mean(x_B: torch.Tensor, has_B: torch.Tensor) -> torch.Tensor:
    """Mean over the responses that have at least one counted token."""
    return (x_B * has_B.to(x_B.dtype)).sum() / has_B.sum().clamp(min=1).to(x_B.dtype)


@AGGREGATIONS.register("token-mean")
def agg_token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor, **_hp: Any) -> torch.Tensor:
    """sum_{b,t} l m / sum_{b,t} m: every token weighs the same (DAPO, Yu et al. 2025)."""
    return masked_mean(loss_BT, mask_BT)


@AGGREGATIONS.register("seq-mean-token-sum")
def agg_seq_mean_token_sum(loss_BT: torch.Tensor, mask_BT: torch.Tensor, **_hp: Any) -> torch.Tensor:
    """mean_b sum_t l m over responses with >= 1 counted token."""
    seq_B = torch.where(mask_BT, loss_BT, loss_BT.new_zeros(())).sum(1)
    return _seq_mean(seq_B, mask_BT.any(1))


@AGGREGATIONS.register("seq-mean-token-mean")
def agg_seq_mean_token_mean(loss_BT: torch.Tensor, mask_BT: torch.Tensor, **_hp: Any) -> torch.Tensor:
    """mean_b (sum_t l m / sum_t m): every response weighs the same (original GRPO)."""
    return _seq_mean(masked_mean(loss_BT, mask_BT, dim=1), mask_BT.any(1))


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def agg_seq_mean_token_sum_norm(
    loss_BT: torch.Tensor, mask_BT: torch.Tensor, *, norm_len: int | None = None, **_hp: Any
) -> torch.Tensor:
    """mean_b sum_t l m / L with a constant L (Dr. GRPO, Liu et al. 2025): L = ``norm_len``, or
    the padded length T when it is None (verl's default; then extra padding changes the loss)."""
    L = norm_len if norm_len else loss_BT.shape[1]
    return agg_seq_mean_token_sum(loss_BT, mask_BT) / L


def aggregate(
    loss_BT: torch.Tensor, mask_BT: torch.Tensor, *, mode: str = "token-mean", norm_len: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar by the named mode (see :data:`AGGREGATIONS`)."""
    return AGGREGATIONS.get(mode)(loss_BT, mask_BT, norm_len=norm_len)


# ----------------------------------------------------------------------------------- policy loss
PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: the per-token function plus what the start-up check needs to know."""

    fn: PolicyLossFn
    corrects_staleness: bool = False
    """Built for data from an older policy (one-step off-policy): the trust region or the weights
    account for the behaviour policy differing from the current one."""


LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_loss(name: str, *, corrects_staleness: bool = False) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: ``@register_loss("ppo_clip")`` adds a per-token policy loss to :data:`LOSSES`."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        LOSSES.add(name, PolicyLoss(fn=fn, corrects_staleness=corrects_staleness))
        return fn

    return deco


# ratio = exp(log-ratio): clamp the log-ratio for stability (verl / TRL use the same bound).
_LOG_RATIO_CLAMP = 20.0


def _clipped_surrogate(
    log_ratio_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate with asymmetric clip and dual clip, as a per-token loss:

    l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))      (Schulman et al. 2017, eq. 7;
                                                               eps_high > eps_low: DAPO "clip-higher")
    l = min(l, -A c)  where A < 0, if c > 0                  (dual clip, Ye et al. 2020, arXiv 1912.09729)
    """
    ratio_BT = torch.exp(log_ratio_BT.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    l1_BT = -adv_BT * ratio_BT
    l2_BT = -adv_BT * ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_BT = torch.maximum(l1_BT, l2_BT)
    metrics = {"clip_frac": masked_mean((l2_BT > l1_BT).to(adv_BT.dtype), mask_BT)}
    if dual_clip_c > 0:
        l3_BT = -adv_BT * dual_clip_c
        neg_BT = adv_BT < 0
        metrics["clip_frac_lower"] = masked_mean((neg_BT & (loss_BT > l3_BT)).to(adv_BT.dtype), mask_BT)
        loss_BT = torch.where(neg_BT, torch.minimum(loss_BT, l3_BT), loss_BT)
    return loss_BT, metrics


@register_loss("ppo_clip")
def ppo_clip(
    *,
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float = 3.0,
    **_hp: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clip (Schulman et al. 2017) with r = pi_theta / pi_old per token, separate low/high clip
    ranges and the dual-clip bound c on negative advantages (see :func:`_clipped_surrogate`)."""
    return _clipped_surrogate(
        logp_BT - old_logp_BT,
        adv_BT,
        mask_BT,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip_c=dual_clip_c,
    )


# Hilton et al. 2022: the proximal policy centres the trust region, the behaviour policy only weights.
@register_loss("decoupled_ppo", corrects_staleness=True)
def decoupled_ppo(
    *,
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    prox_logp_BT: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float = 3.0,
    behav_weight_cap: float = 0.0,
    **_hp: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled PPO (Hilton et al. 2022, arXiv 2110.13799, eq. 3; AReaL, Fu et al. 2025): the trust
    region is centred on a proximal policy, the off-policy correction uses the behaviour policy.

        l = w * clip_surrogate(pi_theta / pi_prox, A),    w = sg(pi_prox / pi_behav)

    ``old_logp_BT`` is the behaviour policy (the one that sampled), ``prox_logp_BT`` the proximal
    one (None = behaviour, i.e. plain PPO). ``behav_weight_cap`` > 0 truncates w at that value.
    """
    prox_BT = old_logp_BT if prox_logp_BT is None else prox_logp_BT
    loss_BT, metrics = _clipped_surrogate(
        logp_BT - prox_BT, adv_BT, mask_BT, clip_low=clip_low, clip_high=clip_high, dual_clip_c=dual_clip_c
    )
    w_BT = torch.exp((prox_BT - old_logp_BT).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)).detach()
    if behav_weight_cap > 0:
        w_BT = w_BT.clamp(max=behav_weight_cap)
    metrics["behav_weight"] = masked_mean(w_BT, mask_BT)
    return loss_BT * w_BT, metrics


# TOPR is built for off-policy data (its truncated weights on negative samples).
@register_loss("topr", corrects_staleness=True)
def topr(
    *,
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    **_hp: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Tapered off-policy REINFORCE (Le Roux et al. 2025, arXiv 2503.14286, eq. 7):

        l_t = -A_t log pi_theta(y_t)                        where A_t >= 0 (positive: no truncation)
        l_t = -sg(clip(rho, 0, 1)) A_t log pi_theta(y_t)    where A_t < 0, rho = pi_theta(y)/pi_old(y)

    rho is the sequence-level ratio exp(sum_t log pi_theta - log pi_old), as in the paper; computed
    as exp(min(., 0)) so it never overflows.
    """
    seq_log_ratio_B = torch.where(mask_BT, logp_BT - old_logp_BT, logp_BT.new_zeros(())).sum(1).detach()
    rho_B = torch.exp(seq_log_ratio_B.clamp(max=0.0))
    neg_BT = adv_BT < 0
    w_BT = torch.where(neg_BT, rho_B[:, None].expand_as(adv_BT), torch.ones_like(adv_BT))
    metrics = {"neg_weight": masked_mean(w_BT, mask_BT & neg_BT)}
    return -w_BT * adv_BT * logp_BT, metrics


@register_loss("gspo")
def gspo(
    *,
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    **_hp: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group sequence policy optimisation (Zheng et al. 2025, arXiv 2507.18071, eqs. 5-7 and 10):

        s_i = exp(1/|y_i| sum_t log(pi_theta / pi_old)),     s_{i,t} = sg(s_i) pi_theta(y_t) / sg(pi_theta(y_t))
        l_{i,t} = max(-A s_{i,t}, -A clip(s_{i,t}, 1 - eps_low, 1 + eps_high))

    (the token form gives GSPO's gradient while allowing token-level advantages). The paper's clip
    ranges are tiny (3e-4 / 4e-4): set ``loss.clip_low``/``clip_high`` accordingly.
    """
    zero = logp_BT.new_zeros(())
    n_B = mask_BT.sum(1).clamp(min=1).to(logp_BT.dtype)
    seq_B = torch.where(mask_BT, logp_BT - old_logp_BT, zero).sum(1) / n_B
    log_s_BT = seq_B.detach()[:, None] + logp_BT - logp_BT.detach()
    s_BT = torch.exp(log_s_BT.clamp(max=10.0))
    l1_BT = -adv_BT * s_BT
    l2_BT = -adv_BT * s_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    metrics = {"clip_frac": masked_mean((l2_BT > l1_BT).to(adv_BT.dtype), mask_BT)}
    return torch.maximum(l1_BT, l2_BT), metrics


# ----------------------------------------------------------------------- engine mismatch (TIS)
def truncated_is_weight(
    *,
    logp_BT: torch.Tensor,
    engine_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance sampling for a rollout engine that is not the trainer (Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training"; verl's
    ``tis_imp_ratio_cap``, TRL's ``vllm_importance_sampling_cap``): the tokens were drawn from the
    engine's pi_engine, the loss assumes the trainer's pi_old of the same weights, so each token's loss
    is weighted by

        w = sg(min(pi_old / pi_engine, C))        (C = ``cap``; ``cap`` = 0: w = 1, no correction)

    ``logp_BT``: the trainer's log-probs of the sampled tokens at the weights that sampled them.
    Metrics, over counted tokens: the gap |log pi_old - log pi_engine| (mean, max), the mean weight
    and the share of tokens whose weight was truncated.
    """
    check_shape("engine_logp_BT", engine_logp_BT, tuple(logp_BT.shape))
    diff_BT = (logp_BT - engine_logp_BT).detach()
    ratio_BT = torch.exp(diff_BT.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    w_BT = ratio_BT.clamp(max=cap) if cap > 0 else torch.ones_like(ratio_BT)
    gap_BT = diff_BT.abs()
    zero = gap_BT.new_zeros(())
    metrics = {
        "engine/logp_gap_mean": masked_mean(gap_BT, mask_BT),
        "engine/logp_gap_max": torch.where(mask_BT, gap_BT, zero).max() if mask_BT.any() else zero,
        "engine/tis_weight_mean": masked_mean(w_BT, mask_BT),
        "engine/tis_clip_frac": masked_mean((ratio_BT > cap).to(w_BT.dtype), mask_BT) if cap > 0 else zero,
    }
    return w_BT, metrics


# -------------------------------------------------------------------------------------- entry
@dataclass
class LossOutput:
    loss: torch.Tensor
    """Scalar to call ``backward()`` on."""
    metrics: dict[str, float] = field(default_factory=dict)
    """pg_loss, clip_frac, approx_kl (pi vs old, k3), ppo_kl (k1), kl_ref, entropy, ..."""


_LOSS_HPARAMS = ("clip_low", "clip_high", "dual_clip_c", "behav_weight_cap")
"""The ``LossConfig`` fields every registered policy loss is called with (each takes what it uses)."""


def _check_inputs(*, logp_BT: torch.Tensor, **others_BT: torch.Tensor | None) -> None:
    """Every given tensor has ``logp_BT``'s (B, T) shape, and the mask is boolean."""
    check_shape("logp_BT", logp_BT, (None, None))
    for name, x in others_BT.items():
        if x is not None:
            check_shape(name, x, tuple(logp_BT.shape))
    mask_BT = others_BT["mask_BT"]
    if mask_BT is not None and mask_BT.dtype != torch.bool:
        raise ValueError(f"mask_BT: expected dtype bool, got {mask_BT.dtype}")


@torch.no_grad()
def _policy_drift(
    *, logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the policy moved from pi_old on the counted tokens: the mean negative log-ratio
    (``ppo_kl``) and k3 = (r - 1) - log r >= 0 (``approx_kl``; Schulman 2020, CleanRL's approx_kl)."""
    log_r_BT = (logp_BT - old_logp_BT).detach()
    return {
        "ppo_kl": masked_mean(-log_r_BT, mask_BT),
        "approx_kl": masked_mean(torch.expm1(log_r_BT.clamp(-20, 20)) - log_r_BT, mask_BT),
    }


def compute_policy_loss(
    cfg: LossConfig,
    *,
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None = None,
    entropy_BT: torch.Tensor | None = None,
    prox_logp_BT: torch.Tensor | None = None,
    engine_logp_BT: torch.Tensor | None = None,
    kl_coef: float | None = None,
) -> LossOutput:
    """The policy loss of one (mini-)batch: the configured policy loss, aggregated, plus
    ``kl_coef`` times the aggregated KL to the reference (unless the KL is in the reward) minus
    ``entropy_coef`` times the aggregated entropy.

    ``mask_BT`` must already exclude the responses whose reward failed. ``kl_coef`` overrides
    ``cfg.kl_coef`` (pass a :class:`KLController`'s value). ``engine_logp_BT``: an external rollout
    engine's log-probs of the tokens; the policy loss is then weighted per token by
    :func:`truncated_is_weight` against ``old_logp_BT`` (cap ``cfg.tis_cap``) and the gap is reported.
    """
    _check_inputs(
        logp_BT=logp_BT,
        old_logp_BT=old_logp_BT,
        adv_BT=adv_BT,
        mask_BT=mask_BT,
        ref_logp_BT=ref_logp_BT,
        entropy_BT=entropy_BT,
        prox_logp_BT=prox_logp_BT,
        engine_logp_BT=engine_logp_BT,
    )
    beta = cfg.kl_coef if kl_coef is None else kl_coef
    norm_len = cfg.agg_norm_len or None

    pg_BT, tmetrics = LOSSES.get(cfg.name).fn(
        logp_BT=logp_BT,
        old_logp_BT=old_logp_BT,
        adv_BT=adv_BT,
        mask_BT=mask_BT,
        prox_logp_BT=prox_logp_BT,
        **{k: getattr(cfg, k) for k in _LOSS_HPARAMS},
    )
    if engine_logp_BT is not None:
        tis_BT, tis_metrics = truncated_is_weight(
            logp_BT=old_logp_BT, engine_logp_BT=engine_logp_BT, mask_BT=mask_BT, cap=cfg.tis_cap
        )
        pg_BT = pg_BT * tis_BT
        tmetrics.update(tis_metrics)
    pg = aggregate(pg_BT, mask_BT, mode=cfg.agg, norm_len=norm_len)
    loss = pg
    tmetrics.update(_policy_drift(logp_BT=logp_BT, old_logp_BT=old_logp_BT, mask_BT=mask_BT))
    metrics = {k: float(v) for k, v in tmetrics.items()}
    metrics["pg_loss"] = float(pg.detach())

    if ref_logp_BT is not None:
        kl = aggregate(
            kl_estimate(logp_BT, ref_logp_BT, kind=cfg.kl_estimator), mask_BT, mode=cfg.agg, norm_len=norm_len
        )
        metrics["kl_ref"] = float(kl.detach())
        if not cfg.kl_in_reward and beta > 0:
            loss = loss + beta * kl
            metrics["kl_coef"] = beta
    elif beta > 0 and not cfg.kl_in_reward:
        raise ValueError(
            "loss.kl_coef > 0 needs ref_logp_BT (set loss.kl_coef=0 to train without a reference)"
        )

    if entropy_BT is not None:
        ent = aggregate(entropy_BT, mask_BT, mode=cfg.agg, norm_len=norm_len)
        metrics["entropy"] = float(ent.detach())
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * ent
    elif cfg.entropy_coef > 0:
        raise ValueError("loss.entropy_coef > 0 needs entropy_BT")
    metrics["loss"] = float(loss.detach())
    return LossOutput(loss=loss, metrics=metrics)


def check_config(cfg: Config) -> None:
    """Start-up check of the loss settings that the config tree cannot see; raises ConfigError."""
    if cfg.loss.name not in LOSSES:
        raise ConfigError(
            f"config key loss.name: unknown policy loss {cfg.loss.name!r} (valid: {', '.join(LOSSES)})"
        )
    if cfg.loss.kl_estimator not in KL_ESTIMATORS:
        raise ConfigError(
            f"config key loss.kl_estimator: unknown {cfg.loss.kl_estimator!r} (valid: {', '.join(KL_ESTIMATORS)})"
        )
    if cfg.loss.agg not in AGGREGATIONS:
        raise ConfigError(
            f"config key loss.agg: unknown mode {cfg.loss.agg!r} (valid: {', '.join(AGGREGATIONS)})"
        )
