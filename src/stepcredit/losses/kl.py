"""KL to the reference policy: estimators, the in-reward penalty and the coefficient controllers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stepcredit.ops import masked_mean
from stepcredit.registry import Registry

if TYPE_CHECKING:
    from stepcredit.config import LossConfig

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")

# exp() of a log-ratio beyond +-20 is numerically useless; clamping it (as verl/TRL do) keeps
# k3 finite when a token's probability collapses under one of the two policies.
_LOG_RATIO_CLAMP = 20.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    """k1 = log pi(x) - log pi_ref(x): unbiased for KL(pi || pi_ref), high variance, can be < 0
    (Schulman 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html)."""
    return logp_BT - ref_logp_BT


@KL_ESTIMATORS.register("k2")
def kl_k2(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    """k2 = 1/2 (log pi(x) - log pi_ref(x))^2: biased, low variance, >= 0 (Schulman 2020)."""
    return 0.5 * (logp_BT - ref_logp_BT).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    """k3 = rho - 1 - log rho with rho = pi_ref(x)/pi(x): unbiased, low variance, >= 0 (Schulman 2020).

    The log-ratio is clamped to +-20 and the result to [-10, 10], as verl does (its "low_var_kl").
    """
    log_rho = (ref_logp_BT - logp_BT).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (torch.exp(log_rho) - log_rho - 1).clamp(-10.0, 10.0)


def kl_estimate(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, *, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) by the named estimator (``k1``, ``k2`` or ``k3``)."""
    return KL_ESTIMATORS.get(kind)(logp_BT, ref_logp_BT)


def apply_kl_penalty(
    reward_BT: torch.Tensor,
    *,
    logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    coef: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, float]:
    """KL as an in-reward penalty (Ziegler et al. 2019; Ouyang et al. 2022): r_t - beta * KL_t.

    ``logp_BT`` are the behaviour policy's log-probs of the sampled tokens. Returns the penalised
    token rewards (0 where ``mask_BT`` is False) and the batch KL (mean over responses of the
    per-token mean), the quantity :meth:`KLController.update` expects.
    """
    with torch.no_grad():
        kl_BT = kl_estimate(logp_BT, ref_logp_BT, kind=kind)
        out_BT = torch.where(mask_BT, reward_BT - coef * kl_BT, reward_BT.new_zeros(()))
        has_B = mask_BT.any(dim=1)
        per_seq_B = masked_mean(kl_BT, mask_BT, dim=1)
        current = float(per_seq_B[has_B].mean()) if bool(has_B.any()) else 0.0
    return out_BT, current


_ADAPTIVE = {"fixed": False, "adaptive": True}
"""``loss.kl_ctrl`` -> whether the coefficient adapts."""


class KLController:
    """The KL coefficient beta: fixed, or adaptive (Ziegler et al. 2019, arXiv 1909.08593, eq. 2):

        e_t = clip(KL_t / KL_target - 1, -0.2, 0.2);    beta_{t+1} = beta_t (1 + K_beta e_t)

    with K_beta = n_steps / horizon. State is saved with :meth:`state_dict` for checkpoints.
    """

    def __init__(
        self, *, coef: float, adaptive: bool = False, target: float = 0.1, horizon: int = 10000
    ) -> None:
        if adaptive and (target <= 0 or horizon <= 0):
            raise ValueError("adaptive KL controller needs target > 0 and horizon > 0")
        self.value = float(coef)
        self.adaptive = adaptive
        self.target = float(target)
        self.horizon = int(horizon)

    @classmethod
    def from_config(cls, cfg: LossConfig) -> KLController:
        return cls(
            coef=cfg.kl_coef, adaptive=_ADAPTIVE[cfg.kl_ctrl], target=cfg.kl_target, horizon=cfg.kl_horizon
        )

    def update(self, current_kl: float, n_steps: int) -> float:
        """Move beta towards the target after ``n_steps`` samples (no-op when fixed); returns beta."""
        if self.adaptive:
            err = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
            self.value *= 1.0 + err * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "adaptive": self.adaptive,
            "target": self.target,
            "horizon": self.horizon,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.adaptive = bool(state["adaptive"])
        self.target = float(state["target"])
        self.horizon = int(state["horizon"])
