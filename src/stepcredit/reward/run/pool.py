"""A kill-safe process pool: a reward function that hangs or crashes costs one worker, never the run.

Why not ``concurrent.futures.ProcessPoolExecutor`` or ``signal.alarm``: the executor cannot stop a
running task (a timed-out future keeps its worker busy forever) and breaks the whole pool when one
worker dies; SIGALRM only works on the main thread of the main process (math-verify raises
elsewhere). Here each worker slot has one thread in the parent that sends a job down a pipe and
waits for the answer with ``poll(timeout)``. On a deadline it kills the worker's whole process
group (the worker calls ``setsid`` so user code's children go too), answers ``timeout`` and starts a
replacement; a worker that dies (segfault, ``os._exit``) answers ``error`` and is replaced. Every
reply carries its job id and a slot runs one job at a time, so a result cannot reach the wrong
sample. A job is a chunk (several samples of one function, or one batched call) sent by the reward
agent's process backend; ``submit_chunk`` returns a :class:`concurrent.futures.Future` of its
:class:`Outcome`, and each item of the chunk has its own deadline.

Workers are fresh interpreters (``python -m stepcredit.reward.run._worker``), not ``fork``s (the parent may
hold threads and locks, e.g. torch's) nor ``multiprocessing`` spawns (those re-run the user's
``__main__`` script). They get the parent's ``sys.path``, run in their own session, print user output
to stderr (stdout is never the channel) and exit when the parent dies. A replacement is started right
after the failed job has been answered, so its import time (~1-2 s) delays only later jobs of that slot.
Neither a worker's start nor a function's first import in it counts against an item's deadline: the
worker reports "ready", its progress says "loading" while it imports a chunk's function (timed by
``STARTUP_TIMEOUT_S``), and each item's clock starts when the worker begins that item.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import multiprocessing as mp
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from stepcredit.reward.base import FnRef, load_ref
from stepcredit.reward.run.chunks import (
    Encoded,
    Outcome,
    Stop,
    _none_or,
    call_reward,
    callable_of,
    decode,
    decode_all,
    encode,
    encode_all,
    failures,
    finite,
    run_items,
)
from stepcredit.sandbox.dirs import remove_sandbox_dirs
from stepcredit.types import RewardResult, Status

__all__ = [  # the chunk helpers live in chunks.py; importable from here as before
    "LOADING",
    "PRELOAD",
    "PROGRESS",
    "STARTUP_TIMEOUT_S",
    "Encoded",
    "KillSafePool",
    "Outcome",
    "Stop",
    "call_reward",
    "callable_of",
    "decode",
    "encode",
    "encode_all",
    "failures",
    "finite",
    "run_items",
    "worker_main",
]

PRELOAD = ("stepcredit.reward.builtin", "math_verify")
"""Modules every worker imports before its first job, so that their import time is not charged to a
job's deadline (the built-in verifiers and math-verify; missing ones are skipped)."""
STARTUP_TIMEOUT_S = 120.0
"""How long a new worker may take to import its modules and report ready, and how long a worker may take
to import a reward function the first time it runs it (neither counts against a job's deadline)."""


PROGRESS = struct.Struct("qd")
"""Shared progress of a pool worker: the item it is running and when (CLOCK_MONOTONIC) it started."""
LOADING = -1
"""The progress item while the worker imports the chunk's function (timed by ``STARTUP_TIMEOUT_S``)."""


# --------------------------------------------------------------------------------------- worker
def _parent_watchdog(parent_pid: int) -> None:
    # The worker's parent is the forkserver, which exits with our user's process; a worker stuck in
    # a job would otherwise outlive them both.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(1)


def worker_main(fd: int, progress_fd: int = -1) -> None:
    """Entry point of a worker process: serve jobs from the connection on file descriptor ``fd``;
    ``progress_fd`` is the slot's shared memory where the worker writes which item of a chunk runs."""
    import importlib
    import sys
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    os.dup2(2, 1)  # user code's prints go to stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the parent, which kills us
    threading.Thread(target=_parent_watchdog, args=(os.getppid(),), daemon=True).start()
    _, path, preload = conn.recv()
    sys.path[:] = list(path) + [p for p in sys.path if p not in path]
    from stepcredit.reward.verifiers import math as math_verifier

    math_verifier.disable_math_verify_timeouts()
    for mod in preload:
        with contextlib.suppress(Exception):
            importlib.import_module(mod)
    progress = mmap.mmap(progress_fd, PROGRESS.size) if progress_fd >= 0 else None
    conn.send(("ready", os.getpid()))
    cache: dict[FnRef, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        _serve_chunk(conn, progress, cache, *msg[1:])


def _serve_chunk(
    conn: Any,
    progress: mmap.mmap | None,
    cache: dict[FnRef, Any],
    job_id: int,
    ref: FnRef,
    items: list[tuple[Any, ...]],
    kwargs: dict[str, Any],
    source: str,
    batched: bool,
    flush_s: float,
) -> None:
    # Before each item: note it in the shared progress (the parent times each item from there) and,
    # when the chunk has run for flush_s since the last message, send what is done so far, so that a
    # hang later in the chunk costs its neighbours nothing but that wait.
    out: list[RewardResult] = []
    sent = 0
    last = time.monotonic()
    loaded = False  # the function was imported in this chunk: item 0's deadline is the parent's news

    def started(k: int) -> None:
        nonlocal sent, last, loaded
        now = time.monotonic()
        if len(out) > sent and now - last >= flush_s:
            _send(conn, (False, job_id, sent), out[sent:])
            sent, last = len(out), now
        if progress is not None:
            PROGRESS.pack_into(progress, 0, k, now)
            if loaded:
                # The parent waits on the pipe until the deadline it last read, and the import's was
                # STARTUP_TIMEOUT_S: wake it (an empty partial message, sent after the progress says
                # item 0) so it waits for item 0's own deadline instead of sleeping through a hang.
                loaded = False
                _send(conn, (False, job_id, sent), [])

    try:
        if ref not in cache:
            # A function's first import (a user module importing verl took ~9 s) is start-up, not
            # scoring: the progress says "loading", which the parent times by STARTUP_TIMEOUT_S; the
            # first item's own clock starts when it starts.
            if progress is not None:
                PROGRESS.pack_into(progress, 0, LOADING, time.monotonic())
                loaded = True
            cache[ref] = callable_of(load_ref(ref))
        fn = cache[ref]
    except BaseException as e:
        out = failures(len(items), Status.ERROR, f"{type(e).__name__}: {e}", source)
    else:
        run_items(fn, items, kwargs, source=source, batched=batched, out=out, started=started)
    _send(conn, (True, job_id, sent), out[sent:])  # final: the job is over


def _send(conn: Any, head: tuple[Any, ...], rs: list[RewardResult]) -> None:
    """Send ``(final, job_id, first, encoded results)``: ``final`` is True on a job's last message (the
    parent then returns its results), False on a partial flush."""
    try:
        conn.send((*head, encode_all(rs)))
    except (pickle.PicklingError, TypeError, AttributeError):  # an unpicklable info dict: that item alone
        conn.send((*head, encode_all(rs, check=True)))


# --------------------------------------------------------------------------------------- parent
@dataclass
class _Job:
    """One chunk: the function, its per-sample arguments and the future its :class:`Outcome` goes to."""

    ref: FnRef
    items: list[tuple[Any, ...]]
    kwargs: dict[str, Any]
    source: str
    timeout_s: float
    future: Future[Outcome]
    batched: bool = False
    flush_s: float = 0.05


class _Slot:
    """One worker process, its pipe, and the parent thread that feeds it."""

    def __init__(self, pool: KillSafePool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.proc: Any = None
        self.conn: Any = None
        self.starting: Any = None
        """A worker started and not yet ready (a shutdown kills it too, so nobody waits out its imports)."""
        self.thread = threading.Thread(target=self._loop, name=f"reward-pool-{index}", daemon=True)
        # Shared with the worker (an anonymous memory file passed by descriptor): the item of a chunk
        # it is running and when it started, so each item gets its own deadline.
        self.progress_fd = os.memfd_create(f"reward-slot-{index}")
        os.ftruncate(self.progress_fd, PROGRESS.size)
        self.progress = mmap.mmap(self.progress_fd, PROGRESS.size)
        # ensure_worker runs on the slot's thread and, for a prestart, on another: one starts at a time
        self._start_lock = threading.Lock()
        self.next: tuple[_Job, int | None] | None = None
        """A job taken off the queue for this slot before its loop came back to it: its id when it
        was sent to the worker already (:meth:`_presend`), None when it still has to be."""

    # Worker lifecycle -------------------------------------------------------------------------
    def start_worker(self) -> None:
        parent, child = mp.Pipe(duplex=True)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepcredit.reward.run._worker",
                str(child.fileno()),
                str(self.progress_fd),
            ],
            pass_fds=(child.fileno(), self.progress_fd),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: a kill takes user code's children too
        )
        child.close()
        self.starting = proc
        if self.pool._closed:  # closed before the shutdown could see it starting: ours to kill
            _kill(proc)
        try:
            parent.send(("init", list(sys.path), self.pool.preload))
            ready = parent.poll(STARTUP_TIMEOUT_S)
            if ready:
                parent.recv()
        except (EOFError, OSError):
            ready = False
        finally:
            self.starting = None
        if not ready:
            _kill(proc)
            parent.close()
            raise RuntimeError(f"reward worker failed to start (exit code {proc.returncode})")
        self.proc, self.conn = proc, parent
        self.pool._pids.add(proc.pid)

    def ensure_worker(self) -> None:
        """A live worker in this slot: started now when there is none or it died (the slot's own thread
        and a :meth:`KillSafePool.prestart` may both ask; one starts it). Raises when none starts."""
        with self._start_lock:
            if self.proc is not None and self.proc.poll() is None:
                return
            self.kill_worker()
            if self.pool._closed:
                raise RuntimeError("reward pool is closed")
            self.start_worker()
            if self.pool._closed:  # closed while it started: the shutdown may have missed it
                self.kill_worker()

    def kill_worker(self) -> None:
        if self.proc is not None:
            _kill(self.proc)
            self.pool._pids.discard(self.proc.pid)
            # a worker killed mid-program (a tool's or a code reward's) never removed its sandbox folder
            remove_sandbox_dirs(self.proc.pid)
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        self.proc = self.conn = None

    # Job loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            sent_id: int | None = None
            if self.next is not None:
                (job, sent_id), self.next = self.next, None
            else:
                got = self.pool._queue.get()
                if got is None:
                    break
                job = got
                if not job.future.set_running_or_notify_cancel():
                    continue
            try:
                outcome = self._run_chunk(job, job.items, sent_id)
            except BaseException as e:  # never leave a caller waiting
                msg = f"reward pool failure: {type(e).__name__}: {e}"
                outcome = Outcome(_none_or(failures(len(job.items), Status.ERROR, msg, job.source)))
            job.future.set_result(outcome)
            if self.proc is None and not self.pool._closed:
                # Replace a killed/crashed worker now, while nobody is waiting on this slot.
                with contextlib.suppress(Exception):
                    self.ensure_worker()
        self.kill_worker()

    def _send(self, job: _Job, job_id: int) -> None:
        PROGRESS.pack_into(self.progress, 0, 0, time.monotonic())  # item 0's clock starts at the send
        self.conn.send(
            ("chunk", job_id, job.ref, job.items, job.kwargs, job.source, job.batched, job.flush_s)
        )

    def _presend(self) -> None:
        """The worker has answered its chunk: send it the next queued one now, before this thread
        decodes and answers the last, so the worker computes meanwhile (it idled through the
        parent's share of every chunk: issue 48). The worker still runs one chunk at a time."""
        try:
            job = self.pool._queue.get_nowait()
        except queue.Empty:
            return
        if job is None:  # a slot's stop signal: left for a loop to take
            self.pool._queue.put(None)
            return
        if not job.future.set_running_or_notify_cancel():
            return
        job_id = next(self.pool._ids)
        try:
            self._send(job, job_id)
        except Exception:  # unpicklable arguments, or a worker that just died: the loop sends it again
            self.kill_worker()
            self.next = (job, None)
            return
        self.next = (job, job_id)

    def _run_chunk(self, job: _Job, items: list[tuple[Any, ...]], sent_id: int | None = None) -> Outcome:
        """Run ``job`` on this slot's worker (``sent_id``: it was sent already, with that id)."""
        n = len(items)
        if self.pool._closed:
            return Outcome(_none_or(failures(n, Status.ERROR, "reward pool is closed", job.source)))
        results: list[RewardResult | None] = [None] * n
        # no item's clock starts before this wait did: a progress slot not yet written (time 0) must not
        # read as a chunk that started at boot (one CI run killed a healthy worker that way)
        t0 = time.monotonic()
        if sent_id is not None:
            # sent by _presend to the worker that was alive then: if it died since, the recv below
            # says so (under which item: the progress), as for a chunk sent here
            job_id = sent_id
        else:
            self.ensure_worker()
            job_id = next(self.pool._ids)
            try:
                self._send(job, job_id)
            except Exception as e:  # unpicklable arguments, or a worker that just died
                self.kill_worker()
                msg = f"could not send the job to a worker: {e}"
                return Outcome(_none_or(failures(n, Status.ERROR, msg, job.source)), died=list(range(n)))

        def limit(k: int) -> float:
            return STARTUP_TIMEOUT_S if k == LOADING else job.timeout_s

        while True:
            k, started = PROGRESS.unpack_from(self.progress, 0)
            started = max(started, t0)
            left = started + limit(k) - time.monotonic()
            if left > 0 and self.conn.poll(left):
                try:
                    final, got_id, first, enc = self.conn.recv()
                except (EOFError, OSError):
                    # The worker died under item k (the progress says which): that item is re-submitted
                    # by the caller, the items after it simply run again.
                    k, _ = PROGRESS.unpack_from(self.progress, 0)
                    code = None
                    if self.proc is not None:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            code = self.proc.wait(1.0)
                    self.kill_worker()
                    why = "pool closed" if self.pool._closed else "crashed"
                    (r,) = failures(
                        1,
                        Status.ERROR,
                        f"reward worker {why} (exit code {code}) while running {job.ref}",
                        job.source,
                    )
                    k = min(max(k, 0), n - 1)
                    died = list(range(n)) if job.batched else [k]
                    for i in died:
                        results[i] = (
                            r
                            if len(died) == 1
                            else failures(1, Status.ERROR, str(r.info["message"]), job.source)[0]
                        )
                    return Outcome(results, died=died)
                if got_id != job_id:  # pragma: no cover - cannot happen with one job per slot
                    continue
                if final and not self.pool._closed:
                    self._presend()
                results[first : first + len(enc)] = decode_all(enc, job.source)
                if final:
                    return Outcome(results)
                continue
            k, started = PROGRESS.unpack_from(self.progress, 0)
            started = max(started, t0)
            now = time.monotonic()
            if now < started + limit(k):
                continue  # the worker moved on to the next item (or from importing to item 0) meanwhile
            self.kill_worker()
            if k == LOADING:
                msg = f"importing reward function {job.ref} exceeded {STARTUP_TIMEOUT_S:g} s and was killed"
                return Outcome(list(failures(n, Status.TIMEOUT, msg, job.source)))
            msg = f"reward function {job.ref} exceeded {job.timeout_s:g} s and was killed"
            if job.batched:
                out = failures(n, Status.TIMEOUT, msg, job.source)
                for r in out:
                    r.latency_s = now - started
                return Outcome(list(out), whole=True)
            (r,) = failures(1, Status.TIMEOUT, msg, job.source)
            r.latency_s = now - started
            results[min(max(k, 0), n - 1)] = r
            return Outcome(results)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's process group (it leads its own session), then reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(Exception):
                proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5.0)


class KillSafePool:
    """``workers`` processes running reward functions with hard per-job deadlines (see the module doc)."""

    def __init__(self, workers: int = 1, *, preload: tuple[str, ...] = PRELOAD) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.preload = preload
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._closed = False
        self._pids: set[int] = set()
        self._slots = [_Slot(self, i) for i in range(workers)]
        self._prestarts: list[threading.Thread] = []
        for s in self._slots:
            s.thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, self._slots, self._queue)

    @property
    def pids(self) -> set[int]:
        """Process ids of the live workers (for tests and metrics)."""
        return set(self._pids)

    def warmup(self) -> None:
        """Start every worker now rather than at its first job (raises when one cannot start)."""
        errors: list[BaseException] = []

        def start(slot: _Slot) -> None:
            try:
                slot.ensure_worker()
            except Exception as e:  # the caller hears of it; a job would start the worker again
                errors.append(e)

        threads = [threading.Thread(target=start, args=(s,)) for s in self._slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors and not self._closed:
            raise errors[0]

    def prestart(self) -> threading.Thread:
        """:meth:`warmup` in the background, returning at once: the workers import their modules while
        the caller works (a worker that cannot start is started again, and fails loudly, at its first
        job). Returns the thread (tests join it)."""

        def run() -> None:
            with contextlib.suppress(Exception):
                self.warmup()

        t = threading.Thread(target=run, name="reward-pool-prestart", daemon=True)
        t.start()
        self._prestarts.append(t)
        return t

    def submit_chunk(
        self,
        ref: FnRef,
        items: list[tuple[Any, ...]],
        kwargs: dict[str, Any] | None = None,
        *,
        timeout_s: float,
        source: str = "",
        batched: bool = False,
        flush_s: float = 0.05,
    ) -> Future[Outcome]:
        """Run a chunk in one worker: per item (``batched``: one call over all items) with ``timeout_s``
        per item. The future always gets an :class:`Outcome`: an item that hangs is killed with its
        worker and answered ``timeout``; the items it kept from running come back as None."""
        fut: Future[Outcome] = Future()
        if self._closed:
            fut.set_result(
                Outcome(_none_or(failures(len(items), Status.ERROR, "reward pool is closed", source)))
            )
            return fut
        job = _Job(ref, list(items), dict(kwargs or {}), source, float(timeout_s), fut, batched, flush_s)
        self._queue.put(job)
        return fut

    def close(self) -> None:
        """Stop the workers (a running job is killed and answers ``error``) and their threads."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        for t in self._prestarts:  # their workers were killed above: they end at once
            t.join(10.0)

    def __enter__(self) -> KillSafePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _shutdown(slots: list[_Slot], q: queue.SimpleQueue[_Job | None]) -> None:
    for s in slots:
        s.pool._closed = True
    # Drain jobs nobody has started, then wake every slot thread.
    while True:
        try:
            job = q.get_nowait()
        except queue.Empty:
            break
        if job is not None and job.future.set_running_or_notify_cancel():
            msg = "reward pool is closed"
            job.future.set_result(Outcome(_none_or(failures(len(job.items), Status.ERROR, msg, job.source))))
    for _ in slots:
        q.put(None)
    for s in slots:
        for proc in (s.proc, s.starting):  # a starting one: its starter sees the pipe close and gives up
            if proc is not None:
                _kill(proc)  # interrupts a running job; its thread answers "error" and exits
    for s in slots:
        s.thread.join(10.0)
    for s in slots:
        with contextlib.suppress(Exception):
            s.progress.close()
            os.close(s.progress_fd)
