"""The config tree's one validation helper: a failed check is a ConfigError naming the key."""

from __future__ import annotations

from stepcredit.errors import ConfigError


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key {key}: {msg}")
