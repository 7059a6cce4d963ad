"""stepcredit's advantage estimators in verl's registry, as ``stepcredit_<name>``.

verl calls a registered estimator as ``fn(token_level_rewards=, response_mask=, config=, index=)``
(``index`` = the prompt uids, ``config`` = its ``algorithm`` config); the adapter below turns that
into :class:`~stepcredit.advantages.AdvantageInputs` and runs the stepcredit estimator of the same
name, so ``algorithm.adv_estimator=stepcredit_grpo_process`` in verl gives exactly what
``algorithm.advantage=grpo_process`` gives in stepcredit on the same tensors.

verl's reward loop carries one outcome score per response, so through verl's own trainers the
process channel is absent (``grpo_process`` then equals ``grpo``). The ``stepcredit_sync`` trainer
(:mod:`stepcredit.integrations.verl.trainer`) calls the same adapter with the extra keyword
arguments ``process_rewards``, ``process_mask``, ``valid`` and ``values``, which verl never passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stepcredit.advantages import ESTIMATORS, AdvantageInputs, compute_advantages
from stepcredit.errors import ConfigError
from stepcredit.integrations.verl.config import algorithm_config

PREFIX = "stepcredit_"
"""verl names are ``stepcredit_`` + the stepcredit name: none clashes with verl's own estimators."""


def group_ids(index: Any, n: int) -> torch.Tensor:
    """Long group ids [B] from verl's per-response prompt uids (any hashables); all 0..B-1 if None."""
    if index is None:
        return torch.arange(n, dtype=torch.long)
    keys = [str(u) for u in np.asarray(index, dtype=object).tolist()]
    if len(keys) != n:
        raise ValueError(f"index has {len(keys)} entries for {n} responses")
    first: dict[str, int] = {}
    return torch.tensor([first.setdefault(k, len(first)) for k in keys], dtype=torch.long)


def verl_advantages(
    name: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Any = None,
    *,
    process_rewards: torch.Tensor | None = None,
    process_mask: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    **_ignored: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]) of stepcredit estimator ``name`` on verl's tensors.

    ``token_level_rewards`` is the outcome channel (verl puts the score on the last response token;
    an in-reward KL penalty makes it dense, which every estimator accepts). Keyword arguments verl
    does not know (``reward_baselines`` and the like) are ignored.
    """
    cfg = algorithm_config(name, config)
    est = ESTIMATORS.get(name)
    if est.needs_values and values is None:
        raise ConfigError(
            f"verl config key algorithm.adv_estimator={PREFIX}{name}: needs critic values, which verl's "
            "compute_advantage passes only to its own 'gae'; use trainer.v1.trainer_mode=stepcredit_sync "
            "with critic.enable=true"
        )
    mask_BT = response_mask.bool()
    B = mask_BT.shape[0]
    inp = AdvantageInputs(
        outcome_BT=token_level_rewards.float(),
        mask_BT=mask_BT,
        group_B=group_ids(index, B),
        valid_B=None if valid is None else valid.bool(),
        process_BT=None if process_rewards is None else process_rewards.float(),
        process_mask_BT=None if process_mask is None else process_mask.bool(),
        values_BT=None if values is None else values.float(),
    )
    out = compute_advantages(cfg, inp)
    return out.adv_BT, out.ret_BT


def _adapter(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def fn(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **kwargs: Any) -> Any:
        return verl_advantages(name, token_level_rewards, response_mask, **kwargs)

    fn.__name__ = f"{PREFIX}{name}"
    fn.__qualname__ = fn.__name__
    fn.__doc__ = f"stepcredit's ``{name}`` estimator behind verl's estimator signature."
    return fn


ADAPTERS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    PREFIX + n: _adapter(n) for n in ESTIMATORS.names()
}
"""verl name -> adapter; built once so registering again (every ``import verl``) is a no-op."""


def register_estimators() -> list[str]:
    """Put every stepcredit estimator into verl's ``ADV_ESTIMATOR_REGISTRY``; returns the names."""
    from verl.trainer.ppo.core_algos import register_adv_est

    for verl_name, fn in ADAPTERS.items():
        register_adv_est(verl_name)(fn)
    return list(ADAPTERS)
