"""Policy losses, aggregation modes, KL estimators / penalty / controllers and the entropy bonus.

    from stepcredit.losses import compute_policy_loss
    out = compute_policy_loss(cfg.loss, logp_BT=..., old_logp_BT=..., adv_BT=..., mask_BT=...)
    out.loss.backward(); log(out.metrics)

A new loss: ``@register_loss("name")`` on a per-token function (docs/extending/losses.md).
Registered losses: ``ppo_clip``, ``decoupled_ppo``, ``topr``, ``gspo``. Aggregations: ``token-mean``,
``seq-mean-token-sum``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``. KL: ``k1``, ``k2``, ``k3``.
"""

from stepcredit.losses.core import (
    AGGREGATIONS,
    LOSSES,
    LossOutput,
    PolicyLoss,
    aggregate,
    check_config,
    compute_policy_loss,
    decoupled_ppo,
    gspo,
    ppo_clip,
    register_loss,
    topr,
)
from stepcredit.losses.kl import KL_ESTIMATORS, KLController, apply_kl_penalty, kl_estimate

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOSSES",
    "KLController",
    "LossOutput",
    "PolicyLoss",
    "aggregate",
    "apply_kl_penalty",
    "check_config",
    "compute_policy_loss",
    "decoupled_ppo",
    "gspo",
    "kl_estimate",
    "ppo_clip",
    "register_loss",
    "topr",
]
