"""The host's side of a conversation with a program under test: references to its objects and links.

A :class:`Remote` stands for a program's function, class, instance or method; only attribute lookups
and calls on it are forwarded (with plain arguments) through a :class:`RemoteLink`, and any other use
(comparing, ``bool``, ``len``, iterating, hashing) is refused, so an always-equal object cannot pass.
:class:`PrecomputedLink` answers the same questions from replies the sandbox gave in one go.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from stepcredit.sandbox.plain import NotPlain, decode_plain, encode_plain

Call = tuple[str, str, tuple[Any, ...], dict[str, Any]]
"""A call the sandbox makes after the program ran: (kind, target, args, kwargs) with plain values; kind ``fn``
(``target(...)``), ``method`` (``Class().name(...)`` for target ``Class.name``) or ``auto`` (VeRL's
fn_name: the function if the program defines it, else ``Solution().target``)."""


def reply_object(raw: Any) -> dict[str, Any]:
    """The program's answer to one request, which must be a JSON object (its text as read from the
    sandbox); NotPlain when it is not text, not JSON or not an object."""
    try:
        reply = json.loads(raw) if isinstance(raw, str) else None
    except (json.JSONDecodeError, RecursionError):
        reply = None
    if type(reply) is not dict:
        raise NotPlain("an unreadable answer from the program")
    return reply


class Remote:
    """A reference to an object inside the sandbox (a program function, class, instance or method).

    Only attribute lookup and calls are forwarded, through ``link``; every other use is refused.
    """

    __slots__ = ("_label", "_link", "_ref")

    def __init__(self, link: RemoteLink, ref: Any, label: str) -> None:
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_label", label)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._link.attr(self._ref, name, f"{self._label}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.call(self._ref, args, kwargs, f"{self._label}(...)")

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise NotPlain(f"{object.__getattribute__(self, '_label')} is not a plain builtin value")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __bool__ = __len__ = __iter__ = __contains__ = __hash__ = __index__ = __int__ = __float__ = _refuse
    __str__ = __repr__ = __format__ = __getitem__ = __setattr__ = __delattr__ = _refuse  # type: ignore[assignment]
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = _refuse
    __abs__ = __invert__ = __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _refuse
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = __round__ = __reversed__ = _refuse


class RemoteLink:
    """The host's side of the conversation with one running test case (see ``sandbox._Session``).

    ``send(request) -> reply`` forwards one request to the program's process; replies are
    ``{"v": wire}`` (a plain value), ``{"h": id}`` (a new reference) or ``{"raise": "Type: message"}``.
    """

    def __init__(self, send: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self._send = send

    def _reply(self, reply: dict[str, Any], label: str) -> Any:
        if "raise" in reply:
            raise ProgramRaised(f"{label} raised {str(reply['raise'])[:300]}")
        if "np" in reply:
            raise NotPlain(f"{label} returned {str(reply['np'])[:80]}, not a plain builtin value")
        if "h" in reply and type(reply["h"]) is int:
            return Remote(self, {"h": reply["h"]}, label)
        if "v" in reply:
            return decode_plain(reply["v"])
        raise NotPlain(f"malformed reply from the sandbox for {label}")

    def attr(self, ref: Any, name: str, label: str) -> Any:
        return self._reply(self._send({"op": "attr", "ref": ref, "name": name}), label)

    def call(self, ref: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: str) -> Any:
        request = {"op": "call", "ref": ref, "args": [_arg(a) for a in args]}
        request["kwargs"] = {k: _arg(v) for k, v in kwargs.items()}
        return self._reply(self._send(request), label)

    def auto(self, fn_name: str, args: tuple[Any, ...]) -> Any:
        """VeRL's ``fn_name`` call: the program's function ``fn_name``, else ``Solution().fn_name``."""
        found = self.names((fn_name, "Solution"))
        if fn_name in found:
            fn = found[fn_name]
        elif "Solution" in found:
            fn = getattr(found["Solution"](), fn_name)
        else:
            raise ProgramRaised(f"the program defines neither {fn_name} nor Solution")
        return fn(*args)

    def names(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The program's values of ``names``: Remote references (functions, classes) or plain values."""
        reply = self._send({"op": "names", "names": list(names)})
        found = reply.get("found")
        if type(found) is not dict:
            raise NotPlain("malformed reply from the sandbox for the program's names")
        return {n: self._reply(found[n], n) for n in names if n in found and type(found[n]) is dict}


class ProgramRaised(Exception):
    """The program raised while the test called it."""


def _arg(value: Any) -> Any:
    """An argument for the program: a plain value, or a reference to one of its objects (as bytes)."""
    if type(value) is Remote:
        ref = object.__getattribute__(value, "_ref")
        if "h" not in ref:
            raise NeedsConversation("a reference as an argument")
        return str(ref["h"]).encode()
    try:
        encode_plain(value)
    except NotPlain:
        raise NotPlain("an assert case passes a non-plain value (a function?) to the program") from None
    return value


class NeedsConversation(Exception):
    """The test asked for something the precomputed calls do not answer."""


class PrecomputedLink(RemoteLink):
    """Serves an assert's calls from the answers the sandbox gave to ``AssertPlan.calls``."""

    def __init__(self, calls: tuple[Call, ...], replies: list[Any]) -> None:
        super().__init__(self._refuse_send)
        self._answers: dict[str, list[Any]] = {}
        for (kind, target, args, kwargs), reply in zip(calls, replies, strict=False):
            self._answers.setdefault(_key(kind, target, args, kwargs), []).append(reply)
        self._classes = {c[1].split(".", 1)[0] for c in calls if c[0] == "method"}

    @staticmethod
    def _refuse_send(request: dict[str, Any]) -> dict[str, Any]:
        raise NeedsConversation(str(request.get("op")))

    def names(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {n: Remote(self, {"name": n}, n) for n in names}

    def auto(self, fn_name: str, args: tuple[Any, ...]) -> Any:
        pending = self._answers.get(_key("auto", fn_name, args, {}))
        if not pending:
            raise NeedsConversation("call")
        reply = pending.pop(0)
        if type(reply) is not dict:
            raise NotPlain(f"malformed reply from the sandbox for {fn_name}(...)")
        return self._reply(reply, f"{fn_name}(...)")

    def attr(self, ref: Any, name: str, label: str) -> Any:
        if "new" in ref:
            return Remote(self, {"method": f"{ref['new']}.{name}"}, label)
        raise NeedsConversation("attr")

    def call(self, ref: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: str) -> Any:
        if any(type(a) is Remote for a in (*args, *kwargs.values())):
            raise NeedsConversation("a reference as an argument")
        if "method" in ref:
            key = _key("method", ref["method"], args, kwargs)
        elif not args and not kwargs and ref["name"] in self._classes:
            return Remote(self, {"new": ref["name"]}, label)
        else:
            key = _key("fn", ref["name"], args, kwargs)
        pending = self._answers.get(key)
        if not pending:
            raise NeedsConversation("call")
        reply = pending.pop(0)
        if type(reply) is not dict:
            raise NotPlain(f"malformed reply from the sandbox for {label}")
        return self._reply(reply, label)


def _key(kind: str, target: str, args: Any, kwargs: Any) -> str:
    try:
        return json.dumps(
            [kind, target, encode_plain(list(args)), encode_plain(dict(kwargs))], sort_keys=True
        )
    except (NotPlain, TypeError):
        raise NeedsConversation("a value that has no key") from None
