"""The cost of isolation: the bubblewrap code sandbox vs a bare ``subprocess.run`` per test case.

    python benchmarks/sandbox.py [--json] [--programs 24] [--cases 8]

Programs (three small competitive-programming ones: read stdin, compute, print) with ``--cases`` test
cases each are judged at concurrency 1 and 2 (programs in flight at once), once through
:class:`stepcredit.reward.verifiers.code.sandbox.Sandbox` (one sandbox per program: namespaces, its own
uid, limits, private tmpfs, every case in a fresh child from an emptied cwd, output capture, verdict)
and once as ``subprocess.run([python, "-I", "-S", "-B", file], input=..., capture_output=True,
timeout=...)`` per test case with the same interpreter and the same comparison. Latency is per
program (all its cases), measured around the call (p50/p95); throughput is programs per second of
wall time. Both runners alternate in one process, so load from elsewhere hits both alike. With
``--json`` the last stdout line is ``{"results": [...], "ratios": {...}}``; each result row carries
``runner``, ``concurrency``, ``cases`` and ``programs_per_s``; ratios are sandbox / bare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stepcredit.config import SandboxConfig
from stepcredit.reward.verifiers.code.cases import outputs_match
from stepcredit.reward.verifiers.code.sandbox import PASSED, Sandbox, TestCase

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


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


Job = tuple[str, str, list[TestCase]]


def run_many(fn: Callable[[Job], bool], jobs: list[Job], concurrency: int) -> dict[str, Any]:
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
    wall = time.perf_counter() - t0
    return {
        "p50_ms": 1000 * statistics.median(lat),
        "p95_ms": 1000 * percentile(lat, 0.95),
        "programs_per_s": len(jobs) / wall,
        "passed": ok,
        "programs": len(jobs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument("--programs", type=int, default=24, help="programs judged per runner and concurrency")
    ap.add_argument("--cases", type=int, default=8, help="test cases per program")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of both runners (summed)")
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

    jobs = [programs[i % len(programs)] for i in range(args.programs)]
    results = []
    for conc in (1, 2):
        box = Sandbox(SandboxConfig(concurrency=conc))

        def sandboxed(job: Job, box: Sandbox = box) -> bool:
            _, code, cases = job
            return all(o.status == PASSED for o in box.check(code, cases))

        run_many(bare, jobs[:3], conc)  # warm the page cache for both
        run_many(sandboxed, jobs[:3], conc)
        acc: dict[str, list[dict[str, Any]]] = {"bare subprocess.run": [], "bubblewrap sandbox": []}
        for _ in range(args.rounds):  # alternate, so that a burst of load elsewhere hits both
            for label, fn in (("bare subprocess.run", bare), ("bubblewrap sandbox", sandboxed)):
                acc[label].append(run_many(fn, jobs, conc))
        for label, rs in acc.items():
            wall = sum(r["programs"] / r["programs_per_s"] for r in rs)
            results.append(
                {
                    "runner": label,
                    "concurrency": conc,
                    "cases": args.cases,
                    "programs_per_s": sum(r["programs"] for r in rs) / wall,
                    "p50_ms": statistics.median(r["p50_ms"] for r in rs),
                    "p95_ms": max(r["p95_ms"] for r in rs),
                    "passed": sum(r["passed"] for r in rs),
                    "programs": sum(r["programs"] for r in rs),
                }
            )
    shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'runner':<22}{'conc':>5}{'cases':>6}{'p50 ms':>10}{'p95 ms':>10}{'prog/s':>10}{'passed':>10}")
    for r in results:
        print(
            f"{r['runner']:<22}{r['concurrency']:>5}{r['cases']:>6}{r['p50_ms']:>10.1f}{r['p95_ms']:>10.1f}"
            f"{r['programs_per_s']:>10.1f}{r['passed']:>6}/{r['programs']}"
        )
    ratios = {}
    for conc in (1, 2):
        b, s = (
            next(r for r in results if r["runner"] == lab and r["concurrency"] == conc)
            for lab in ("bare subprocess.run", "bubblewrap sandbox")
        )
        ratios[f"c{conc}"] = {
            "p50_latency_ratio": s["p50_ms"] / b["p50_ms"],
            "throughput_ratio": s["programs_per_s"] / b["programs_per_s"],
        }
        print(
            f"concurrency {conc}: sandbox/bare p50 latency x{ratios[f'c{conc}']['p50_latency_ratio']:.2f}, "
            f"throughput x{ratios[f'c{conc}']['throughput_ratio']:.2f}"
        )
    if args.json:
        print(json.dumps({"results": results, "ratios": ratios, "python": python}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
