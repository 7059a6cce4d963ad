"""Advantage estimators: one registry, one signature, token-level credit kept where the maths allows.

    from stepcredit.advantages import AdvantageInputs, compute_advantages, check_config
    out = compute_advantages(cfg.algorithm, AdvantageInputs(outcome_BT=..., mask_BT=..., group_B=...))

Registered: ``grpo`` (and Dr. GRPO via ``norm_by_std=False``), ``rloo``, ``reinforce_pp_baseline``
(outcome); ``gae``, ``reinforce_pp``, ``grpo_process``, ``prime_rloo``, ``vineppo`` (token-level).
A new estimator is one function decorated with :func:`register_estimator`.
"""

from stepcredit.advantages import outcome as outcome
from stepcredit.advantages import token as token
from stepcredit.advantages.core import (
    ESTIMATORS,
    AdvantageInputs,
    AdvantageOutputs,
    Estimator,
    check_config,
    compute_advantages,
    hparams,
    register_estimator,
)
from stepcredit.advantages.outcome import grpo, reinforce_pp_baseline, rloo
from stepcredit.advantages.token import (
    discounted_returns,
    gae,
    grpo_process,
    grpo_vineppo,
    prime_rloo,
    reinforce_pp,
    step_fill,
    vineppo,
)

__all__ = [
    "ESTIMATORS",
    "AdvantageInputs",
    "AdvantageOutputs",
    "Estimator",
    "check_config",
    "compute_advantages",
    "discounted_returns",
    "gae",
    "grpo",
    "grpo_process",
    "grpo_vineppo",
    "hparams",
    "prime_rloo",
    "register_estimator",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "step_fill",
    "vineppo",
]
