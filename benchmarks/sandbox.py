"""The cost of isolation: the bubblewrap code sandbox vs a bare ``subprocess.run`` of the same programs.

    python benchmarks/sandbox.py [--json] [--runs 24]

Three small competitive-programming programs (read stdin, compute, print) are each run ``--runs``
times per setting, at concurrency 1 and 2, once through :class:`stepcredit.reward.verifiers.code.sandbox.Sandbox`
(namespaces, own uid, limits, private tmpfs, output capture, verdict) and once as
``subprocess.run([python, "-I", "-S", "-B", file], input=..., capture_output=True, timeout=...)`` with
the same interpreter. Latency is per test case, measured around the call (p50/p95); throughput is
programs per second of wall time. The ratio columns are sandbox / bare. With ``--json`` the last
stdout line is ``{"results": [...], "ratios": {...}}``.
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stepcredit.config import SandboxConfig
from stepcredit.reward.verifiers.code.sandbox import PASSED, Sandbox, TestCase

PROGRAMS: list[tuple[str, str, str, str]] = [
    ("sum", "print(sum(map(int, input().split())))", "1 2 3 4 5\n", "15"),
    (
        "sort",
        "n = int(input())\nxs = sorted(map(int, input().split()))\nprint(' '.join(map(str, xs)))",
        "5\n5 3 1 4 2\n",
        "1 2 3 4 5",
    ),
    (
        "primes",
        "n = int(input())\nsieve = bytearray([1]) * (n + 1)\nsieve[0:2] = b'\\x00\\x00'\n"
        "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n        sieve[i*i::i] = bytearray(len(sieve[i*i::i]))\n"
        "print(sum(sieve))",
        "200000\n",
        "17984",
    ),
]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_many(fn: Any, jobs: list[tuple[str, str, str, str]], concurrency: int) -> dict[str, Any]:
    lat: list[float] = []
    ok = 0

    def one(job: tuple[str, str, str, str]) -> None:
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
        "runs": len(jobs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument("--runs", type=int, default=24, help="runs of each program per setting")
    args = ap.parse_args()

    probe = Sandbox(SandboxConfig())
    why = probe.unavailable()
    if why is not None:
        print(f"sandbox unavailable: {why}", file=sys.stderr)
        return 1
    python = probe._python  # the same interpreter for both sides
    tmp = tempfile.mkdtemp(prefix="stepcredit-bench-")
    files = {}
    for name, code, _, _ in PROGRAMS:
        files[name] = os.path.join(tmp, f"{name}.py")
        with open(files[name], "w") as f:
            f.write(code)

    def bare(job: tuple[str, str, str, str]) -> bool:
        name, _, stdin, expected = job
        p = subprocess.run(
            [python, "-I", "-S", "-B", files[name]], input=stdin.encode(), capture_output=True, timeout=10
        )
        return p.returncode == 0 and p.stdout.decode().strip() == expected

    jobs = [p for _ in range(args.runs) for p in PROGRAMS]
    results = []
    for conc in (1, 2):
        box = Sandbox(SandboxConfig(concurrency=conc))

        def sandboxed(job: tuple[str, str, str, str], box: Sandbox = box) -> bool:
            _, code, stdin, expected = job
            return box.judge(code, TestCase("stdio", stdin=stdin, expected=expected)).status == PASSED

        run_many(bare, jobs[:3], conc)  # warm the page cache for both
        run_many(sandboxed, jobs[:3], conc)
        for label, fn in (("bare subprocess.run", bare), ("bubblewrap sandbox", sandboxed)):
            r = run_many(fn, jobs, conc)
            results.append({"runner": label, "concurrency": conc, **r})
    shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'runner':<22}{'conc':>5}{'p50 ms':>10}{'p95 ms':>10}{'prog/s':>10}{'passed':>10}")
    for r in results:
        print(
            f"{r['runner']:<22}{r['concurrency']:>5}{r['p50_ms']:>10.1f}{r['p95_ms']:>10.1f}"
            f"{r['programs_per_s']:>10.1f}{r['passed']:>6}/{r['runs']}"
        )
    ratios = {}
    for conc in (1, 2):
        b, s = (
            next(r for r in results if r["runner"] == lab and r["concurrency"] == conc)
            for lab in ("bare subprocess.run", "bubblewrap sandbox")
        )
        ratios[f"c{conc}"] = {
            "p50_latency_ratio": s["p50_ms"] / b["p50_ms"],
            "p95_latency_ratio": s["p95_ms"] / b["p95_ms"],
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
