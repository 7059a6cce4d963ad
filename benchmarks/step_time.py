"""Time per RL step of the default job: this tree against an earlier commit, side by side in one run.

Both start from the same saved SFT model (trained once here, ``trainer.steps=0``) and run
``--steps`` RL steps of the ``--preset`` config with the same seed; the earlier commit is exported
with ``git archive`` into a temporary directory and run in a subprocess with its own ``src`` first
on ``PYTHONPATH`` (same venv). Runs alternate (``--repeats`` each) so a slow spell of the machine
hits both, and the machine's load is recorded around each (``benchmarks/_harness.py``; ``"valid":
false`` says the figures cannot be trusted, and why). Reported: the median of ``time/step_s`` over
steps 2.. (step 1 warms caches) per run, the median (and min/max) over repeats, and the ratio (ours /
earlier; < 1 is faster).

    python benchmarks/step_time.py [--rev 08aae9c] [--steps 8] [--repeats 3] [--json] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import Monitor, emit, spread

ROOT = Path(__file__).resolve().parents[1]
RUNNER = """
import sys, json
from pathlib import Path

from _harness import Monitor, emit, spread
from stepcredit.cli.common import apply_overrides, load_preset, setup_runtime
from stepcredit.config import from_dict
from stepcredit.trainer import train
setup_runtime()
preset, out, *over = sys.argv[1:]
train(from_dict(apply_overrides(load_preset(preset), over)), Path(out))
"""


def run(src: Path, preset: str, out: Path, overrides: list[str]) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", RUNNER, preset, str(out), *overrides], check=True, env=env)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["time/step_s"] for r in rows if r.get("step", 0) >= 2 and "time/step_s" in r]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rev", default="08aae9c", help="the earlier commit (default: main before the loop rewrite)"
    )
    p.add_argument("--preset", default="default")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()
    common = [
        f"trainer.steps={args.steps}",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
    ]
    with tempfile.TemporaryDirectory(prefix="step_time_") as tmp:
        work = Path(tmp)
        old = work / "old"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.rev, "src"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        sft = work / "sft"
        run(ROOT / "src", args.preset, sft, ["trainer.steps=0", "trainer.val_every=0", *args.overrides])
        model = sft / "checkpoints" / "final" / "model"
        start = [f"model.path={model}", "sft.steps=0", *common, *args.overrides]
        mon = Monitor()
        times: dict[str, list[float]] = {"ours": [], "earlier": []}
        for i in range(args.repeats):
            for name, src in (("ours", ROOT / "src"), ("earlier", old / "src")):
                with mon.side(name):
                    times[name].append(statistics.median(run(src, args.preset, work / f"{name}{i}", start)))
    ours, earlier = statistics.median(times["ours"]), statistics.median(times["earlier"])
    print(f"{args.preset}: {args.steps} RL steps from one SFT model, {args.repeats} alternating runs each")
    print(f"{'tree':<10} {'step_s (median)':>16}  runs")
    print(f"{'ours':<10} {ours:16.3f}  {', '.join(f'{t:.3f}' for t in times['ours'])}")
    print(f"{args.rev:<10} {earlier:16.3f}  {', '.join(f'{t:.3f}' for t in times['earlier'])}")
    print(f"ratio ours/earlier: {ours / earlier:.3f} (< 1 is faster)")
    side = {"preset": args.preset, "steps": args.steps, "overrides": [*start]}
    res = {
        "benchmark": "step_time",
        "rev": args.rev,
        "ours_step_s": ours,
        "earlier_step_s": earlier,
        "ours_step_s_spread": spread(times["ours"]),
        "earlier_step_s_spread": spread(times["earlier"]),
        "ratio": ours / earlier,
    }
    emit(
        mon.finish(res, {"ours": {**side, "src": "this tree"}, "earlier": {**side, "src": args.rev}}),
        args.json,
    )


if __name__ == "__main__":
    main()
