"""``stepcredit train``: SFT warm-up then RL, into a run directory."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from stepcredit.cli.common import add_config_args, build_config, setup_runtime


def configure(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--out", type=Path, help="run directory (default: runs/<time>)")
    p.add_argument("--resume", type=Path, help="continue the run in this directory from its last checkpoint")


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args, resume=args.resume)
    out = args.resume or args.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    setup_runtime()
    from stepcredit.trainer import check_config, train

    check_config(cfg)
    train(cfg, out, resume=args.resume)
    from stepcredit.trainer.metrics import summary_lines

    summary = json.loads((out / "summary.json").read_text())
    for line in summary_lines(summary):
        print(line)
    if (out / "checkpoints" / "sft" / "model").is_dir():
        print(
            f"models: {out / 'checkpoints' / 'sft' / 'model'} (after SFT), {out / 'checkpoints' / 'final' / 'model'}"
        )
    print(f"run directory: {out}")
    return 0
