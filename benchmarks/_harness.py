"""What every benchmark in this directory shares: a record of the machine's load around each measured
side, sides run in alternation (A B A B ...), medians with their spread, and a verdict on whether the
figures can be trusted.

Around each measured side :class:`Monitor` reads the 1-minute load average and the CPU time of every
process in ``/proc``. A process that is not this benchmark's own and that used at least ``busy_share``
of a core while a side ran (or during a short probe before the first side) is *busy*; the run is also
busy when the whole machine's CPU time over the side (``/proc/stat``), less what this benchmark's own
processes used, exceeds ``other_cores`` cores: that catches work no single process shows, e.g. many
short-lived processes. (The 1-minute load average is recorded too, but it is no verdict: it lags by a
minute, so a benchmark's own busy side, e.g. the spinners of ``shared_machine.py``, made the next
quiet side look loaded.) Either way the JSON says ``"valid": false`` with the reason: a figure goes
into the README or the docs only from a run that says ``"valid": true``.

*Own* processes are this one, its descendants, and every process started with this run's mark in its
environment (:data:`RUN_ENV`, set by :class:`Monitor` and inherited by whatever it starts) or with the
mark of the guard that started it (:data:`GUARD_ENV`). The marks are what recognise a process that
left the tree: Ray's workers outlive ``ray.shutdown`` for a moment, re-parented to init, and would
otherwise count as a foreign process in the next window. A mark alone does not settle a process that
ends inside a window after leaving the tree (Ray's workers orphaned at ``ray.shutdown``): where init
reaps it, its CPU time lands in no process a snapshot reads (the machine's total beyond ours held it);
where init does not (this machine's), it is a zombie whose environment, mark included, can no longer be
read, so it counted as foreign. :class:`OwnSampler`, a thread :class:`Monitor` runs when asked
(``Monitor(sample_s=SAMPLE_S)``: agent_throughput, whose Ray workers leave it; a thread waking 5 times a
second would tax a GIL-bound side of the others), looks at the own processes every :data:`SAMPLE_S`: a process it saw as own stays own, and the CPU time of one that
ended unseen is its last look's; :func:`window` counts both as own. :func:`window` is the one reader of a window (the guard's too: it adds up
the foreign processes' CPU).

Used by the scripts as::

    mon = Monitor()
    runs = mon.alternate({"ours": run_ours, "theirs": run_theirs}, repeats=args.repeats)
    out = {..., "ours": spread(times_of(runs["ours"]))}
    emit(mon.finish(out, settings={"ours": {...}, "theirs": {...}}), args.json)

Run on its own it is a self-check (two tiny CPU-bound sides): ``python benchmarks/_harness.py --json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BUSY_SHARE = 0.1
"""A foreign process using at least this share of one core during a side makes the run invalid."""
OTHER_CORES = 0.3
"""CPU use of the whole machine beyond our own processes, in cores, above which the run is invalid."""
PROBE_S = 0.5
"""Length of the look at the machine before the first side."""
MIN_WINDOW_S = 0.5
"""Sides shorter than this are too short (CPU time counts in clock ticks) to judge a process busy in;
the whole run's window still covers them."""
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SAMPLE_S = 0.2
"""How often :class:`OwnSampler` looks at the own processes (the CPU an own process uses between its
last look and its end inside a window is the part of it still missed)."""


RUN_ENV = "STEPCREDIT_BENCH_RUN"
"""Environment variable marking the processes a benchmark run started (its value: the run's pid)."""
GUARD_ENV = "STEPCREDIT_BENCH_GUARD"
"""Environment variable marking the processes a guard run started (benchmarks/guard.py)."""
_env_marks: dict[tuple[int, int], frozenset[bytes]] = {}


def mark(name: str, value: str) -> bytes:
    """The environment entry ``name=value`` as :func:`_own` looks for it."""
    return f"{name}={value}".encode()


def run_marks() -> frozenset[bytes]:
    """This run's marks: its own (set now in the environment, so whatever it starts from here on,
    Ray's processes included, inherits it) and that of the guard that started it, if one did."""
    os.environ[RUN_ENV] = str(os.getpid())
    marks = {mark(RUN_ENV, str(os.getpid()))}
    if os.environ.get(GUARD_ENV):
        marks.add(mark(GUARD_ENV, os.environ[GUARD_ENV]))
    return frozenset(marks)


def _marks_of(pid: int, started: int) -> frozenset[bytes]:
    """The ``STEPCREDIT_BENCH_*`` entries of the environment the process started with (cached by pid
    and start time: a process's initial environment never changes)."""
    key = (pid, started)
    got = _env_marks.get(key)
    if got is None:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            env = []
        got = _env_marks[key] = frozenset(e for e in env if e.startswith(b"STEPCREDIT_BENCH_"))
    return got


def _proc_table() -> dict[int, tuple[str, int, float, float, int]]:
    """{pid: (name, parent pid, CPU seconds used so far, that plus its children waited for, start time
    in clock ticks)}.

    A process's reaped children land in its own count at once when they end (a shell that ran a build
    would seem to use many cores for an instant), so only our own main process counts them."""
    out: dict[int, tuple[str, int, float, float, int]] = {}
    for d in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        # "pid (name with spaces) state ppid ... utime stime cutime cstime ... starttime ..."
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        f = raw[raw.rindex(")") + 2 :].split()
        own = (int(f[11]) + int(f[12])) / _TICK
        out[int(d.name)] = (name, int(f[1]), own, own + (int(f[13]) + int(f[14])) / _TICK, int(f[19]))
    return out


def _own(
    table: dict[int, tuple[str, int, float, float, int]],
    roots: set[int] | None = None,
    marks: frozenset[bytes] = frozenset(),
) -> set[int]:
    """``roots`` (default: this process), the processes whose environment holds one of ``marks``, and
    all their descendants."""
    kids: dict[int, list[int]] = {}
    for pid, row in table.items():
        kids.setdefault(row[1], []).append(pid)
    todo = list({os.getpid()} if roots is None else roots)
    if marks:
        todo += [pid for pid, row in table.items() if marks & _marks_of(pid, row[4])]
    own: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid not in own:
            own.add(pid)
            todo.extend(kids.get(pid, []))
    return own


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - no load average on this platform
        return float("nan")


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: all but idle and
    iowait), NaN where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds with its reaped children, start time in clock ticks), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    f = raw[raw.rindex(b")") + 2 :].split()
    return int(f[1]), sum(int(x) for x in f[11:15]) / _TICK, int(f[19])


class OwnSampler:
    """A thread that looks at this run's own processes every ``interval_s`` (this process, its
    descendants, the processes carrying one of ``marks``, and every process once seen as own) and
    keeps, per process, its parent and CPU time at the last look: what :func:`window` counts as own
    for a process that ended inside the window and that no own process reaped (its CPU time then lands
    in no process a snapshot reads). A look reads only the new processes and the own ones, so it
    costs the benchmark little."""

    def __init__(self, marks: frozenset[bytes] = frozenset(), interval_s: float = SAMPLE_S) -> None:
        self.marks = marks
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._known: dict[int, int] = {}  # pid -> start time, every process looked at (own or not)
        self._own: set[tuple[int, int]] = set()  # (pid, start time) of the own processes
        self.seen: dict[tuple[int, int], tuple[int, float, float]] = {}
        """(pid, start time) -> (parent pid, CPU seconds, when: perf_counter) at the last look."""
        self._stop = threading.Event()
        self.look()
        self._thread = threading.Thread(target=self._run, name="bench-own-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.look()

    def look(self) -> None:
        """Note the own processes now: new ones (read once) and the CPU time of every own one."""
        now = time.perf_counter()
        pids = {int(d) for d in os.listdir("/proc") if d.isdigit()} if os.path.isdir("/proc") else set()
        with self._lock:
            for gone in [p for p in self._known if p not in pids]:
                del self._known[gone]
            new = {}
            for pid in pids - self._known.keys():
                st = _stat(pid)
                if st is not None:
                    new[pid] = st
            own_pids = {p for p, start in self._own if self._known.get(p) == start}
            own_pids.add(os.getpid())
            # parents start before their children: resolved in start order, a child of a new own
            # process is own too
            for pid, (ppid, cpu, start) in sorted(new.items(), key=lambda kv: kv[1][2]):
                self._known[pid] = start
                if pid in own_pids or ppid in own_pids or self.marks & _marks_of(pid, start):
                    own_pids.add(pid)
                    self._own.add((pid, start))
                    self.seen[(pid, start)] = (ppid, cpu, now)
            for pid, start in list(self._own):
                if self._known.get(pid) != start or pid in new:
                    continue
                st = _stat(pid)
                if st is not None and st[2] == start:
                    self.seen[(pid, start)] = (st[0], st[1], now)

    def own_keys(self) -> set[tuple[int, int]]:
        """(pid, start time) of every process seen as own so far."""
        with self._lock:
            return set(self._own)

    def last_seen(self) -> dict[tuple[int, int], tuple[int, float, float]]:
        """A copy of :attr:`seen`."""
        with self._lock:
            return dict(self.seen)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


class Snapshot:
    def __init__(
        self,
        roots: set[int] | None = None,
        marks: frozenset[bytes] = frozenset(),
        sampler: OwnSampler | None = None,
    ) -> None:
        self.t = time.perf_counter()
        self.load1 = _loadavg()
        self.machine_s = _machine_busy_s()
        self.table = _proc_table()
        self.own = _own(self.table, roots, marks)
        # what the sampler saw: own processes that left the tree unmarked stay own, and the last CPU
        # time of those that ended is known
        self.seen: dict[tuple[int, int], tuple[int, float, float]] = {}
        if sampler is not None:
            sampler.look()
            keys = sampler.own_keys()
            self.own |= {pid for pid, row in self.table.items() if (pid, row[4]) in keys}
            self.seen = sampler.last_seen()


def window(a: Snapshot, b: Snapshot, busy_share: float) -> dict[str, Any]:
    """What happened between two snapshots: our own CPU use, the foreign processes that were busy and
    the cores all foreign processes used together (``foreign_cores``: their CPU time over the window,
    a process started within it counted from its start; one that ended within it is not seen)."""
    wall = max(b.t - a.t, 1e-9)
    me = os.getpid()
    own_s = b.table[me][3] - a.table[me][3] if me in a.table and me in b.table else 0.0
    # an own process's children it reaped in between are own too (a run's worker processes)
    own_s += sum(b.table[p][3] - a.table[p][3] for p in b.own if p in a.table and p != me)
    own_s += sum(b.table[p][3] for p in b.own if p not in a.table)  # children started in between
    own_s += _ended_own_s(a, b)
    own_s = min(own_s, wall * (os.cpu_count() or 1))  # a child reaped in between counts twice
    busy: list[dict[str, Any]] = []
    foreign_s = 0.0
    for pid, (name, _, cpu, _, started) in b.table.items():
        if pid in b.own or pid in a.own:
            continue
        before = a.table.get(pid)
        used = cpu - before[2] if before is not None and before[4] == started else cpu
        foreign_s += used
        if wall >= MIN_WINDOW_S and used / wall >= busy_share:
            busy.append({"pid": pid, "name": name, "cores": round(used / wall, 3)})
    busy.sort(key=lambda x: -x["cores"])
    return {
        "wall_s": round(wall, 4),
        "load1_before": round(a.load1, 2),
        "load1_after": round(b.load1, 2),
        "own_cores": round(own_s / wall, 3),
        "foreign_cores": round(foreign_s / wall, 3),
        # the whole machine's use beyond ours: foreign processes seen or not (NaN without /proc/stat)
        "other_cores": round(max(0.0, (b.machine_s - a.machine_s - own_s) / wall), 3),
        "busy": busy,
    }


def _ended_own_s(a: Snapshot, b: Snapshot) -> float:
    """CPU seconds, within the window, of the own processes the sampler saw in it that ended before
    ``b`` and that no own process still there reaped (last seen with a parent that is not one: init
    after ``ray.shutdown``). Those an own process reaped are in its count of waited-for children."""
    total = 0.0
    for (pid, start), (ppid, cpu, when) in b.seen.items():
        if when < a.t or (pid in b.table and b.table[pid][4] == start):
            continue  # not seen in the window, or still running (counted from the table)
        if ppid in b.own and ppid in b.table:
            continue
        before = a.table.get(pid)
        total += cpu - before[3] if before is not None and before[4] == start else cpu
    return total


def own_pids(marks: frozenset[bytes]) -> set[int]:
    """The own processes now (this one included)."""
    return _own(_proc_table(), None, marks)


def wait_own_exit(
    before: set[int], marks: frozenset[bytes], timeout_s: float = 10.0, poll_s: float = 0.1
) -> float:
    """Wait (at most ``timeout_s``) until every own process that was not in ``before`` (an
    :func:`own_pids` taken earlier) has ended, e.g. Ray's after ``ray.shutdown``, so that the next
    window does not hold their last CPU; returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        # a zombie (state Z) waits for its parent only: it uses no CPU
        if not [p for p in own_pids(marks) - before if not _zombie(p)]:
            break
        time.sleep(poll_s)
    return time.perf_counter() - t0


def _zombie(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return raw[raw.rindex(")") + 2 :].startswith("Z")


class Monitor:
    """Load record of one benchmark run: a probe before the first side, then one window per side."""

    def __init__(
        self,
        *,
        busy_share: float = BUSY_SHARE,
        other_cores: float = OTHER_CORES,
        probe_s: float = PROBE_S,
        sample_s: float = 0.0,
    ) -> None:
        self.busy_share = busy_share
        self.other_cores = other_cores
        self.cpus = os.cpu_count() or 1
        self.windows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        # what this run starts from now on (Ray's processes included) carries its mark; a guard's
        # other runs (their lingering processes) are own too
        self.marks = run_marks()
        # own processes that end inside a window after leaving the tree still count as own: only for a
        # benchmark whose processes leave it (Ray's workers, orphaned at ray.shutdown; ``sample_s``, e.g.
        # SAMPLE_S): the sampling thread wakes every sample_s and would tax a GIL-bound side otherwise
        self.sampler = OwnSampler(self.marks, sample_s) if sample_s > 0 else None
        self.first = self.snapshot()
        if probe_s > 0:
            with self.side("probe (before the first side)"):
                time.sleep(probe_s)

    def snapshot(self) -> Snapshot:
        return Snapshot(None, self.marks, self.sampler)

    @contextmanager
    def side(self, name: str) -> Iterator[dict[str, Any]]:
        """Record the machine's load before and after the block; the window's record is yielded."""
        rec: dict[str, Any] = {"side": name}
        a = self.snapshot()
        try:
            yield rec
        finally:
            rec.update(window(a, self.snapshot(), self.busy_share))
            self.windows.append(rec)

    def timed(self, name: str, fn: Callable[[], Any]) -> tuple[float, Any]:
        """(seconds, result) of ``fn()`` run as one side."""
        with self.side(name):
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
        return dt, out

    def alternate(self, sides: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[Any]]:
        """Run the sides in turn (A B A B ...), ``repeats`` rounds; each side's results in order."""
        out: dict[str, list[Any]] = {k: [] for k in sides}
        for _ in range(repeats):
            for name, fn in sides.items():
                with self.side(name):
                    out[name].append(fn())
        return out

    def reasons(self) -> list[str]:
        """Why the run cannot be trusted: each busy foreign process (its busiest side), the worst load."""
        why: list[str] = []
        worst: dict[tuple[int, str], tuple[float, str]] = {}
        for w in self.windows:
            for b in w["busy"]:
                key = (b["pid"], b["name"])
                if b["cores"] > worst.get(key, (0.0, ""))[0]:
                    worst[key] = (b["cores"], w["side"])
        for (pid, name), (cores, side) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
            why.append(f"busy process {name} (pid {pid}) used {cores:.2f} of a core during {side}")
        loaded = [
            w for w in self.windows if w["wall_s"] >= MIN_WINDOW_S and w["other_cores"] > self.other_cores
        ]
        if loaded:
            w = max(loaded, key=lambda x: x["other_cores"])
            why.append(
                f"the machine used {w['other_cores']:.2f} cores beyond this benchmark's own "
                f"{w['own_cores']:.2f} during {w['side']} (limit {self.other_cores:g})"
            )
        return why + self.notes

    def invalidate(self, reason: str) -> None:
        """Mark the run invalid for a reason the load record cannot see."""
        self.notes.append(reason)

    def record(self) -> dict[str, Any]:
        whole = {"side": "whole run", **window(self.first, self.snapshot(), self.busy_share)}
        self.windows = [w for w in self.windows if w["side"] != "whole run"] + [whole]
        why = self.reasons()
        loads = [x for w in self.windows for x in (w["load1_before"], w["load1_after"])]
        return {
            "valid": not why,
            "reason": "; ".join(why) if why else None,
            "load": {
                "cpus": self.cpus,
                "load1_max": max(loads, default=float("nan")),
                "busy_share_threshold": self.busy_share,
                "other_cores_threshold": self.other_cores,
                "windows": self.windows,
            },
        }

    def finish(self, result: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
        """The benchmark's result with both sides' settings and the load record added (the sampler
        stops)."""
        out = {**result, "settings": settings, **self.record()}
        if self.sampler is not None:
            self.sampler.stop()
        return out


def spread(xs: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def emit(obj: dict[str, Any], as_json: bool) -> None:
    """Print the verdict; with ``as_json`` the JSON object is the last line of stdout."""
    if obj.get("valid"):
        print("valid: the machine was quiet during every side")
    else:
        print(f"NOT VALID (do not quote these figures): {obj.get('reason')}")
    if as_json:
        print(json.dumps(obj, default=str))


def add_args(p: argparse.ArgumentParser, repeats: int = 3) -> None:
    """``--repeats`` (alternating rounds) and ``--json``, unless the script defines them itself."""
    have = {a.dest for a in p._actions}
    if "repeats" not in have:
        p.add_argument("--repeats", type=int, default=repeats, help="alternating rounds of the sides")
    if "json" not in have:
        p.add_argument("--json", action="store_true", help="print a JSON object as the last line")


# ------------------------------------------------------------------------------ self-check
def _spin(seconds: float) -> int:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description="self-check of the benchmark harness: two CPU-bound sides")
    p.add_argument("--side-s", type=float, default=0.2, help="seconds each side spins")
    add_args(p)
    a = p.parse_args()
    mon = Monitor()
    runs = mon.alternate({"a": lambda: _spin(a.side_s), "b": lambda: _spin(a.side_s)}, repeats=a.repeats)
    res: dict[str, Any] = {
        "benchmark": "harness",
        "a_loops": spread([float(x) for x in runs["a"]]),
        "b_loops": spread([float(x) for x in runs["b"]]),
    }
    res["ratio"] = res["a_loops"]["median"] / res["b_loops"]["median"]
    print(f"loops per side: a {res['a_loops']['median']:.0f}, b {res['b_loops']['median']:.0f}")
    emit(mon.finish(res, {"a": {"spin_s": a.side_s}, "b": {"spin_s": a.side_s}}), a.json)


if __name__ == "__main__":
    main()
