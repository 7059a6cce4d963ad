"""One small generic registry used by every extension point (estimators, losses, verifiers, ...).

An extension is added by one decorated function; callers look it up by name and never branch on it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from stepcredit.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object mapping with a decorator to fill it and helpful errors on a miss."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, *aliases: str, override: bool = False) -> Callable[[T], T]:
        """Decorator: ``@REG.register("grpo")`` adds the decorated object under ``name`` (and aliases)."""

        def deco(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._items and not override and self._items[key] is not obj:
                    raise ValueError(f"{self.kind} {key!r} is already registered")
                self._items[key] = obj
            return obj

        return deco

    def add(self, name: str, obj: T, *, override: bool = False) -> T:
        """Register ``obj`` under ``name`` without the decorator syntax."""
        return self.register(name, override=override)(obj)

    def get(self, name: str) -> T:
        """Return the entry for ``name`` or raise a ConfigError that lists the close valid names."""
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._items), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown {self.kind} {name!r}{hint} (valid: {', '.join(sorted(self._items))})"
            ) from None

    def require(self, name: str, key: str) -> None:
        """Start-up check of a config value naming an entry: a ConfigError naming the key and the
        valid names when ``name`` is not registered."""
        if name not in self._items:
            raise ConfigError(f"config key {key}: unknown {name!r} (valid: {', '.join(self.names())})")

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
