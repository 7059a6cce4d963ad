"""What a reward-agent backend is: the job it gets, its protocol, its registry entry, and the timer and event loop it is lent."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from stepcredit.config import RewardConfig
from stepcredit.registry import Registry
from stepcredit.reward.base import RewardFn, TrainingProgress
from stepcredit.reward.run.chunks import (
    Outcome,
    failures,
)
from stepcredit.types import RewardResult, Status


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
    progress: TrainingProgress | None = None
    """Where training stood for the items' batch (a remote scorer sets it around its call)."""

    @property
    def n(self) -> int:
        return len(self.items)


OnDone = Callable[[Job, Outcome], None]


class Backend(Protocol):
    """What the agent needs from a backend (module doc)."""

    def submit(self, job: Job) -> None: ...

    def warmup(self) -> None: ...

    def prestart(self) -> None:
        """Start the workers in the background and return at once (a backend whose start is cheap or
        cannot run beside its first use does nothing: it starts on first use)."""
        ...

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
    requires: tuple[str, ...] = ()
    """Modules it imports beyond the core install (checked at start-up by ``check_config``)."""


BACKENDS: Registry[BackendSpec] = Registry("reward agent backend")


def register_backend(
    name: str,
    *,
    default_concurrency: int = 0,
    in_process: bool = False,
    stops_hung_work: bool = True,
    hosts_scorers: bool = False,
    uses_ray: bool = False,
    requires: tuple[str, ...] = (),
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
                requires=tuple(requires),
            ),
        )
        return make

    return deco


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
