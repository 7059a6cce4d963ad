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
    for line in model_lines(out):
        print(line)
    print(f"run directory: {out}")
    return 0


def model_lines(run_dir: Path) -> list[str]:
    """What the run wrote that a model loader reads, each only if it is there: the SFT model, and the
    final policy (a model directory, or with LoRA its adapters and their base, and the merged model
    when ``model.lora.merge_on_export`` asked for it)."""
    ckpt = run_dir / "checkpoints"
    found = [
        (ckpt / "sft" / "model", "after SFT"),
        (
            ckpt / "final" / "model",
            "final policy" + (", adapters merged" if (ckpt / "final" / "adapter").is_dir() else ""),
        ),
        (ckpt / "final" / "adapter", "final LoRA adapters, peft format"),
        (ckpt / "final" / "base", "the base the adapters apply to"),
    ]
    lines = [
        f"model: {path} ({what})"
        for path, what in found
        if (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
    ]
    adapter = ckpt / "final" / "adapter" / "adapter_config.json"
    if adapter.is_file() and not (ckpt / "final" / "base").is_dir():  # the base was the unchanged model.path
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        lines.append(f"model: {base} (the base the adapters apply to)")
    return lines
