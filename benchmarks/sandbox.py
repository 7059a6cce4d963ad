"""The cost of isolation: the bubblewrap code sandbox vs the same runner without isolation, beside the
naive ``subprocess.run`` per test case that a user would write.

    python benchmarks/sandbox.py [--json] [--programs 24] [--cases 8] [--rounds 3]

Programs (three small competitive-programming ones: read stdin, compute, print) with ``--cases`` test
cases each are judged at concurrency 1 and 2 (programs in flight at once) by four runners:

* ``bubblewrap sandbox``: :class:`stepcredit.reward.verifiers.code.sandbox.Sandbox` (one sandbox per
  program: namespaces, its own uid, limits, private tmpfs, every case in a fresh child forked by the
  sandbox's runner, output capture, verdict), all programs in one ``check_many`` batch as the code
  reward calls it (the next program's sandbox starts while one runs: ``stepcredit.sandbox.lifecycle``);
* ``bubblewrap sandbox, one call per program``: the same, each program its own ``check`` call (as the
  ``python`` tool calls it): nothing is started ahead;
* ``runner without isolation``: the same host code and the same runner (``runner.py``: limits, a fork
  per case, the same protocol and verdicts, the same batch), started directly instead of under ``bwrap`` (no
  namespaces, no private tmpfs). BENCHMARK ONLY: this script rewrites a copy of the runner to use a
  private work directory instead of the namespace's ``/tmp`` and to kill only its own case's child
  instead of ``kill(-1)``, which outside a pid namespace would reach every process of the user; like
  the sandbox's runner it is compiled once and started as a ``.pyc``. The ratio sandbox / this runner
  is the cost of isolation itself;
* ``bare subprocess.run``: ``subprocess.run([python, "-I", "-S", "-B", file], input=...,
  capture_output=True, timeout=...)`` per test case, the same interpreter and comparison: a fresh
  interpreter per case, what a user writes without a sandbox.

Latency is per program (all its cases), measured around the call, or in a batch around the sandbox's
step for that program (p50/p95); throughput is programs
per second of wall time. The runners alternate (``--rounds``, an A B C A B C ... order) in one
process, and the machine's load is recorded around each (``benchmarks/_harness.py``); with
``--json`` the last stdout line is ``{"results": [...], "ratios": {...}, "settings": ..., "valid": ...,
"load": ...}``; each result row carries ``runner``, ``concurrency``, ``cases``, ``programs_per_s``
(median over rounds) with its min/max; ratios are sandbox / unisolated runner and sandbox / bare (and
``sandbox_per_call_vs_bare_throughput_ratio``, one call per program / bare).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _harness import Monitor, emit
from stepcredit.config import SandboxConfig
from stepcredit.reward.verifiers.code.sandbox import PASSED, CaseOutcome, Sandbox, TestCase
from stepcredit.sandbox import session as sandbox_session
from stepcredit.sandbox.cases import outputs_match
from stepcredit.sandbox.jail import RUNNER_LIMITS

BARE, PLAIN, BOX = "bare subprocess.run", "runner without isolation", "bubblewrap sandbox"
BOX1 = "bubblewrap sandbox, one call per program"

SUM = "print(sum(map(int, input().split())))"
SORT = "n = int(input())\nxs = sorted(map(int, input().split()))\nprint(' '.join(map(str, xs)))"
PRIMES = (
    "n = int(input())\nsieve = bytearray([1]) * (n + 1)\nsieve[0:2] = b'\\x00\\x00'\n"
    "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n"
    "        sieve[i*i::i] = bytearray(len(sieve[i*i::i]))\nprint(sum(sieve))"
)


def _primes_upto(n: int) -> int:
    sieve = bytearray([1]) * (n + 1)
    sieve[0:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
    return sum(sieve)


def make_programs(cases: int) -> list[tuple[str, str, list[TestCase]]]:
    """(name, code, cases): each case a different input with its expected output."""
    out = []
    sums = [" ".join(str(j) for j in range(i + 2)) for i in range(cases)]
    out.append(
        (
            "sum",
            SUM,
            [TestCase("stdio", stdin=s + "\n", expected=str(sum(map(int, s.split())))) for s in sums],
        )
    )
    sorts = [[(7 * j + i) % 11 for j in range(5 + i)] for i in range(cases)]
    out.append(
        (
            "sort",
            SORT,
            [
                TestCase(
                    "stdio",
                    stdin=f"{len(x)}\n{' '.join(map(str, x))}\n",
                    expected=" ".join(map(str, sorted(x))),
                )
                for x in sorts
            ],
        )
    )
    sizes = [20_000 + 5_000 * i for i in range(cases)]
    out.append(
        ("primes", PRIMES, [TestCase("stdio", stdin=f"{n}\n", expected=str(_primes_upto(n))) for n in sizes])
    )
    return out


_EMPTY_WORK = """def _fresh_tmp(limits):
    for top, dirs, files in os.walk("/tmp", topdown=False):
        for name in files:
            os.unlink(os.path.join(top, name))
        for name in dirs:
            os.rmdir(os.path.join(top, name))


"""
"""BENCHMARK ONLY: the unisolated runner's clean-up between cases (the benchmark's programs are benign)."""


def unisolated_runner_source(work: str | None = None) -> str:
    """BENCHMARK ONLY: the sandbox's runner rewritten to run outside a namespace, in the folder ``work``
    (None: the folder given as its 7th argument, so that one compiled copy serves every program). Each
    rewrite must apply (a changed runner fails here rather than running unsafely)."""
    src = sandbox_session._runner_source()
    where = repr(work) if work is not None else f"sys.argv[{len(RUNNER_LIMITS) + 1}]"
    # The runner mounts a fresh tmpfs on /tmp for each case in a mount namespace of its own; outside a
    # namespace it can do neither: no namespace, and the work folder is emptied between cases instead.
    fresh = re.search(r"^def _fresh_tmp\(limits\):\n.*?\n\n\n", src, re.MULTILINE | re.DOTALL)
    private = "        _private_mounts()\n"
    if fresh is None or src.count(private) != 1:
        raise SystemExit("benchmarks/sandbox.py: the runner's /tmp changed; update the rewrite")
    src = src.replace(fresh.group(0), _EMPTY_WORK).replace(private, "")
    # every other use of the sandbox's private /tmp (the cases' cwd: outside a namespace that would be
    # the host's /tmp) becomes the work folder
    named = len(re.findall(r"""["']/tmp""", src))
    if not named or src.count('"/tmp"') != named:
        raise SystemExit(
            'benchmarks/sandbox.py: the runner names /tmp otherwise than "/tmp"; update the rewrite'
        )
    src = src.replace('"/tmp"', where)
    # kill(-1) from pid 1 of a pid namespace ends the sandbox's processes; outside one it would
    # reach every process of the user: kill the case's own child (unreaped, so its pid is ours)
    old = "os.kill(-1, _SIGKILL)"
    if src.count(old) != 1:
        raise SystemExit(f"benchmarks/sandbox.py: the runner changed ({old!r}); update the rewrite")
    return src.replace(old, "os.kill(child, _SIGKILL)")


class TimedSandbox(Sandbox):
    """The sandbox with the time of each program it judges recorded (one program's step of a batch)."""

    def __init__(self, cfg: SandboxConfig) -> None:
        super().__init__(cfg)
        self.latencies: list[float] = []

    def _run_in(self, *args: Any) -> list[CaseOutcome]:
        t0 = time.perf_counter()
        try:
            return super()._run_in(*args)
        finally:
            self.latencies.append(time.perf_counter() - t0)


class UnisolatedSandbox(TimedSandbox):
    """BENCHMARK ONLY: the Sandbox's host code and runner, started without bubblewrap."""

    def _command(self, host_dir: str, limits: dict[str, Any]) -> list[str]:
        work = os.path.join(host_dir, "work")
        os.mkdir(work)
        os.chmod(work, 0o777)  # the runner may run as the sandbox's own uid
        name, data = unisolated_runner_file(self._python)
        runner = os.path.join(host_dir, name)
        with open(runner, "wb") as f:
            f.write(data)
        os.chmod(runner, 0o444)
        return [self._python, "-I", "-S", "-B", runner, *(str(limits[k]) for k in RUNNER_LIMITS), work]


@functools.lru_cache(maxsize=2)
def unisolated_runner_file(python: str) -> tuple[str, bytes]:
    """The unisolated runner compiled once, as the sandbox's runner is (``session.runner_file``)."""
    source = unisolated_runner_source().encode("utf-8")
    pyc = sandbox_session.compile_pyc(python, source, "runner_unisolated.py")
    return ("runner_unisolated.pyc", pyc) if pyc is not None else ("runner_unisolated.py", source)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


Job = tuple[str, str, list[TestCase]]


def _summary(lat: list[float], wall: float, ok: int, programs: int) -> dict[str, Any]:
    return {
        "p50_ms": 1000 * statistics.median(lat),
        "p95_ms": 1000 * percentile(lat, 0.95),
        "programs_per_s": programs / wall,
        "passed": ok,
        "programs": programs,
    }


def run_many(fn: Callable[[Job], bool], jobs: list[Job], concurrency: int) -> dict[str, Any]:
    """``fn(job)`` for every job, ``concurrency`` at a time; a program's latency is its call."""
    lat: list[float] = []
    ok = 0

    def one(job: Job) -> None:
        nonlocal ok
        t0 = time.perf_counter()
        passed = fn(job)
        lat.append(time.perf_counter() - t0)
        ok += bool(passed)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, jobs))
    return _summary(lat, time.perf_counter() - t0, ok, len(jobs))


def run_batch(runner: TimedSandbox, jobs: list[Job]) -> dict[str, Any]:
    """All programs as one ``check_many`` batch, the code reward's path (the next program's jail starts
    while one runs, a judged program's jail stops in the background); a program's latency runs from
    its worker taking it up to its verdicts."""
    runner.latencies = []
    t0 = time.perf_counter()
    verdicts = runner.check_many([(code, cases) for _, code, cases in jobs])
    wall = time.perf_counter() - t0
    ok = sum(all(o.status == PASSED for o in outs) for outs in verdicts)
    return _summary(runner.latencies, wall, ok, len(jobs))


def bare_runner(python: str, files: dict[str, str]) -> Callable[[Job], bool]:
    """What a user writes without a sandbox: a fresh interpreter per case, the same comparison."""

    def bare(job: Job) -> bool:
        name, _, cases = job
        passed = True
        for case in cases:
            p = subprocess.run(
                [python, "-I", "-S", "-B", files[name]],
                input=case.stdin.encode(),
                capture_output=True,
                timeout=10,
            )
            passed &= p.returncode == 0 and outputs_match(p.stdout.decode(), str(case.expected))
        return passed

    return bare


def sides(conc: int, jobs: list[Job], bare: Callable[[Job], bool]) -> dict[str, Callable[[list[Job]], Any]]:
    """Each runner at concurrency ``conc``: a function of the jobs to judge."""
    box = TimedSandbox(SandboxConfig(concurrency=conc))
    plain = UnisolatedSandbox(SandboxConfig(concurrency=conc))

    def per_call(job: Job) -> bool:
        _, code, cases = job
        return all(o.status == PASSED for o in box.check(code, cases))

    return {
        BARE: lambda js: run_many(bare, js, conc),
        PLAIN: lambda js: run_batch(plain, js),
        BOX: lambda js: run_batch(box, js),
        BOX1: lambda js: run_many(per_call, js, conc),
    }


def measure(mon: Monitor, jobs: list[Job], bare: Callable[[Job], bool], args: Any) -> list[dict[str, Any]]:
    results = []
    for conc in (1, 2):
        fns = sides(conc, jobs, bare)
        for fn in fns.values():  # warm the page cache for all
            fn(jobs[:3])
        acc = mon.alternate(
            {f"{label} c{conc}": (lambda fn=fn: fn(jobs)) for label, fn in fns.items()},
            repeats=args.rounds,
        )
        for label in fns:
            rs = acc[f"{label} c{conc}"]
            tput = [r["programs_per_s"] for r in rs]
            results.append(
                {
                    "runner": label,
                    "concurrency": conc,
                    "cases": args.cases,
                    "programs_per_s": statistics.median(tput),
                    "programs_per_s_min": min(tput),
                    "programs_per_s_max": max(tput),
                    "p50_ms": statistics.median(r["p50_ms"] for r in rs),
                    "p95_ms": max(r["p95_ms"] for r in rs),
                    "passed": sum(r["passed"] for r in rs),
                    "programs": sum(r["programs"] for r in rs),
                }
            )
    return results


def ratios_of(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    ratios = {}
    print(f"{'runner':<40}{'conc':>5}{'cases':>6}{'p50 ms':>10}{'p95 ms':>10}{'prog/s':>10}{'passed':>10}")
    for r in results:
        print(
            f"{r['runner']:<40}{r['concurrency']:>5}{r['cases']:>6}{r['p50_ms']:>10.1f}{r['p95_ms']:>10.1f}"
            f"{r['programs_per_s']:>10.1f}{r['passed']:>6}/{r['programs']}"
        )
    for conc in (1, 2):
        b, u, x, x1 = (
            next(r for r in results if r["runner"] == lab and r["concurrency"] == conc)
            for lab in (BARE, PLAIN, BOX, BOX1)
        )
        ratios[f"c{conc}"] = {
            "isolation_p50_latency_ratio": x["p50_ms"] / u["p50_ms"],
            "isolation_throughput_ratio": x["programs_per_s"] / u["programs_per_s"],
            "sandbox_vs_bare_p50_latency_ratio": x["p50_ms"] / b["p50_ms"],
            "sandbox_vs_bare_throughput_ratio": x["programs_per_s"] / b["programs_per_s"],
            "sandbox_per_call_vs_bare_throughput_ratio": x1["programs_per_s"] / b["programs_per_s"],
        }
        r = ratios[f"c{conc}"]
        print(
            f"concurrency {conc}: sandbox / runner without isolation: p50 latency "
            f"x{r['isolation_p50_latency_ratio']:.2f}, throughput x{r['isolation_throughput_ratio']:.2f}; "
            f"sandbox / bare subprocess.run: p50 x{r['sandbox_vs_bare_p50_latency_ratio']:.2f}, "
            f"throughput x{r['sandbox_vs_bare_throughput_ratio']:.2f} "
            f"(one call per program: x{r['sandbox_per_call_vs_bare_throughput_ratio']:.2f})"
        )
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument("--programs", type=int, default=24, help="programs judged per runner and concurrency")
    ap.add_argument("--cases", type=int, default=8, help="test cases per program")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the runners (median)")
    args = ap.parse_args()

    probe = Sandbox(SandboxConfig())
    why = probe.unavailable()
    if why is not None:
        print(f"sandbox unavailable: {why}", file=sys.stderr)
        return 1
    python = probe._python  # the same interpreter for both sides
    tmp = tempfile.mkdtemp(prefix="stepcredit-bench-")
    programs = make_programs(args.cases)
    files = {}
    for name, code, _ in programs:
        files[name] = os.path.join(tmp, f"{name}.py")
        with open(files[name], "w") as f:
            f.write(code)
    jobs = [programs[i % len(programs)] for i in range(args.programs)]
    mon = Monitor()
    try:
        results = measure(mon, jobs, bare_runner(python, files), args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = ratios_of(results)
    cfg = SandboxConfig()
    limits = {"timeout_s": cfg.timeout_s, "memory_mb": cfg.memory_mb, "cpu_s": cfg.cpu_s}
    common = {"python": python, "programs": args.programs, "cases": args.cases, "concurrency": [1, 2]}
    isolation = "bwrap namespaces, own uid, private tmpfs"
    settings = {
        BOX: {**common, **limits, "isolation": isolation, "fork_per_case": True, "path": "check_many"},
        BOX1: {
            **common,
            **limits,
            "isolation": isolation,
            "fork_per_case": True,
            "path": "check per program",
        },
        PLAIN: {**common, **limits, "isolation": "none (benchmark-only runner copy)", "fork_per_case": True},
        BARE: {**common, "timeout_s": 10, "isolation": "none", "fork_per_case": False, "exec_per_case": True},
    }
    out = {"benchmark": "sandbox", "results": results, "ratios": ratios, "python": python}
    emit(mon.finish(out, settings), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
