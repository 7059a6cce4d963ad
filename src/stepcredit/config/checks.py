"""The config tree's one validation helper: a failed check is a ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from stepcredit.errors import ConfigError


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key {key}: {msg}")


def check_bounds(
    cfg: Any,
    section: str,
    *,
    above_0: tuple[str, ...] = (),
    at_least_0: tuple[str, ...] = (),
    at_least_1: tuple[str, ...] = (),
) -> None:
    """The numeric fields of ``cfg`` named here are > 0, >= 0 or >= 1: the tree's common range checks,
    one error per field naming ``section.field`` (a check with its own message stays a :func:`_check`)."""
    for names, low, strict in ((above_0, 0, True), (at_least_0, 0, False), (at_least_1, 1, False)):
        for name in names:
            v = getattr(cfg, name)
            _check(
                v > low if strict else v >= low,
                f"{section}.{name}",
                f"must be {'>' if strict else '>='} {low}",
            )


def check_choices(cfg: Any, section: str) -> None:
    """Every ``Literal`` field of the config dataclass ``cfg`` holds one of its values: the one check of
    the tree's string-valued switches (a YAML value arrives unchecked), so code that branches on one
    never meets another value. The error names ``section.field`` and the valid values."""
    kind: Any = type(cfg)
    for name, values in _choices(kind).items():
        if getattr(cfg, name) not in values:
            *head, last = [str(v) for v in values]
            _check(False, f"{section}.{name}", f"{', '.join(head)} or {last}" if head else last)


@functools.cache
def _choices(cls: Any) -> dict[str, tuple[Any, ...]]:
    hints = typing.get_type_hints(cls)
    return {
        f.name: typing.get_args(hints[f.name])
        for f in dataclasses.fields(cls)
        if typing.get_origin(hints[f.name]) is typing.Literal
    }
