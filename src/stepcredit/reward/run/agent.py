"""The reward agent: the one execution path of rewards. A scheduler over the routing of
:class:`~stepcredit.reward.run.routing.Router` that scores a batch in the background and hands back
whole groups as they complete, so the trainer can update on early groups while slow rewards are still
running; :meth:`RewardAgent.score_batch` (and :meth:`Rewarder.score_batch
<stepcredit.reward.run.rewarder.Rewarder.score_batch>`, which calls it on the run's one agent) is its
synchronous face.

Use::

    from stepcredit.reward import build_agent, build_rewarder
    rewarder = build_rewarder(cfg.reward)
    with build_agent(cfg.reward, rewarder) as agent:    # the rewarder's own agent: one pool per run
        ticket = agent.submit(batch)                   # returns at once
        for idx, results in agent.stream(ticket, k):   # whole groups, >= k samples per yield (last may be fewer)
            mb = batch.select(idx).with_rewards(results)
        agent.metrics()

Division of labour: the router decides *what* each sample needs (:meth:`Router.plan`: routing,
the inline fast path, scorers) and finishes each group (:meth:`Router.finish`: domain weights,
``post_process_scores``); the agent decides *where and when* the rest runs:

* scorers (reward models, judges, sandboxes) get the batch's share on a helper thread of the driver
  and enforce their own timeouts and concurrency; with a backend that hosts scorers, those listed in
  ``reward.agent.ray_scorers`` run instead as their own actors, placed by resources (e.g. ``sandbox``);
* a function registered or configured with ``isolate=False`` runs on the in-process backend (threads);
* everything else runs on ``reward.agent.backend`` (a registry entry, see
  :mod:`stepcredit.reward.run.backends`: ``process``, ``thread``, ``ray``), in *chunks*: samples of
  one route sent to a worker in one message, whole groups where they fit, sized so that a chunk runs
  about ``reward.agent.chunk_s`` at the measured per-sample time (a slow reward still streams group by
  group, a trivial one goes in chunks of up to ``max_chunk``).

Reward function shapes (:mod:`stepcredit.reward.base`): a function or a class with ``compute_score``
(instantiated once per process, optional ``post_process_scores(scores_of_one_group)``), returning a
float, a dict with ``"score"``, a tuple ``(score, ...)`` or a :class:`RewardResult`; sync or async. A
*batched* function has VeRL's batch signature ``compute_score(data_sources, solution_strs,
ground_truths, extra_infos, **kw)`` returning one value per sample; declare it with
``reward.custom.batched=true`` or an attribute ``batched = True``; it is called with
``reward.agent.batch_size`` samples of whole groups (one group when 0).

Guarantees (chunking changes none of them): every index of a submitted batch comes back exactly once,
with its own result and a typed status (a failed sample is a result, never an exception); a
non-finite score is an ``error``. Each sample has its own deadline: one that hangs is answered
``timeout`` (its worker killed where the backend can), the samples before it in its chunk keep their
results and those after it run again. A batched call that times out is split into its groups and
retried. Failed samples (error, timeout) are retried ``retries`` times with backoff; a sample whose
worker died (killed process, lost Ray actor) is re-submitted up to ``resubmits`` times. Backpressure: at
most ``max_in_flight`` samples are with the backend, the rest wait in the agent's queue (``submit``
never blocks). A group is released only when all its members are scored, after ``post_process_scores``;
groups are released in completion order. A batch not fully scored ``deadline_s`` after its
submission ends the step with :class:`RewardBackendError`, which names the backend's state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import itertools
import math
import random
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from stepcredit.config import RewardConfig
from stepcredit.errors import UserError
from stepcredit.reward.base import REWARDS, TrainingProgress, scoring_progress
from stepcredit.reward.run.backends import (
    BACKENDS,
    AsyncLoop,
    Backend,
    BackendArgs,
    Job,
    Timer,
    check_config,
)
from stepcredit.reward.run.chunks import Outcome, failures
from stepcredit.reward.run.routing import Router, build_router, call_args_of
from stepcredit.reward.run.tickets import LATENCY_WINDOW, Counters, Flight, Ticket, Unit, settle
from stepcredit.types import Batch, RewardResult, Sample, Status

_OK = Status.OK
_FAILED = (Status.ERROR, Status.TIMEOUT)

__all__ = ["EMA", "LATENCY_WINDOW", "PROBE_CHUNK", "RewardAgent", "RewardBackendError", "Ticket"]

PROBE_CHUNK = 4
"""Chunk size for a function whose per-sample time has not been measured yet."""
EMA = 0.3
"""Weight of the newest chunk in the running per-sample time of a function."""


def _all_ok(results: list[RewardResult | None], late_s: float) -> bool:
    """Every item ran to an ``ok`` result within ``late_s``."""
    return all(r is not None and r.status is _OK and r.latency_s <= late_s for r in results)


class RewardBackendError(UserError):
    """A submitted batch was not fully scored within ``reward.agent.deadline_s``: the backend is stuck or dead."""


class RewardAgent:
    """Scores submitted batches in the background (module doc); build with :func:`build_agent`."""

    def __init__(self, cfg: RewardConfig | None = None, rewarder: Router | None = None) -> None:
        self.cfg = cfg or (rewarder.cfg if rewarder is not None else RewardConfig())
        a = self.cfg.agent
        self.spec = check_config(self.cfg)
        # scorers that run as their own actors, by registry name (the config may use an alias)
        self._remote_scorers = (
            {REWARDS.get(name).name for name in a.ray_scorers} if self.spec.hosts_scorers else set()
        )
        self.rewarder = rewarder if rewarder is not None else build_router(self.cfg)
        self._own_rewarder = rewarder is None
        self.timeout_s = a.timeout_s or self.cfg.timeout_s
        self.concurrency = a.max_concurrency or self.spec.default_concurrency or self.cfg.workers
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[Unit] = deque()
        self._queued = 0
        self._in_flight = 0
        self._jobs: dict[int, Flight] = {}
        self._keys = itertools.count()
        self._tickets = itertools.count()
        self._open: set[Ticket] = set()
        self._backoff = 0
        self._closed = False
        self._timer = Timer()
        self._loop: AsyncLoop | None = None
        self._backend: Backend | None = None
        self._local: Backend | None = None
        self._scorers = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reward-agent-scorer")
        self._rng = random.Random(0)
        self._per_sample_s: dict[str, float] = {}
        self._stats = Counters()

    # ------------------------------------------------------------------------------ backends
    def _event_loop(self) -> AsyncLoop:
        with self._lock:
            if self._loop is None:
                self._loop = AsyncLoop()
            return self._loop

    def _make(self, spec: Any, concurrency: int) -> Backend:
        only_custom = self.rewarder.custom is not None and not self.rewarder.domains
        args = BackendArgs(self.cfg, concurrency, self._on_done, self._timer, self._event_loop, only_custom)
        return spec.make(args)  # type: ignore[no-any-return]

    @property
    def backend(self) -> Backend:
        """The configured backend, started on first use (a fast-path-only run never starts one)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("reward agent is closed")
            if self._backend is None:
                self._backend = self._make(self.spec, self.concurrency)
            return self._backend

    def _in_process(self) -> Backend:
        """Where ``isolate=False`` functions run: the backend itself when it runs in this process."""
        if self.spec.in_process:
            return self.backend
        with self._lock:
            if self._local is None:
                spec = next(BACKENDS.get(n) for n in BACKENDS if BACKENDS.get(n).in_process)
                self._local = self._make(spec, spec.default_concurrency or self.concurrency)
            return self._local

    @property
    def closed(self) -> bool:
        """Has :meth:`close` been called?"""
        return self._closed

    def warmup(self) -> None:
        """Start the backend now (pool workers, Ray and its actors start on first use otherwise)."""
        self.backend.warmup()

    def prestart(self) -> None:
        """Start the backend's workers in the background and return at once (``reward.agent.prestart``):
        the process pool's workers import math-verify while the run loads and generates, so the first
        sample the fast path cannot decide does not wait seconds for them mid-run."""
        start = getattr(self.backend, "prestart", None)  # a backend written before prestart has none
        if start is not None:
            start()

    # ------------------------------------------------------------------------------- submit
    def submit(self, batch: Batch, progress: TrainingProgress | None = None) -> Ticket:
        """Start scoring ``batch.samples[i]`` against ``batch.texts[i]``; returns at once. ``progress``:
        where training stood for the batch (what a TRL function gets as ``trainer_state``)."""
        ticket = self.submit_samples(batch.samples, batch.texts, batch.group_B, progress)
        ticket.batch = batch
        return ticket

    def submit_samples(
        self,
        samples: Sequence[Sample],
        texts: Sequence[str],
        group_B: Any = None,
        progress: TrainingProgress | None = None,
    ) -> Ticket:
        """:meth:`submit` without a :class:`Batch`: groups from ``group_B`` (ids per response), else by ``uid``."""
        if len(samples) != len(texts):
            raise ValueError(f"{len(samples)} samples but {len(texts)} responses")
        if self._closed:
            raise RuntimeError("reward agent is closed")
        n = len(samples)
        t = Ticket.open(next(self._tickets), samples, texts, group_B)
        t.progress = progress
        plan = self.rewarder.plan(samples, texts)
        t.routes = plan.routes
        units: list[Unit] = []
        local_scorers = []
        for entry, idx in plan.scorers:
            if entry.name in self._remote_scorers:
                route = t.routes[idx[0]]
                assert route is not None
                size = self.cfg.agent.batch_size or self.cfg.agent.max_chunk
                units += [Unit(t, route, c, fixed=True, scorer=True) for c in t.group_chunks(idx, size)]
            else:
                local_scorers.append((entry, idx))
        for route, idx in plan.calls:
            local = not route.entry.isolate or route.entry.ref is None
            if self.rewarder.is_batched(route.entry):
                chunks = t.group_chunks(idx, self.cfg.agent.batch_size)
                units += [Unit(t, route, c, fixed=True, local=local) for c in chunks]
            else:
                # cut to chunks at dispatch (_take_locked takes the next indices of one ticket and
                # route across units): queued as runs of whole groups, not one unit per group
                chunks = t.group_chunks(idx, self.cfg.agent.max_chunk)
                units += [Unit(t, route, c, local=local) for c in chunks]
        with self._lock:
            self._open.add(t)
            self._stats.count["submitted"] += n
            self._queue.extend(units)
            self._queued += sum(len(u.idx) for u in units)
        for entry, idx in local_scorers:
            self._scorers.submit(self._run_scorer, t, entry, idx)
        if plan.done:
            self._record(t, [i for i, _ in plan.done], [r for _, r in plan.done])
        self._dispatch()
        return t

    def _run_scorer(self, t: Ticket, entry: Any, idx: list[int]) -> None:
        try:
            with scoring_progress(t.progress):  # read by scorers that hand it on (TRL's trainer_state)
                got = self.rewarder.run_scorer(entry, [t.samples[i] for i in idx], [t.texts[i] for i in idx])
        except Exception as e:
            got = failures(len(idx), Status.ERROR, f"{type(e).__name__}: {e}", entry.name)
        with self._lock:
            self._stats.note_all(got)
        self._record(t, idx, got)

    # ----------------------------------------------------------------------------- dispatch
    def _chunk_size(self, unit: Unit) -> int:
        a = self.cfg.agent
        if unit.solo or a.chunk_s <= 0 or not unit.route.entry.reruns:
            return 1  # a call that must not run twice runs alone: nothing of it is ever re-run
        per = self._per_sample_s.get(unit.route.entry.name)
        size = PROBE_CHUNK if per is None else int(a.chunk_s / max(per, 1e-7))
        # Enough chunks for every worker: a share of the queue and of the in-flight window each.
        share = math.ceil(self._queued / self.concurrency)
        # At least two chunks in the window, so a worker finds the next one queued when it finishes.
        window = max(1, a.max_in_flight // max(2, self.concurrency))
        if per is not None and a.max_in_flight * per < a.chunk_s:
            # the whole window is less work than one chunk: more workers would not finish it sooner,
            # fewer and larger chunks cost less dispatch (two in flight, so one is always queued)
            window = max(window, a.max_in_flight // 2)
        return max(1, min(size, a.max_chunk, share, window))

    def _take_locked(self) -> tuple[Unit, list[int]] | None:
        """The next chunk off the queue (merging queued units of the same ticket and route), or None."""
        room = self.cfg.agent.max_in_flight - self._in_flight
        while self._queue and room > 0:
            unit = self._queue[0]
            if unit.ticket.error is not None:
                self._queue.popleft()
                self._queued -= len(unit.idx)
                continue
            if unit.fixed:
                if len(unit.idx) > room and self._in_flight:
                    return None  # a whole call that does not fit: wait until it does
                self._queue.popleft()
                return unit, unit.idx
            size = self._chunk_size(unit)
            if size > room:
                if self._in_flight:
                    return None  # wait for room for a whole chunk rather than send slivers
                size = room
            idx: list[int] = []
            while self._queue and len(idx) < size:
                head = self._queue[0]
                if (
                    head.ticket is not unit.ticket
                    or head.route is not unit.route
                    or head.fixed
                    or head.solo != unit.solo
                ):
                    break
                take = size - len(idx)
                if len(head.idx) <= take:
                    idx.extend(head.idx)
                    self._queue.popleft()
                else:
                    idx.extend(head.idx[:take])
                    head.idx = head.idx[take:]
            return unit, idx
        return None

    def _dispatch(self) -> None:
        """Hand chunks to their backend while fewer than ``max_in_flight`` samples are there."""
        while True:
            with self._lock:
                if self._closed:
                    return
                got = self._take_locked()
                if got is None:
                    return
                unit, idx = got
                self._queued -= len(idx)
                self._in_flight += len(idx)
                key = next(self._keys)
                self._jobs[key] = Flight(unit, idx, time.monotonic())
                self._stats.sent(len(idx))
            t, entry = unit.ticket, unit.route.entry
            if unit.scorer:
                items = [(t.samples[i], t.texts[i]) for i in idx]
                timeout = self.cfg.agent.deadline_s  # scorers enforce their own per-sample timeouts
            else:
                items = call_args_of(t.samples, t.texts, idx)
                timeout = self.timeout_s
            kwargs = dict(unit.route.kwargs)
            job = Job(
                key,
                entry,
                items,
                kwargs,
                unit.fixed,
                timeout,
                entry.name,
                scorer=unit.scorer,
                progress=t.progress,
            )
            try:
                backend = self._in_process() if unit.local else self.backend
                backend.submit(job)
            except Exception as e:  # a backend that cannot start (Ray missing, agent closing)
                msg = f"reward backend failed: {type(e).__name__}: {e}"
                self._on_done(job, Outcome(list(failures(len(idx), Status.ERROR, msg, entry.name))))

    def _on_done(self, job: Job, outcome: Outcome) -> None:
        """A backend's answer to one chunk: final results, retries, re-submissions and re-runs."""
        a = self.cfg.agent
        idx: list[int] = []
        final: list[RewardResult] = []
        with self._lock:
            flight = self._jobs.pop(job.key, None)
            if flight is None:
                return  # a late answer (its ticket expired, or the agent closed)
            self._in_flight -= len(flight.idx)
            t = flight.unit.ticket
            if t.error is None and not self._closed:
                idx, final = self._settle_locked(flight, outcome, a.retries, a.resubmits)
        if idx:
            self._record(t, idx, final)
        self._dispatch()

    def _settle_locked(
        self, flight: Flight, outcome: Outcome, retries: int, resubmits: int
    ) -> tuple[list[int], list[RewardResult]]:
        """The chunk's final results (indices, results); the rest is queued again or retried later."""
        unit, t = flight.unit, flight.unit.ticket
        ran = [r for r in outcome.results if r is not None]
        if ran and not unit.scorer:
            per = sum(r.latency_s for r in ran) / len(ran)
            old = self._per_sample_s.get(unit.route.entry.name)
            self._per_sample_s[unit.route.entry.name] = per if old is None else (1 - EMA) * old + EMA * per
        if outcome.whole and unit.fixed and not unit.scorer:
            groups = t.group_chunks(flight.idx, 0)
            if len(groups) > 1:  # a batched call timed out: retry its groups one call each
                for g in reversed(groups):
                    self._queue.appendleft(Unit(t, unit.route, g, fixed=True, local=unit.local))
                self._queued += len(flight.idx)
                return [], []
        if outcome.whole and not unit.fixed and len(flight.idx) > 1:
            self._requeue_locked(Unit(t, unit.route, list(flight.idx), local=unit.local, solo=True))
            return [], []
        died = set(outcome.died)
        results = outcome.results
        late_s = math.inf if unit.scorer else self.timeout_s  # scorers enforce their own timeouts
        if not died and not t.reran and _all_ok(results, late_s):
            # the common answer: every item ran to an ok result in time, none was ever re-run in this
            # batch (so none has attempts to note): all final as they are
            self._stats.note_all(results)  # type: ignore[arg-type]
            return flight.idx, results  # type: ignore[return-value]
        if died:
            self._stats.count["worker_deaths"] += 1
        if not unit.route.entry.reruns:
            # at most once (a tool with side effects): a death or a failure is the call's result
            retries, resubmits = 0, 0
        idx: list[int] = []
        final: list[RewardResult] = []
        again: list[int] = []
        retry: list[int] = []
        noted: list[RewardResult] = []
        attempts, resubs = t.attempts, t.resubmits
        for pos, i in enumerate(flight.idx):
            r = results[pos]
            if r is not None and r.latency_s > late_s and r.status == _OK:
                r = self._late(r, unit)
            if died and pos in died and resubs[i] < resubmits:
                resubs[i] += 1
                t.reran = True
                self._stats.count["resubmits"] += 1
                again.append(i)
            elif r is None:
                again.append(i)  # it never ran to the end (a neighbour hung): it simply runs again
            elif r.status in _FAILED and pos not in died and attempts[i] < retries:
                noted.append(r)
                attempts[i] += 1
                t.reran = True
                retry.append(i)
            else:
                noted.append(r)
                if attempts[i] or resubs[i]:
                    r.info.setdefault("attempts", attempts[i] + 1)
                    if resubs[i]:
                        r.info.setdefault("resubmits", resubs[i])
                idx.append(i)
                final.append(r)
        self._stats.note_all(noted)
        if again:  # in flight already: it goes first; a worker death or a hang makes it run alone
            self._requeue_locked(
                Unit(t, unit.route, again, unit.fixed, unit.scorer, unit.local, solo=unit.solo or bool(died))
            )
        if retry:
            self._stats.count["retries"] += len(retry)
            attempt = max(attempts[i] for i in retry)
            delay = self._rng.uniform(0.0, self.cfg.agent.retry_backoff_s * 2 ** (attempt - 1))
            self._backoff += len(retry)
            later = Unit(t, unit.route, retry, unit.fixed, unit.scorer, unit.local, solo=unit.solo)
            self._timer.schedule(time.monotonic() + delay, functools.partial(self._requeue, later))
        return idx, final

    def _late(self, r: RewardResult, unit: Unit) -> RewardResult:
        """A score computed past its deadline (a busy machine made the watchdog late) is a timeout all
        the same, whatever backend ran it, so the deadline means one thing."""
        (late,) = failures(
            1,
            Status.TIMEOUT,
            f"reward function {unit.route.entry.name} exceeded "
            f"{self.timeout_s:g} s (its late result is discarded)",
            r.source,
        )
        late.latency_s = r.latency_s
        return late

    def _requeue_locked(self, unit: Unit) -> None:
        self._queue.appendleft(unit)
        self._queued += len(unit.idx)

    def _requeue(self, unit: Unit) -> None:
        with self._lock:
            self._backoff -= len(unit.idx)
            if unit.ticket.error is None and not self._closed:
                self._requeue_locked(unit)
        self._dispatch()

    # ------------------------------------------------------------------------------ results
    def _record(self, t: Ticket, idx: list[int], results: list[RewardResult]) -> None:
        """Store final results; the groups whose last member arrived are finished and released."""
        with self._lock:
            if t.error is not None:
                return
            complete = t.store(idx, results)
            self._stats.count["completed"] += len(idx)
        if not complete:
            return
        groups = [t.groups[k] for k in complete]
        members = [i for g in groups for i in g]
        try:
            # The rewarder's own finishing step (domain weights, source, post_process_scores per
            # group), so results equal Rewarder.score_batch's: one call for every group this answer
            # completed (group ids 0..n-1 keep post_process_scores per group).
            out = self.rewarder.finish(
                [t.results[i] for i in members],
                [t.routes[i] for i in members],
                [t.samples[i] for i in members],
                [gi for gi, g in enumerate(groups) for _ in g],
            )
        except Exception as e:  # pragma: no cover - finish catches the user's errors itself
            msg = f"finishing the group failed: {type(e).__name__}: {e}"
            out = failures(len(members), Status.ERROR, msg)
        with self._cond:
            pos = 0
            for g in groups:
                t.release(g, out[pos : pos + len(g)])
                pos += len(g)
            if t.done:
                self._open.discard(t)
                settle(t.finished)
            if t.pullable():  # a pulling thread is woken when its pull can succeed, not per group
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
                got = ticket.pull(k)
                if got is not None:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._expire_locked(ticket)
                want = k if k > 0 else ticket.n
                ticket.waiting.append(want)  # _record wakes this thread only once the pull can succeed
                try:
                    self._cond.wait(left)
                finally:
                    ticket.waiting.remove(want)

    def stream(self, ticket: Ticket, k: int = 0) -> Iterator[tuple[list[int], list[RewardResult]]]:
        """Yield :meth:`get` pulls until every index has come back exactly once."""
        while True:
            idx, res = self.get(ticket, k)
            if not idx:
                return
            yield idx, res

    def score_batch(
        self,
        samples: Sequence[Sample],
        responses: Sequence[str],
        group_B: Any = None,
        progress: TrainingProgress | None = None,
    ) -> list[RewardResult]:
        """:meth:`Rewarder.score_batch` through the agent (batched functions included): results in order."""
        t = self.submit_samples(samples, responses, group_B, progress)
        return self.get(t, 0)[1] if len(samples) else []

    async def aget(self, ticket: Ticket) -> list[RewardResult]:
        """``get(ticket, 0)`` for asyncio (the results in index order): awaits the whole batch without
        blocking the event loop; raises :class:`RewardBackendError` past ``reward.agent.deadline_s``."""
        left = ticket.submitted_at + self.cfg.agent.deadline_s - time.monotonic()
        with contextlib.suppress(asyncio.TimeoutError):
            # shielded: a timed-out wait must not cancel the ticket's future, other waiters share it
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(ticket.finished)), max(left, 0.0))
        return self.get(ticket, 0)[1]

    def _expire_locked(self, t: Ticket) -> RewardBackendError:
        a = self.cfg.agent
        missing = t.n - t.released
        unscored = sum(r is None for r in t.results)
        queued = sum(len(u.idx) for u in self._queue if u.ticket is t)
        flying = sum(len(f.idx) for f in self._jobs.values() if f.unit.ticket is t)
        states = []
        for b in (self._backend, self._local):
            if b is not None:
                try:
                    states.append(b.describe())
                except Exception as e:  # pragma: no cover
                    states.append(f"state unknown ({e})")
        err = RewardBackendError(
            f"reward agent: batch of {t.n} still has {missing} samples unreleased ({unscored} unscored: "
            f"{flying} in flight, {queued} queued) after reward.agent.deadline_s={a.deadline_s:g}; "
            f"backend {a.backend} is stuck or dead ({'; '.join(states) or 'not started'}); check the "
            "reward function or service, or raise reward.agent.deadline_s"
        )
        t.error = err
        self._open.discard(t)
        settle(t.finished)
        kept = deque(u for u in self._queue if u.ticket is not t)
        self._queued -= queued
        self._queue = kept
        for key in [key for key, f in self._jobs.items() if f.unit.ticket is t]:
            self._in_flight -= len(self._jobs.pop(key).idx)  # late answers are dropped
        self._cond.notify_all()
        return err

    # ----------------------------------------------------------------------------- metrics
    def metrics(self) -> dict[str, float]:
        """Throughput since the last call (``agent/requests_per_s``), queue depth, samples in flight,
        chunk sizes, counters, latency p50/p95/p99 per source (seconds) and the backend's own (per-node
        load on Ray)."""
        now = time.monotonic()
        with self._lock:
            gauges = {
                "agent/queue_depth": float(self._queued + self._backoff),
                "agent/in_flight": float(self._in_flight),
                "agent/open_batches": float(len(self._open)),
            }
            m, lats = self._stats.read(now, gauges)
        m.update(Counters.percentiles(lats))
        for b in (self._local, self._backend):
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
                settle(t.finished)
            self._open.clear()
            self._queue.clear()
            self._jobs.clear()
            self._queued = self._in_flight = 0
            self._cond.notify_all()
            backends, loop = (self._backend, self._local), self._loop
        for b in backends:
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
