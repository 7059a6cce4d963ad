"""``stepcredit train`` against TRL's ``GRPOTrainer``: completions per second on the same saved model,
tokenizer, prompts, reward and settings, in one run.

Both sides: the built-in model at three sizes (default tiny ~0.9M, ~5M, ~20M parameters, BPE
tokenizer) saved once with ``save_pretrained``; 16 ``arith`` prompts x 8 samples per step, 40 new
tokens, temperature 1, KL off (no reference model), one optimiser step per generation, constant
learning rate, no SFT, no validation or checkpoints, 2 torch threads; the reward is stepcredit's
rewarder on both sides (TRL calls it as a TRL reward function). The two run one after the other in
separate processes, alternating ``--repeats`` times, so both see the same machine; each reports its
steady-state throughput (steps 2..N: the first step's start-up costs are left out) and its mean
reward over the run.

TRL is not a dependency of stepcredit: install it in a separate venv and point ``--python`` at it::

    python3 -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch==2.13.0 && /tmp/trlvenv/bin/pip install trl
    /tmp/trlvenv/bin/pip install --no-deps -e . && /tmp/trlvenv/bin/pip install pyyaml rich matplotlib math-verify
    python benchmarks/trl_compare.py --python /tmp/trlvenv/bin/python [--sizes tiny,5m,20m] [--steps 6] [--json]

Both sides run under that interpreter (same torch and transformers). Prints a table and, with
``--json``, a JSON object as its last line.
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
from pathlib import Path
from typing import Any

PROMPTS_PER_STEP = 16
N = 8
MAX_NEW_TOKENS = 40
LR = 1e-5
THREADS = int(os.environ.get("STEPCREDIT_BENCH_THREADS", "2"))
SIZES: dict[str, dict[str, int]] = {
    "tiny": {},  # TinyModelConfig's defaults
    "5m": {"hidden_size": 256, "num_layers": 6, "num_heads": 4, "intermediate_size": 768},
    "20m": {"hidden_size": 512, "num_layers": 6, "num_heads": 8, "intermediate_size": 1536},
}


# ------------------------------------------------------------------------------ shared inputs
def build_inputs(work: Path, size: str, steps: int) -> tuple[Path, Path, int]:
    """Save the model of ``size`` and the prompts (verl rows, jsonl); returns (model dir, prompts, params)."""
    from stepcredit.config import ArithConfig, TinyModelConfig
    from stepcredit.data.arith import make_rows
    from stepcredit.models import build_tiny, save_pretrained

    model, tok = build_tiny(TinyModelConfig(tokenizer="bpe", **SIZES[size]), seed=0)
    mdir = work / f"model-{size}"
    save_pretrained(model, tok, mdir)
    rows = make_rows(ArithConfig(), PROMPTS_PER_STEP * (steps + 2), seed=0, split="train")
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return mdir, prompts, sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------ workers
def worker_ours(model_dir: str, prompts: str, steps: int, seed: int) -> dict[str, Any]:
    from stepcredit.config import from_dict
    from stepcredit.trainer import train
    from stepcredit.trainer.metrics import read_metrics

    cfg = from_dict(
        {
            "model": {"path": model_dir},
            "data": {"task": "files", "train_files": [prompts], "val_files": [], "val_size": 0},
            "sft": {"steps": 0},
            "rollout": {"prompts_per_step": PROMPTS_PER_STEP, "n": N, "max_new_tokens": MAX_NEW_TOKENS},
            "algorithm": {"advantage": "grpo"},
            "loss": {"name": "ppo_clip", "kl_coef": 0.0},
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


def worker_trl(model_dir: str, prompts: str, steps: int, seed: int) -> dict[str, Any]:
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
            per_device_train_batch_size=PROMPTS_PER_STEP * N,
            num_generations=N,
            max_completion_length=MAX_NEW_TOKENS,
            temperature=1.0,
            top_p=1.0,
            beta=0.0,
            num_iterations=1,
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
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
    }


WORKERS = {"ours": worker_ours, "trl": worker_trl}


# -------------------------------------------------------------------------------------- driver
def run_worker(
    python: str, side: str, model_dir: Path, prompts: Path, steps: int, seed: int
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
    cmd += ["--steps", str(steps), "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{side} worker failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["completions_per_s"] = out["steady_steps"] * PROMPTS_PER_STEP * N / out["steady_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=sys.executable, help="interpreter with TRL and stepcredit installed")
    p.add_argument("--sizes", default="tiny,5m,20m")
    p.add_argument("--steps", type=int, default=6, help="training steps per run (the first is not timed)")
    p.add_argument("--repeats", type=int, default=1, help="alternating runs per side; the median is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each side")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(WORKERS[a.worker](a.model_dir, a.prompts, a.steps, a.seed)))
        return
    global THREADS
    THREADS = a.threads
    if a.steps < 3:
        raise SystemExit("--steps must be >= 3 (the first step is not timed)")
    results: dict[str, Any] = {}
    print(
        f"{'model':<6} {'params':>8} {'ours c/s':>9} {'TRL c/s':>9} {'ratio':>6} {'ours R':>7} {'TRL R':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.sizes.split(","):
            mdir, prompts, params = build_inputs(Path(tmp), size, a.steps)
            runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
            for _ in range(a.repeats):
                for side in ("ours", "trl"):
                    runs[side].append(run_worker(a.python, side, mdir, prompts, a.steps, a.seed))
            med = {side: statistics.median(r["completions_per_s"] for r in rs) for side, rs in runs.items()}
            rew = {side: statistics.fmean(r["reward"] for r in rs) for side, rs in runs.items()}
            ratio = med["ours"] / med["trl"]
            results[size] = {
                "params": params,
                "ours_completions_per_s": med["ours"],
                "trl_completions_per_s": med["trl"],
                "ratio": ratio,
                "ours_reward": rew["ours"],
                "trl_reward": rew["trl"],
                "runs": runs,
            }
            print(
                f"{size:<6} {params / 1e6:>7.1f}M {med['ours']:>9.1f} {med['trl']:>9.1f} {ratio:>5.2f}x "
                f"{rew['ours']:>7.3f} {rew['trl']:>7.3f}",
                flush=True,
            )
    if a.json:
        head = {"benchmark": "trl_compare", "steps": a.steps, "repeats": a.repeats, "threads": THREADS}
        print(json.dumps({**head, **results}))


if __name__ == "__main__":
    main()
