"""Reading stepcredit's settings out of a verl (Hydra/OmegaConf) config.

verl hands each extension a different slice of its config: an advantage estimator gets only
``algorithm``, a reward manager and a trainer get the whole tree. So stepcredit's settings live in
two places of a verl config:

* ``algorithm.stepcredit``: the estimator hyperparameters verl has no key for (``eps``,
  ``process_weight``); ``gamma``, ``lam`` and ``norm_adv_by_std_in_grpo`` are verl's own keys.
* ``stepcredit``: a subtree shaped like stepcredit's own config, with ``reward`` and ``process``
  (:class:`~stepcredit.config.RewardConfig`, :class:`~stepcredit.config.ProcessConfig`).

Both are optional (``+stepcredit.process.enabled=true`` on verl's command line adds one). An unknown
key is a :class:`~stepcredit.errors.ConfigError` that names it and lists the valid ones.
"""

from __future__ import annotations

from typing import Any

from stepcredit.config import AlgorithmConfig, Config, from_dict
from stepcredit.errors import ConfigError

ALGORITHM_EXTRA = ("eps", "process_weight")
"""Keys of ``algorithm.stepcredit`` (everything else comes from verl's own ``algorithm`` keys)."""
SECTIONS = ("reward", "process")
"""Keys of the top-level ``stepcredit`` subtree."""


def get(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for a dict, an OmegaConf DictConfig, a verl dataclass config or None."""
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    getter = getattr(cfg, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:  # a dataclass config whose .get rejects unknown keys
            pass
    return getattr(cfg, key, default)


def to_plain(x: Any) -> Any:
    """An OmegaConf node (or anything mapping-like) as plain dicts and lists."""
    if x is None:
        return None
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(x, DictConfig | ListConfig):
            return OmegaConf.to_container(x, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    if isinstance(x, dict):
        return {k: to_plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_plain(v) for v in x]
    return x


def algorithm_config(name: str, verl_algorithm: Any) -> AlgorithmConfig:
    """stepcredit's AlgorithmConfig for estimator ``name`` from verl's ``algorithm`` config."""
    extra = to_plain(get(verl_algorithm, "stepcredit")) or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"verl config key algorithm.stepcredit: expected a mapping, got {extra!r}")
    unknown = sorted(set(extra) - set(ALGORITHM_EXTRA))
    if unknown:
        raise ConfigError(
            f"unknown verl config key algorithm.stepcredit.{unknown[0]} (valid: {', '.join(ALGORITHM_EXTRA)})"
        )
    d = AlgorithmConfig()
    try:
        return AlgorithmConfig(
            advantage=name,
            gamma=float(get(verl_algorithm, "gamma", d.gamma)),
            lam=float(get(verl_algorithm, "lam", d.lam)),
            norm_by_std=bool(get(verl_algorithm, "norm_adv_by_std_in_grpo", d.norm_by_std)),
            eps=float(extra.get("eps", d.eps)),
            process_weight=float(extra.get("process_weight", d.process_weight)),
        )
    except ConfigError as e:
        raise ConfigError(f"verl config: {e}") from None


def stepcredit_config(verl_config: Any) -> Config:
    """stepcredit's Config with the ``reward`` and ``process`` sections of verl's ``stepcredit`` subtree
    (every other section keeps its default)."""
    sub = to_plain(get(verl_config, "stepcredit")) or {}
    if not isinstance(sub, dict):
        raise ConfigError(f"verl config key stepcredit: expected a mapping, got {sub!r}")
    unknown = sorted(set(sub) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown verl config key stepcredit.{unknown[0]} (valid: {', '.join(SECTIONS)})")
    try:
        return from_dict(sub)
    except ConfigError as e:
        raise ConfigError(f"verl config key stepcredit: {e}") from None
