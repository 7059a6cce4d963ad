"""The asynchronous reward agent: scores a batch in the background and hands back whole groups as
they complete, so the trainer can update on early groups while slow rewards are still running.

Use::

    from stepcredit.reward.run.agent import build_agent
    agent = build_agent(cfg.reward, rewarder)      # backend: cfg.reward.agent.backend
    ticket = agent.submit(batch)                   # returns at once
    for idx, results in agent.stream(ticket, k):   # whole groups, >= k samples per yield (last may be fewer)
        mb = batch.select(idx); mb.rewards = results
    agent.metrics(); agent.close()

What runs where (one rule per sample, after the rewarder's own routing, :meth:`Rewarder.route`):

* a function's ``fast`` pre-check runs inline in :meth:`RewardAgent.submit` (the math verifier
  decides plain numbers there);
* scorers (reward models, judges, sandboxes) get the batch's share at once on a helper thread and
  enforce their own timeouts and concurrency;
* a function registered or configured with ``isolate=False`` runs on the agent's threads (it shares
  state with the trainer's process);
* everything else runs on ``reward.agent.backend``: ``process`` (the kill-safe pool: a deadline kills
  the worker), ``thread`` (threads, and the agent's event loop for ``async def`` functions: a sync
  function past its deadline is answered ``timeout`` and its late result is discarded, since a thread
  cannot be stopped) or ``ray`` (one actor per slot; a deadline kills the actor).

Reward function shapes (:mod:`stepcredit.reward.base`): a function or a class with ``compute_score``
(instantiated once per process, optional ``post_process_scores(scores_of_one_group)``), returning a
float, a dict with ``"score"`` (other keys kept in ``info``), a tuple ``(score, request, explanation)``
(the rest kept in ``info["rest"]``) or a :class:`RewardResult`; sync or async. A *batched* function has
VeRL's batch signature ``compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kw)``
returning one value per sample; declare it with ``reward.custom.batched=true`` or an attribute
``batched = True`` on the function (or class); it is called with ``reward.agent.batch_size`` samples of
whole groups (one group when 0).

Guarantees: every index of a submitted batch comes back exactly once, with its own result and a typed
status (a failed sample is a result, never an exception); a non-finite score is an ``error``; a group
is released only when all its members are scored, after ``post_process_scores``; groups are released in
completion order. Failed attempts (error, timeout) are retried ``retries`` times with backoff; a job
whose worker died (killed process, lost Ray actor) is re-submitted up to ``resubmits`` times.
Backpressure: at most ``max_in_flight`` requests are with the backend, the rest wait in the agent's
queue (``submit`` never blocks). A batch not fully scored ``deadline_s`` after its submission ends the
step with :class:`RewardBackendError`, which names the backend's state.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepcredit.config import RewardConfig
from stepcredit.errors import UserError
from stepcredit.reward.base import RewardFn
from stepcredit.reward.run.backends import (
    AsyncLoop,
    Job,
    ProcessBackend,
    RayBackend,
    ThreadBackend,
    Timer,
    failures,
)
from stepcredit.reward.run.rewarder import Rewarder, Route, build_rewarder, run_fast
from stepcredit.types import Batch, RewardResult, Sample, Status

DEFAULT_CONCURRENCY = {"thread": 16, "ray": 2}
"""Requests at once when ``reward.agent.max_concurrency`` is 0 (process: ``reward.workers``)."""
LATENCY_WINDOW = 10_000
"""Latencies kept per source for the percentiles of :meth:`RewardAgent.metrics`."""


class RewardBackendError(UserError):
    """A submitted batch was not fully scored within ``reward.agent.deadline_s``: the backend is stuck or dead."""


@dataclass(eq=False)
class Ticket:
    """A submitted batch: what :meth:`RewardAgent.get` and :meth:`RewardAgent.stream` pull from."""

    id: int
    samples: Sequence[Sample]
    texts: Sequence[str]
    keys: list[Hashable]
    """Group key per index (``group_B``, else the sample's ``uid``)."""
    batch: Batch | None = None
    results: list[RewardResult | None] = field(default_factory=list)
    """Per index, filled as scored (final, post-processed values once its group is released)."""
    routes: list[Route | None] = field(default_factory=list)
    groups: dict[Hashable, list[int]] = field(default_factory=dict)
    remaining: dict[Hashable, int] = field(default_factory=dict)
    ready: deque[list[int]] = field(default_factory=deque)
    """Released groups not yet pulled, in completion order."""
    released: int = 0
    taken: int = 0
    submitted_at: float = 0.0
    error: Exception | None = None

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def done(self) -> bool:
        """Every group released (not necessarily pulled)."""
        return self.released == self.n


@dataclass(eq=False)
class _Req:
    """One request (a sample, or a chunk of whole groups for a batched function) across its attempts."""

    ticket: Ticket
    idx: list[int]
    entry: RewardFn
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    batched: bool
    local: bool
    attempt: int = 0
    resubmits: int = 0


class RewardAgent:
    """Scores submitted batches in the background (module doc); build with :func:`build_agent`."""

    def __init__(self, cfg: RewardConfig | None = None, rewarder: Rewarder | None = None) -> None:
        self.cfg = cfg or (rewarder.cfg if rewarder is not None else RewardConfig())
        a = self.cfg.agent
        self.backend_name = a.backend
        self.rewarder = rewarder if rewarder is not None else build_rewarder(self.cfg)
        self._own_rewarder = rewarder is None
        self.timeout_s = a.timeout_s or self.cfg.timeout_s
        self.concurrency = a.max_concurrency or DEFAULT_CONCURRENCY.get(a.backend, self.cfg.workers)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[_Req] = deque()
        self._jobs: dict[int, _Req] = {}
        self._keys = itertools.count()
        self._tickets = itertools.count()
        self._open: set[Ticket] = set()
        self._backoff = 0
        self._closed = False
        self._timer = Timer()
        self._loop: AsyncLoop | None = None
        self._local: ThreadBackend | None = None
        self._remote: ProcessBackend | RayBackend | ThreadBackend | None = None
        self._scorers = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reward-agent-scorer")
        self._rng = random.Random(0)
        self._count: dict[str, int] = dict.fromkeys(
            ("submitted", "completed", "retries", "timeouts", "errors", "resubmits", "worker_deaths"), 0
        )
        self._lat: dict[str, deque[float]] = {}

    # ------------------------------------------------------------------------------ backends
    def _event_loop(self) -> AsyncLoop:
        with self._lock:
            if self._loop is None:
                self._loop = AsyncLoop()
            return self._loop

    def _threads(self) -> ThreadBackend:
        with self._lock:
            if self._local is None:
                n = self.concurrency if self.backend_name == "thread" else DEFAULT_CONCURRENCY["thread"]
                self._local = ThreadBackend(n, self._on_done, self._timer, self._event_loop)
            return self._local

    @property
    def backend(self) -> ProcessBackend | RayBackend | ThreadBackend:
        """The configured backend, started on first use (a fast-path-only run never starts one)."""
        if self.backend_name == "thread":
            return self._threads()
        with self._lock:
            if self._closed:
                raise RuntimeError("reward agent is closed")
            if self._remote is None:
                a = self.cfg.agent
                if self.backend_name == "process":
                    only_custom = self.rewarder.custom is not None and not self.rewarder.domains
                    self._remote = ProcessBackend(self.concurrency, self._on_done, only_custom=only_custom)
                else:
                    self._remote = RayBackend(
                        self.concurrency,
                        self._on_done,
                        address=a.ray_address,
                        local_cpus=a.ray_local_cpus,
                        num_cpus=a.ray_num_cpus,
                        startup_timeout_s=a.ray_startup_timeout_s,
                    )
            return self._remote

    def warmup(self) -> None:
        """Start the backend now (pool workers, Ray and its actors start on first use otherwise)."""
        b = self.backend
        if isinstance(b, ProcessBackend):
            b.pool.warmup()

    # ------------------------------------------------------------------------------- submit
    def submit(self, batch: Batch) -> Ticket:
        """Start scoring ``batch.samples[i]`` against ``batch.texts[i]``; returns at once."""
        ticket = self.submit_samples(batch.samples, batch.texts, batch.group_B)
        ticket.batch = batch
        return ticket

    def submit_samples(self, samples: Sequence[Sample], texts: Sequence[str], group_B: Any = None) -> Ticket:
        """:meth:`submit` without a :class:`Batch`: groups from ``group_B`` (ids per response), else by ``uid``."""
        if len(samples) != len(texts):
            raise ValueError(f"{len(samples)} samples but {len(texts)} responses")
        if self._closed:
            raise RuntimeError("reward agent is closed")
        n = len(samples)
        if group_B is not None:
            gl = group_B.tolist() if hasattr(group_B, "tolist") else list(group_B)
            if len(gl) != n:
                raise ValueError(f"group_B has {len(gl)} entries for {n} samples")
            keys: list[Hashable] = [int(g) for g in gl]
        else:
            keys = [s.uid or f"#{i}" for i, s in enumerate(samples)]
        t = Ticket(next(self._tickets), samples, texts, keys, submitted_at=time.monotonic())
        t.results = [None] * n
        t.routes = [None] * n
        for i, k in enumerate(keys):
            t.groups.setdefault(k, []).append(i)
        t.remaining = {k: len(v) for k, v in t.groups.items()}

        done: list[tuple[int, RewardResult]] = []
        reqs: list[_Req] = []
        scorer_idx: dict[int, list[int]] = {}
        batched_idx: dict[int, list[int]] = {}
        entries: dict[int, RewardFn] = {}
        for i, (s, resp) in enumerate(zip(samples, texts, strict=True)):
            try:
                r = t.routes[i] = self.rewarder.route(s)
            except UserError as e:
                done.append((i, _fail(Status.ERROR, str(e), source=s.data_source)))
                continue
            entry = r.entry
            entries[id(entry)] = entry
            if entry.factory is not None:
                scorer_idx.setdefault(id(entry), []).append(i)
                continue
            if not isinstance(resp, str):
                done.append((i, _fail(Status.ERROR, f"response is {type(resp).__name__}, expected str")))
                continue
            args = (s.data_source, resp, s.ground_truth, s.extra_info)
            if entry.fast is not None:
                res = run_fast(entry, args, r.kwargs)
                if res is not None:
                    done.append((i, res))
                    continue
            if self._is_batched(entry):
                batched_idx.setdefault(id(entry), []).append(i)
                continue
            local = not entry.isolate or entry.ref is None
            reqs.append(_Req(t, [i], entry, args, dict(r.kwargs), False, local))
        for eid, idx in batched_idx.items():
            reqs.extend(self._batched_reqs(t, entries[eid], idx))
        with self._lock:
            self._open.add(t)
            self._count["submitted"] += n
            self._queue.extend(reqs)
        for eid, idx in scorer_idx.items():
            self._run_scorer(t, entries[eid], idx)
        for i, res in done:
            self._record(t, [i], [res])
        self._dispatch()
        return t

    def _is_batched(self, entry: RewardFn) -> bool:
        if entry is self.rewarder.custom and self.cfg.custom.batched:
            return True
        fn = entry.fn
        return bool(getattr(fn, "batched", False) or getattr(getattr(fn, "__self__", None), "batched", False))

    def _batched_reqs(self, t: Ticket, entry: RewardFn, idx: list[int]) -> list[_Req]:
        # Chunks of whole groups, so that a call completes groups rather than fragments of many.
        by_group: dict[Hashable, list[int]] = {}
        for i in idx:
            by_group.setdefault(t.keys[i], []).append(i)
        size = self.cfg.agent.batch_size
        chunks: list[list[int]] = []
        cur: list[int] = []
        for members in by_group.values():
            if cur and (size == 0 or len(cur) + len(members) > size):
                chunks.append(cur)
                cur = []
            cur.extend(members)
        if cur:
            chunks.append(cur)
        out = []
        for chunk in chunks:
            route = t.routes[chunk[0]]
            assert route is not None
            ss = [t.samples[i] for i in chunk]
            args = (
                [s.data_source for s in ss],
                [t.texts[i] for i in chunk],
                [s.ground_truth for s in ss],
                [s.extra_info for s in ss],
            )
            local = not entry.isolate or entry.ref is None
            out.append(_Req(t, chunk, entry, args, dict(route.kwargs), True, local))
        return out

    def _run_scorer(self, t: Ticket, entry: RewardFn, idx: list[int]) -> None:
        def run() -> None:
            try:
                got = self.rewarder._run_scorer(entry, [t.samples[i] for i in idx], [t.texts[i] for i in idx])
            except Exception as e:
                got = [_fail(Status.ERROR, f"{type(e).__name__}: {e}", source=entry.name) for _ in idx]
            for r in got:
                self._note(r)
            self._record(t, idx, got)

        self._scorers.submit(run)

    # ----------------------------------------------------------------------------- dispatch
    def _dispatch(self) -> None:
        """Hand queued requests to their backend while fewer than ``max_in_flight`` are there."""
        limit = self.cfg.agent.max_in_flight
        while True:
            with self._lock:
                if self._closed or not self._queue or len(self._jobs) >= limit:
                    return
                req = self._queue.popleft()
                if req.ticket.error is not None:
                    continue
                key = next(self._keys)
                self._jobs[key] = req
            job = Job(
                key,
                req.entry,
                req.args,
                req.kwargs,
                req.batched,
                len(req.idx),
                self.timeout_s,
                req.entry.name,
            )
            try:
                backend = self._threads() if req.local else self.backend
                backend.submit(job)
            except Exception as e:  # a backend that cannot start (Ray missing, agent closing)
                self._on_done(
                    job, failures(job, Status.ERROR, f"reward backend failed: {type(e).__name__}: {e}"), False
                )

    def _on_done(self, job: Job, results: list[RewardResult], died: bool) -> None:
        """A backend's answer to one attempt: retry, re-submit, or record the final results."""
        a = self.cfg.agent
        final = False
        with self._lock:
            req = self._jobs.pop(job.key, None)
            if req is None or req.ticket.error is not None or self._closed:
                pass
            elif died and req.resubmits < a.resubmits:
                req.resubmits += 1
                self._count["resubmits"] += 1
                self._count["worker_deaths"] += 1
                self._queue.appendleft(req)  # it was in flight: it goes first
            else:
                self._count["worker_deaths"] += int(died)
                for r in results:
                    self._note_locked(r)
                failed = all(r.status in (Status.ERROR, Status.TIMEOUT) for r in results)
                if failed and not died and req.attempt < a.retries:
                    req.attempt += 1
                    self._count["retries"] += 1
                    self._backoff += 1
                    delay = self._rng.uniform(0.0, a.retry_backoff_s * 2 ** (req.attempt - 1))
                    self._timer.schedule(time.monotonic() + delay, functools.partial(self._requeue, req))
                else:
                    final = True
        if final:
            assert req is not None
            if req.attempt or req.resubmits:
                for r in results:
                    r.info.setdefault("attempts", req.attempt + 1)
                    if req.resubmits:
                        r.info.setdefault("resubmits", req.resubmits)
            self._record(req.ticket, req.idx, results)
        self._dispatch()

    def _requeue(self, req: _Req) -> None:
        with self._lock:
            self._backoff -= 1
            if req.ticket.error is None:
                self._queue.appendleft(req)
        self._dispatch()

    # ------------------------------------------------------------------------------ results
    def _note(self, r: RewardResult) -> None:
        with self._lock:
            self._note_locked(r)

    def _note_locked(self, r: RewardResult) -> None:
        self._count["timeouts"] += r.status == Status.TIMEOUT
        self._count["errors"] += r.status in (Status.ERROR, Status.SANDBOX_ERROR)
        lat = self._lat.setdefault(r.source or "?", deque(maxlen=LATENCY_WINDOW))
        lat.append(r.latency_s)

    def _record(self, t: Ticket, idx: list[int], results: list[RewardResult]) -> None:
        """Store final results; a group whose last member arrived is post-processed and released."""
        if len(results) != len(idx):  # pragma: no cover - backends answer one result per sample
            results = [_fail(Status.ERROR, "wrong number of results (internal error)") for _ in idx]
        complete: list[Hashable] = []
        with self._lock:
            if t.error is not None:
                return
            for i, r in zip(idx, results, strict=True):
                if t.results[i] is not None:  # pragma: no cover - one final answer per index
                    continue
                t.results[i] = r
                self._count["completed"] += 1
                k = t.keys[i]
                t.remaining[k] -= 1
                if t.remaining[k] == 0:
                    complete.append(k)
        for k in complete:
            members = t.groups[k]
            res = [t.results[i] for i in members]
            try:
                # The rewarder's own finishing step (domain weights, source, post_process_scores per
                # group), so results equal Rewarder.score_batch's.
                out = self.rewarder._finish(
                    res, [t.routes[i] for i in members], [t.samples[i] for i in members], [0] * len(members)
                )
            except Exception as e:  # pragma: no cover - _finish catches the user's errors itself
                out = [
                    _fail(Status.ERROR, f"finishing the group failed: {type(e).__name__}: {e}")
                    for _ in members
                ]
            with self._cond:
                for i, r in zip(members, out, strict=True):
                    t.results[i] = r
                t.ready.append(list(members))
                t.released += len(members)
                if t.done:
                    self._open.discard(t)
                self._cond.notify_all()

    # -------------------------------------------------------------------------------- pull
    def get(self, ticket: Ticket, k: int = 0) -> tuple[list[int], list[RewardResult]]:
        """Block until ``k`` samples' worth of whole groups are released (or all that remain) and return
        their batch indices and results, groups in completion order; ``k <= 0``: the whole batch, in
        index order. Returns empty lists once every index has been pulled. Raises
        :class:`RewardBackendError` when the batch is not complete ``reward.agent.deadline_s`` after submit."""
        deadline = ticket.submitted_at + self.cfg.agent.deadline_s
        with self._cond:
            while True:
                if ticket.error is not None:
                    raise ticket.error
                if ticket.taken == ticket.n:
                    return [], []
                avail = ticket.released - ticket.taken
                if avail and (ticket.done or (k > 0 and avail >= k)):
                    idx: list[int] = []
                    while ticket.ready and (k <= 0 or len(idx) < k):
                        idx.extend(ticket.ready.popleft())
                    if k <= 0:
                        idx.sort()
                    ticket.taken += len(idx)
                    return idx, [ticket.results[i] for i in idx]  # type: ignore[misc]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._expire_locked(ticket)
                self._cond.wait(left)

    def stream(self, ticket: Ticket, k: int = 0) -> Iterator[tuple[list[int], list[RewardResult]]]:
        """Yield :meth:`get` pulls until every index has come back exactly once."""
        while True:
            idx, res = self.get(ticket, k)
            if not idx:
                return
            yield idx, res

    def score_batch(
        self, samples: Sequence[Sample], responses: Sequence[str], group_B: Any = None
    ) -> list[RewardResult]:
        """:meth:`Rewarder.score_batch` through the agent (batched functions included): results in order."""
        t = self.submit_samples(samples, responses, group_B)
        return self.get(t, 0)[1] if len(samples) else []

    def _expire_locked(self, t: Ticket) -> RewardBackendError:
        a = self.cfg.agent
        missing = t.n - t.released
        unscored = sum(r is None for r in t.results)
        queued = sum(1 for r in self._queue if r.ticket is t)
        flying = sum(1 for r in self._jobs.values() if r.ticket is t)
        try:
            state = (
                self._local.describe()
                if self.backend_name == "thread" and self._local
                else (self._remote.describe() if self._remote is not None else "not started")
            )
        except Exception as e:  # pragma: no cover
            state = f"state unknown ({e})"
        err = RewardBackendError(
            f"reward agent: batch of {t.n} still has {missing} samples unreleased ({unscored} unscored: "
            f"{flying} in flight, {queued} queued) after reward.agent.deadline_s={a.deadline_s:g}; "
            f"backend {self.backend_name} is stuck or dead ({state}); check the reward function or "
            "service, or raise reward.agent.deadline_s"
        )
        t.error = err
        self._open.discard(t)
        self._queue = deque(r for r in self._queue if r.ticket is not t)
        for key in [key for key, r in self._jobs.items() if r.ticket is t]:
            del self._jobs[key]  # late answers are dropped; the slots free up as the backend answers
        self._cond.notify_all()
        return err

    # ----------------------------------------------------------------------------- metrics
    def metrics(self) -> dict[str, float]:
        """Queue depth, requests in flight, counters, and latency p50/p95/p99 per source (seconds)."""
        with self._lock:
            m = {
                "agent/queue_depth": float(len(self._queue) + self._backoff),
                "agent/in_flight": float(len(self._jobs)),
                "agent/open_batches": float(len(self._open)),
            }
            m.update({f"agent/{k}": float(v) for k, v in self._count.items()})
            lats = {s: np.asarray(v) for s, v in self._lat.items() if v}
        for src, arr in sorted(lats.items()):
            p50, p95, p99 = np.percentile(arr, [50, 95, 99])
            m[f"agent/latency_p50_s/{src}"] = float(p50)
            m[f"agent/latency_p95_s/{src}"] = float(p95)
            m[f"agent/latency_p99_s/{src}"] = float(p99)
        for b in (self._local, self._remote):
            if b is not None:
                m.update(b.stats())
        return m

    # ------------------------------------------------------------------------------- close
    def close(self) -> None:
        """Stop the backend (worker processes and actors killed), the threads and the event loop.
        Batches still open raise on their next pull; the rewarder is closed if the agent built it."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for t in self._open:
                t.error = RuntimeError("reward agent closed before the batch was scored")
            self._open.clear()
            self._queue.clear()
            self._jobs.clear()
            self._cond.notify_all()
            remote, local, loop = self._remote, self._local, self._loop
        for b in (remote, local):
            if b is not None:
                b.close()
        if loop is not None:
            loop.close()
        self._timer.close()
        self._scorers.shutdown(wait=False, cancel_futures=True)
        if self._own_rewarder:
            self.rewarder.close()

    def __enter__(self) -> RewardAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _fail(status: Status, message: str, source: str = "") -> RewardResult:
    r = RewardResult.failure(status, message)
    r.source = source
    return r


def build_agent(cfg: RewardConfig | None = None, rewarder: Rewarder | None = None) -> RewardAgent:
    """A :class:`RewardAgent` for ``cfg`` (``cfg.agent`` picks the backend), sharing ``rewarder``'s routing
    and loaded functions (one is built when not given; the agent then closes it)."""
    return RewardAgent(cfg, rewarder)
