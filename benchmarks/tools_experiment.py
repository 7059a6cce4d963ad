"""Issue 36's experiment on ``arith_tools``: accuracy with tools against without, and turn-level credit
against outcome GRPO on the same tool rollouts, over paired seeds; with the share of tool calls that
fail over training.

Two SFT models are trained once (seed 0): on the tool traces (``--preset tools``) and on the same
problems answered at once (``data.task=arith_tools_direct``, no tool). Every RL run starts from one of
them (``model.path=SFT sft.steps=0``), so the variants differ only in what the comparison names and the
seeds only in RL sampling and data order:

* ``turn``: tool rollouts, exact per-turn values (``step_oracle``) with VinePPO's per-turn advantage
  (the preset);
* ``grpo``: the same tool rollouts, outcome GRPO (``process.enabled=false algorithm.advantage=grpo``);
* ``direct``: no tool (``rollout.mode=flat``, the direct SFT model), outcome GRPO.

Comparisons (paired by seed, final validation accuracy): tools on vs off = ``grpo`` - ``direct`` (the
same estimator on both sides); turn credit vs outcome = ``turn`` - ``grpo``. Each prints the per-seed
numbers, the mean difference, t with its degrees of freedom, two-sided p and the 95 % interval.

    python benchmarks/tools_experiment.py [--out runs/tools_experiment] [--seeds 0,1,2,3,4] [--steps 30] \\
        [--parallel 2] [--threads 1] [--sft-overrides key=value ...] [--json] [key=value ...]

A run whose ``metrics.jsonl`` already reaches the last step is not run again (``--summarize-only``
only reads the run directories).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import Monitor, emit
from longchain_experiment import _cli, _launch, paired_test

VARIANTS: dict[str, tuple[str, list[str]]] = {
    "turn": ("tools", []),
    "grpo": ("tools", ["process.enabled=false", "algorithm.advantage=grpo"]),
    "direct": (
        "direct",
        [
            "data.task=arith_tools_direct",
            "rollout.mode=flat",
            "process.enabled=false",
            "algorithm.advantage=grpo",
        ],
    ),
}
"""name -> (which SFT model it starts from, its overrides of the ``tools`` preset)."""
SFT: dict[str, list[str]] = {"tools": [], "direct": ["data.task=arith_tools_direct", "rollout.mode=flat"]}
"""SFT model -> its overrides of the ``tools`` preset."""
COMPARISONS = (("tools on vs off", "grpo", "direct"), ("turn credit vs outcome GRPO", "turn", "grpo"))
"""(name, variant, baseline): the paired differences reported."""


def _rows(run: Path) -> list[dict[str, Any]]:
    f = run / "metrics.jsonl"
    if not f.exists():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def _done(run: Path, steps: int) -> bool:
    return any(r.get("step") == steps and "val/accuracy" in r for r in _rows(run))


def run_all(args: argparse.Namespace) -> dict[str, list[Path]]:
    """Train the SFT models that are missing, then every (variant, seed) run not done yet."""
    threads = args.threads * args.parallel
    for name, extra in SFT.items():
        model = args.out / f"sft-{name}" / "model"
        if (model / "config.json").exists():
            continue
        cmd = [*_cli(), "sft", "--preset", "tools", "--out", str(model.parent), *extra]
        cmd += [f"trainer.threads={threads}", *args.sft_overrides]
        print("+", " ".join(cmd), flush=True)
        if _launch(cmd, args.out / f"sft-{name}.log", threads).wait() != 0:
            raise SystemExit(f"SFT failed: see {args.out / f'sft-{name}.log'}")
    runs: dict[str, list[Path]] = {}
    todo: list[tuple[list[str], Path]] = []
    for seed in args.seeds:
        for v, (sft, extra) in VARIANTS.items():
            run = args.out / f"{v}-s{seed}"
            runs.setdefault(v, []).append(run)
            if _done(run, args.steps):
                continue
            cmd = [
                *_cli(), "train", "--preset", "tools", "--out", str(run),
                f"model.path={args.out / f'sft-{sft}' / 'model'}", "sft.steps=0", f"trainer.seed={seed}",
                f"trainer.steps={args.steps}", f"trainer.val_every={args.val_every}", "trainer.save_every=0",
                "trainer.progress=false", f"trainer.threads={args.threads}", *extra, *args.overrides,
            ]  # fmt: skip
            todo.append((cmd, run))
    live: list[tuple[subprocess.Popen[bytes], Path]] = []
    while todo or live:
        while todo and len(live) < args.parallel:
            cmd, run = todo.pop(0)
            print("+", " ".join(cmd), flush=True)
            live.append((_launch(cmd, run.with_suffix(".log"), args.threads), run))
        time.sleep(1)
        for p, run in list(live):
            if p.poll() is not None:
                live.remove((p, run))
                print(f"{run.name}: exit {p.returncode}", flush=True)
                if p.returncode != 0:
                    raise SystemExit(f"{run.name} failed: see {run.with_suffix('.log')}")
    return runs


def failed_share(rows: list[dict[str, Any]], parts: int = 3) -> list[float]:
    """The share of tool calls that failed, in ``parts`` consecutive stretches of the training steps
    (nan where a stretch made no call): sum of failed calls / sum of calls, per-response rates weighted
    equally since every step samples the same number of responses."""
    steps = [r for r in rows if r.get("step", 0) > 0 and "tools/calls_per_response" in r]
    out = []
    for k in range(parts):
        chunk = steps[k * len(steps) // parts : (k + 1) * len(steps) // parts]
        calls = sum(r["tools/calls_per_response"] for r in chunk)
        failed = sum(r.get("tools/failed_calls_per_response", 0.0) for r in chunk)
        out.append(failed / calls if calls else float("nan"))
    return out


def per_run(run: Path) -> dict[str, Any]:
    """Validation accuracy after SFT (step 0), at every validated step and at the last, calls per
    response, the failed-call shares over training and the share of groups whose rewards were all
    equal (no outcome signal)."""
    rows = _rows(run)
    val = [r for r in rows if "val/accuracy" in r]
    calls = [r["tools/calls_per_response"] for r in rows if "tools/calls_per_response" in r]
    equal = [r["groups/all_equal_adv_frac"] for r in rows if "groups/all_equal_adv_frac" in r]
    sampled = [r["reward/mean"] for r in rows if r.get("step", 0) > 0 and "reward/mean" in r]
    k = max(1, len(sampled) // 4)
    return {
        # the training reward (sampled at rollout.temperature) over the first and the last quarter of steps
        "train_reward_first_quarter": sum(sampled[:k]) / k if sampled else float("nan"),
        "train_reward_last_quarter": sum(sampled[-k:]) / k if sampled else float("nan"),
        "val_curve": [[r["step"], r["val/accuracy"]] for r in val],
        "all_equal_groups": sum(equal) / len(equal) if equal else float("nan"),
        "val_sft": val[0]["val/accuracy"] if val else float("nan"),
        "val_final": val[-1]["val/accuracy"] if val else float("nan"),
        "final_step": val[-1]["step"] if val else -1,
        "calls_per_response": sum(calls) / len(calls) if calls else float("nan"),
        "failed_share": failed_share(rows),
    }


def summarize(runs: dict[str, list[Path]], seeds: list[int]) -> dict[str, Any]:
    table = {v: [per_run(r) for r in paths] for v, paths in runs.items()}
    print(
        f"{'variant':>8} {'seed':>4} {'val SFT':>8} {'val end':>8} {'calls/resp':>10}  failed-call share (thirds)"
    )
    for v, results in table.items():
        for seed, x in zip(seeds, results, strict=True):
            share = " ".join(f"{s:.3f}" for s in x["failed_share"])
            print(
                f"{v:>8} {seed:>4} {x['val_sft']:>8.3f} {x['val_final']:>8.3f} "
                f"{x['calls_per_response']:>10.2f}  {share}"
            )
    tests = {}
    for name, a, b in COMPARISONS:
        if a not in table or b not in table:
            continue
        t = paired_test([x["val_final"] for x in table[a]], [x["val_final"] for x in table[b]])
        tests[name] = {"variant": a, "baseline": b, **t}
        lo, hi = t["ci95"]
        print(
            f"{name} ({a} - {b}, final val accuracy): mean {t['mean_diff']:+.4f}, t = {t['t']:.3f}, "
            f"df = {t['df']}, p = {t['p']:.4f}, 95 % CI [{lo:+.4f}, {hi:+.4f}] over {t['n']} seeds"
        )
    for v, results in table.items():  # did RL move each variant from its SFT policy?
        t = paired_test([x["val_final"] for x in results], [x["val_sft"] for x in results])
        tests[f"{v}: end vs after SFT"] = {"variant": v, "baseline": "after SFT", **t}
        lo, hi = t["ci95"]
        print(
            f"{v}, end - after SFT: mean {t['mean_diff']:+.4f}, t = {t['t']:.3f}, df = {t['df']}, "
            f"p = {t['p']:.4f}, 95 % CI [{lo:+.4f}, {hi:+.4f}]"
        )
    return {"seeds": seeds, "runs": table, "tests": tests}


def plot(out: dict[str, Any], png: Path) -> None:
    """Validation accuracy against RL step: each seed thin, the seed mean thick, one colour per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (v, results) in enumerate(out["runs"].items()):
        curves = [x["val_curve"] for x in results if x["val_curve"]]
        for c in curves:
            ax.plot([p[0] for p in c], [p[1] for p in c], color=f"C{i}", alpha=0.25, lw=1)
        steps = sorted({p[0] for c in curves for p in c})
        mean = [sum(p[1] for c in curves for p in c if p[0] == st) / len(curves) for st in steps]
        ax.plot(steps, mean, color=f"C{i}", lw=2.5, marker="o", label=v)
    ax.set_xlabel("RL step")
    ax.set_ylabel("validation accuracy (greedy)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"arith_tools: seeds {out['seeds']} (thin) and their mean (thick)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/tools_experiment"))
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--val-every", type=int, default=10)
    ap.add_argument("--sft-overrides", nargs="*", default=[], metavar="key=value")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--summarize-only", action="store_true", help="do not run, only read the run dirs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--results-json", type=Path, help="write the per-seed numbers and tests here")
    ap.add_argument("--png", type=Path, help="plot validation accuracy per variant (seeds and mean)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="for every RL run")
    args = ap.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad[0]!r} (valid: {', '.join(VARIANTS)})")
    for v in set(VARIANTS) - set(variants):
        del VARIANTS[v]
    mon = Monitor()  # the machine's load around the runs: seconds per step only from a valid run
    if args.summarize_only:
        mon.invalidate("--summarize-only: seconds per step were measured when the runs ran, not here")
        runs = {v: [args.out / f"{v}-s{s}" for s in args.seeds] for v in VARIANTS}
    else:
        with mon.side(f"{args.parallel} runs at a time"):
            runs = run_all(args)
    out = summarize(runs, args.seeds)
    if args.results_json:
        args.results_json.parent.mkdir(parents=True, exist_ok=True)
        record = {"command": "python " + " ".join(sys.argv), **out}
        args.results_json.write_text(json.dumps(_strict(record), indent=1, allow_nan=False) + "\n")
    if args.png:
        plot(out, args.png)
    settings = {"seeds": args.seeds, "steps": args.steps, "parallel": args.parallel, "threads": args.threads}
    # strict JSON: nan (no call, one seed) as null; the verdict line, then the JSON last with --json
    emit(_strict(mon.finish({"benchmark": "tools_experiment", **out}, {"run": settings})), args.json)


def _strict(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_strict(v) for v in x]
    return x


if __name__ == "__main__":
    main()
