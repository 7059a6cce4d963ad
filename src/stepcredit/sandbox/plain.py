"""Plain values: the only things that cross the sandbox boundary from the program to the host.

A tagged JSON form (:func:`encode_plain` in the sandbox, :func:`decode_plain` here) that can only
describe exact builtin values (``int``, ``float``, ``str``, ``bool``, ``None``, ``list``, ``tuple``,
``dict``, ``set``): no subclass, no object with its own ``__eq__``, nothing that runs code.
"""

from __future__ import annotations

import math
from typing import Any


class NotPlain(Exception):
    """A value from the program is not a plain builtin value (or is used as one when it is a reference)."""


MAX_DEPTH = 100
"""Deepest nesting of a value that crosses the sandbox boundary."""


def encode_plain(value: Any, *, depth: int = 0) -> Any:
    """The tagged JSON form of a plain value: lists stay arrays; tuples, sets, dicts and non-finite floats
    become one-key objects (``t``, ``s``, ``d``, ``f``). Exact types only; NotPlain otherwise."""
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return value if math.isfinite(value) else {"f": repr(value)}
    if t is list:
        return [encode_plain(v, depth=depth + 1) for v in value]
    if t is tuple:
        return {"t": [encode_plain(v, depth=depth + 1) for v in value]}
    if t is set:
        return {"s": [encode_plain(v, depth=depth + 1) for v in value]}
    if t is dict:
        return {
            "d": [
                [encode_plain(k, depth=depth + 1), encode_plain(v, depth=depth + 1)] for k, v in value.items()
            ]
        }
    raise NotPlain(f"a {t.__name__} is not a plain builtin value")


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def decode_plain(wire: Any, *, depth: int = 0) -> Any:
    """Strict inverse of :func:`encode_plain` for untrusted input (parsed JSON); NotPlain on anything else."""
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    t = type(wire)
    if wire is None or t is bool or t is int or t is str or t is float:
        return wire
    if t is list:
        return [decode_plain(v, depth=depth + 1) for v in wire]
    if t is dict and len(wire) == 1:
        ((tag, body),) = wire.items()
        match tag:  # the tags encode_plain writes: float (nan, inf), tuple, set, dict (as pairs)
            case "f" if body in _FLOATS:
                return _FLOATS[body]
            case _ if type(body) is list:
                items = [decode_plain(v, depth=depth + 1) for v in body]
                try:
                    match tag:
                        case "t":
                            return tuple(items)
                        case "s":
                            return set(items)
                        case "d" if all(type(p) is list and len(p) == 2 for p in items):
                            return {k: v for k, v in items}
                except TypeError as e:  # an unhashable set element or key
                    raise NotPlain(str(e)) from None
    raise NotPlain(f"malformed value from the sandbox: {str(wire)[:80]}")
