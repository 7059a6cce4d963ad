"""The reward agent's bookkeeping (:mod:`stepcredit.reward.run.agent`): a :class:`Ticket` per submitted
batch (what it is owed: results per index, groups still open, groups released and not yet pulled) and
the units of queued and in-flight work, and the counters behind :meth:`RewardAgent.metrics`. The agent
holds its lock around every method here; nothing in this module locks, schedules or runs a reward.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections import Counter, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepcredit.reward.base import TrainingProgress
from stepcredit.reward.run.routing import Route
from stepcredit.types import Batch, RewardResult, Sample, Status

_NO_KEY = object()
LATENCY_WINDOW = 10_000
"""Latencies kept per source for the percentiles of :meth:`RewardAgent.metrics`."""
_OK = Status.OK
_ERRORS = (Status.ERROR, Status.SANDBOX_ERROR)


@dataclass(eq=False)
class Ticket:
    """A submitted batch: what :meth:`RewardAgent.get` and :meth:`RewardAgent.stream` pull from."""

    id: int
    samples: Sequence[Sample]
    texts: Sequence[str]
    keys: list[Hashable]
    """Group key per index (``group_B``, else the sample's ``uid``)."""
    batch: Batch | None = None
    progress: TrainingProgress | None = None
    """Where training stood for this batch (TRL functions' ``trainer_state``); None outside training."""
    results: list[RewardResult | None] = field(default_factory=list)
    """Per index, filled as scored (final, post-processed values once its group is released)."""
    routes: list[Route | None] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    """Per index, failed attempts retried so far."""
    resubmits: list[int] = field(default_factory=list)
    """Per index, times re-submitted after its worker died."""
    reran: bool = False
    """Has any index been retried or re-submitted (else no result has attempts to note)?"""
    groups: dict[Hashable, list[int]] = field(default_factory=dict)
    remaining: dict[Hashable, int] = field(default_factory=dict)
    ready: deque[list[int]] = field(default_factory=deque)
    """Released groups not yet pulled, in completion order."""
    released: int = 0
    taken: int = 0
    submitted_at: float = 0.0
    error: Exception | None = None
    finished: cf.Future[None] = field(default_factory=cf.Future)
    """Done once every group is released or the batch failed (``get`` then returns or raises at once):
    what asyncio callers await."""
    waiting: list[int] = field(default_factory=list)
    """Per thread blocked in :meth:`RewardAgent.get` on this ticket, the released samples it needs."""

    @classmethod
    def open(
        cls, ticket_id: int, samples: Sequence[Sample], texts: Sequence[str], group_B: Any = None
    ) -> Ticket:
        """A new ticket, its clock started: groups from ``group_B`` (ids per response), else by ``uid``."""
        n = len(samples)
        if group_B is not None:
            gl = group_B.tolist() if hasattr(group_B, "tolist") else list(group_B)
            if len(gl) != n:
                raise ValueError(f"group_B has {len(gl)} entries for {n} samples")
            keys: list[Hashable] = list(map(int, gl))
        else:
            keys = [s.uid or f"#{i}" for i, s in enumerate(samples)]
        t = cls(ticket_id, samples, texts, keys, submitted_at=time.monotonic())
        t.results = [None] * n
        t.attempts = [0] * n
        t.resubmits = [0] * n
        groups = t.groups
        prev: Any = _NO_KEY
        members: list[int] = []
        for i, k in enumerate(keys):
            if k != prev:  # a group's members usually come in a run: one look-up per run
                prev = k
                members = groups.setdefault(k, [])
            members.append(i)
        t.remaining = {k: len(v) for k, v in groups.items()}
        if n == 0:
            settle(t.finished)
        return t

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def done(self) -> bool:
        """Every group released (not necessarily pulled)."""
        return self.released == self.n

    def group_chunks(self, idx: list[int], size: int) -> list[list[int]]:
        """``idx`` cut into runs of whole groups of about ``size`` samples (0 = one group each)."""
        if len(idx) == self.n and idx == list(range(self.n)):
            by_group = self.groups  # the whole batch (one route): its groups as they are
        else:
            by_group = {}
            keys = self.keys
            for i in idx:
                members = by_group.get(keys[i])
                if members is None:
                    by_group[keys[i]] = [i]
                else:
                    members.append(i)
        chunks: list[list[int]] = []
        cur: list[int] = []
        for members in by_group.values():
            if cur and (size == 0 or len(cur) + len(members) > size):
                chunks.append(cur)
                cur = []
            cur.extend(members)
        if cur:
            chunks.append(cur)
        return chunks

    def store(self, idx: list[int], results: list[RewardResult]) -> list[Hashable]:
        """Store final results; returns the groups whose last member this brought (to be finished)."""
        if len(idx) != len(results):
            raise ValueError(f"{len(results)} results for {len(idx)} indices")
        res = self.results
        if any(res[i] is not None for i in idx):  # pragma: no cover - one final answer per index
            kept = [(i, r) for i, r in zip(idx, results, strict=True) if res[i] is None]
            idx, results = [i for i, _ in kept], [r for _, r in kept]
        for i, r in zip(idx, results, strict=True):
            res[i] = r
        # per group, not per index: how many of its members arrived (counted in C)
        complete: list[Hashable] = []
        remaining = self.remaining
        for k, got in Counter(map(self.keys.__getitem__, idx)).items():
            left = remaining[k] - got
            remaining[k] = left
            if left == 0:
                complete.append(k)
        return complete

    def release(self, members: list[int], finished: list[RewardResult]) -> None:
        """A finished group's post-processed results, ready to be pulled."""
        for i, r in zip(members, finished, strict=True):
            self.results[i] = r
        self.ready.append(list(members))
        self.released += len(members)

    def pullable(self) -> bool:
        """Can a thread waiting on this ticket pull now (so it is worth waking)?"""
        avail = self.released - self.taken
        return self.done or any(avail >= w for w in self.waiting)

    def pull(self, k: int) -> tuple[list[int], list[RewardResult]] | None:
        """What :meth:`RewardAgent.get` returns now, or None to wait: ``k`` samples' worth of released
        groups (all that remain once the batch is done; ``k <= 0``: the whole batch, in index order),
        empty lists once every index has been pulled; raises the ticket's error."""
        if self.error is not None:
            raise self.error
        if self.taken == self.n:
            return [], []
        avail = self.released - self.taken
        if avail and (self.done or (k > 0 and avail >= k)):
            idx: list[int] = []
            while self.ready and (k <= 0 or len(idx) < k):
                idx.extend(self.ready.popleft())
            if k <= 0:
                idx.sort()
            self.taken += len(idx)
            return idx, [self.results[i] for i in idx]  # type: ignore[misc]
        return None


@dataclass(eq=False)
class Unit:
    """Queued work: indices of one ticket and one route, in group order."""

    ticket: Ticket
    route: Route
    idx: list[int]
    fixed: bool = False
    """Sent as it is (a batched call's whole groups, a remote scorer's sub-batch), never merged or cut."""
    scorer: bool = False
    local: bool = False
    """Runs on the in-process backend (``isolate=False``)."""
    solo: bool = False
    """Run one sample per chunk (its chunk timed out as a whole: the culprit is unknown)."""


@dataclass(eq=False)
class Flight:
    """A chunk with a backend: its unit, the indices sent and when."""

    unit: Unit
    idx: list[int]
    sent_at: float


def settle(fut: cf.Future[None]) -> None:
    """Mark a ticket's ``finished`` future done (once, under the agent's lock; waiters then read the
    ticket itself)."""
    if not fut.done():
        fut.set_result(None)


class Counters:
    """The agent's counts, latencies per source and chunk sizes, read (and the window restarted) by
    :meth:`RewardAgent.metrics`."""

    def __init__(self) -> None:
        self.count: dict[str, int] = dict.fromkeys(
            (
                "submitted",
                "completed",
                "retries",
                "timeouts",
                "errors",
                "resubmits",
                "worker_deaths",
                "chunks",
            ),
            0,
        )
        self.lat: dict[str, deque[float]] = {}
        self.chunk_sizes: deque[int] = deque(maxlen=LATENCY_WINDOW)
        self.window = (time.monotonic(), 0)  # (since, completed then): requests/s between metrics() calls

    def note_all(self, results: Sequence[RewardResult]) -> None:
        """Final (or retried) results: their statuses counted, their latencies kept (per source)."""
        timeouts = errors = 0
        source, lat = None, None
        for r in results:
            st = r.status
            if st is not _OK:
                timeouts += st == Status.TIMEOUT
                errors += st in _ERRORS
            if r.source != source or lat is None:  # a chunk is one source: one look-up per run of it
                source = r.source
                lat = self.lat.get(source or "?")
                if lat is None:
                    lat = self.lat[source or "?"] = deque(maxlen=LATENCY_WINDOW)
            lat.append(r.latency_s)
        self.count["timeouts"] += timeouts
        self.count["errors"] += errors

    def sent(self, size: int) -> None:
        """A chunk of ``size`` samples went to a backend."""
        self.count["chunks"] += 1
        self.chunk_sizes.append(size)

    def read(self, now: float, state: dict[str, float]) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """The metrics since the last read (``state``, the agent's queue gauges, after the rate) and the
        latencies per source; restarts the window and the chunk sizes."""
        since, before = self.window
        done = self.count["completed"]
        self.window = (now, done)
        sizes = np.asarray(self.chunk_sizes, dtype=float)
        self.chunk_sizes.clear()
        m = {
            "agent/requests_per_s": (done - before) / max(now - since, 1e-9),
            **state,
            "agent/chunk_size_mean": float(sizes.mean()) if sizes.size else 0.0,
            "agent/chunk_size_max": float(sizes.max()) if sizes.size else 0.0,
        }
        m.update({f"agent/{k}": float(v) for k, v in self.count.items()})
        return m, {s: np.asarray(v) for s, v in self.lat.items() if v}

    @staticmethod
    def percentiles(lats: dict[str, np.ndarray]) -> dict[str, float]:
        """Latency p50/p95/p99 per source (seconds)."""
        m: dict[str, float] = {}
        for src, arr in sorted(lats.items()):
            p50, p95, p99 = np.percentile(arr, [50, 95, 99])
            m[f"agent/latency_p50_s/{src}"] = float(p50)
            m[f"agent/latency_p95_s/{src}"] = float(p95)
            m[f"agent/latency_p99_s/{src}"] = float(p99)
        return m
