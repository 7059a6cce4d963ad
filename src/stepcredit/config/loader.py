"""Mapping <-> config tree: YAML values coerced to the annotated types, unknown keys rejected with close valid ones."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from typing import Any

from stepcredit.config.root import Config
from stepcredit.errors import ConfigError


# ------------------------------------------------------------------------------ dict <-> config
def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value to the annotated type, or raise a ConfigError naming the key."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key}: expected a mapping, got {value!r}")
        return _build(tp, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                continue
        raise ConfigError(f"config key {key}: {value!r} is not a valid {tp}")
    if origin is tuple:
        if isinstance(value, str):
            value = [value] if value else []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"config key {key}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key}: expected a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") if args else v for k, v in value.items()}
    if origin is typing.Literal:  # coerced to its values' type; __post_init__ names the valid values
        return _coerce(value, type(args[0]), key)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        value = _number(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key {key}: expected an integer, got {value!r}")
    if tp is float:
        value = _number(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"config key {key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key {key}: expected a string, got {value!r}")
    return value


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _number(value: Any) -> Any:
    """A string written as a number (``1e-5``, which YAML 1.1 reads as a string) as that float."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value)
    return value


def _build(cls: Any, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        if k not in names:
            valid = [prefix + n for n in names]
            close = difflib.get_close_matches(prefix + k, valid, n=3, cutoff=0.4)
            hint = f"did you mean {', '.join(close)}?" if close else f"valid keys: {', '.join(valid)}"
            raise ConfigError(f"unknown config key {prefix + k}: {hint}")
        kwargs[k] = _coerce(v, hints[k], prefix + k)
    try:
        return cls(**kwargs)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"config {prefix or 'root'}: {e}") from None


def from_dict(data: dict[str, Any]) -> Config:
    """Build the config tree from a nested mapping; unknown keys are errors."""
    return typing.cast(Config, _build(Config, data or {}))


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts/lists (tuples become lists), suitable for YAML."""

    def conv(x: Any) -> Any:
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return {f.name: conv(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        return x

    return typing.cast(dict[str, Any], conv(cfg))


def all_keys(cls: Any = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the tree (for error messages and docs)."""
    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(all_keys(tp, prefix + f.name + "."))
        else:
            out.append(prefix + f.name)
    return out


def tree_source() -> str:
    """The source of every module that defines a class of the tree, for readers of the field docstrings
    (``stepcredit config``, the docstring test): the tree is split over several modules."""
    import inspect
    import sys

    modules: dict[str, None] = {}  # in the order first met, root's module first
    seen: set[type] = set()

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
            seen.add(tp)
            modules[tp.__module__] = None
            for f_tp in typing.get_type_hints(tp).values():
                walk(f_tp)
        for arg in typing.get_args(tp):
            walk(arg)

    walk(Config)
    return "\n".join(inspect.getsource(sys.modules[m]) for m in modules)
