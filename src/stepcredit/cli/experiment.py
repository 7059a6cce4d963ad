"""``stepcredit experiment FILE.yaml``: run a pre-registered comparison of arms over paired seeds and
write its summary (:mod:`stepcredit.recipes.experiment`; docs/experiments.md)."""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

from stepcredit.errors import UserError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="the experiment file (arms, seeds, endpoint): experiments/*.yaml")
    p.add_argument("--out", type=Path, help="output directory (default: runs/experiments/<name>)")
    p.add_argument(
        "--jobs", type=int, default=1, help="runs at a time (on a GPU: several runs share the card)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (jobs x threads <= cores)")
    p.add_argument("--seeds", help="run only these of the file's seeds (a smoke run; marked incomplete)")
    p.add_argument(
        "--arms",
        help="run only these arms (the baseline and every kept arm's placebo or equal-compute target among "
        "them; marked incomplete; the whole file later resumes their runs)",
    )
    p.add_argument("--timeout", type=float, default=6 * 3600.0, help="seconds before one run is killed")
    p.add_argument("--summarize-only", action="store_true", help="do not run: summarise the finished runs")
    p.add_argument(
        "--summary", type=Path, help="also copy the summary JSON here (docs/results/replication.json)"
    )
    p.add_argument("--markdown", type=Path, help="also copy the markdown table here")
    p.add_argument("--png", type=Path, help="also copy the plot here")
    p.add_argument(
        "--archive",
        type=Path,
        help="copy each finished run's record, the SFT model and the held-out prompts here as they finish, "
        "and restore them from here first (a directory that outlives the machine: git, durable storage)",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="overrides of every run (e.g. trainer.device=cuda)"
    )


def run(args: argparse.Namespace) -> int:
    from stepcredit.cli.common import apply_overrides, load_preset, setup_runtime
    from stepcredit.config import Config, from_dict
    from stepcredit.recipes.experiment import (
        Plan,
        check,
        load_spec,
        only_arms,
        restore,
        run_all,
        write_outputs,
    )

    spec = load_spec(args.file)
    left_out: tuple[str, ...] = ()
    if args.arms:
        spec, left_out = only_arms(spec, tuple(a.strip() for a in args.arms.split(",") if a.strip()))
    if args.jobs < 1 or args.threads < 1 or args.timeout <= 0:
        raise UserError("--jobs and --threads must be >= 1 and --timeout > 0")
    try:
        seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else ()
    except ValueError:
        raise UserError(f"--seeds {args.seeds}: expected comma-separated integers") from None
    out = args.out or Path("runs") / "experiments" / spec.name
    sft = Path(spec.sft_model) if spec.sft_model else out / "sft" / "model"

    def build(preset: str, overrides: list[str]) -> Config:  # what `stepcredit train --preset` builds
        return from_dict(apply_overrides(load_preset(preset), overrides))

    plan = Plan(
        spec, out, sft.resolve(), build, seeds, tuple(args.overrides), args.threads, args.timeout, left_out,
        args.archive,
    )  # fmt: skip
    setup_runtime()
    lock = threading.Lock()
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        with lock:
            print(f"[{time.perf_counter() - t0:7.0f} s] {msg}", flush=True)

    if args.summarize_only:
        cfgs = check(plan)
        restore(plan)
    else:
        out.mkdir(parents=True, exist_ok=True)
        run_all(plan, args.jobs, log)
        cfgs = check(plan)
        if plan.interim:  # a part of a confirmatory file ends without an interim look (docs/experiments.md)
            done, total = plan.progress()
            asked = (("--summary", args.summary), ("--markdown", args.markdown), ("--png", args.png))
            ignored = [o for o, v in asked if v is not None]
            print(
                f"{done} of {total} runs of {args.file} are done; its comparisons wait for the whole file "
                "(purpose: confirm; --summarize-only writes them now)"
                + (f"; {', '.join(ignored)} not written" if ignored else "")
            )
            return 0
    _, path = write_outputs(plan, cfgs)
    print((out / "replication.md").read_text())
    for src, dst in (
        (path, args.summary),
        (out / "replication.md", args.markdown),
        (out / "curves.png", args.png),
    ):
        if dst is not None:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    print(f"summary: {path}; table: {out / 'replication.md'}; plot: {out / 'curves.png'}")
    sys.stdout.flush()
    return 0


def worker(argv: list[str]) -> int:
    """``python -m stepcredit.cli.experiment :: CMD ARGS :: CMD ARGS``: run ``stepcredit`` commands in
    turn in this one process (an experiment run's train and eval), stopping at the first that fails."""
    from stepcredit.cli.main import main

    commands: list[list[str]] = []
    for a in argv:
        if a == "::":
            commands.append([])
        elif commands:
            commands[-1].append(a)
    for c in commands:
        code = main(c)
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
