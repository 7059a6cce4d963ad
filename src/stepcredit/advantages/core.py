"""The estimator bundle, the registry and the one entry point the trainer calls.

An estimator is a pure function ``fn(inp: AdvantageInputs, **hparams) -> AdvantageOutputs``.
Every estimator receives the *same* keyword hyperparameters (see :func:`hparams`) and ignores
the ones it does not use (``**_``), so the caller looks an estimator up by name and never
branches on it. Metadata the start-up check needs (does it need values? process rewards?) is
given to :func:`register_estimator` next to the function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from stepcredit.errors import ConfigError
from stepcredit.ops import check_shape
from stepcredit.registry import Registry

if TYPE_CHECKING:
    from stepcredit.config import AlgorithmConfig, Config


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may read. B responses, T response tokens (right-padded).

    ``outcome_BT`` holds each response's score at its last valid token (0 elsewhere);
    ``process_BT`` holds step rewards (U_i) at episode-end tokens (0 elsewhere). The two channels
    stay apart until the estimator combines them.
    """

    outcome_BT: torch.Tensor
    """Outcome channel: the response's score at its last valid token, 0 elsewhere."""
    mask_BT: torch.Tensor
    """bool; True on response tokens that count."""
    group_B: torch.Tensor
    """long; responses to the same prompt share an id."""
    valid_B: torch.Tensor | None = None
    """bool; False = the reward failed (failure policy ``mask``): no advantage, and the response is
    left out of every group baseline and batch statistic. None = all valid."""
    process_BT: torch.Tensor | None = None
    """Process channel: step rewards at episode-end tokens, 0 elsewhere. None = no process rewards."""
    process_mask_BT: torch.Tensor | None = None
    """bool; True at the tokens that carry a step reward (episode ends). None = the nonzero
    entries of ``process_BT`` (pass it explicitly when a step reward can be exactly 0)."""
    values_BT: torch.Tensor | None = None
    """Critic values V(s_t) per token (``gae``)."""

    def __post_init__(self) -> None:
        check_shape("outcome_BT", self.outcome_BT, (None, None))
        B, T = self.outcome_BT.shape
        check_shape("mask_BT", self.mask_BT, (B, T))
        check_shape("group_B", self.group_B, (B,))
        if self.mask_BT.dtype != torch.bool:
            raise ValueError(f"mask_BT: expected dtype bool, got {self.mask_BT.dtype}")
        for name in ("process_BT", "values_BT", "process_mask_BT"):
            x = getattr(self, name)
            if x is not None:
                check_shape(name, x, (B, T))
        if self.valid_B is not None:
            check_shape("valid_B", self.valid_B, (B,))

    @property
    def live_BT(self) -> torch.Tensor:
        """Tokens that get an advantage: response tokens of valid responses."""
        if self.valid_B is None:
            return self.mask_BT
        return self.mask_BT & self.valid_B[:, None]

    @property
    def live_B(self) -> torch.Tensor:
        """Responses that count (valid), as a bool vector."""
        if self.valid_B is None:
            return torch.ones(self.mask_BT.shape[0], dtype=torch.bool, device=self.mask_BT.device)
        return self.valid_B

    @property
    def steps_BT(self) -> torch.Tensor | None:
        """bool; tokens of valid responses that carry a process (step) reward, or None."""
        if self.process_BT is None:
            return None
        steps = self.process_mask_BT if self.process_mask_BT is not None else self.process_BT != 0
        return steps & self.live_BT


@dataclass(frozen=True)
class AdvantageOutputs:
    adv_BT: torch.Tensor
    """Advantages; exactly 0 on tokens that do not count."""
    ret_BT: torch.Tensor
    """Returns (the critic's regression target for ``gae``); exactly 0 on tokens that do not count."""


EstimatorFn = Callable[..., AdvantageOutputs]


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: the pure function plus what the start-up check needs to know."""

    fn: EstimatorFn
    needs_values: bool = False
    """Reads ``values_BT`` (needs a critic)."""
    needs_process: bool = False
    """Meaningless without process rewards (``process.enabled`` must be true)."""
    token_level: bool = False
    """Keeps token-level rewards (False: collapses each response to one score)."""
    process_std_normalised: bool = False
    """Divides the process channel by its group std (with ``algorithm.norm_by_std``), so a constant
    factor on the step rewards (``process.scale``) cancels out; ``algorithm.process_weight`` is the knob."""
    needs_reward_values: bool = False
    """Reads the step rewards as differences of a value whose last entry is the response's reward (the
    outcome enters only through the last step): needs a value estimator whose registry entry says
    ``terminal_is_reward`` and ``process.last_episode=utility``."""
    process_batch_centred: bool = False
    """Centres the process term on a mean over the batch's tokens (whitening), so a response without step
    rewards still gets a share of it: ``process.credit_groups`` other than ``all`` is refused."""


ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register_estimator(
    name: str,
    *,
    needs_values: bool = False,
    needs_process: bool = False,
    token_level: bool = False,
    process_std_normalised: bool = False,
    needs_reward_values: bool = False,
    process_batch_centred: bool = False,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: ``@register_estimator("grpo")`` adds an estimator function to :data:`ESTIMATORS`."""

    def deco(fn: EstimatorFn) -> EstimatorFn:
        ESTIMATORS.add(
            name,
            Estimator(
                fn=fn,
                needs_values=needs_values,
                needs_process=needs_process,
                token_level=token_level,
                process_std_normalised=process_std_normalised,
                needs_reward_values=needs_reward_values,
                process_batch_centred=process_batch_centred,
            ),
        )
        return fn

    return deco


def hparams(cfg: AlgorithmConfig) -> dict[str, Any]:
    """The keyword hyperparameters every estimator receives (each uses the ones it needs)."""
    return {
        "gamma": cfg.gamma,
        "lam": cfg.lam,
        "eps": cfg.eps,
        "norm_by_std": cfg.norm_by_std,
        "process_weight": cfg.process_weight,
    }


def compute_advantages(cfg: AlgorithmConfig, inp: AdvantageInputs) -> AdvantageOutputs:
    """Run the estimator named by ``cfg.advantage`` on ``inp`` (no gradient is recorded)."""
    est = ESTIMATORS.get(cfg.advantage)
    if est.needs_values and inp.values_BT is None:
        raise ValueError(f"advantage estimator {cfg.advantage!r} needs values_BT (a critic)")
    with torch.no_grad():
        return est.fn(inp, **hparams(cfg))


def check_config(cfg: Config) -> None:
    """Start-up check of the estimator choice against the rest of the config; raises ConfigError.

    - the estimator name must be registered (the message lists the valid ones);
    - an estimator that reads values (``gae``) needs ``algorithm.use_critic=true``;
    - an estimator that needs process rewards (``grpo_process``) needs ``process.enabled=true``;
    - one that ``needs_reward_values`` (``vineppo``) needs a ``terminal_is_reward`` value estimator
      and ``process.last_episode=utility``.
    """
    name = cfg.algorithm.advantage
    est = ESTIMATORS.get(name)
    if est.needs_values and not cfg.algorithm.use_critic:
        ok = ", ".join(n for n in ESTIMATORS if not ESTIMATORS.get(n).needs_values)
        raise ConfigError(
            f"config key algorithm.advantage: {name!r} needs a critic (values_BT); set "
            f"algorithm.use_critic=true or use one of: {ok}"
        )
    if est.needs_process and not cfg.process.enabled:
        raise ConfigError(
            f"config key algorithm.advantage: {name!r} needs process rewards; set process.enabled=true"
        )
    if est.needs_reward_values and cfg.process.enabled:
        from stepcredit.process.values import VALUE_ESTIMATORS

        p = cfg.process
        if (
            p.value_estimator in VALUE_ESTIMATORS
            and not VALUE_ESTIMATORS.get(p.value_estimator).terminal_is_reward
        ):
            ok = ", ".join(n for n in VALUE_ESTIMATORS if VALUE_ESTIMATORS.get(n).terminal_is_reward)
            raise ConfigError(
                f"config key process.value_estimator: algorithm.advantage={name} reads step rewards as "
                f"changes of a value that ends at the reward; {p.value_estimator} does not (use {ok})"
            )
        if p.zero_last:
            raise ConfigError(
                f"config key process.last_episode: algorithm.advantage={name} gets the outcome through the "
                "last step's utility; set it to utility"
            )
    if cfg.process.enabled and cfg.process.step_cost and not est.needs_reward_values:
        from stepcredit.process.utility import STEP_COST_FORMS

        if STEP_COST_FORMS[cfg.process.step_cost_as].cost_to_go:
            ok = ", ".join(n for n in ESTIMATORS if ESTIMATORS.get(n).needs_reward_values)
            raise ConfigError(
                f"config key process.step_cost_as: {cfg.process.step_cost_as} writes each step's cost-to-go into its credit, "
                f"but {name!r} sums the step credits into returns itself; use token or outcome, or one of: {ok}"
            )
    if est.process_batch_centred and cfg.process.enabled and cfg.process.credit_groups != "all":
        ok = ", ".join(n for n in ESTIMATORS if ESTIMATORS.get(n).needs_process)
        raise ConfigError(
            f"config key process.credit_groups: {name!r} centres the step term on the whole batch, so the "
            f"responses left out ({cfg.process.credit_groups} keeps only some groups) would still get step "
            f"credit; use one of: {ok}"
        )
    if est.process_std_normalised and cfg.algorithm.norm_by_std and cfg.process.scale != 1.0:
        raise ConfigError(
            f"config key process.scale: {name!r} divides step rewards by their group std, so "
            f"process.scale={cfg.process.scale:g} would have no effect; weight the process channel "
            f"with algorithm.process_weight instead"
        )
