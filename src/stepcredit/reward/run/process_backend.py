"""The ``process`` reward-agent backend: chunks run in the kill-safe process pool; a deadline kills the worker."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib

from stepcredit.reward.run.backend_api import Backend, BackendArgs, Job, register_backend
from stepcredit.reward.run.pool import (
    PRELOAD,
    KillSafePool,
    Outcome,
)


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

    def prestart(self) -> None:
        self.pool.prestart()

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
