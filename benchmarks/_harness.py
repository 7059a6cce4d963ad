"""What every benchmark in this directory shares: a record of the machine's load around each measured
side, sides run in alternation (A B A B ...), medians with their spread, and a verdict on whether the
figures can be trusted.

Around each measured side :class:`Monitor` reads the 1-minute load average and the CPU time of every
process in ``/proc``. A process that is neither this one nor one of its children and that used at least
``busy_share`` of a core while a side ran (or during a short probe before the first side) is *busy*;
the run is also busy when the load average, less the cores this benchmark's own processes kept busy,
exceeds ``load_per_core`` per core. Either way the JSON says ``"valid": false`` with the reason: a
figure goes into the README or the docs only from a run that says ``"valid": true``.

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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BUSY_SHARE = 0.1
"""A foreign process using at least this share of one core during a side makes the run invalid."""
LOAD_PER_CORE = 0.5
"""Load average beyond our own processes, per core, above which the run is invalid."""
PROBE_S = 0.5
"""Length of the look at the machine before the first side."""
MIN_WINDOW_S = 0.5
"""Sides shorter than this are too short (CPU time counts in clock ticks) to judge a process busy in;
the whole run's window still covers them."""
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[str, int, float, float]]:
    """{pid: (name, parent pid, CPU seconds used so far, that plus its children waited for)}.

    A process's reaped children land in its own count at once when they end (a shell that ran a build
    would seem to use many cores for an instant), so only our own main process counts them."""
    out: dict[int, tuple[str, int, float, float]] = {}
    for d in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        # "pid (name with spaces) state ppid ... utime stime cutime cstime ..."
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        f = raw[raw.rindex(")") + 2 :].split()
        own = (int(f[11]) + int(f[12])) / _TICK
        out[int(d.name)] = (name, int(f[1]), own, own + (int(f[13]) + int(f[14])) / _TICK)
    return out


def _own(table: dict[int, tuple[str, int, float, float]]) -> set[int]:
    """This process and all its descendants."""
    kids: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    own, todo = set(), [os.getpid()]
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


class Snapshot:
    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.load1 = _loadavg()
        self.table = _proc_table()
        self.own = _own(self.table)


def _window(a: Snapshot, b: Snapshot, busy_share: float) -> dict[str, Any]:
    """What happened between two snapshots: our own CPU use and the foreign processes that were busy."""
    wall = max(b.t - a.t, 1e-9)
    me = os.getpid()
    own_s = b.table[me][3] - a.table[me][3] if me in a.table and me in b.table else 0.0
    own_s += sum(b.table[p][2] - a.table[p][2] for p in b.own if p in a.table and p != me)
    own_s += sum(b.table[p][2] for p in b.own if p not in a.table)  # children started in between
    own_s = min(own_s, wall * (os.cpu_count() or 1))  # a child reaped in between counts twice
    busy: list[dict[str, Any]] = []
    for pid, (name, _, cpu, _) in b.table.items() if wall >= MIN_WINDOW_S else ():
        if pid in b.own or pid in a.own or pid not in a.table:
            continue
        share = (cpu - a.table[pid][2]) / wall
        if share >= busy_share:
            busy.append({"pid": pid, "name": name, "cores": round(share, 3)})
    busy.sort(key=lambda x: -x["cores"])
    return {
        "wall_s": round(wall, 4),
        "load1_before": round(a.load1, 2),
        "load1_after": round(b.load1, 2),
        "own_cores": round(own_s / wall, 3),
        "busy": busy,
    }


class Monitor:
    """Load record of one benchmark run: a probe before the first side, then one window per side."""

    def __init__(
        self,
        *,
        busy_share: float = BUSY_SHARE,
        load_per_core: float = LOAD_PER_CORE,
        probe_s: float = PROBE_S,
    ) -> None:
        self.busy_share = busy_share
        self.load_per_core = load_per_core
        self.cpus = os.cpu_count() or 1
        self.windows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.first = Snapshot()
        if probe_s > 0:
            with self.side("probe (before the first side)"):
                time.sleep(probe_s)

    @contextmanager
    def side(self, name: str) -> Iterator[dict[str, Any]]:
        """Record the machine's load before and after the block; the window's record is yielded."""
        rec: dict[str, Any] = {"side": name}
        a = Snapshot()
        try:
            yield rec
        finally:
            rec.update(_window(a, Snapshot(), self.busy_share))
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
            (max(w["load1_before"], w["load1_after"]) - w["own_cores"], w)
            for w in self.windows
            if max(w["load1_before"], w["load1_after"]) - w["own_cores"] > self.load_per_core * self.cpus
        ]
        if loaded:
            foreign, w = max(loaded, key=lambda x: x[0])
            why.append(
                f"load average {max(w['load1_before'], w['load1_after']):.2f} on {self.cpus} cores "
                f"({foreign:.2f} beyond this benchmark's own {w['own_cores']:.2f}) during {w['side']}"
            )
        return why + self.notes

    def invalidate(self, reason: str) -> None:
        """Mark the run invalid for a reason the load record cannot see."""
        self.notes.append(reason)

    def record(self) -> dict[str, Any]:
        whole = {"side": "whole run", **_window(self.first, Snapshot(), self.busy_share)}
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
                "load_per_core_threshold": self.load_per_core,
                "windows": self.windows,
            },
        }

    def finish(self, result: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
        """The benchmark's result with both sides' settings and the load record added."""
        return {**result, "settings": settings, **self.record()}


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
