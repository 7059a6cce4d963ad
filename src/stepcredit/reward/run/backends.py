"""Where the reward agent's chunks run: the backend registry and the three built-in backends.

A backend receives :class:`Job` objects (one attempt of one chunk: several samples of one reward
function, or one batched call) through ``submit`` and answers each exactly once through the agent's
callback ``on_done(job, outcome)``, an :class:`~stepcredit.reward.run.pool.Outcome` holding one
result per item, or None for an item that did not run to the end (the agent queues it again). A
backend never raises into the agent for a job: a failure is a typed result.

Each item of a chunk has its own deadline, counted from when that item started: a sample that hangs
is answered ``timeout``, the items before it keep their results and the items after it run again in a
new chunk, so one hanging sample never fails its neighbours.

Backends are registry entries (:data:`BACKENDS`, :func:`register_backend`) whose capabilities are
metadata the agent and :func:`check_config` read; nobody compares backend names:

* ``thread`` (:class:`ThreadBackend`): in-process worker threads (sync functions) and the agent's
  event loop (async functions). A thread cannot be stopped: at an item's deadline the chunk is
  answered, the thread is *abandoned* (its late result is discarded) and a replacement takes its
  place, up to ``concurrency`` abandoned threads at once; past that cap no replacement starts, so a
  function that hangs for ever ends in the agent's step deadline rather than in unbounded threads.
* ``process`` (:class:`ProcessBackend`): the :class:`~stepcredit.reward.run.pool.KillSafePool`; a
  deadline kills the worker's process group; a worker that died under an item reports it so the
  agent re-submits it.
* ``ray`` (:class:`RayBackend`): pools of Ray actors with declared resources, chunks handed to idle
  actors; a deadline kills the actor, a lost actor (killed, its node gone) is replaced and its chunk
  re-submitted. Scorers listed in ``reward.agent.ray_scorers`` (the code sandbox, reward models) run
  as actors of their own, placed by custom resources such as ``sandbox``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import heapq
import inspect
import itertools
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stepcredit.config import RewardConfig
from stepcredit.errors import ConfigError
from stepcredit.registry import Registry
from stepcredit.reward.base import REWARDS, FnRef, RewardFn, load_ref, ref_of
from stepcredit.reward.run.pool import (
    PRELOAD,
    KillSafePool,
    Outcome,
    Stop,
    callable_of,
    decode,
    encode_all,
    failures,
    run_items,
)
from stepcredit.types import RewardResult, Sample, Status


@dataclass(eq=False)
class Job:
    """One attempt of one chunk, as a backend sees it."""

    key: int
    """Unique per attempt: an answer carrying an old key is a late one and is dropped."""
    entry: RewardFn
    items: list[tuple[Any, ...]]
    """Per sample ``(data_source, response, ground_truth, extra_info)``; for a scorer ``(sample, response)``."""
    kwargs: dict[str, Any]
    batched: bool
    """One call over all items (a batched function, or a scorer's ``score_batch``)."""
    timeout_s: float
    """Deadline of one item (of the whole call when ``batched``)."""
    source: str
    scorer: bool = False
    """The items go to ``entry``'s scorer (a remote scorer pool), not to a reward function."""

    @property
    def n(self) -> int:
        return len(self.items)


OnDone = Callable[[Job, Outcome], None]


class Backend(Protocol):
    """What the agent needs from a backend (module doc)."""

    def submit(self, job: Job) -> None: ...

    def warmup(self) -> None: ...

    def describe(self) -> str: ...

    def stats(self) -> dict[str, float]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BackendArgs:
    """What a backend factory gets from the agent."""

    cfg: RewardConfig
    concurrency: int
    on_done: OnDone
    timer: Timer
    loop: Callable[[], AsyncLoop]
    only_custom: bool
    """Only the user's function runs there: workers skip preloading sympy and math-verify."""


@dataclass(frozen=True)
class BackendSpec:
    """A registered agent backend: its factory plus what the agent and the config check need to know."""

    make: Callable[[BackendArgs], Backend]
    default_concurrency: int = 0
    """Chunks at once when ``reward.agent.max_concurrency`` is 0; 0 = ``reward.workers``."""
    in_process: bool = False
    """Runs in the trainer's process: it also serves functions registered with ``isolate=False``."""
    stops_hung_work: bool = True
    """A deadline really stops the work (kills a process or actor); False: it is abandoned."""
    hosts_scorers: bool = False
    """Can run scorers (sandbox, reward model) as placed workers (``reward.agent.ray_scorers``)."""
    uses_ray: bool = False
    """Reads the ``reward.agent.ray_*`` settings."""


BACKENDS: Registry[BackendSpec] = Registry("reward agent backend")


def register_backend(
    name: str,
    *,
    default_concurrency: int = 0,
    in_process: bool = False,
    stops_hung_work: bool = True,
    hosts_scorers: bool = False,
    uses_ray: bool = False,
) -> Callable[[Callable[[BackendArgs], Backend]], Callable[[BackendArgs], Backend]]:
    """Decorator: ``@register_backend("thread", in_process=True)`` adds a backend factory to :data:`BACKENDS`."""

    def deco(make: Callable[[BackendArgs], Backend]) -> Callable[[BackendArgs], Backend]:
        BACKENDS.add(
            name,
            BackendSpec(
                make=make,
                default_concurrency=default_concurrency,
                in_process=in_process,
                stops_hung_work=stops_hung_work,
                hosts_scorers=hosts_scorers,
                uses_ray=uses_ray,
            ),
        )
        return make

    return deco


def check_config(cfg: RewardConfig) -> BackendSpec:
    """Start-up check of ``reward.agent`` against the backend registry; returns the backend's spec.

    - the backend must be registered (the message lists the valid ones);
    - ``ray_scorers`` needs a backend that hosts scorers, and each key must name a registered scorer;
    - ``ray_resources`` / ``ray_scorers`` need a backend that reads the Ray settings.
    """
    a = cfg.agent
    try:
        spec = BACKENDS.get(a.backend)
    except ConfigError as e:
        raise ConfigError(f"config key reward.agent.backend: {e}") from None
    if a.ray_scorers and not spec.hosts_scorers:
        ok = ", ".join(n for n in BACKENDS if BACKENDS.get(n).hosts_scorers)
        raise ConfigError(
            f"config key reward.agent.ray_scorers: backend {a.backend!r} cannot host scorers; use one of: {ok}"
        )
    if a.ray_resources and not spec.uses_ray:
        raise ConfigError(f"config key reward.agent.ray_resources: backend {a.backend!r} does not use Ray")
    if a.ray_scorers:
        import stepcredit.reward.builtin  # noqa: F401  (registers the built-in scorers)

        for name in a.ray_scorers:
            try:
                entry = REWARDS.get(name)
            except ConfigError as e:
                raise ConfigError(f"config key reward.agent.ray_scorers.{name}: {e}") from None
            if entry.factory is None:
                raise ConfigError(
                    f"config key reward.agent.ray_scorers.{name}: {name!r} is a reward function, not a "
                    "scorer (only scorers such as code or model run as their own actors)"
                )
    return spec


# --------------------------------------------------------------------------------------- timer
class Handle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timer:
    """One thread running callbacks at given times (deadlines of thread jobs, retry backoffs)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Handle, Callable[[], None]]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self._thread: threading.Thread | None = None

    def schedule(self, when: float, fn: Callable[[], None]) -> Handle:
        """Call ``fn()`` at ``time.monotonic() >= when`` (from the timer's thread)."""
        h = Handle()
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="reward-agent-timer", daemon=True)
                self._thread.start()
            wake = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, next(self._seq), h, fn))
            if wake:  # equal timeouts arrive in order: most schedules need no wake-up
                self._cond.notify()
        return h

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                        continue
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                if self._closed:
                    return
                _, _, h, fn = heapq.heappop(self._heap)
            if not h.cancelled:
                with contextlib.suppress(Exception):
                    fn()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(5.0)


class AsyncLoop:
    """The agent's event loop, on its own thread: async reward functions run here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="reward-agent-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Any) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        async def stop() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self.loop.close()


def _timeouts(job: Job, n: int, why: str) -> list[RewardResult]:
    return failures(
        n, Status.TIMEOUT, f"reward function {job.source} exceeded {job.timeout_s:g} s ({why})", job.source
    )


# ------------------------------------------------------------------------------------- threads
@dataclass(eq=False)
class _Running:
    job: Job
    out: list[RewardResult] = field(default_factory=list)
    progress: tuple[int, float] = (0, 0.0)
    """The item running and when it started (one tuple: a reader never sees half an update)."""
    abandoned: bool = False
    handle: Handle | None = None


class ThreadBackend:
    """Worker threads for sync functions and the agent's event loop for async ones (module doc)."""

    def __init__(self, args: BackendArgs) -> None:
        self.concurrency = args.concurrency
        self.max_abandoned = args.concurrency
        self._on_done = args.on_done
        self._timer = args.timer
        self._loop = args.loop
        self._q: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0
        self._abandoned = 0
        self._running: dict[int, _Running] = {}
        self._closed = False
        self._sem: asyncio.Semaphore | None = None

    def warmup(self) -> None:
        pass

    def describe(self) -> str:
        with self._lock:
            return (
                f"thread backend, {self._live} live threads, {self._abandoned} abandoned "
                f"(cap {self.max_abandoned}), {len(self._running)} running"
            )

    def stats(self) -> dict[str, float]:
        return {"agent/abandoned_threads": float(self._abandoned)}

    def submit(self, job: Job) -> None:
        if inspect.iscoroutinefunction(job.entry.fn):
            self._loop().submit(self._run_async(job))
            return
        self._q.put(job)
        with self._lock:
            spawn = (
                not self._closed
                and self._live < self.concurrency
                and self._live + self._abandoned < self.concurrency + self.max_abandoned
            )
            if spawn:
                self._live += 1
        if spawn:
            threading.Thread(target=self._work, name="reward-agent-worker", daemon=True).start()

    def _work(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            run = _Running(job, progress=(0, time.monotonic()))
            with self._lock:
                self._running[job.key] = run
            run.handle = self._timer.schedule(
                run.progress[1] + job.timeout_s, functools.partial(self._check, job.key)
            )

            def started(k: int, run: _Running = run) -> None:
                if run.abandoned:
                    raise Stop
                run.progress = (k, time.monotonic())

            with contextlib.suppress(Stop):
                run_items(
                    job.entry.fn,
                    job.items,
                    job.kwargs,
                    source=job.source,
                    batched=job.batched,
                    out=run.out,
                    started=started,
                )
            with self._lock:
                mine = self._running.pop(job.key, None) is not None
                if not mine:  # abandoned at a deadline: drop the late result, rejoin if there is room
                    self._abandoned -= 1
                    rejoin = not self._closed and self._live < self.concurrency
                    if rejoin:
                        self._live += 1
            if not mine:
                if not rejoin:
                    return
                continue
            if run.handle is not None:
                run.handle.cancel()
            results: list[RewardResult | None] = list(run.out)
            self._on_done(job, Outcome(results))

    def _check(self, key: int) -> None:
        """The timer's visit at an item's deadline: reschedule if the item moved on, else give up on it."""
        with self._lock:
            run = self._running.get(key)
            if run is None:
                return
            job = run.job
            k, t0 = run.progress
            now = time.monotonic()
            if len(run.out) > k or now < t0 + job.timeout_s:
                when = t0 + job.timeout_s if len(run.out) <= k else now + job.timeout_s
                run.handle = self._timer.schedule(when, functools.partial(self._check, key))
                return
            del self._running[key]
            run.abandoned = True
            self._live -= 1
            self._abandoned += 1
            replace = (
                not self._closed and self._live + self._abandoned < self.concurrency + self.max_abandoned
            )
            if replace:
                self._live += 1
            done = run.out[:k]
        if replace:
            threading.Thread(target=self._work, name="reward-agent-worker", daemon=True).start()
        why = "thread backend: the thread cannot be stopped; its late result is discarded"
        if job.batched:
            out = _timeouts(job, job.n, why)
            for r in out:
                r.latency_s = now - t0
            self._on_done(job, Outcome(list(out), whole=True))
            return
        (hung,) = _timeouts(job, 1, why)
        hung.latency_s = now - t0
        results: list[RewardResult | None] = [*done, hung] + [None] * (job.n - k - 1)
        self._on_done(job, Outcome(results))

    async def _run_async(self, job: Job) -> None:
        if self._sem is None:  # created on the loop's own thread
            self._sem = asyncio.Semaphore(self.concurrency)
        fn = job.entry.fn
        assert fn is not None

        async def one(args: Any) -> Any:
            async with self._sem:  # type: ignore[union-attr]
                t0 = time.monotonic()
                try:
                    value = await asyncio.wait_for(fn(*args, **job.kwargs), job.timeout_s)
                    (r,) = run_items(
                        lambda *_a, **_k: value, [()], {}, source=job.source, batched=False, out=[]
                    )
                except asyncio.TimeoutError:
                    (r,) = _timeouts(job, 1, "cancelled")
                r.latency_s = time.monotonic() - t0
                return r

        try:
            if job.batched:
                cols = tuple(list(c) for c in zip(*job.items, strict=True))
                t0 = time.monotonic()
                try:
                    value = await asyncio.wait_for(fn(*cols, **job.kwargs), job.timeout_s)
                    out = run_items(
                        lambda *_a, **_k: value, job.items, {}, source=job.source, batched=True, out=[]
                    )
                    outcome = Outcome(list(out))
                except asyncio.TimeoutError:
                    outcome = Outcome(list(_timeouts(job, job.n, "cancelled")), whole=True)
                for r in outcome.results:
                    r.latency_s = time.monotonic() - t0  # type: ignore[union-attr]
            else:
                got = await asyncio.gather(*(one(a) for a in job.items), return_exceptions=True)
                results: list[RewardResult | None] = []
                for g in got:
                    if isinstance(g, BaseException):
                        (g,) = failures(1, Status.ERROR, f"{type(g).__name__}: {g}", job.source)
                    results.append(g)
                outcome = Outcome(results)
        except asyncio.CancelledError:
            return  # the agent is closing
        self._on_done(job, outcome)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            n = self._live
        for _ in range(n):
            self._q.put(None)


@register_backend("thread", default_concurrency=16, in_process=True, stops_hung_work=False)
def _thread_backend(args: BackendArgs) -> Backend:
    return ThreadBackend(args)


# ----------------------------------------------------------------------------------- processes
class ProcessBackend:
    """The kill-safe pool, fed chunks (module doc)."""

    def __init__(self, args: BackendArgs) -> None:
        self.concurrency = args.concurrency
        self._on_done = args.on_done
        self.flush_s = min(0.05, args.cfg.agent.chunk_s or 0.05)
        # With only the user's function in the pool, skip preloading sympy/math-verify.
        self.pool = KillSafePool(
            args.concurrency, preload=("stepcredit.reward.builtin",) if args.only_custom else PRELOAD
        )
        # Answers go to the agent from one thread of their own, in order: a slot's thread sends its
        # next chunk at once instead of first recording this one, so the worker computes meanwhile.
        self._answers = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-process-answers")

    def warmup(self) -> None:
        self.pool.warmup()

    def describe(self) -> str:
        return f"process backend, {len(self.pool.pids)} of {self.concurrency} worker processes alive"

    def stats(self) -> dict[str, float]:
        return {"agent/workers_alive": float(len(self.pool.pids))}

    def submit(self, job: Job) -> None:
        assert job.entry.ref is not None
        fut = self.pool.submit_chunk(
            job.entry.ref,
            job.items,
            job.kwargs,
            timeout_s=job.timeout_s,
            source=job.source,
            batched=job.batched,
            flush_s=self.flush_s,
        )
        fut.add_done_callback(lambda f: self._answer(job, f.result()))

    def _answer(self, job: Job, outcome: Outcome) -> None:
        with contextlib.suppress(RuntimeError):  # closing: nobody waits for it any more
            self._answers.submit(self._on_done, job, outcome)

    def close(self) -> None:
        self.pool.close()
        self._answers.shutdown(wait=True, cancel_futures=True)


@register_backend("process", stops_hung_work=True)
def _process_backend(args: BackendArgs) -> Backend:
    return ProcessBackend(args)


# ----------------------------------------------------------------------------------------- ray
_CACHE: dict[FnRef, Any] = {}


def _user_fn(ref: FnRef) -> Any:
    if ref not in _CACHE:  # a stateful class is instantiated once per actor
        _CACHE[ref] = callable_of(load_ref(ref))
    return _CACHE[ref]


def _actor_setup(path: list[str]) -> None:
    sys.path[:] = list(path) + [p for p in sys.path if p not in path]
    import stepcredit.reward.builtin  # noqa: F401  (registers the built-in functions)
    from stepcredit.reward.verifiers import math as math_verifier

    math_verifier.disable_math_verify_timeouts()  # chunks run off the main thread (a threaded actor)


def _node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


class RewardActor:
    """A Ray actor running one chunk at a time; a second thread answers :meth:`progress` meanwhile."""

    def __init__(self, path: list[str]) -> None:
        _actor_setup(path)
        self._out: list[RewardResult] = []
        self._progress = (0, time.monotonic())

    def ready(self) -> tuple[int, str]:
        return os.getpid(), _node_id()

    def run(
        self, ref: FnRef, items: list[tuple[Any, ...]], kwargs: dict[str, Any], source: str, batched: bool
    ) -> list[Any]:
        out: list[RewardResult] = []
        self._out = out

        def started(k: int) -> None:
            self._progress = (k, time.monotonic())

        try:
            fn = _user_fn(ref)
        except BaseException as e:
            return encode_all(
                failures(len(items), Status.ERROR, f"{type(e).__name__}: {e}", source), check=True
            )
        run_items(fn, items, kwargs, source=source, batched=batched, out=out, started=started)
        return encode_all(out, check=True)

    def progress(self) -> tuple[int, float, list[Any]]:
        """The running item, how long it has run (this node's clock) and the results done before it."""
        k, t0 = self._progress
        out = self._out
        if len(out) > k:  # item k is done and the next has not started: nothing is running late
            return len(out), 0.0, encode_all(out[: len(out)], check=True)
        return k, time.monotonic() - t0, encode_all(out[:k], check=True)


class ScorerActor:
    """A Ray actor holding one scorer (code sandbox, reward model) built where its resources are."""

    def __init__(self, path: list[str], factory: Any, cfg: RewardConfig) -> None:
        _actor_setup(path)
        make = load_ref(factory) if isinstance(factory, FnRef) else REWARDS.get(factory).factory
        assert make is not None
        self.scorer = make(cfg)

    def ready(self) -> tuple[int, str]:
        return os.getpid(), _node_id()

    def run(self, items: list[tuple[Sample, str]], source: str) -> list[Any]:
        samples = [s for s, _ in items]
        responses = [r for _, r in items]
        t0 = time.perf_counter()
        try:
            out = list(self.scorer.score_batch(samples, responses))
            if len(out) != len(items):
                raise RuntimeError(f"scorer {source} returned {len(out)} results for {len(items)} responses")
        except Exception as e:
            out = failures(len(items), Status.ERROR, f"{type(e).__name__}: {e}", source)
        dt = (time.perf_counter() - t0) / max(1, len(items))
        for r in out:
            r.latency_s = r.latency_s or dt
        return encode_all(out, check=True)


@dataclass(eq=False)
class _RaySlot:
    index: int
    actor: Any = None
    pid: int = 0
    node: str = ""
    thread: threading.Thread | None = None
    starts: int = 0
    busy: int = 0
    """Samples of the chunk running there (0 = idle)."""
    history: list[int] = field(default_factory=list)


class _RayPool:
    """``concurrency`` actors of one kind; each driver thread takes the next chunk when its actor is idle."""

    def __init__(self, owner: RayBackend, name: str, make: Callable[[], Any], concurrency: int) -> None:
        self.owner = owner
        self.name = name
        self._make = make
        self.q: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.slots = [_RaySlot(i) for i in range(concurrency)]
        for s in self.slots:
            s.thread = threading.Thread(
                target=self._loop, args=(s,), name=f"reward-ray-{name}-{s.index}", daemon=True
            )
            s.thread.start()

    def _kill(self, slot: _RaySlot) -> None:
        actor, slot.actor, slot.pid = slot.actor, None, 0
        if actor is not None:
            with contextlib.suppress(Exception):
                self.owner.ray.kill(actor, no_restart=True)

    def _start(self, slot: _RaySlot) -> None:
        actor = self._make()
        slot.actor = actor
        slot.starts += 1
        try:
            slot.pid, slot.node = self.owner.ray.get(
                actor.ready.remote(), timeout=self.owner.startup_timeout_s
            )
        except Exception as e:
            self._kill(slot)
            raise RuntimeError(
                f"Ray reward actor did not start within {self.owner.startup_timeout_s:g} s: {type(e).__name__}"
            ) from None
        slot.history.append(slot.pid)

    def _loop(self, slot: _RaySlot) -> None:
        while True:
            job = self.q.get()
            if job is None or self.owner.closed:
                break
            slot.busy = job.n
            try:
                outcome = self._run(slot, job)
            except BaseException as e:  # never leave the agent waiting
                msg = f"ray backend failure: {type(e).__name__}: {e}"
                outcome = Outcome(
                    list(failures(job.n, Status.ERROR, msg, job.source)), died=list(range(job.n))
                )
            slot.busy = 0
            if self.owner.closed:
                break
            node = slot.node or "?"
            self.owner.node_done[node] = self.owner.node_done.get(node, 0) + job.n
            self.owner.on_done(job, outcome)
        self._kill(slot)

    def _run(self, slot: _RaySlot, job: Job) -> Outcome:
        ray = self.owner.ray
        if slot.actor is None:
            try:
                self._start(slot)
            except RuntimeError as e:
                return Outcome(
                    list(failures(job.n, Status.ERROR, str(e), job.source)), died=list(range(job.n))
                )
        if job.scorer:
            ref = slot.actor.run.remote(job.items, job.source)
        else:
            assert job.entry.ref is not None
            ref = slot.actor.run.remote(job.entry.ref, job.items, job.kwargs, job.source, job.batched)
        t0 = time.monotonic()
        wait = job.timeout_s
        while True:
            ready, _ = ray.wait([ref], timeout=wait)
            if ready:
                break
            if job.batched:  # one call: its deadline is the call's
                self._kill(slot)
                out = _timeouts(job, job.n, "its actor was killed")
                for r in out:
                    r.latency_s = time.monotonic() - t0
                return Outcome(list(out), whole=True)
            try:  # which item is running, and for how long? (answered by the actor's second thread)
                k, ran, done = ray.get(slot.actor.progress.remote(), timeout=min(5.0, job.timeout_s + 1.0))
            except Exception:
                self._kill(slot)
                return Outcome(list(_timeouts(job, job.n, "its actor was killed")), whole=True)
            if ran < job.timeout_s:
                wait = job.timeout_s - ran
                continue
            self._kill(slot)
            (hung,) = _timeouts(job, 1, "its actor was killed")
            hung.latency_s = ran
            results: list[RewardResult | None] = [decode(t, job.source) for t in done[:k]]
            return Outcome(results + [hung] + [None] * (job.n - len(results) - 1))
        try:
            return Outcome([decode(t, job.source) for t in ray.get(ref)])
        except ray.exceptions.RayActorError as e:  # the actor or its node died: which item is unknown
            self._kill(slot)
            msg = f"Ray reward actor died: {type(e).__name__}"
            return Outcome(list(failures(job.n, Status.ERROR, msg, job.source)), died=list(range(job.n)))
        except Exception as e:
            return Outcome(list(failures(job.n, Status.ERROR, f"{type(e).__name__}: {e}", job.source)))

    def close(self) -> None:
        for _ in self.slots:
            self.q.put(None)
        for s in self.slots:
            self._kill(s)  # interrupts a running job: its ray.wait returns at once
        for s in self.slots:
            if s.thread is not None:
                s.thread.join(10.0)


class RayBackend:
    """Pools of Ray actors (module doc): one for reward functions, one per scorer in ``ray_scorers``."""

    def __init__(self, args: BackendArgs) -> None:
        import ray

        a = args.cfg.agent
        self.ray = ray
        self.cfg = args.cfg
        self.on_done = args.on_done
        self.closed = False
        self.startup_timeout_s = a.ray_startup_timeout_s
        self.node_done: dict[str, int] = {}
        self._started_ray = False
        if not ray.is_initialized():
            if a.ray_address:
                ray.init(address=a.ray_address)
            else:
                ray.init(num_cpus=a.ray_local_cpus, include_dashboard=False)
            self._started_ray = True
        path = list(sys.path)
        # max_concurrency=2: the second thread answers progress() while a chunk runs.
        opts: dict[str, Any] = {"num_cpus": a.ray_num_cpus, "max_restarts": 0, "max_concurrency": 2}
        if a.ray_resources:
            opts["resources"] = dict(a.ray_resources)
        cls = ray.remote(**opts)(RewardActor)
        self.pools: dict[str, _RayPool] = {
            "": _RayPool(self, "reward", lambda: cls.remote(path), args.concurrency)  # type: ignore[attr-defined]
        }
        for name, resources in a.ray_scorers.items():
            entry = REWARDS.get(name)
            assert entry.factory is not None
            try:
                factory: Any = ref_of(entry.factory)
            except ConfigError:  # defined inside a function: the actor finds it by name
                factory = entry.name
            sopts: dict[str, Any] = {"num_cpus": a.ray_num_cpus, "max_restarts": 0}
            if resources:
                sopts["resources"] = dict(resources)
            scls = ray.remote(**sopts)(ScorerActor)
            self.pools[entry.name] = _RayPool(
                self,
                entry.name,
                functools.partial(scls.remote, path, factory, args.cfg),  # type: ignore[attr-defined]
                a.ray_scorer_concurrency,
            )

    @property
    def slots(self) -> list[_RaySlot]:
        return [s for p in self.pools.values() for s in p.slots]

    @property
    def pids(self) -> set[int]:
        """Process ids of the live actors (for tests)."""
        return {s.pid for s in self.slots if s.actor is not None and s.pid}

    def all_pids(self) -> set[int]:
        """Every actor process this backend started (for tests: none may outlive close)."""
        return {p for s in self.slots for p in s.history}

    def actor_nodes(self, pool: str = "") -> list[str]:
        """Node ids of the live actors of a pool ("" = reward functions, else a scorer's name)."""
        return [s.node for s in self.pools[pool].slots if s.actor is not None and s.pid]

    def warmup(self) -> None:
        for p in self.pools.values():
            for s in p.slots:
                if s.actor is None:
                    p._start(s)

    def describe(self) -> str:
        parts = []
        for p in self.pools.values():
            ready = sum(1 for s in p.slots if s.actor is not None and s.pid)
            starting = sum(1 for s in p.slots if s.actor is not None and not s.pid)
            parts.append(f"{ready} of {len(p.slots)} {p.name} actors ready, {starting} starting")
        return "ray backend, " + "; ".join(parts)

    def stats(self) -> dict[str, float]:
        m = {"agent/actor_starts": float(sum(s.starts for s in self.slots))}
        busy: dict[str, int] = {}
        for s in self.slots:
            if s.node:
                busy[s.node] = busy.get(s.node, 0) + s.busy
        for node, n in busy.items():
            m[f"agent/node_in_flight/{node[:8]}"] = float(n)
        for node, n in list(self.node_done.items()):
            m[f"agent/node_completed/{node[:8]}"] = float(n)
        return m

    def submit(self, job: Job) -> None:
        self.pools[job.entry.name if job.scorer else ""].q.put(job)

    def close(self) -> None:
        self.closed = True
        for p in self.pools.values():
            p.close()
        if self._started_ray:
            with contextlib.suppress(Exception):
                self.ray.shutdown()


@register_backend("ray", default_concurrency=2, hosts_scorers=True, uses_ray=True)
def _ray_backend(args: BackendArgs) -> Backend:
    return RayBackend(args)
