"""The ``thread`` reward-agent backend: in-process worker threads (sync functions) and the agent's event loop (async)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from stepcredit.reward.run.backend_api import Backend, BackendArgs, Handle, Job, _timeouts, register_backend
from stepcredit.reward.run.chunks import (
    VERL_BATCH_NAMES,
    Outcome,
    Stop,
    failures,
    run_items,
    verl_call,
)
from stepcredit.types import RewardResult, Status


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
        self._free = 0
        """Threads waiting (or about to wait) for a job, less the jobs queued: below 0, a job has no
        thread yet."""
        self._tls = threading.local()
        """Per worker thread: ``credit``, whether it is answering a job (the next job it submits is its
        own: ``next``, run when it is done answering)."""

    def prestart(self) -> None:
        pass  # threads start with their first job at no cost

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
        tls = self._tls
        if getattr(tls, "credit", False):
            # a worker answering its job submits the next one: it keeps it and runs it when it is done,
            # so no thread is woken or started for it, and no idle thread waiting on the queue takes
            # it (with a trivial reward, thread hand-offs and wake-ups cost more than the work: issue 48)
            tls.credit = False
            tls.next = job
            return
        self._q.put(job)
        with self._lock:
            self._free -= 1
            if self._free >= 0:
                return  # a waiting thread takes it
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
        tls = self._tls
        tls.credit, tls.next = False, None
        while True:
            job = tls.next  # the job this thread submitted while answering its last one
            if job is not None:
                tls.next = None
            else:
                with self._lock:
                    self._free += 1
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
            tls.credit = True
            try:
                self._on_done(job, Outcome(results))
            finally:
                tls.credit = False

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
                    a, kw = verl_call(fn, args, job.kwargs)
                    value = await asyncio.wait_for(fn(*a, **kw), job.timeout_s)
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
                    a, kw = verl_call(fn, cols, job.kwargs, VERL_BATCH_NAMES)
                    value = await asyncio.wait_for(fn(*a, **kw), job.timeout_s)
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
