"""Chunks: several samples of one reward function run as one message. Every place that runs a chunk (a
pool worker, a Ray actor, an agent thread) runs it through :func:`run_items`, so the per-sample
conversion and error handling exist once; :class:`Outcome` is what one attempt of a chunk came to, and
``encode``/``decode`` carry results over a pipe.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepcredit.reward.base import to_result
from stepcredit.reward.run.failures import user_traceback
from stepcredit.types import RewardResult, Status


def callable_of(obj: Any) -> Any:
    """A reward callable from what a reference names: a function, or a class with ``compute_score``
    (instantiated once, with no arguments, so it can keep state such as a loaded model)."""
    if inspect.isclass(obj):
        inst = obj()
        fn = getattr(inst, "compute_score", None)
        if not callable(fn):
            raise TypeError(f"class {obj.__name__} has no compute_score method")
        return fn
    if not callable(obj):
        raise TypeError(f"{obj!r} is not callable")
    return obj


def call_reward(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a reward function; a coroutine function is run to completion on a fresh event loop."""
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(*args, **kwargs))
    out = fn(*args, **kwargs)
    if inspect.isawaitable(out):
        return asyncio.run(_await(out))
    return out


async def _await(x: Any) -> Any:
    return await x


VERL_NAMES = ("data_source", "solution_str", "ground_truth", "extra_info")
"""The names VeRL's per-sample reward managers (naive, dapo) pass a reward function's arguments by."""
VERL_BATCH_NAMES = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
"""The names VeRL's ``BatchRewardManager`` passes a batched function's lists by."""


def call_style(fn: Any, names: tuple[str, ...], kwargs: frozenset[str] = frozenset()) -> str | None:
    """How ``fn`` takes VeRL's arguments ``names`` plus the keyword arguments ``kwargs``: ``"name"``
    (as VeRL's reward managers pass them, so parameters in another order or a bare ``**kwargs`` get
    each by its name), ``"position"`` (other names, as VeRL's prime manager passes them), or None
    (neither binds: the call would raise TypeError)."""
    try:
        return _call_style(fn, names, kwargs)
    except TypeError:  # an unhashable callable: not cached
        return _call_style.__wrapped__(fn, names, kwargs)


def verl_call(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...] = VERL_NAMES
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of a call of ``fn`` on VeRL's arguments ``args`` (in the order of ``names``):
    by name, with ``kwargs`` merged over them as VeRL's ``_call_with_kwargs`` does, where ``fn``
    takes them so (:func:`call_style`); by position otherwise."""
    if len(args) == len(names) and call_style(fn, names, frozenset(kwargs)) == "name":
        return (), {**dict(zip(names, args, strict=True)), **kwargs}
    return args, kwargs


@functools.lru_cache(maxsize=256)
def _call_style(fn: Any, names: tuple[str, ...], kwargs: frozenset[str]) -> str | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return "position"
    extra = dict.fromkeys(kwargs)
    for style, args, kw in (("name", (), {**dict.fromkeys(names), **extra}), ("position", names, extra)):
        try:
            sig.bind(*args, **kw)
            return style
        except TypeError:
            continue
    return None


# ---------------------------------------------------------------------------------------- chunks
# A chunk is several samples of one reward function sent to a worker in one message: per-sample
# dispatch costs one round trip (IPC or a Ray call) per sample, which dominates a reward that takes
# microseconds. Every place that runs a chunk (a pool worker, a Ray actor, an agent thread) runs it
# through run_items, so the per-sample conversion and error handling exist once.

Encoded = tuple[float, str, "str | None", dict[str, Any], "bool | None", float]
"""A result on the wire: (score, status, extracted, info, verdict, latency_s); the source is the job's."""


@dataclass
class Outcome:
    """What one attempt of one chunk came to, item by item."""

    results: list[RewardResult | None]
    """Per item: its result, or None when it did not run to the end (the caller queues it again)."""
    died: list[int] = field(default_factory=list)
    """Items whose worker died under them (their result says so); the caller re-submits them."""
    whole: bool = False
    """The chunk timed out as one call (a batched function, or no way to tell which item hung)."""


def _none_or(rs: list[RewardResult]) -> list[RewardResult | None]:
    return list(rs)


class Stop(Exception):
    """Raised by a ``started`` callback to stop a chunk whose runner gave up on it."""


def finite(res: RewardResult) -> RewardResult:
    """A result claiming ``ok`` with a non-finite score (a RewardResult returned as is) is an error."""
    if res.status in (Status.OK, Status.UNPARSEABLE) and not math.isfinite(res.score):
        return RewardResult.failure(
            Status.ERROR, f"reward function returned a non-finite score {res.score!r}", **res.info
        )
    return res


def failures(n: int, status: Status, message: str, source: str = "", **info: Any) -> list[RewardResult]:
    """``n`` failed results (each its own object: callers may annotate one without the others)."""
    out = []
    for _ in range(n):
        r = RewardResult.failure(status, message, **info)
        r.source = source
        out.append(r)
    return out


def run_items(
    fn: Any,
    items: list[tuple[Any, ...]],
    kwargs: dict[str, Any],
    *,
    source: str,
    batched: bool,
    out: list[RewardResult],
    started: Callable[[int], None] | None = None,
) -> list[RewardResult]:
    """Run one chunk here, appending one result per item to ``out`` (returned); never raises except
    :class:`Stop` from ``started(k)``, which is called before item ``k`` starts.

    Per-sample: ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **kwargs)``
    for each item (by position when ``fn`` names its parameters otherwise: :func:`call_style`), each
    caught on its own (one failing sample never fails its neighbours). Batched (VeRL's
    ``fn(data_sources=, solution_strs=, ground_truths=, extra_infos=, **kw) -> list``): one call on the
    items' columns, which must return one value each.
    """
    if batched:
        if started is not None:
            started(0)
        t0 = time.perf_counter()
        try:
            cols = tuple(list(c) for c in zip(*items, strict=True))
            value = call_reward(fn, *verl_call(fn, cols, kwargs, VERL_BATCH_NAMES))
            if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
                got = failures(
                    len(items), Status.ERROR, f"batched reward function returned {type(value).__name__}"
                )
            elif len(value) != len(items):
                msg = f"batched reward function returned {len(value)} results for {len(items)}"
                got = failures(len(items), Status.ERROR, msg)
            else:
                got = [finite(to_result(v, source=source)) for v in value]
        except BaseException as e:  # user code may raise anything, SystemExit included
            got = failures(len(items), Status.ERROR, f"{type(e).__name__}: {e}", traceback=user_traceback(e))
        dt = (time.perf_counter() - t0) / max(1, len(items))
        for r in got:
            r.latency_s = dt
            r.source = r.source or source
        out.extend(got)
        return out
    sync = not inspect.iscoroutinefunction(fn)
    by_name = call_style(fn, VERL_NAMES, frozenset(kwargs)) == "name"  # once per chunk: microseconds
    clock, ok, append = (
        time.perf_counter,
        Status.OK,
        out.append,
    )  # looked up once: microseconds per item count
    for k, args in enumerate(items):
        if started is not None:
            started(k)
        t0 = clock()
        try:
            if by_name and len(args) == len(VERL_NAMES):  # VeRL's call: verl_call inlined
                named = {**dict(zip(VERL_NAMES, args, strict=True)), **kwargs}
                value = fn(**named) if sync else call_reward(fn, (), named)
            elif not sync:
                value = call_reward(fn, args, kwargs)
            else:
                value = fn(*args, **kwargs) if kwargs else fn(*args)
            if type(value) is float and value - value == 0.0:  # the common case, finite: no conversion
                r = RewardResult(value, ok, None, {}, clock() - t0, source)
                append(r)
                continue
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            r = finite(to_result(value, source=source))
        except BaseException as e:  # user code may raise anything, SystemExit included
            r = RewardResult.failure(Status.ERROR, f"{type(e).__name__}: {e}", traceback=user_traceback(e))
            r.source = source
        r.latency_s = clock() - t0
        append(r)
    return out


def encode(r: RewardResult) -> Encoded:
    return (r.score, r.status.value, r.extracted, r.info, r.verdict, r.latency_s)


_STATUS = {s.value: s for s in Status}


def decode(t: Encoded, source: str) -> RewardResult:
    score, status, extracted, info, verdict, latency = t
    return RewardResult(score, _STATUS[status], extracted, info, latency, source, verdict)


def decode_all(enc: list[Encoded], source: str) -> list[RewardResult | None]:
    """:func:`decode` of a whole message (one call, not one per result)."""
    st = _STATUS
    return [RewardResult(s, st[status], x, info, lat, source, v) for s, status, x, info, v, lat in enc]


def dumps_results(rs: list[RewardResult]) -> bytes:
    """A chunk's results pickled once for the wire (a Ray actor's answer: Ray then carries bytes
    instead of pickling the list again); an unpicklable ``info`` fails its result alone."""
    try:
        return pickle.dumps(encode_all(rs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return pickle.dumps(encode_all(rs, check=True), protocol=pickle.HIGHEST_PROTOCOL)


def encode_all(rs: list[RewardResult], *, check: bool = False) -> list[Encoded]:
    """Results for the wire; with ``check``, one whose ``info`` cannot be pickled is replaced by an
    error (alone) rather than failing the whole message."""
    out = [(r.score, r.status.value, r.extracted, r.info, r.verdict, r.latency_s) for r in rs]
    if not check:
        return out
    try:
        pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        return out
    except Exception:
        pass
    fixed = []
    for t in out:
        try:
            pickle.dumps(t)
            fixed.append(t)
        except Exception as e:
            fixed.append(
                (math.nan, Status.ERROR.value, None, {"message": f"result not sendable: {e}"}, None, t[5])
            )
    return fixed
