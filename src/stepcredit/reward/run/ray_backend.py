"""The ``ray`` reward-agent backend: pools of Ray actors with declared resources; scorers as actors of their own."""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepcredit.config import RewardConfig
from stepcredit.errors import ConfigError
from stepcredit.reward.base import REWARDS, FnRef, TrainingProgress, load_ref, ref_of, scoring_progress
from stepcredit.reward.run.backend_api import Backend, BackendArgs, Job, _timeouts, register_backend
from stepcredit.reward.run.chunks import (
    Outcome,
    callable_of,
    decode,
    decode_all,
    dumps_results,
    encode_all,
    failures,
    run_items,
)
from stepcredit.types import RewardResult, Sample, Status

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

    def run(self, payload: bytes) -> bytes:
        """Run one chunk, pickled by the driver as ``(ref, items, kwargs, source, batched)``; returns
        its results, pickled once here (:func:`dumps_results`). Bytes both ways: Ray's own pickler
        calls back into Python for every tuple and dict of a chunk (most of the driver's CPU per
        chunk in a profile, issue 48), the standard one does not."""
        ref, items, kwargs, source, batched = pickle.loads(payload)
        out: list[RewardResult] = []
        self._out = out

        def started(k: int) -> None:
            self._progress = (k, time.monotonic())

        try:
            fn = _user_fn(ref)
        except BaseException as e:
            return dumps_results(failures(len(items), Status.ERROR, f"{type(e).__name__}: {e}", source))
        run_items(fn, items, kwargs, source=source, batched=batched, out=out, started=started)
        return dumps_results(out)

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

    def run(
        self, items: list[tuple[Sample, str]], source: str, progress: TrainingProgress | None = None
    ) -> bytes:
        samples = [s for s, _ in items]
        responses = [r for _, r in items]
        t0 = time.perf_counter()
        try:
            with scoring_progress(progress):  # the batch's training progress (TRL's trainer_state)
                out = list(self.scorer.score_batch(samples, responses))
            if len(out) != len(items):
                raise RuntimeError(f"scorer {source} returned {len(out)} results for {len(items)} responses")
        except Exception as e:
            out = failures(len(items), Status.ERROR, f"{type(e).__name__}: {e}", source)
        dt = (time.perf_counter() - t0) / max(1, len(items))
        for r in out:
            r.latency_s = r.latency_s or dt
        return dumps_results(out)


def _payload(job: Job) -> bytes:
    """What :meth:`RewardActor.run` gets: the chunk pickled by the standard pickler (a reward
    function's arguments and keyword arguments are plain data; an unpicklable one fails the chunk as
    it did through Ray's pickler)."""
    args = (job.entry.ref, job.items, job.kwargs, job.source, job.batched)
    try:
        return pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # e.g. a lambda in extra_info: Ray's own pickler (cloudpickle) can carry it
        import ray.cloudpickle

        return ray.cloudpickle.dumps(args)  # type: ignore[no-any-return]


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
            ref = slot.actor.run.remote(job.items, job.source, job.progress)
        else:
            assert job.entry.ref is not None
            ref = slot.actor.run.remote(_payload(job))
        t0 = time.monotonic()
        wait = job.timeout_s
        while True:
            # one ray.get with the deadline (no ray.wait before it: one call per chunk, not two)
            try:
                got = ray.get(ref, timeout=wait)
                break
            except ray.exceptions.GetTimeoutError:
                pass
            except ray.exceptions.RayActorError as e:  # the actor or its node died: which item is unknown
                self._kill(slot)
                msg = f"Ray reward actor died: {type(e).__name__}"
                return Outcome(list(failures(job.n, Status.ERROR, msg, job.source)), died=list(range(job.n)))
            except Exception as e:
                return Outcome(list(failures(job.n, Status.ERROR, f"{type(e).__name__}: {e}", job.source)))
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
        return Outcome(decode_all(pickle.loads(got), job.source))

    def close(self) -> None:
        for _ in self.slots:
            self.q.put(None)
        for s in self.slots:
            self._kill(s)  # interrupts a running job: its ray.wait returns at once
        for s in self.slots:
            if s.thread is not None:
                s.thread.join(10.0)


WORKER_REGISTER_TIMEOUT_S = 600
"""How long a Ray instance we start waits for a starting worker process to register before it kills it
and starts another (Ray's ``worker_register_timeout_seconds``, 60 s by default)."""


def slow_machine_tolerance() -> None:
    """Before we start a local Ray: let its starting workers take up to :data:`WORKER_REGISTER_TIMEOUT_S`
    to register (``RAY_worker_register_timeout_seconds``, unless set). With Ray's 60 s, a worker that
    needs a few CPU seconds to import Ray and the reward code never registers on a starved machine
    (observed: 2 cores, 2 busy processes and a test suite beside it): the raylet kills it and starts
    another every minute, and no actor ever becomes ready. Our own ``ray_startup_timeout_s`` still
    bounds how long the agent waits for an actor."""
    os.environ.setdefault("RAY_worker_register_timeout_seconds", str(WORKER_REGISTER_TIMEOUT_S))


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
                # address="local": a new instance of our own, even when another Ray cluster runs on the
                # machine (ray.init() alone would join it, through /tmp/ray/ray_current_cluster)
                slow_machine_tolerance()
                ray.init(address="local", num_cpus=a.ray_local_cpus, include_dashboard=False)
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

    def prestart(self) -> None:
        pass  # actors start on first use (warmup() starts them and waits)

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


@register_backend("ray", default_concurrency=2, hosts_scorers=True, uses_ray=True, requires=("ray",))
def _ray_backend(args: BackendArgs) -> Backend:
    return RayBackend(args)
