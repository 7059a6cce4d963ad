"""Where the reward agent's requests run, and how each backend enforces a request's deadline.

A backend receives :class:`Job` objects (one attempt of one request) through ``submit`` and answers
each exactly once through the agent's callback ``on_done(job, results, worker_died)``; ``results``
holds one :class:`~stepcredit.types.RewardResult` per sample of the job. A backend never raises into
the agent for a job: a failure is a typed result.

* :class:`ThreadBackend`: in-process worker threads (sync functions) and the agent's event loop
  (async functions). A thread cannot be stopped: at its deadline the job is answered ``timeout``, the
  thread is *abandoned* (its late result is discarded) and a replacement thread takes its place, up
  to ``concurrency`` abandoned threads at once; past that cap no replacement starts, so a function
  that hangs for ever ends in the agent's step deadline rather than in unbounded threads. An async
  function is cancelled at its deadline (a real stop, unless it blocks the loop).
* :class:`ProcessBackend`: the :class:`~stepcredit.reward.run.pool.KillSafePool`; a deadline kills the
  worker's process group. A worker that died under a job (killed, segfault) is reported as
  ``worker_died`` so the agent re-submits the job.
* :class:`RayBackend`: one Ray actor per concurrency slot, one job at a time each; a deadline kills
  the actor (``ray.kill``) and starts a new one; a lost actor is reported as ``worker_died``.

Batched functions (VeRL's ``fn(data_sources, solution_strs, ground_truths, extra_infos, **kw) -> list``)
run through :func:`call_batched`, which the pool's workers import by reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import inspect
import itertools
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepcredit.reward.base import FnRef, RewardFn, load_ref, to_result
from stepcredit.reward.run.pool import PRELOAD, KillSafePool, call_reward, callable_of
from stepcredit.types import RewardResult, Status


@dataclass(eq=False)
class Job:
    """One attempt of one request, as a backend sees it."""

    key: int
    """Unique per attempt: an answer carrying an old key is a late one and is dropped."""
    entry: RewardFn
    args: tuple[Any, ...]
    """Per sample: ``(data_source, response, ground_truth, extra_info)``; batched: four lists."""
    kwargs: dict[str, Any]
    batched: bool
    n: int
    """Results expected (1, or the samples of a batched call)."""
    timeout_s: float
    source: str


OnDone = Callable[[Job, list[RewardResult], bool], None]


# ------------------------------------------------------------------------------------- results
def finite(res: RewardResult) -> RewardResult:
    """A result claiming ``ok`` with a non-finite score (a RewardResult returned as is) is an error."""
    if res.status in (Status.OK, Status.UNPARSEABLE) and not math.isfinite(res.score):
        return RewardResult.failure(
            Status.ERROR, f"reward function returned a non-finite score {res.score!r}", **res.info
        )
    return res


def convert(job: Job, value: Any) -> list[RewardResult]:
    """What a reward function returned, as ``job.n`` typed results."""
    if not job.batched:
        return [finite(to_result(value, source=job.source))]
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        return failures(job, Status.ERROR, f"batched reward function returned {type(value).__name__}")
    if len(value) != job.n:
        return failures(
            job, Status.ERROR, f"batched reward function returned {len(value)} results for {job.n}"
        )
    return [finite(to_result(v, source=job.source)) for v in value]


def failures(job: Job, status: Status, message: str) -> list[RewardResult]:
    out = []
    for _ in range(job.n):
        r = RewardResult.failure(status, message)
        r.source = job.source
        out.append(r)
    return out


def _encode(res: RewardResult) -> tuple[float, str, str | None, dict[str, Any]]:
    return (res.score, res.status.value, res.extracted, res.info)


def _decode(t: Any, source: str) -> RewardResult:
    score, status, extracted, info = t
    return RewardResult(score=score, status=Status(status), extracted=extracted, info=info, source=source)


_CACHE: dict[FnRef, Any] = {}


def _user_fn(ref: FnRef) -> Any:
    if ref not in _CACHE:  # a stateful class is instantiated once per worker process
        _CACHE[ref] = callable_of(load_ref(ref))
    return _CACHE[ref]


def call_batched(ref: FnRef, n: int, source: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run a batched function inside a pool worker; the pool's result carries the encoded list in
    ``info["batch"]`` (its own score is a placeholder)."""
    job = Job(0, RewardFn(name=source), (), {}, True, n, 0.0, source)
    out = convert(job, call_reward(_user_fn(ref), args, kwargs))
    return {"score": 0.0, "batch": [_encode(r) for r in out]}


BATCHED_REF = FnRef("module", __name__, "call_batched")


def run_encoded(
    ref: FnRef, args: tuple[Any, ...], kwargs: dict[str, Any], source: str, batched: bool, n: int
) -> list[tuple[float, str, str | None, dict[str, Any]]]:
    """Run a job where it is (a Ray actor) and return its results encoded; never raises."""
    job = Job(0, RewardFn(name=source), args, kwargs, batched, n, 0.0, source)
    try:
        out = convert(job, call_reward(_user_fn(ref), args, kwargs))
    except BaseException as e:  # user code may raise anything, SystemExit included
        out = failures(job, Status.ERROR, f"{type(e).__name__}: {e}")
    return [_encode(r) for r in out]


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


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn)


# ------------------------------------------------------------------------------------- threads
@dataclass(eq=False)
class _Running:
    job: Job
    t0: float
    handle: Handle | None = None


class ThreadBackend:
    """Worker threads for sync functions and the agent's event loop for async ones (module doc)."""

    name = "thread"

    def __init__(
        self, concurrency: int, on_done: OnDone, timer: Timer, loop: Callable[[], AsyncLoop]
    ) -> None:
        self.concurrency = concurrency
        self.max_abandoned = concurrency
        self._on_done = on_done
        self._timer = timer
        self._loop = loop
        self._q: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0
        self._abandoned = 0
        self._running: dict[int, _Running] = {}
        self._closed = False
        self._sem: asyncio.Semaphore | None = None

    def describe(self) -> str:
        with self._lock:
            return (
                f"thread backend, {self._live} live threads, {self._abandoned} abandoned "
                f"(cap {self.max_abandoned}), {len(self._running)} running"
            )

    def stats(self) -> dict[str, float]:
        return {"agent/abandoned_threads": float(self._abandoned)}

    def submit(self, job: Job) -> None:
        if _is_async(job.entry.fn):
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
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._work, name="reward-agent-worker", daemon=True).start()

    def _work(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            run = _Running(job, time.monotonic())
            with self._lock:
                self._running[job.key] = run
            run.handle = self._timer.schedule(
                run.t0 + job.timeout_s, functools.partial(self._expire, job.key)
            )
            try:
                results = convert(job, call_reward(job.entry.fn, job.args, job.kwargs))
            except BaseException as e:  # user code may raise anything, SystemExit included
                results = failures(job, Status.ERROR, f"{type(e).__name__}: {e}")
            dt = time.monotonic() - run.t0
            with self._lock:
                mine = self._running.pop(job.key, None) is not None
                if not mine:  # abandoned at its deadline: drop the late result, rejoin if there is room
                    self._abandoned -= 1
                    rejoin = not self._closed and self._live < self.concurrency
                    if rejoin:
                        self._live += 1
            if not mine:
                if not rejoin:
                    return
                continue
            run.handle.cancel()
            if (
                dt > job.timeout_s
            ):  # the timer ran late (a busy GIL): past its deadline is a timeout all the same
                results = self._timeouts(job)
            for r in results:
                r.latency_s = dt
            self._on_done(job, results, False)

    def _expire(self, key: int) -> None:
        with self._lock:
            run = self._running.pop(key, None)
            if run is None:
                return
            self._live -= 1
            self._abandoned += 1
            replace = (
                not self._closed and self._live + self._abandoned < self.concurrency + self.max_abandoned
            )
            if replace:
                self._live += 1
        if replace:
            self._spawn()
        dt = time.monotonic() - run.t0
        out = self._timeouts(run.job)
        for r in out:
            r.latency_s = dt
        self._on_done(run.job, out, False)

    @staticmethod
    def _timeouts(job: Job) -> list[RewardResult]:
        return failures(
            job,
            Status.TIMEOUT,
            f"reward function {job.source} exceeded {job.timeout_s:g} s "
            "(thread backend: the thread cannot be stopped; its late result is discarded)",
        )

    async def _run_async(self, job: Job) -> None:
        if self._sem is None:  # created on the loop's own thread
            self._sem = asyncio.Semaphore(self.concurrency)
        async with self._sem:
            t0 = time.monotonic()
            try:
                assert job.entry.fn is not None
                value = await asyncio.wait_for(job.entry.fn(*job.args, **job.kwargs), job.timeout_s)
                results = convert(job, value)
            except asyncio.TimeoutError:
                results = failures(
                    job,
                    Status.TIMEOUT,
                    f"reward function {job.source} exceeded {job.timeout_s:g} s (cancelled)",
                )
            except asyncio.CancelledError:
                return  # the agent is closing
            except BaseException as e:
                results = failures(job, Status.ERROR, f"{type(e).__name__}: {e}")
            dt = time.monotonic() - t0
        for r in results:
            r.latency_s = dt
        self._on_done(job, results, False)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            n = self._live
        for _ in range(n):
            self._q.put(None)


# ----------------------------------------------------------------------------------- processes
def worker_died(res: RewardResult) -> bool:
    """Did the pool answer this job because its worker process died (not because the function failed)?

    The pool reports a dead worker, a failed send and a failed start as ``error`` results with these
    messages (see :mod:`stepcredit.reward.run.pool`); the agent re-submits such jobs.
    """
    msg = str(res.info.get("message", "")) if res.status == Status.ERROR else ""
    return msg.startswith(("reward worker crashed", "could not send the job", "reward pool failure"))


class ProcessBackend:
    """The kill-safe pool (module doc)."""

    name = "process"

    def __init__(self, concurrency: int, on_done: OnDone, *, only_custom: bool) -> None:
        self.concurrency = concurrency
        self._on_done = on_done
        # With only the user's function in the pool, skip preloading sympy/math-verify.
        self.pool = KillSafePool(
            concurrency, preload=("stepcredit.reward.builtin",) if only_custom else PRELOAD
        )

    def describe(self) -> str:
        return f"process backend, {len(self.pool.pids)} of {self.concurrency} worker processes alive"

    def stats(self) -> dict[str, float]:
        return {}

    def submit(self, job: Job) -> None:
        ref, args = job.entry.ref, job.args
        assert ref is not None
        if job.batched:
            ref, args = BATCHED_REF, (job.entry.ref, job.n, job.source, *job.args)
        fut = self.pool.submit(ref, args, job.kwargs, timeout_s=job.timeout_s, source=job.source)
        fut.add_done_callback(lambda f: self._done(job, f))

    def _done(self, job: Job, fut: Any) -> None:
        try:
            res: RewardResult = fut.result()
        except BaseException as e:  # pragma: no cover - the pool always sets a result
            res = RewardResult.failure(Status.ERROR, f"reward pool failure: {type(e).__name__}: {e}")
        died = worker_died(res)
        if not job.batched:
            out = [finite(res)]
        elif res.status == Status.OK and "batch" in res.info:
            out = [_decode(t, job.source) for t in res.info["batch"]]
        else:
            out = failures(job, res.status, str(res.info.get("message", "reward failed")))
        for r in out:
            r.latency_s = res.latency_s
            r.source = job.source
        self._on_done(job, out, died)

    def close(self) -> None:
        self.pool.close()


# ----------------------------------------------------------------------------------------- ray
class RewardActor:
    """A Ray actor running one reward job at a time (the pool worker's counterpart on Ray)."""

    def __init__(self, path: list[str]) -> None:
        sys.path[:] = list(path) + [p for p in sys.path if p not in path]
        import stepcredit.reward.builtin  # noqa: F401  (registers the built-in functions)

    def ready(self) -> int:
        return os.getpid()

    def run(
        self, ref: FnRef, args: tuple[Any, ...], kwargs: dict[str, Any], source: str, batched: bool, n: int
    ) -> list[tuple[float, str, str | None, dict[str, Any]]]:
        return run_encoded(ref, args, kwargs, source, batched, n)


@dataclass(eq=False)
class _RaySlot:
    index: int
    actor: Any = None
    pid: int = 0
    thread: threading.Thread | None = None
    starts: int = 0
    busy: bool = False
    history: list[int] = field(default_factory=list)


class RayBackend:
    """Ray actors, one job at a time each (module doc)."""

    name = "ray"

    def __init__(
        self,
        concurrency: int,
        on_done: OnDone,
        *,
        address: str,
        local_cpus: int,
        num_cpus: float,
        startup_timeout_s: float,
    ) -> None:
        import ray

        self._ray = ray
        self.concurrency = concurrency
        self._on_done = on_done
        self._started_ray = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address)
            else:
                ray.init(num_cpus=local_cpus, include_dashboard=False)
            self._started_ray = True
        self._cls = ray.remote(num_cpus=num_cpus, max_restarts=0)(RewardActor)
        self._startup_timeout_s = startup_timeout_s
        self._q: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self.slots = [_RaySlot(i) for i in range(concurrency)]
        for s in self.slots:
            s.thread = threading.Thread(
                target=self._loop, args=(s,), name=f"reward-ray-{s.index}", daemon=True
            )
            s.thread.start()

    @property
    def pids(self) -> set[int]:
        """Process ids of the live actors (for tests)."""
        return {s.pid for s in self.slots if s.actor is not None and s.pid}

    def all_pids(self) -> set[int]:
        """Every actor process this backend started (for tests: none may outlive close)."""
        return {p for s in self.slots for p in s.history}

    def describe(self) -> str:
        ready = sum(1 for s in self.slots if s.actor is not None and s.pid)
        starting = sum(1 for s in self.slots if s.actor is not None and not s.pid)
        return f"ray backend, {ready} of {self.concurrency} actors ready, {starting} starting"

    def stats(self) -> dict[str, float]:
        return {"agent/actor_starts": float(sum(s.starts for s in self.slots))}

    def submit(self, job: Job) -> None:
        self._q.put(job)

    def _kill(self, slot: _RaySlot) -> None:
        actor, slot.actor, slot.pid = slot.actor, None, 0
        if actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(actor, no_restart=True)

    def _start(self, slot: _RaySlot) -> None:
        ray = self._ray
        actor: Any = self._cls.remote(list(sys.path))  # type: ignore[attr-defined]
        slot.actor = actor
        slot.starts += 1
        try:
            slot.pid = int(ray.get(actor.ready.remote(), timeout=self._startup_timeout_s))
        except Exception as e:
            self._kill(slot)
            raise RuntimeError(
                f"Ray reward actor did not start within {self._startup_timeout_s:g} s: {type(e).__name__}"
            ) from None
        slot.history.append(slot.pid)

    def _loop(self, slot: _RaySlot) -> None:
        while True:
            job = self._q.get()
            if job is None or self._closed:
                break
            slot.busy = True
            try:
                out, died = self._run(slot, job)
            except BaseException as e:  # never leave the agent waiting
                out, died = failures(job, Status.ERROR, f"ray backend failure: {type(e).__name__}: {e}"), True
            slot.busy = False
            if self._closed:
                break
            self._on_done(job, out, died)
        self._kill(slot)

    def _run(self, slot: _RaySlot, job: Job) -> tuple[list[RewardResult], bool]:
        ray = self._ray
        if slot.actor is None:
            try:
                self._start(slot)
            except RuntimeError as e:
                return failures(job, Status.ERROR, str(e)), True
        assert job.entry.ref is not None
        t0 = time.monotonic()
        ref = slot.actor.run.remote(job.entry.ref, job.args, job.kwargs, job.source, job.batched, job.n)
        ready, _ = ray.wait([ref], timeout=job.timeout_s)
        dt = time.monotonic() - t0
        if not ready:
            self._kill(slot)
            out = failures(
                job,
                Status.TIMEOUT,
                f"reward function {job.source} exceeded {job.timeout_s:g} s; its actor was killed",
            )
            died = False
        else:
            try:
                out = [_decode(t, job.source) for t in ray.get(ref)]
                died = False
            except ray.exceptions.RayActorError as e:
                self._kill(slot)
                out = failures(job, Status.ERROR, f"Ray reward actor died: {type(e).__name__}")
                died = True
            except Exception as e:
                out = failures(job, Status.ERROR, f"{type(e).__name__}: {e}")
                died = False
        for r in out:
            r.latency_s = dt
        return out, died

    def close(self) -> None:
        self._closed = True
        for _ in self.slots:
            self._q.put(None)
        for s in self.slots:
            self._kill(s)  # interrupts a running job: its ray.wait returns at once
        for s in self.slots:
            if s.thread is not None:
                s.thread.join(10.0)
        if self._started_ray:
            with contextlib.suppress(Exception):
                self._ray.shutdown()
