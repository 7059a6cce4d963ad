"""Which reward function scores a response: routes, the per-batch plan and the finishing step.

Routing of one sample, first match wins:

1. ``reward.domains[domain]`` when it names a function, where the domain is
   ``reward.tag_domains[sample.tag]`` or else ``sample.domain`` (its ``weight`` multiplies the score);
2. a row style other than ``rule`` (e.g. ``model``): the reward registered under that style name;
3. ``reward.custom.path``, the user's own function, for every other ``rule`` row;
4. the reward registered under the sample's ``data_source`` (exact name, then a pattern like ``aime*``).

:meth:`Router.plan` triages a batch (what the inline fast path decides, what scorers get as a
sub-batch, what runs as calls of a route's function) and :meth:`Router.finish` applies a group's
domain weights and ``post_process_scores``. *Where and when* the rest runs is the reward agent's job
(:mod:`stepcredit.reward.run.agent`); :class:`~stepcredit.reward.run.rewarder.Rewarder` is its
synchronous face.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stepcredit.config import RewardConfig, RewardCustomConfig
from stepcredit.errors import ConfigError, MissingPackageError, UserError
from stepcredit.reward.base import (
    CUSTOM_STYLES,
    REWARDS,
    FnRef,
    RewardFn,
    Scorer,
    load_ref,
    parse_spec,
    resolve_source,
)
from stepcredit.reward.run.chunks import VERL_BATCH_NAMES, VERL_NAMES, call_style, callable_of
from stepcredit.runtime import require
from stepcredit.types import RewardResult, Sample, Status


@dataclass(frozen=True)
class Route:
    """Where one sample goes: the function, the weight of its domain and the keyword arguments."""

    entry: RewardFn
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """The triage of a batch (:meth:`Router.plan`): what is decided already and what must run where.

    Every index appears exactly once across ``done``, ``scorers`` and ``calls``.
    """

    routes: list[Route | None]
    """Per index, its route (None: no reward function routes it; its ``done`` result says why)."""
    done: list[tuple[int, RewardResult]]
    """Decided without running anything else: no route, a response that is not text, or the
    function's inline fast path."""
    scorers: list[tuple[RewardFn, list[int]]]
    """Per scorer (reward model, judge, sandbox), the indices it scores as one sub-batch."""
    calls: list[tuple[Route, list[int]]]
    """Per route, in index order, the indices that need a call of the route's function."""


def call_args(sample: Sample, response: str) -> tuple[Any, ...]:
    """A reward function's positional arguments for one response (VeRL's signature)."""
    return (sample.data_source, response, sample.ground_truth, sample.extra_info)


def call_args_of(
    samples: Sequence[Sample], responses: Sequence[str], idx: list[int]
) -> list[tuple[Any, ...]]:
    """:func:`call_args` of ``samples[i]``, ``responses[i]`` for each ``i`` in ``idx`` (one
    comprehension, no call per sample)."""
    return [
        (s.data_source, x, s.ground_truth, s.extra_info)
        for s, x in zip(map(samples.__getitem__, idx), map(responses.__getitem__, idx), strict=True)
    ]


def load_custom(spec: str, *, name: str, kwargs: dict[str, Any], isolate: bool, key: str) -> RewardFn:
    """Load a user's function or class named by ``spec``; any problem is a ConfigError naming ``key``."""
    ref = parse_spec(spec)
    try:
        obj = load_ref(ref)
    except ConfigError as e:
        raise ConfigError(f"{key}={spec}: {e}") from None
    post = None
    try:
        fn = callable_of(obj)
    except Exception as e:
        raise ConfigError(f"{key}={spec}: {type(e).__name__}: {e}") from None
    if hasattr(fn, "__self__"):  # a stateful class: its post_process_scores runs in this process
        post = getattr(fn.__self__, "post_process_scores", None)
    return RewardFn(
        name=name,
        fn=fn,
        isolate=isolate,
        kwargs=dict(kwargs),
        ref=FnRef(ref.kind, ref.target, ref.attr),
        post_process=post if callable(post) else None,
    )


@CUSTOM_STYLES.register("verl")
def _load_verl_style(c: RewardCustomConfig) -> RewardFn:
    entry = load_custom(c.path, name="custom", kwargs=c.kwargs, isolate=c.isolate, key="reward.custom.path")
    fn = entry.fn
    assert fn is not None
    owner = getattr(fn, "__self__", None)
    batched = c.batched or getattr(fn, "batched", False) or getattr(owner, "batched", False)
    names = VERL_BATCH_NAMES if batched else VERL_NAMES
    # VeRL raises TypeError at its first call; here a signature that cannot take the call stops start-up
    if call_style(fn, names, frozenset(c.kwargs)) is None:
        call = ", ".join([f"{n}=..." for n in names] + [f"{k}=..." for k in c.kwargs])
        raise ConfigError(
            f"reward.custom.path={c.path}: {getattr(fn, '__name__', 'fn')}{inspect.signature(fn)} cannot be "
            f"called as VeRL calls it: fn({call}){' (reward.custom.batched=true)' if batched else ''}"
        )
    return entry


class Router:
    """Decides what each response needs (route, fast path, scorer) and finishes each group; the
    scoring itself runs in the reward agent (:mod:`stepcredit.reward.run.agent`), whose synchronous
    face is :class:`~stepcredit.reward.run.rewarder.Rewarder`."""

    def __init__(self, cfg: RewardConfig | None = None) -> None:
        self.cfg = cfg or RewardConfig()
        c = self.cfg
        self.custom: RewardFn | None = None
        if c.custom.path:
            self.custom = CUSTOM_STYLES.get(c.custom.style)(c.custom)
        self.domains: dict[str, Route] = {}
        for dom, dc in c.domains.items():
            if dc.fn:
                entry = self._named(dc.fn, key=f"reward.domains.{dom}.fn", name=f"domain:{dom}")
                self.domains[dom] = Route(entry, dc.weight, {**c.kwargs.get(entry.name, {}), **dc.kwargs})
        for name in c.kwargs:
            REWARDS.get(name)  # a typo in reward.kwargs is a ConfigError listing the valid names
        self._lock = threading.Lock()
        self._scorers: dict[str, Scorer] = {}
        self._routes: dict[tuple[str, str, str, str, str], Route] = {}
        self._closed = False

    def _named(self, spec: str, *, key: str, name: str) -> RewardFn:
        if spec in REWARDS or (":" not in spec and not spec.endswith(".py")):
            try:
                return resolve_source(spec)
            except ConfigError as e:
                raise ConfigError(f"{key}: {e}") from None
        return load_custom(spec, name=name, kwargs={}, isolate=self.cfg.custom.isolate, key=key)

    # ---------------------------------------------------------------------------- resources
    def scorer(self, entry: RewardFn) -> Scorer:
        """The scorer object of a registered scorer ``entry`` (built once, on first use)."""
        with self._lock:
            if entry.name not in self._scorers:
                assert entry.factory is not None
                self._scorers[entry.name] = entry.factory(self.cfg)
            return self._scorers[entry.name]

    def close(self) -> None:
        """Close the scorers; the router cannot be used afterwards."""
        with self._lock:
            self._closed = True
            scorers, self._scorers = list(self._scorers.values()), {}
        for s in scorers:
            close = getattr(s, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------ routing
    def route(self, sample: Sample) -> Route:
        """The reward function, weight and keyword arguments of one sample (raises ConfigError if none).
        Samples alike in tag, domain, style, data source and ability share one Route object. A new
        route's ``requires`` packages are checked here, once: a missing one raises
        :class:`~stepcredit.errors.MissingPackageError`, which stops the run rather than failing rows."""
        key = (sample.tag, sample.domain, sample.style, sample.data_source, sample.ability)
        got = self._routes.get(key)
        if got is None:
            got = self._route(sample)
            require(
                got.entry.requires,
                what=f"reward {got.entry.name!r} (data_source {sample.data_source!r}, row {sample.uid or '?'})",
            )
            self._routes[key] = got
        return got

    def is_batched(self, entry: RewardFn) -> bool:
        """Does ``entry`` take VeRL's batch signature (lists in, one value per sample out)? Declared by
        ``reward.custom.batched`` for the custom function, or ``batched = True`` on the function or class."""
        if entry is self.custom and self.cfg.custom.batched:
            return True
        fn = entry.fn
        return bool(getattr(fn, "batched", False) or getattr(getattr(fn, "__self__", None), "batched", False))

    def _route(self, sample: Sample) -> Route:
        c = self.cfg
        domain = c.tag_domains.get(sample.tag, sample.domain)
        if domain in self.domains:
            return self.domains[domain]
        weight = c.domains[domain].weight if domain in c.domains else 1.0
        extra = dict(c.domains[domain].kwargs) if domain in c.domains else {}
        if sample.style and sample.style != "rule":
            entry = REWARDS.get(sample.style)
        elif self.custom is not None:
            return Route(self.custom, weight, {**self.custom.kwargs, **extra})
        else:
            try:
                entry = resolve_source(sample.data_source)
            except ConfigError:
                # an unknown data_source falls back to its ability where a reward opted in by
                # registering ``ability:<name>`` (the sandbox: ``ability:code``); otherwise it is an error
                if f"ability:{sample.ability}" not in REWARDS:
                    raise
                entry = REWARDS.get(f"ability:{sample.ability}")
        return Route(entry, weight, {**c.kwargs.get(entry.name, {}), **extra})

    # ------------------------------------------------------------------------------ scoring
    def plan(self, samples: Sequence[Sample], responses: Sequence[str]) -> Plan:
        """Triage a batch: route each sample, decide what the fast path can, and group the rest by
        scorer and by route: the one per-sample triage, before the agent runs what is left."""
        if len(samples) != len(responses):
            raise ValueError(f"{len(samples)} samples but {len(responses)} responses")
        if self._closed:
            raise RuntimeError("rewarder is closed")
        routes: list[Route | None] = [None] * len(samples)
        done: list[tuple[int, RewardResult]] = []
        scorers: dict[int, tuple[RewardFn, list[int]]] = {}
        calls: dict[int, tuple[Route, list[int]]] = {}
        # the common batch is one route throughout: its call list is kept at hand (no dict look-up
        # and no new (route, []) pair per sample)
        last: Route | None = None
        last_calls: list[int] = []
        cached = self._routes.get
        plain: Route | None = None  # ``last`` when it needs nothing but a call (no check, no fast path)
        for i, (s, resp) in enumerate(zip(samples, responses, strict=True)):
            r = cached((s.tag, s.domain, s.style, s.data_source, s.ability))  # route()'s key
            if r is not None and r is plain and type(resp) is str:
                # the common sample: the route of the one before, nothing to decide here
                routes[i] = r
                last_calls.append(i)
                continue
            try:
                r = routes[i] = self.route(s)
                if r.entry.validate is not None:
                    r.entry.validate(s)
            except MissingPackageError:
                raise  # the environment, not the row: every later row would fail the same way
            except UserError as e:
                done.append((i, _fail(Status.ERROR, str(e), source=s.data_source)))
                continue
            entry = r.entry
            if entry.factory is not None:
                scorers.setdefault(id(entry), (entry, []))[1].append(i)
                continue
            if not isinstance(resp, str):
                done.append((i, _fail(Status.ERROR, f"response is {type(resp).__name__}, expected str")))
                continue
            if entry.fast is not None:
                res = run_fast(entry, call_args(s, resp), r.kwargs)
                if res is not None:
                    done.append((i, res))
                    continue
            if r is not last:
                last = r
                last_calls = calls.setdefault(id(r), (r, []))[1]
            last_calls.append(i)
            plain = r if entry.validate is None and entry.fast is None else None
        return Plan(routes, done, list(scorers.values()), list(calls.values()))

    def run_scorer(self, entry: RewardFn, samples: list[Sample], responses: list[str]) -> list[RewardResult]:
        """Score a sub-batch with ``entry``'s scorer (built on first use); one result per response."""
        t0 = time.perf_counter()
        out = list(self.scorer(entry).score_batch(samples, responses))
        if len(out) != len(samples):
            raise RuntimeError(
                f"scorer {entry.name} returned {len(out)} results for {len(samples)} responses"
            )
        dt = (time.perf_counter() - t0) / max(1, len(samples))
        for r in out:
            if not r.latency_s:
                r.latency_s = dt
        return out

    def finish(
        self,
        results: Sequence[RewardResult | None],
        routes: Sequence[Route | None],
        samples: Sequence[Sample],
        group_B: Any,
    ) -> list[RewardResult]:
        """The last step of scoring, on raw results in index order: the domain's weight, the source,
        and ``post_process_scores`` per group (``group_B``; None = by ``uid``). A missing result is an
        internal error result."""
        if len(results) != len(routes):
            raise ValueError(f"{len(results)} results for {len(routes)} routes")
        if results and _plain(results, routes):
            return list(results)  # type: ignore[arg-type]  # (no None: _plain checked)
        out: list[RewardResult] = []
        for res, route in zip(results, routes, strict=True):
            r = res if res is not None else _fail(Status.ERROR, "no result (internal error)")
            if route is not None:
                r.source = r.source or route.entry.name
                if route.weight != 1.0 and r.ok:
                    r.info["weight"] = route.weight
                    r.score *= route.weight
            out.append(r)
        self._post_process(out, routes, samples, group_B)
        return out

    # ----------------------------------------------------------------------------- internals
    def _post_process(
        self,
        out: list[RewardResult],
        routes: Sequence[Route | None],
        samples: Sequence[Sample],
        group_B: Any,
    ) -> None:
        posts = {id(r.entry): r.entry for r in routes if r is not None and r.entry.post_process is not None}
        if not posts:
            return
        keys = (
            [int(g) for g in group_B]
            if group_B is not None
            else [s.uid or f"#{i}" for i, s in enumerate(samples)]
        )
        groups: dict[tuple[int, Any], list[int]] = {}
        for i, (key, route) in enumerate(zip(keys, routes, strict=True)):
            if route is not None and id(route.entry) in posts and out[i].ok:
                groups.setdefault((id(route.entry), key), []).append(i)
        for (eid, _), idx in groups.items():
            post = posts[eid].post_process
            assert post is not None
            try:
                new = [float(x) for x in post([out[i].score for i in idx])]
                if len(new) != len(idx):
                    raise ValueError(f"returned {len(new)} scores for a group of {len(idx)}")
            except Exception as e:
                for i in idx:
                    out[i] = _fail(
                        Status.ERROR,
                        f"post_process_scores failed: {type(e).__name__}: {e}",
                        source=out[i].source,
                    )
                continue
            for i, v in zip(idx, new, strict=True):
                out[i].info.setdefault("raw_score", out[i].score)
                out[i].score = v


def _plain(results: Sequence[RewardResult | None], routes: Sequence[Route | None]) -> bool:
    """Would :meth:`Router.finish` leave these results as they are? One route throughout, of weight 1
    and without ``post_process_scores``, and every result there with its source: the common answer
    (a chunk of one function), which then costs one look per result instead of the whole finish."""
    first = routes[0]
    if first is None or first.weight != 1.0 or first.entry.post_process is not None:
        return False
    if len(set(map(id, routes))) != 1:
        return False
    return all(r is not None and r.source for r in results)


def run_fast(entry: RewardFn, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RewardResult | None:
    """The entry's inline fast path (None = undecided, go to the slow path); it raising is an error."""
    assert entry.fast is not None
    t0 = time.perf_counter()
    try:
        res = entry.fast(*args, **kwargs)
    except Exception as e:
        res = _fail(Status.ERROR, f"{type(e).__name__}: {e}")
    if res is not None:
        res.latency_s = time.perf_counter() - t0
    return res


def _fail(status: Status, message: str, source: str = "") -> RewardResult:
    r = RewardResult.failure(status, message)
    r.source = source
    return r


def build_router(cfg: RewardConfig | None = None) -> Router:
    """A :class:`Router` for ``cfg`` with the built-in reward functions registered."""
    import stepcredit.reward.builtin  # noqa: F401  (registers the built-in reward functions)

    return Router(cfg)


def check_packages(cfg: RewardConfig, samples: Sequence[Sample]) -> None:
    """Start-up check for a command that scores later (``stepcredit sft``'s validation, ``eval``): route
    each kind of sample once, so a reward whose package is missing stops the command now, with one line
    (:class:`~stepcredit.errors.MissingPackageError`), not after the work. Other routing problems are
    left to the scoring, which reports them per row."""
    with build_router(cfg) as router:
        for s in samples:
            try:
                router.route(s)
            except MissingPackageError:
                raise
            except UserError:
                continue
