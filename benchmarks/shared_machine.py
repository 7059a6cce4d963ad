"""A run on a machine shared with other work: RL steps of the default job alone and beside busy processes.

Trains one SFT model first (``trainer.steps=0``), then runs ``--steps`` RL steps from it through the
command line (``stepcredit train`` in a subprocess, so the process starts as a user's does: OpenMP's
wait policy is chosen before torch loads, ``stepcredit.runtime``), in alternation (``--repeats``
rounds): *alone*, then *beside* ``--busy`` processes running ``python -c "while True: pass"``. Each run
gives the median ``time/step_s`` over steps 2.. (step 1 warms caches); reported: the median per side and
the slowdown ratio beside/alone, next to the ratio a run would show if it slowed only in proportion to
the CPU it gets (``threads`` of ours and ``busy`` spinners sharing the usable cores fairly:
``(threads + busy) / cores`` when that exceeds 1). Issue 45 measured 30x and more before the fix.

``--policies AUTO,PASSIVE,ACTIVE,SPIN300000`` runs both sides under each OpenMP setting: ``AUTO`` as the
command line chooses it, ``PASSIVE``/``ACTIVE`` as ``OMP_WAIT_POLICY``, ``SPIN<N>`` as libgomp's
``GOMP_SPINCOUNT`` (``SPIN300000`` is libgomp's default, the behaviour issue 45 measured); each has its
own ratio.

The spinners are this benchmark's own children: the load record (``benchmarks/_harness.py``) counts them
as planted load, so ``"valid": false`` means other work beyond them was on the machine.

    python benchmarks/shared_machine.py [--steps 6] [--repeats 2] [--busy 2] [--policies AUTO] [--json] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _harness import Monitor, emit, spread

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SPIN = "while True: pass"


def _env(policy: str | None) -> dict[str, str]:
    """The environment of one run: ``AUTO`` (or None) leaves OpenMP's settings to the command line, as a
    user gets them; ``PASSIVE`` / ``ACTIVE`` set ``OMP_WAIT_POLICY``; ``SPIN<N>`` sets libgomp's
    ``GOMP_SPINCOUNT=N`` (busy-wait iterations before a thread sleeps; libgomp's own default is 300000)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if policy is None or policy == "AUTO":
        return env
    if policy.startswith("SPIN"):
        env["GOMP_SPINCOUNT"] = str(int(policy[4:]))
    else:
        env["OMP_WAIT_POLICY"] = policy
    return env


def train(out: Path, overrides: list[str], policy: str | None = None) -> list[float]:
    """``stepcredit train`` into ``out``; the step times of steps 2.. from its metrics."""
    cmd = [sys.executable, "-m", "stepcredit.cli.main", "train", "--out", str(out), *overrides]
    proc = subprocess.run(cmd, env=_env(policy), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"shared_machine: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["time/step_s"] for r in rows if r.get("step", 0) >= 2 and "time/step_s" in r]


@contextmanager
def spinners(n: int) -> Iterator[list[int]]:
    """``n`` busy processes for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def proportional_ratio(threads: int, busy: int, cores: int) -> float:
    """The slowdown of a run of ``threads`` busy threads beside ``busy`` spinners on ``cores`` usable
    cores when every runnable thread gets an equal share: ``(threads + busy) / cores`` (>= 1)."""
    return max(1.0, (threads + busy) / max(1, min(cores, threads + busy)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="default")
    p.add_argument("--steps", type=int, default=6, help="RL steps per run (step 1 is not timed)")
    p.add_argument("--repeats", type=int, default=2, help="alternating rounds of alone / beside")
    p.add_argument("--busy", type=int, default=2, help='processes running "while True: pass" beside')
    p.add_argument(
        "--policies",
        default="AUTO",
        help="OpenMP settings to run: AUTO (the command line's choice), PASSIVE, ACTIVE, SPIN<N> (GOMP_SPINCOUNT)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be >= 2 (step 1 is not timed)")
    policies = [x.strip().upper() for x in args.policies.split(",") if x.strip()]

    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict
    from stepcredit.runtime import thread_count, usable_cpus

    cfg = from_dict(apply_overrides(load_preset(args.preset), list(args.overrides)))
    threads, cores = thread_count(cfg.trainer.threads), usable_cpus()
    common = ["--preset", args.preset, *args.overrides]
    rl = [
        "sft.steps=0",
        f"trainer.steps={args.steps}",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.tensorboard=false",
    ]
    with tempfile.TemporaryDirectory(prefix="shared_machine_") as tmp:
        work = Path(tmp)
        train(work / "sft", [*common, "trainer.steps=0", "trainer.val_every=0", "trainer.progress=false"])
        start = [*common, f"model.path={work / 'sft' / 'checkpoints' / 'final' / 'model'}", *rl]
        mon = Monitor()
        times: dict[str, list[float]] = {}
        for i in range(args.repeats):
            for policy in policies:
                for side in ("alone", "beside"):
                    name = f"{policy.lower()} {side}"
                    with mon.side(name):
                        if side == "alone":
                            steps = train(work / f"{policy}-{side}-{i}", start, policy)
                        else:
                            with spinners(args.busy):
                                steps = train(work / f"{policy}-{side}-{i}", start, policy)
                    times.setdefault(name, []).append(statistics.median(steps))
    expected = proportional_ratio(threads, args.busy, cores)
    res: dict[str, object] = {
        "benchmark": "shared_machine",
        "preset": args.preset,
        "threads": threads,
        "cores": cores,
        "busy": args.busy,
        "proportional_ratio": expected,
    }
    print(
        f"{args.preset}: {args.steps} RL steps from one SFT model, {threads} threads on {cores} usable "
        f"cores, alone and beside {args.busy} busy processes, {args.repeats} alternating rounds"
    )
    print(f"{'side':<18} {'step_s (median)':>16}  runs")
    for name, ts in times.items():
        print(f"{name:<18} {statistics.median(ts):16.3f}  {', '.join(f'{t:.3f}' for t in ts)}")
    for policy in policies:
        alone = statistics.median(times[f"{policy.lower()} alone"])
        beside = statistics.median(times[f"{policy.lower()} beside"])
        key = policy.lower()
        res[f"{key}_alone_step_s"] = spread(times[f"{key} alone"])
        res[f"{key}_beside_step_s"] = spread(times[f"{key} beside"])
        res[f"{key}_slowdown"] = beside / alone
        print(
            f"OpenMP {policy}: slowdown beside/alone {beside / alone:.2f}x "
            f"(in proportion to the CPU it gets: {expected:.2f}x)"
        )
    side_settings = {"preset": args.preset, "overrides": start, "threads": threads}
    settings = {
        f"{pol.lower()} {s}": {**side_settings, "busy": args.busy if s == "beside" else 0}
        for pol in policies
        for s in ("alone", "beside")
    }
    emit(mon.finish(res, settings), args.json)


if __name__ == "__main__":
    main()
