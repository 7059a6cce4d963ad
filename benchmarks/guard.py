"""Benchmark guard: the fast benchmarks run alone, this commit against the previous one, every ratio
recorded with its commit in ``benchmarks/history.jsonl``, and the ratios that moved beyond their
run-to-run spread named.

    python benchmarks/guard.py [--base HEAD~1] [--rounds 2] [--only verifier,sandbox] [--slow] [--no-record]

What it does, in order:

1. **Alone or not at all.** Before the first run it watches the machine for ``--probe-s`` seconds:
   the CPU time of every process that is not its own is *foreign* (the harness's window reader,
   ``benchmarks/_harness.py:window``). Own are this process and the benchmark runs it started,
   recognised by the mark in their environment (``STEPCREDIT_BENCH_GUARD``) wherever they end up in
   the process tree (Ray's workers outlive ``ray.shutdown`` for a moment, re-parented to init). Above
   ``--max-foreign-cores`` (default 0.25 of a core) it refuses (exit 3) unless ``--allow-busy``; then
   every record says ``"valid": false``. Each benchmark run gets the same check over its own window.
2. **Alternation with the previous commit.** ``--base`` (default ``HEAD~1``) is checked out as a
   ``git worktree`` in a temporary folder; each benchmark that compares two sides (ours against a
   competitor: every ratio here) runs head, base, head, base, ... (``--rounds`` of each), each with its
   own tree's ``src`` first on ``PYTHONPATH``, so a slow minute of the machine hits both commits.
   A benchmark the base does not have runs on head only. A clean head runs from a checkout of its
   commit too (a commit made during the run changes nothing); uncommitted changes run from the working
   tree and are recorded as ``<commit>+dirty``.
3. **A record per benchmarked commit.** One line per commit per guard run is appended to ``--history``
   (``benchmarks/history.jsonl``): commit, date, the runs' validity, and each ratio's values (one per
   round) with their median.
4. **What moved.** For each ratio, head's median against base's (or, without a base run, the last valid
   record of another commit in the history): it *moved* when the difference exceeds the run-to-run
   spread, the widest of head's range, base's range and the ratio's typical range in earlier records
   (:func:`moved`). Each line says slipped or improved (by the ratio's direction) and whether the head
   meets the ratio's goal. Exit 0, or 1 when a ratio slipped (``--fail-on-slip``).

The suite (:data:`SUITE`): each benchmark's script, short arguments and the JSON paths of its ratios
(:func:`pick`); ``--suite FILE`` replaces it (a JSON list). ``process_cost`` trains: only with ``--slow``
(and ``--process-model DIR``, a saved SFT model of the ``midchain_process`` preset).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from _harness import BUSY_SHARE, GUARD_ENV, Snapshot, mark, window

REPO = Path(__file__).resolve().parents[1]
HISTORY = REPO / "benchmarks" / "history.jsonl"
MAX_FOREIGN_CORES = 0.25  # foreign CPU (cores, over a window) above which a window is not alone


@dataclass(frozen=True)
class Ratio:
    """One figure of a benchmark's JSON that the guard follows."""

    name: str
    """Its name in the history and the report, ``benchmark.what``."""
    path: str
    """Where it is in the JSON (:func:`pick`)."""
    higher_is_better: bool = True
    """Its direction: a speed-up is better higher, a cost ratio lower."""
    goal: float | None = None
    """The mark it should meet (at least, or at most when lower is better); None: no mark."""


@dataclass(frozen=True)
class Bench:
    """A benchmark of the suite."""

    name: str
    script: str
    """Its file in ``benchmarks/`` (the base tree's own copy runs on the base side)."""
    args: list[str]
    """Arguments besides ``--json``."""
    ratios: list[Ratio]
    two_sided: bool = True
    """It compares two sides in one run (ours against a competitor), so it runs on both commits in
    alternation; False: head only."""
    slow: bool = False
    """It trains: only with ``--slow``."""
    timeout_s: float = 900.0
    env: dict[str, str] = field(default_factory=dict)
    venv: str = ""
    """``verl``: it imports verl, so it runs with ``--verl-python`` (the verl tests' venv)."""


SUITE: list[Bench] = [
    Bench(
        "verifier",
        "verifier.py",
        ["--repeats", "1"],
        [
            Ratio("verifier.gsm8k_speedup", "gsm8k.all.speedup", goal=30.0),
            Ratio("verifier.math500_speedup", "math500.all.speedup", goal=4.0),
            Ratio("verifier.gsm8k_speedup_cpu", "gsm8k.all.speedup_cpu", goal=30.0),
            Ratio("verifier.math500_speedup_cpu", "math500.all.speedup_cpu", goal=4.0),
        ],
    ),
    Bench(
        "advantages",
        "advantages.py",
        ["--shapes", "1024x4096", "--runs", "5", "--threads", "1"],
        [
            Ratio("advantages.reinforce_pp_1024x4096", "results[estimator=reinforce_pp,shape=1024x4096].speedup", goal=20.0),
            Ratio("advantages.grpo_1024x4096", "results[estimator=grpo,shape=1024x4096].speedup"),
            Ratio("advantages.gae_1024x4096", "results[estimator=gae,shape=1024x4096].speedup"),
        ],
        venv="verl",
    ),
    Bench(
        "sandbox",
        "sandbox.py",
        ["--programs", "12", "--rounds", "2"],
        [
            Ratio("sandbox.vs_bare_c1", "ratios.c1.sandbox_vs_bare_throughput_ratio", goal=2.0),
            Ratio("sandbox.vs_bare_c2", "ratios.c2.sandbox_vs_bare_throughput_ratio"),
            Ratio("sandbox.isolation_c1", "ratios.c1.isolation_throughput_ratio"),
        ],
    ),
    Bench(
        "agent_throughput",
        "agent_throughput.py",
        ["--repeats", "2"],
        [
            Ratio("agent.thread_per_s", "thread.per_s", goal=150_000),
            Ratio("agent.process_per_s", "process.per_s", goal=150_000),
            Ratio("agent.ray_per_s", "ray.per_s", goal=50_000),
        ],
    ),
    Bench(
        "process_cost",
        "process_cost.py",
        ["--steps", "1", "--skip-reward-stage", "--continuation-rows", "4", "--tree-steps", "4", "--repeats", "2",
         "process.value_estimator=forced_answer_logprob", "algorithm.advantage=grpo_process"],
        [
            Ratio("process_cost.tree_vs_flat", "tree_vs_flat", higher_is_better=False, goal=1.2),
            Ratio("process_cost.monte_carlo_vs_flat", "monte_carlo_vs_flat", higher_is_better=False),
        ],
        slow=True,
        timeout_s=3600.0,
    ),
]  # fmt: skip
"""The fast benchmarks and the ratios followed (goals from the issues that set them)."""


# ------------------------------------------------------------------------------ reading the JSON
def pick(obj: Any, path: str) -> float | None:
    """The number at ``path`` in a benchmark's JSON: dotted keys; ``key[a=x,b=y]`` is the first element
    of the list ``obj[key]`` whose fields match. None when it is not there (or not a number)."""
    cur = obj
    for part in path.split("."):
        key, _, sel = part.partition("[")
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
        if sel:
            want = dict(kv.split("=", 1) for kv in sel.rstrip("]").split(","))
            if not isinstance(cur, list):
                return None
            cur = next((x for x in cur if all(str(x.get(k)) == v for k, v in want.items())), None)
            if cur is None:
                return None
    if isinstance(cur, bool) or not isinstance(cur, int | float):
        return None
    return float(cur)


def last_json(stdout: str) -> dict[str, Any] | None:
    """The JSON object on the last non-empty line of a benchmark's output (every script prints it last)."""
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        out = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return out if isinstance(out, dict) else None


# ------------------------------------------------------------------------------ being alone
GUARD_MARK = f"{os.getpid()}-{time.time_ns()}"
"""This guard's ``STEPCREDIT_BENCH_GUARD``, in every benchmark run's environment (and passed on to what
it starts): processes holding it are the guard's own wherever they are in the process tree."""


def _snapshot() -> Snapshot:
    # own: this process and the marked runs with their descendants, not every child of this process
    # (a test's busy process started beside an in-process guard is foreign)
    snap = Snapshot(roots=set(), marks=frozenset({mark(GUARD_ENV, GUARD_MARK)}))
    snap.own.add(os.getpid())
    return snap


class Window:
    """Foreign CPU use between construction and ``stop()`` (the harness's window reader)."""

    def __init__(self) -> None:
        self.start = _snapshot()

    def stop(self) -> dict[str, Any]:
        w = window(self.start, _snapshot(), BUSY_SHARE)
        # per process (own ones recognised by their mark): the machine's total beyond ours would also
        # hold Ray workers orphaned and reaped by init at ray.shutdown, which no snapshot sees
        return {
            "wall_s": w["wall_s"],
            "own_cores": w["own_cores"],
            "foreign_cores": w["foreign_cores"],
            "busy": w["busy"],
        }


def probe(seconds: float) -> dict[str, Any]:
    """Foreign CPU use while this process sleeps for ``seconds``."""
    w = Window()
    time.sleep(seconds)
    return w.stop()


# ------------------------------------------------------------------------------ what moved
@dataclass(frozen=True)
class Move:
    name: str
    head: list[float]
    reference: list[float]
    reference_from: str
    """``base <commit>`` (alternated in this run) or ``history <commit>``."""
    spread: float
    moved: bool
    better: bool
    """The move is in the ratio's good direction."""
    goal: float | None
    meets_goal: bool | None
    spread_known: bool = True
    """False when neither side was repeated and the history has no spread of the ratio: nothing says
    how far it moves by itself, so it is never called moved."""

    def line(self) -> str:
        h, r = statistics.median(self.head), statistics.median(self.reference)
        verdict = ("IMPROVED" if self.better else "SLIPPED") if self.moved else "steady"
        if not self.spread_known:
            verdict = "no spread known (one round each, no history): rerun with --rounds 2 or more"
        goal = "" if self.goal is None else f"  goal {self.goal:g}: {'met' if self.meets_goal else 'NOT MET'}"
        return (
            f"{self.name:<38} {self.reference_from:<22} {r:>10.4g} [{min(self.reference):.4g}, "
            f"{max(self.reference):.4g}] -> head {h:>10.4g} [{min(self.head):.4g}, {max(self.head):.4g}]  "
            f"diff {h - r:+.4g} vs spread {self.spread:.4g}: {verdict}{goal}"
        )


def _range(xs: list[float]) -> float:
    return max(xs) - min(xs) if xs else 0.0


def historical_spread(history: list[dict[str, Any]], name: str) -> float:
    """The ratio's typical run-to-run range: the median, over the valid records with at least two
    values of it, of (max - min) of those values; 0 without such records."""
    ranges = [
        _range(vals)
        for rec in history
        if rec.get("valid")
        for vals in [rec.get("ratios", {}).get(name, {}).get("values", [])]
        if len(vals) >= 2
    ]
    return statistics.median(ranges) if ranges else 0.0


def reference_from_history(
    history: list[dict[str, Any]], name: str, commit: str
) -> tuple[str, list[float]] | None:
    """The last valid record of another commit that has values of the ratio: (commit, values)."""
    for rec in reversed(history):
        vals = rec.get("ratios", {}).get(name, {}).get("values", [])
        if rec.get("valid") and rec.get("commit") != commit and vals:
            return rec["commit"], vals
    return None


def moved(
    ratio: Ratio,
    head: list[float],
    reference: list[float],
    *,
    reference_from: str,
    history: list[dict[str, Any]],
) -> Move:
    """Did ``ratio`` move from ``reference`` to ``head`` beyond its run-to-run spread?

    The spread is the widest of the two sides' own ranges (max - min over rounds) and the ratio's
    typical range in the history (:func:`historical_spread`): a difference of medians no larger than
    what repeating the same commit gives is noise. Moved when ``|median(head) - median(reference)|``
    exceeds it."""
    h, r = statistics.median(head), statistics.median(reference)
    past = historical_spread(history, ratio.name)
    spread = max(_range(head), _range(reference), past)
    known = len(head) >= 2 or len(reference) >= 2 or past > 0
    diff = h - r
    meets = None if ratio.goal is None else (h >= ratio.goal if ratio.higher_is_better else h <= ratio.goal)
    return Move(
        ratio.name,
        head,
        reference,
        reference_from,
        spread,
        known and abs(diff) > spread,
        (diff > 0) == ratio.higher_is_better,
        ratio.goal,
        meets,
        known,
    )


def read_history(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise SystemExit(f"guard: {path}:{i} is not a JSON line; fix or remove it") from None
    return out


def compare(
    suite: list[Bench],
    head_values: dict[str, list[float]],
    base_values: dict[str, list[float]],
    *,
    head_commit: str,
    base_commit: str | None,
    history: list[dict[str, Any]],
) -> list[Move]:
    """A :class:`Move` per ratio with head values: against the base run where there is one, else
    against the history's last valid record of another commit; ratios with neither are left out."""
    out = []
    for b in suite:
        for r in b.ratios:
            head = head_values.get(r.name, [])
            if not head:
                continue
            if base_values.get(r.name):
                out.append(
                    moved(
                        r,
                        head,
                        base_values[r.name],
                        reference_from=f"base {str(base_commit)[:9]}",
                        history=history,
                    )
                )
                continue
            ref = reference_from_history(history, r.name, head_commit)
            if ref is not None:
                out.append(moved(r, head, ref[1], reference_from=f"history {ref[0][:9]}", history=history))
    return out


# ------------------------------------------------------------------------------ running
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def run_one(bench: Bench, tree: Path, max_foreign: float, python: str = sys.executable) -> dict[str, Any]:
    """One run of ``bench`` from ``tree`` (its ``src`` first on the path) by ``python``: its ratios,
    the script's own validity and this window's foreign CPU use."""
    script = tree / "benchmarks" / bench.script
    env = {
        **os.environ,
        **bench.env,
        "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree / "benchmarks")]),
        GUARD_ENV: GUARD_MARK,
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    if "STEPCREDIT_SHARED_DATA" not in env and (REPO.parent / "shared" / "data").is_dir():
        env["STEPCREDIT_SHARED_DATA"] = str(REPO.parent / "shared" / "data")
    w = Window()
    try:
        proc = subprocess.run(
            [python, str(script), *bench.args, "--json"],
            cwd=tree / "benchmarks",
            env=env,
            capture_output=True,
            text=True,
            timeout=bench.timeout_s,
        )
        out, err, rc = last_json(proc.stdout), proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = None, f"timed out after {bench.timeout_s:.0f} s", -1
    win = w.stop()
    values = {r.name: v for r in bench.ratios if out is not None and (v := pick(out, r.path)) is not None}
    alone = win["foreign_cores"] <= max_foreign
    return {
        "ok": rc == 0 and out is not None,
        "error": None
        if rc == 0 and out is not None
        else (err.strip().splitlines() or ["no output"])[-1][:300],
        "values": values,
        "script_valid": None if out is None else out.get("valid"),
        "alone": alone,
        **win,
    }


def record(commit: str, role: str, runs: list[tuple[Bench, dict[str, Any]]], guard_id: str) -> dict[str, Any]:
    """The history line of one commit: every ratio's values (one per round) and whether every run was
    alone and valid by its own harness."""
    ratios: dict[str, dict[str, Any]] = {}
    for _, r in runs:
        for k, v in r["values"].items():
            ratios.setdefault(k, {"values": []})["values"].append(v)
    for v in ratios.values():
        v["median"] = statistics.median(v["values"])
    why = sorted(
        {f"{b.name}: {r['error']}" for b, r in runs if not r["ok"]}
        | {f"{b.name}: foreign CPU {r['foreign_cores']:.2f} cores" for b, r in runs if not r["alone"]}
        | {f"{b.name}: its harness said not valid" for b, r in runs if r["script_valid"] is False}
    )
    return {
        "commit": commit,
        "role": role,
        "guard_run": guard_id,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "valid": not why and bool(runs),
        "reason": "; ".join(why) or None,
        "benchmarks": sorted({b.name for b, _ in runs}),
        "foreign_cores_max": max((r["foreign_cores"] for _, r in runs), default=0.0),
        "ratios": ratios,
    }


def load_suite(path: Path | None) -> list[Bench]:
    if path is None:
        return SUITE
    raw = json.loads(path.read_text())
    return [
        Bench(
            b["name"],
            b["script"],
            list(b.get("args", [])),
            [Ratio(**r) for r in b["ratios"]],
            two_sided=b.get("two_sided", True),
            slow=b.get("slow", False),
            timeout_s=b.get("timeout_s", 900.0),
            env=b.get("env", {}),
            venv=b.get("venv", ""),
        )
        for b in raw
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD~1", help="the commit to alternate with (default HEAD~1)")
    ap.add_argument("--no-base", action="store_true", help="head only; compare with the history")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each benchmark per commit, alternated")
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    ap.add_argument("--slow", action="store_true", help="also the benchmarks that train (process_cost)")
    ap.add_argument("--process-model", default="", help="saved SFT model for process_cost (--model)")
    ap.add_argument(
        "--verl-python",
        default=str(REPO / ".venv-verl" / "bin" / "python"),
        help="the interpreter of benchmarks that import verl (advantages); default the repo's .venv-verl",
    )
    ap.add_argument("--history", type=Path, default=HISTORY)
    ap.add_argument("--no-record", action="store_true", help="do not append to the history")
    ap.add_argument("--repo", type=Path, default=REPO, help="the repository whose HEAD is benchmarked")
    ap.add_argument("--suite", type=Path, help="a JSON list of benchmarks instead of the built-in suite")
    ap.add_argument("--probe-s", type=float, default=2.0)
    ap.add_argument("--max-foreign-cores", type=float, default=MAX_FOREIGN_CORES)
    ap.add_argument(
        "--allow-busy", action="store_true", help="run on a busy machine (records marked not valid)"
    )
    ap.add_argument("--fail-on-slip", action="store_true", help="exit 1 when a ratio slipped")
    a = ap.parse_args(argv)
    with contextlib.suppress(AttributeError, ValueError):  # each run's line as it ends, also into a file
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]

    suite = [b for b in load_suite(a.suite) if a.slow or not b.slow]
    if a.only:
        names = set(a.only.split(","))
        unknown = names - {b.name for b in load_suite(a.suite)}
        if unknown:
            print(
                f"guard: unknown benchmark(s) {sorted(unknown)}; known: {[b.name for b in load_suite(a.suite)]}"
            )
            return 2
        suite = [b for b in load_suite(a.suite) if b.name in names]
    if a.process_model:
        model = str(Path(a.process_model).resolve())
        suite = [
            replace(b, args=["--model", model, *b.args]) if b.name == "process_cost" else b for b in suite
        ]
    elif any(b.name == "process_cost" for b in suite):
        print("guard: process_cost needs --process-model DIR (a saved midchain_process SFT model); left out")
        suite = [b for b in suite if b.name != "process_cost"]

    if any(b.venv == "verl" for b in suite) and not Path(a.verl_python).exists():
        print(
            f"guard: {a.verl_python} not found (make setup-verl, or --verl-python); verl benchmarks left out"
        )
        suite = [b for b in suite if b.venv != "verl"]
    repo = a.repo.resolve()
    try:
        head = _git(repo, "rev-parse", "HEAD")
        dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))
        base = None if a.no_base else _git(repo, "rev-parse", a.base)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"guard: git failed in {repo}: {(getattr(e, 'stderr', '') or str(e)).strip()}")
        return 2
    head_label = head + ("+dirty" if dirty else "")

    p = probe(a.probe_s)
    busy = p["foreign_cores"] > a.max_foreign_cores
    print(f"probe: other processes used {p['foreign_cores']:.2f} cores over {p['wall_s']:.1f} s "
          f"(limit {a.max_foreign_cores:.2f})")  # fmt: skip
    if busy and not a.allow_busy:
        print(
            "guard: REFUSED: the machine is not quiet (wait, or --allow-busy to record runs marked not valid)"
        )
        return 3

    guard_id = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    history = read_history(a.history)
    runs: dict[str, list[tuple[Bench, dict[str, Any]]]] = {"head": [], "base": []}
    tmp = Path(tempfile.mkdtemp(prefix="guard-"))
    base_tree = tmp / "base"
    # a clean head runs from a checkout of its commit; uncommitted changes from the tree (as +dirty)
    head_tree = repo if dirty else tmp / "head"
    checkouts = ([] if dirty else [(head_tree, head)]) + ([] if base is None else [(base_tree, base)])
    try:
        for tree, commit in checkouts:
            _git(repo, "worktree", "add", "--detach", str(tree), commit)
        for b in suite:
            sides = [("head", head_tree)]
            if base is not None and b.two_sided and (base_tree / "benchmarks" / b.script).exists():
                sides.append(("base", base_tree))
            for rnd in range(a.rounds):
                for role, tree in sides:
                    r = run_one(
                        b, tree, a.max_foreign_cores, a.verl_python if b.venv == "verl" else sys.executable
                    )
                    runs[role].append((b, r))
                    vals = (
                        ", ".join(f"{k.split('.', 1)[1]} {v:.4g}" for k, v in r["values"].items())
                        or r["error"]
                    )
                    top = ", ".join(f"{x['name']} {x['cores']:.2f}" for x in r["busy"][:3])
                    note = "" if r["alone"] else f"  NOT ALONE ({r['foreign_cores']:.2f} cores: {top})"
                    print(f"{b.name:<18} {role} round {rnd + 1}: {vals}{note}")
    finally:
        for tree, _ in checkouts:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True
            )
        shutil.rmtree(tmp, ignore_errors=True)

    recs = [record(head_label, "head", runs["head"], guard_id)]
    if runs["base"]:
        recs.append(record(base or "", "base", runs["base"], guard_id))
    if busy:
        for rec in recs:
            rec["valid"] = False
            rec["reason"] = "; ".join(
                filter(None, [f"probe: {p['foreign_cores']:.2f} foreign cores", rec["reason"]])
            )
    if not a.no_record:
        a.history.parent.mkdir(parents=True, exist_ok=True)
        with a.history.open("a") as f:
            for rec in recs:
                f.write(json.dumps(rec, sort_keys=True) + "\n")

    head_vals = {k: v["values"] for k, v in recs[0]["ratios"].items()}
    base_vals = {k: v["values"] for k, v in recs[1]["ratios"].items()} if len(recs) > 1 else {}
    moves = compare(suite, head_vals, base_vals, head_commit=head_label, base_commit=base, history=history)
    print(f"\nhead {head_label[:12]}" + (f" against base {base[:12]}" if base else "") +
          ("" if recs[0]["valid"] else f"  NOT VALID: {recs[0]['reason']}"))  # fmt: skip
    for m in moves:
        print(m.line())
    for name in sorted(set(head_vals) - {m.name for m in moves}):
        print(f"{name:<38} head {statistics.median(head_vals[name]):.4g}: nothing to compare with yet")
    slipped = [m for m in moves if m.moved and not m.better]
    print(f"moved beyond spread: {sum(m.moved for m in moves)} of {len(moves)}; slipped: "
          f"{', '.join(m.name for m in slipped) or 'none'}")  # fmt: skip
    return 1 if slipped and a.fail_on_slip else 0


if __name__ == "__main__":
    sys.exit(main())
