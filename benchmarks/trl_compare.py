"""``stepcredit train`` against TRL's ``GRPOTrainer``: completions per second on the same saved model,
tokenizer, prompts, reward and settings, in one run.

Both sides: the built-in model at three sizes (tiny ~0.9M, ~5M, ~20M parameters, BPE tokenizer)
saved once with ``save_pretrained``, untrained and (``--sft``) after stepcredit's SFT warm-up on
``arith`` (its responses end early); 16 ``arith`` prompts x 8 samples per step (the group size), 40
new tokens, temperature 1, top_p 1, KL off (beta 0, no reference model), clipped objective (0.2),
token-mean loss aggregation over the batch, group-std-normalised advantages, one optimiser step per
generation, constant learning rate, no validation or checkpoints, ``--threads`` torch threads; the
reward is stepcredit's rewarder on both sides (TRL calls it as a TRL reward function). Two modes:

* ``matched``: TRL configured like ours: fp32 (``bf16=False``), ``gradient_checkpointing=False``,
  ``loss_type="dapo"`` (token mean over the batch's tokens, as ``loss.agg=token-mean``); ours in
  ``model.dtype=float32``;
* ``best``: each side at its own best for this machine: TRL's ``GRPOConfig`` defaults for precision
  and gradient checkpointing (bf16 autocast and checkpointing on, in TRL 1.16); ours the faster of
  ``model.dtype=float32`` and ``bfloat16`` (both are run; the chosen one is in the settings).

The sides run in separate processes, one after the other in alternation (``--repeats`` rounds), with
the machine's load recorded around each (``benchmarks/_harness.py``): a run beside other work says
``"valid": false`` and why. Each side reports its steady-state throughput (steps 2..N: the first
step's start-up costs are left out) and its mean reward. ``--steps`` is per run; sizes in
``--trl-steps`` run fewer steps on both sides (default ``20m:3``), the same steady-state measure.

TRL is not a dependency of stepcredit: install it in a separate venv and point ``--python`` at it::

    python3 -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch==2.13.0 && /tmp/trlvenv/bin/pip install trl
    /tmp/trlvenv/bin/pip install --no-deps -e . && /tmp/trlvenv/bin/pip install pyyaml rich matplotlib math-verify
    python benchmarks/trl_compare.py --python /tmp/trlvenv/bin/python [--sizes tiny,5m,20m] [--sft] [--json]

Both sides run under that interpreter (same torch and transformers). Prints a table and, with
``--json``, a JSON object as its last line: ``{"results": [...], "valid", "reason", "load", ...}``,
one result per size (and model variant and mode) with ``ratio``, ``ours_completions_per_s``,
``trl_completions_per_s``, ``ours_settings`` and ``trl_settings``; ``ratio_min`` is the smallest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from _harness import Monitor, emit, spread

PROMPTS_PER_STEP = 16
N = 8
MAX_NEW_TOKENS = 40
LR = 1e-5
THREADS = int(os.environ.get("STEPCREDIT_BENCH_THREADS", "2"))
CLIP = 0.2
MODES = ("matched", "best")
SIZES: dict[str, dict[str, int]] = {
    "tiny": {},  # TinyModelConfig's defaults
    "5m": {"hidden_size": 256, "num_layers": 6, "num_heads": 4, "intermediate_size": 768},
    "20m": {"hidden_size": 512, "num_layers": 6, "num_heads": 8, "intermediate_size": 1536},
}


# ------------------------------------------------------------------------------ shared inputs
def build_inputs(work: Path, size: str, steps: int, sft_steps: int) -> tuple[Path, Path, int]:
    """Save the model of ``size`` (after ``sft_steps`` of SFT on arith, if any) and the prompts (verl
    rows, jsonl); returns (model dir, prompts, params)."""
    from stepcredit.config import ArithConfig, DataConfig, SFTConfig, TinyModelConfig
    from stepcredit.data import load_task
    from stepcredit.data.arith import make_rows
    from stepcredit.models import build_tiny, save_pretrained

    model, tok = build_tiny(TinyModelConfig(tokenizer="bpe", **SIZES[size]), seed=0)
    if sft_steps > 0:
        import torch

        from stepcredit.trainer.sft import run_sft

        torch.set_num_threads(THREADS)
        run_sft(model, tok, load_task(DataConfig())[0], SFTConfig(steps=sft_steps), seed=0)
    mdir = work / f"model-{size}-{'sft' if sft_steps > 0 else 'untrained'}"
    save_pretrained(model, tok, mdir)
    rows = make_rows(ArithConfig(), PROMPTS_PER_STEP * (steps + 2), seed=0, split="train")
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return mdir, prompts, sum(p.numel() for p in model.parameters())


def ours_settings(dtype: str) -> dict[str, Any]:
    return {
        "trainer": "stepcredit",
        "model.dtype": dtype,
        "gradient_checkpointing": False,
        "loss": "ppo_clip",
        "clip": CLIP,
        "loss.agg": "token-mean",
        "kl_coef": 0.0,
        "advantage": "grpo (group std-normalised)",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": MAX_NEW_TOKENS,
        "group_size": N,
        "prompts_per_step": PROMPTS_PER_STEP,
        "lr": LR,
        "threads": THREADS,
    }


def trl_settings(mode: str) -> dict[str, Any]:
    """The GRPOConfig arguments of a mode (``best`` leaves precision and checkpointing at TRL's defaults)."""
    out: dict[str, Any] = {
        "per_device_train_batch_size": PROMPTS_PER_STEP * N,
        "num_generations": N,
        "max_completion_length": MAX_NEW_TOKENS,
        "temperature": 1.0,
        "top_p": 1.0,
        "beta": 0.0,
        "epsilon": CLIP,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "num_iterations": 1,
        "learning_rate": LR,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
    }
    if mode == "matched":
        out.update(bf16=False, gradient_checkpointing=False)
    return out


# ------------------------------------------------------------------------------------ workers
def worker_ours(model_dir: str, prompts: str, steps: int, seed: int, variant: str) -> dict[str, Any]:
    from stepcredit.config import from_dict
    from stepcredit.trainer import train
    from stepcredit.trainer.metrics import read_metrics

    cfg = from_dict(
        {
            "model": {"path": model_dir, "dtype": variant},
            "data": {"task": "files", "train_files": [prompts], "val_files": [], "val_size": 0},
            "sft": {"steps": 0},
            "rollout": {
                "prompts_per_step": PROMPTS_PER_STEP,
                "n": N,
                "max_new_tokens": MAX_NEW_TOKENS,
                "temperature": 1.0,
                "top_p": 1.0,
            },
            "algorithm": {"advantage": "grpo", "norm_by_std": True},
            "loss": {
                "name": "ppo_clip",
                "kl_coef": 0.0,
                "agg": "token-mean",
                "clip_low": CLIP,
                "clip_high": CLIP,
            },
            "optim": {"lr": LR, "warmup_steps": 0},
            "trainer": {
                "steps": steps,
                "seed": seed,
                "threads": THREADS,
                "val_every": 0,
                "save_every": 0,
                "progress": False,
                "tensorboard": False,
            },
        }
    )
    with tempfile.TemporaryDirectory() as run:
        train(cfg, Path(run))
        rows = [r for r in read_metrics(Path(run) / "metrics.jsonl") if "time/step_s" in r]
    step_s = [r["time/step_s"] for r in rows]
    return {
        "steady_s": sum(step_s[1:]),
        "steady_steps": len(step_s) - 1,
        "reward": statistics.fmean(r["reward/mean"] for r in rows),
    }


def worker_trl(model_dir: str, prompts: str, steps: int, seed: int, variant: str) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from stepcredit.data import read_samples
    from stepcredit.reward import build_rewarder

    torch.set_num_threads(THREADS)
    samples = read_samples(prompts)
    by_prompt = {s.prompt[-1]["content"]: s for s in samples}
    ds = Dataset.from_list([{"prompt": [dict(m) for m in s.prompt]} for s in samples])
    rewarder = build_rewarder()

    def reward(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float]:
        ss = [by_prompt[p[-1]["content"]] for p in prompts]
        res = rewarder.score_batch(ss, [c[0]["content"] for c in completions])
        return [r.score if r.ok else 0.0 for r in res]

    stamps: list[float] = []
    rewards: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            stamps.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            **trl_settings(variant),
            max_steps=steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=ds,
            processing_class=tok,
            callbacks=[Clock()],
        )
        start = time.perf_counter()
        trainer.train()
    rewarder.close()
    stamps.insert(0, start)
    return {
        "steady_s": stamps[-1] - stamps[1],
        "steady_steps": len(stamps) - 2,
        "reward": statistics.fmean(rewards) if rewards else float("nan"),
        # what TRL actually ran with (its defaults in mode "best")
        "bf16": bool(args.bf16),
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "trl_version": __import__("trl").__version__,
    }


WORKERS = {"ours": worker_ours, "trl": worker_trl}


# -------------------------------------------------------------------------------------- driver
def run_worker(
    python: str, side: str, variant: str, model_dir: Path, prompts: Path, steps: int, seed: int
) -> dict[str, Any]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "STEPCREDIT_BENCH_THREADS": str(THREADS),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), env.get("PYTHONPATH", "")]
    )
    cmd = [python, __file__, "--worker", side, "--model-dir", str(model_dir), "--prompts", str(prompts)]
    cmd += ["--steps", str(steps), "--seed", str(seed), "--variant", variant]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{side} worker failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["completions_per_s"] = out["steady_steps"] * PROMPTS_PER_STEP * N / out["steady_s"]
    return out


def _size_steps(spec: str) -> dict[str, int]:
    return {k: int(v) for k, v in (x.split(":") for x in spec.split(",") if x)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=sys.executable, help="interpreter with TRL and stepcredit installed")
    p.add_argument("--sizes", default="tiny,5m,20m")
    p.add_argument("--steps", type=int, default=6, help="training steps per run (the first is not timed)")
    p.add_argument(
        "--trl-steps",
        default="20m:3",
        help="size:steps pairs run with fewer steps (both sides, same measure)",
    )
    p.add_argument("--repeats", type=int, default=3, help="alternating runs per side; the median is reported")
    p.add_argument(
        "--modes", default=",".join(MODES), help="matched (TRL like ours), best (each at its best)"
    )
    p.add_argument("--sft", action="store_true", help="also measure an SFT-trained model (short responses)")
    p.add_argument(
        "--sft-steps", type=int, default=300, help="SFT steps of the --sft model (default preset's)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each side")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(WORKERS[a.worker](a.model_dir, a.prompts, a.steps, a.seed, a.variant)))
        return
    global THREADS
    THREADS = a.threads
    modes = [m for m in a.modes.split(",") if m]
    if not set(modes) <= set(MODES):
        raise SystemExit(f"--modes: one or more of {', '.join(MODES)}")
    size_steps = _size_steps(a.trl_steps)
    if min([a.steps, *size_steps.values()]) < 2:
        raise SystemExit("--steps must be >= 2 (the first step is not timed)")
    # the sides: (ours, model.dtype) and (trl, mode); bfloat16 only in "best"
    sides = [("ours", "float32"), *([("trl", "matched")] if "matched" in modes else [])]
    if "best" in modes:
        sides += [("ours", "bfloat16"), ("trl", "best")]
    mon = Monitor()
    results: list[dict[str, Any]] = []
    print(
        f"{'model':<6} {'variant':<9} {'mode':<8} {'params':>8} {'ours c/s':>9} {'TRL c/s':>9} {'ratio':>6} "
        f"{'ours R':>7} {'TRL R':>7}"
    )
    variants = ["untrained", *(["sft"] if a.sft else [])]
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.sizes.split(","):
            steps = size_steps.get(size, a.steps)
            for variant in variants:
                sft_steps = a.sft_steps if variant == "sft" else 0
                mdir, prompts, params = build_inputs(Path(tmp), size, steps, sft_steps)
                runs = mon.alternate(
                    {
                        f"{side}:{v} {size} {variant}": partial(
                            run_worker, a.python, side, v, mdir, prompts, steps, a.seed
                        )
                        for side, v in sides
                    },
                    repeats=a.repeats,
                )
                by = {k.split(" ")[0]: rs for k, rs in runs.items()}
                cps = {k: [r["completions_per_s"] for r in rs] for k, rs in by.items()}
                for mode in modes:
                    ours_key = "ours:float32"
                    if mode == "best":
                        ours_key = max(
                            ("ours:float32", "ours:bfloat16"), key=lambda k: statistics.median(cps[k])
                        )
                    trl_key = f"trl:{mode}"
                    ours_c, trl_c = statistics.median(cps[ours_key]), statistics.median(cps[trl_key])
                    trl_ran = by[trl_key][0]
                    row = {
                        "size": size,
                        "params": params,
                        "model": variant,
                        "mode": mode,
                        "steps": steps,
                        "ratio": ours_c / trl_c,
                        "ours_completions_per_s": ours_c,
                        "trl_completions_per_s": trl_c,
                        "ours_completions_per_s_spread": spread(cps[ours_key]),
                        "trl_completions_per_s_spread": spread(cps[trl_key]),
                        "ours_reward": statistics.fmean(r["reward"] for r in by[ours_key]),
                        "trl_reward": statistics.fmean(r["reward"] for r in by[trl_key]),
                        "ours_settings": ours_settings(ours_key.split(":")[1]),
                        "trl_settings": {
                            **trl_settings(mode),
                            "bf16": trl_ran.get("bf16"),
                            "gradient_checkpointing": trl_ran.get("gradient_checkpointing"),
                            "trl_version": trl_ran.get("trl_version"),
                        },
                        "runs": {ours_key: by[ours_key], trl_key: by[trl_key]},
                    }
                    results.append(row)
                    print(
                        f"{size:<6} {variant:<9} {mode:<8} {params / 1e6:>7.1f}M {ours_c:>9.1f} {trl_c:>9.1f} "
                        f"{row['ratio']:>5.2f}x {row['ours_reward']:>7.3f} {row['trl_reward']:>7.3f}",
                        flush=True,
                    )
    head = {
        "benchmark": "trl_compare",
        "steps": a.steps,
        "steps_by_size": size_steps,
        "repeats": a.repeats,
        "threads": THREADS,
        "ratio_min": min((r["ratio"] for r in results), default=None),
        "results": results,
    }
    settings = {
        "ours": {
            m: ours_settings("float32" if m == "matched" else "float32|bfloat16 (faster)") for m in modes
        },
        "trl": {m: trl_settings(m) for m in modes},
    }
    emit(mon.finish(head, settings), a.json)


if __name__ == "__main__":
    main()
