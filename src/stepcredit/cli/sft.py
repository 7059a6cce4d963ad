"""``stepcredit sft``: the supervised warm-up alone; saves the model and prints validation accuracy."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from stepcredit.cli.common import add_config_args, build_config, setup_runtime
from stepcredit.cli.paths import absolute_paths


def configure(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--out", type=Path, help="output directory (default: runs/sft-<time>)")


def run(args: argparse.Namespace) -> int:
    # paths absolute, as ``train`` makes them: the files it reads and the model path it prints mean the
    # same from any directory
    cfg = absolute_paths(build_config(args), Path.cwd())
    out = (args.out or Path("runs") / time.strftime("sft-%Y%m%d-%H%M%S")).resolve()
    setup_runtime()

    from stepcredit.data.domains import build_data
    from stepcredit.models import save_pretrained
    from stepcredit.reward import build_rewarder
    from stepcredit.reward.run.routing import check_packages
    from stepcredit.rollout import ROLLOUT_MODES
    from stepcredit.runtime import set_threads
    from stepcredit.stats import wilson_interval
    from stepcredit.trainer.loop import seed_everything
    from stepcredit.trainer.rollout import tool_context
    from stepcredit.trainer.setup import engine_bound, load_model
    from stepcredit.trainer.sft import run_sft
    from stepcredit.trainer.validate import validate

    set_threads(cfg.trainer.threads)  # at most the usable CPUs; STEPCREDIT_THREADS overrides
    seed_everything(cfg.trainer.seed)
    train_set, val_set, _ = build_data(cfg.data, seed=cfg.trainer.seed)  # every domain, as train does
    check_packages(cfg.reward, train_set + val_set)  # before SFT: a reward's missing package, one line
    tools = ROLLOUT_MODES.get(cfg.rollout.mode).uses_tools
    model, tok = load_model(cfg)
    m = run_sft(
        model, tok, train_set, cfg.sft, seed=cfg.trainer.seed, tools=cfg.rollout.tools if tools else None
    )
    save_pretrained(model, tok, out / "model")
    # the engine is built from the SFT policy (vLLM copies the weights it is given)
    with engine_bound(cfg, model, tok), build_rewarder(cfg.reward) as rewarder:
        # a tools config validates as training does: the tool rollout, its calls run by the reward layer
        vm, _ = validate(
            model,
            tok,
            val_set,
            rewarder,
            max_new_tokens=cfg.rollout.max_new_tokens,
            tools=tool_context(cfg, rewarder),
        )
    m.update(vm)
    (out / "sft_metrics.json").write_text(json.dumps(m, indent=2))
    n = len(val_set)
    acc = vm.get("val/accuracy", float("nan"))
    line = f"model saved to {out / 'model'}  val/accuracy_greedy {acc:.3f}"
    if n:
        lo, hi = wilson_interval(round(acc * n) / n, n)
        line += f" [{lo:.3f}, {hi:.3f}] (95 % Wilson interval, {n} prompts)"
    print(line)
    return 0
