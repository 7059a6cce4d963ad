"""Kill-safe execution: hangs are stopped on time, crashes are replaced, results never swap."""

from __future__ import annotations

import asyncio
import os
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from stepcredit.config import RewardConfig, RewardCustomConfig
from stepcredit.reward import build_rewarder
from stepcredit.reward.run.pool import KillSafePool
from stepcredit.reward.run.rewarder import Rewarder
from stepcredit.types import Sample, Status

TIMEOUT = 1.0

FNS = textwrap.dedent(
    """
    import ctypes, os, subprocess, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        if solution_str == "sleep":
            time.sleep(10_000)
        if solution_str == "spawn":  # a grandchild that must die with the worker
            p = subprocess.Popen(["sleep", "10000"])
            open(extra_info["pidfile"], "w").write(str(p.pid))
            time.sleep(10_000)
        if solution_str == "segfault":
            ctypes.string_at(0)
        if solution_str == "exit":
            os._exit(3)
        if solution_str == "raise":
            raise ValueError("boom")
        return {"score": float(solution_str == ground_truth), "pred": solution_str}
    """
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def rewarder(tmp_path_factory: pytest.TempPathFactory) -> Rewarder:
    path = tmp_path_factory.mktemp("fns") / "fns.py"
    path.write_text(FNS)
    rw = build_rewarder(
        RewardConfig(timeout_s=TIMEOUT, workers=2, custom=RewardCustomConfig(path=f"{path}:compute_score"))
    )
    rw.warmup()
    yield rw
    pids = _pool(rw).pids
    rw.close()
    assert pids and all(_gone(p) for p in pids), "a worker outlived close()"


def _pool(rw: Rewarder) -> KillSafePool:
    """The kill-safe pool behind the rewarder's agent (its process backend)."""
    pool = rw.agent.backend.pool  # type: ignore[attr-defined]
    assert isinstance(pool, KillSafePool)
    return pool


def _s(gt: str = "a", **extra: str) -> Sample:
    return Sample(prompt=(), ground_truth=gt, extra_info=dict(extra))


def test_hang_is_stopped_from_a_worker_thread(rewarder: Rewarder) -> None:
    before = _pool(rewarder).pids
    out: dict[str, object] = {}

    def run() -> None:
        t0 = time.monotonic()
        out["res"] = rewarder.score_batch([_s(), _s()], ["sleep", "a"])
        out["dt"] = time.monotonic() - t0

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    res = out["res"]
    # killed at its deadline (TIMEOUT below), not after its 10,000 s sleep: 10x the deadline
    assert out["dt"] < 10 * TIMEOUT  # type: ignore[operator]
    assert [r.status for r in res] == [Status.TIMEOUT, Status.OK]  # type: ignore[union-attr]
    killed = before - _pool(rewarder).pids
    assert killed and all(_gone(p) for p in killed)


def test_hang_is_stopped_from_asyncio(rewarder: Rewarder) -> None:
    async def main() -> tuple[float, list]:
        t0 = time.monotonic()
        res = await rewarder.ascore_batch([_s()], ["sleep"])
        return time.monotonic() - t0, res

    dt, res = asyncio.run(main())
    assert dt < 10 * TIMEOUT  # the 10,000 s sleep is killed at its 1 s deadline (10x: a busy machine)
    assert res[0].status == Status.TIMEOUT and res[0].score != res[0].score  # NaN, never a silent 0


def test_a_timeout_kills_the_workers_children_too(rewarder: Rewarder, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    res = rewarder.score_batch([_s(pidfile=str(pidfile))], ["spawn"])
    assert res[0].status == Status.TIMEOUT
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild)


@pytest.mark.parametrize("how", ["segfault", "exit"])
def test_a_crashed_worker_is_replaced(rewarder: Rewarder, how: str) -> None:
    res = rewarder.score_batch([_s(), _s(), _s("b")], [how, "a", "b"])
    assert res[0].status == Status.ERROR and "crashed" in res[0].info["message"]
    assert [r.score for r in res[1:]] == [1.0, 1.0]
    assert rewarder.score_batch([_s()], ["a"])[0].score == 1.0


def test_user_exceptions_are_errors_not_crashes(rewarder: Rewarder) -> None:
    res = rewarder.score_batch([_s()], ["raise"])[0]
    assert res.status == Status.ERROR and "ValueError: boom" in res.info["message"]


def test_results_never_go_to_the_wrong_sample(rewarder: Rewarder) -> None:
    # Many threads at once, a crash and a timeout in the mix: each result still matches its input.
    errors: list[str] = []

    def worker(k: int) -> None:
        texts = [f"t{k}-{i}" for i in range(15)]
        if k == 0:
            texts[3] = "exit"
        if k == 1:
            texts[5] = "sleep"
        res = rewarder.score_batch([_s(t) for t in texts], texts)
        for t, r in zip(texts, res, strict=True):
            if t in ("exit", "sleep"):
                ok = r.status in (Status.ERROR, Status.TIMEOUT)
            else:
                ok = r.extracted == t and r.score == 1.0
            if not ok:
                errors.append(f"{t}: {r}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


def test_pool_workers_are_this_process_children_only_while_open(tmp_path: Path) -> None:
    path = tmp_path / "f.py"
    path.write_text("def f(d, s, g, e=None):\n    return 1.0\n")
    rw = build_rewarder(RewardConfig(custom=RewardCustomConfig(path=f"{path}:f")))
    assert rw.score_batch([_s()], ["x"])[0].score == 1.0
    pids = _pool(rw).pids
    assert pids <= {c.pid for c in psutil.Process(os.getpid()).children()}
    rw.close()
    assert all(_gone(p) for p in pids)


# ---------------------------------------------------------------------------------------- chunks
def test_a_chunk_times_each_item_and_a_hang_costs_its_neighbours_nothing(rewarder: Rewarder) -> None:
    # Items 0-2 finish (sent before item 3 starts: flush_s=0), item 3 hangs (killed at its own
    # deadline), items 4-5 never ran: the caller gets 0-2's results, a timeout for 3 and None (run
    # again) for 4-5.
    ref = rewarder.custom.ref  # type: ignore[union-attr]
    assert ref is not None
    texts = ["a", "b", "a", "sleep", "a", "a"]
    items = [("x", t, "a", {}) for t in texts]
    out = _pool(rewarder).submit_chunk(ref, items, timeout_s=TIMEOUT, flush_s=0.0).result(30)
    # one item's deadline, not six: the statuses say so (3 scored, 1 timed out, 2 never started),
    # whatever the machine's load
    assert [r.score for r in out.results[:3]] == [1.0, 0.0, 1.0]  # type: ignore[union-attr]
    assert out.results[3] is not None and out.results[3].status == Status.TIMEOUT
    assert out.results[4:] == [None, None] and not out.died and not out.whole


def test_a_chunk_item_that_kills_its_worker_is_named(rewarder: Rewarder) -> None:
    ref = rewarder.custom.ref  # type: ignore[union-attr]
    assert ref is not None
    out = (
        _pool(rewarder)
        .submit_chunk(ref, [("x", t, "a", {}) for t in ["a", "exit", "a"]], timeout_s=TIMEOUT, flush_s=0.0)
        .result(30)
    )
    assert out.died == [1] and out.results[1] is not None and "crashed" in out.results[1].info["message"]
    assert out.results[0] is not None and out.results[0].score == 1.0 and out.results[2] is None
    # the slot has a fresh worker: the next chunk runs
    again = _pool(rewarder).submit_chunk(ref, [("x", "a", "a", {})], timeout_s=TIMEOUT).result(30)
    assert again.results[0] is not None and again.results[0].score == 1.0


def test_a_hang_right_after_a_slow_first_import_is_killed_at_its_own_deadline(tmp_path: Path) -> None:
    # The first chunk of a function imports it under the "loading" allowance (STARTUP_TIMEOUT_S, 120 s).
    # The parent used to compute its wait from that allowance and sleep through the worker's move to
    # item 0, so a first item that hung after an import longer than its deadline ran ~120 s, not 1 s.
    source = "import time\ntime.sleep(2.0)\n\ndef f(d, s, g, e=None):\n    time.sleep(10_000)\n"
    rw, pool = _custom_rewarder(tmp_path, source, workers=1)
    pool.warmup()  # the worker's own start is not what is timed
    t0 = time.monotonic()
    out = pool.submit_chunk(rw.custom.ref, [("x", "s", "g", {})], timeout_s=TIMEOUT).result(100)  # type: ignore[union-attr]
    dt = time.monotonic() - t0
    rw.close()
    assert out.results[0] is not None and out.results[0].status == Status.TIMEOUT
    # ~3 s quiet (2 s import + 1 s deadline): the old wait was the 120 s loading allowance
    assert dt < 60
    assert "exceeded 1 s" in out.results[0].info["message"]


# -------------------------------------------------------------------------------------- prestart
def _children() -> set[int]:
    return {c.pid for c in psutil.Process(os.getpid()).children()}


def _custom_rewarder(tmp_path: Path, source: str, workers: int) -> tuple[Rewarder, KillSafePool]:
    """A rewarder over the user function ``f`` written in ``source``, and its (not yet started) pool."""
    path = tmp_path / "f.py"
    path.write_text(source)
    rw = build_rewarder(RewardConfig(workers=workers, custom=RewardCustomConfig(path=f"{path}:f")))
    return rw, _pool(rw)


def test_prestart_returns_at_once_and_a_job_beside_it_gets_the_one_worker(tmp_path: Path) -> None:
    # The trainer prestarts the pool while it generates; the first job may come while the worker
    # imports: the slot's own thread and the prestart must start one worker between them, not two.
    rw, pool = _custom_rewarder(tmp_path, "def f(d, s, g, e=None):\n    return 1.0\n", workers=1)
    before = _children()
    starting = pool.prestart()
    assert starting.is_alive()  # it returned before the worker was ready
    out = pool.submit_chunk(rw.custom.ref, [("x", "s", "g", {})], timeout_s=60.0).result(120)  # type: ignore[union-attr]
    starting.join(120)
    assert out.results[0] is not None and out.results[0].score == 1.0
    assert len(pool.pids) == 1 and len(_children() - before) == 1
    pids = pool.pids
    rw.close()
    assert all(_gone(p) for p in pids)


def test_a_pool_closed_while_it_prestarts_leaves_no_worker(tmp_path: Path) -> None:
    rw, pool = _custom_rewarder(tmp_path, "def f(d, s, g, e=None):\n    return 1.0\n", workers=2)
    before = _children()
    starting = pool.prestart()
    rw.close()
    assert not starting.is_alive()  # close killed the starting workers and waited for their starter
    deadline = time.monotonic() + 30
    while not all(_gone(p) for p in _children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in _children() - before) and not pool.pids
