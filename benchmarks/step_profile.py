"""Where one RL step of ``stepcredit train`` spends its time, phase by phase, this tree against an
earlier commit, both run in alternation in one invocation.

Each side runs ``--steps`` RL steps of the ``--preset`` config (with ``trainer.threads=1``) in a
subprocess of its own with its own ``src`` first on ``PYTHONPATH`` (the earlier commit is exported with
``git archive``); the subprocess wraps the trainer's functions and records, per phase, the main
thread's **CPU time** (``time.thread_time``: work done, far less distorted by other processes on the
machine than wall time, though still not immune to shared caches) and the call count:

    generation      the sampling loop (``rollout.decode``)
    rollout_other   the rest of ``rollout.generate`` (prompt rendering, detokenising, padding)
    behaviour_logp  the rollout's behaviour log-prob pass (skipped when on-policy)
    nograd_logp     log-prob passes without gradient in the update (reference, proximal)
    train_forward   the training forward pass (log-probs and entropies)
    loss            ``compute_policy_loss``
    backward        ``Tensor.backward``
    optimiser       gradient clipping and ``AdamW.step``
    python          the rest of the step on the main thread (advantages, metrics, batching...)

plus the step's wall time and ``time/reward_wait_s`` (the reward agent scores in the background).
Steps 2.. are averaged (step 1 warms caches). ``--model-dir`` starts from a saved model (e.g. one
trained by ``stepcredit sft --out DIR``, whose responses end early), else the untrained tiny model.

    python benchmarks/step_profile.py [--rev HEAD~3] [--size tiny|5m|20m] [--steps 4] [--repeats 2]
        [--model-dir DIR] [--like-trl-compare] [--json] [key=value ...]

``--like-trl-compare`` sets what ``benchmarks/trl_compare.py`` sets on our side (KL off, token-mean
loss, constant learning rate 1e-5, 16 x 8 responses of up to 40 tokens, temperature 1, top_p 1).
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

from _harness import Monitor, emit

ROOT = Path(__file__).resolve().parents[1]
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 384},
    "5m": {"hidden_size": 256, "num_layers": 6, "num_heads": 4, "intermediate_size": 768},
    "20m": {"hidden_size": 512, "num_layers": 6, "num_heads": 8, "intermediate_size": 1536},
}
LIKE_TRL_COMPARE = [
    "loss.name=ppo_clip",
    "loss.kl_coef=0.0",
    "loss.agg=token-mean",
    "loss.clip_low=0.2",
    "loss.clip_high=0.2",
    "algorithm.advantage=grpo",
    "algorithm.norm_by_std=true",
    "optim.lr=0.00001",
    "optim.warmup_steps=0",
    "rollout.prompts_per_step=16",
    "rollout.n=8",
    "rollout.max_new_tokens=40",
    "rollout.temperature=1.0",
    "rollout.top_p=1.0",
]
"""The overrides that make a profiled step the one ``trl_compare.py`` times on our side."""
PHASES = (
    "generation",
    "rollout_other",
    "behaviour_logp",
    "nograd_logp",
    "train_forward",
    "loss",
    "backward",
    "optimiser",
    "python",
)

RUNNER = r"""
import json, sys, time
from collections import defaultdict
from pathlib import Path
import torch
import stepcredit.rollout as ro
import stepcredit.trainer.loop as loop
import stepcredit.trainer.rollout as tro
import stepcredit.trainer.update as upd
from stepcredit.cli.common import apply_overrides, load_preset, setup_runtime
from stepcredit.config import from_dict

cpu = defaultdict(float); calls = defaultdict(int); steps = []; depth = [0]

def timed(name, fn, pick=None):
    def wrapper(*a, **k):
        label = pick() if pick else name
        depth[0] += 1
        t = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            depth[0] -= 1
            cpu[label] += time.thread_time() - t; calls[label] += 1
    return wrapper

ro.decode = timed("generation", ro.decode)
ro.token_logprobs = timed("behaviour_logp", ro.token_logprobs)
ro.generate = timed("generate_total", ro.generate)  # the flat rollout mode calls it
upd.token_logprobs = timed("", upd.token_logprobs,
                           lambda: "train_forward" if torch.is_grad_enabled() else "nograd_logp")
upd.compute_policy_loss = timed("loss", upd.compute_policy_loss)
torch.Tensor.backward = timed("backward", torch.Tensor.backward)
torch.nn.utils.clip_grad_norm_ = timed("optimiser", torch.nn.utils.clip_grad_norm_)
torch.optim.AdamW.step = timed("optimiser", torch.optim.AdamW.step)
mark = {}
_ras = loop.rollout_and_submit
def ras(*a, **k):
    mark["t"] = time.thread_time(); mark["c"] = dict(cpu)
    return _ras(*a, **k)
loop.rollout_and_submit = ras
_log_row = loop.log_row
def log_row(log, bar, row, t_step=None):
    _log_row(log, bar, row, t_step)
    if t_step is None or "t" not in mark:
        return
    d = {k: cpu[k] - mark["c"].get(k, 0.0) for k in cpu}
    d["rollout_other"] = d.pop("generate_total", 0.0) - d.get("generation", 0.0) - d.get("behaviour_logp", 0.0)
    total = time.thread_time() - mark["t"]
    d["python"] = total - sum(v for v in d.values())
    steps.append({"cpu": d, "cpu_total": total, "wall": row["time/step_s"],
                  "reward_wait": row.get("time/reward_wait_s", 0.0),
                  "tokens": float(row.get("response_length/mean", 0.0) or 0.0)})
loop.log_row = log_row
setup_runtime()
preset, out, *over = sys.argv[1:]
loop.train(from_dict(apply_overrides(load_preset(preset), over)), Path(out))
print("PROFILE " + json.dumps({"steps": steps, "calls": dict(calls)}))
"""


def run_side(src: Path, preset: str, out: Path, overrides: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    res = subprocess.run(
        [sys.executable, "-c", RUNNER, preset, str(out), *overrides],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    line = next(x for x in res.stdout.splitlines() if x.startswith("PROFILE "))
    steps = json.loads(line[len("PROFILE ") :])["steps"][1:]  # step 1 warms caches
    agg = {p: statistics.mean(s["cpu"].get(p, 0.0) for s in steps) for p in PHASES}
    agg["cpu_total"] = statistics.mean(s["cpu_total"] for s in steps)
    agg["wall"] = statistics.mean(s["wall"] for s in steps)
    agg["reward_wait"] = statistics.mean(s["reward_wait"] for s in steps)
    return agg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rev", default="", help="an earlier commit to compare with (default: none)")
    p.add_argument("--preset", default="default")
    p.add_argument("--size", default="tiny", choices=sorted(SIZES))
    p.add_argument("--model-dir", default="", help="a saved model to start RL from (no SFT)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--like-trl-compare", action="store_true", help="trl_compare.py's settings")
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()
    common = [
        f"trainer.steps={args.steps}",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.tensorboard=false",
        "trainer.threads=1",
        "sft.steps=0",
        *(f"model.tiny.{k}={v}" for k, v in SIZES[args.size].items()),
        *([f"model.path={args.model_dir}"] if args.model_dir else []),
        *(LIKE_TRL_COMPARE if args.like_trl_compare else []),
        *args.overrides,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"ours": ROOT / "src"}
        if args.rev:
            old = Path(tmp) / "old"
            old.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.rev, "src"], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            sides = {"earlier": old / "src", **sides}
        mon = Monitor()
        rounds = iter(range(10**6))
        runs: dict[str, list[dict[str, float]]] = mon.alternate(  # a slow spell hits both sides
            {
                name: (
                    lambda name=name, src=src: run_side(
                        src, args.preset, Path(tmp) / f"{name}{next(rounds)}", common
                    )
                )
                for name, src in sides.items()
            },
            repeats=args.repeats,
        )
    result: dict[str, object] = {"size": args.size, "model_dir": args.model_dir, "settings": common}
    for name, rs in runs.items():
        result[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    if "earlier" in runs:
        e, o = result["earlier"], result["ours"]
        assert isinstance(e, dict) and isinstance(o, dict)
        result["cpu_ratio"] = o["cpu_total"] / e["cpu_total"]
    print(f"{'phase (CPU s per step)':<24}" + "".join(f"{n:>12}" for n in runs))
    for k in (*PHASES, "cpu_total", "wall", "reward_wait"):
        print(f"{k:<24}" + "".join(f"{result[n][k]:>12.3f}" for n in runs))  # type: ignore[index]
    if "cpu_ratio" in result:
        print(f"CPU time per step, ours / earlier: {result['cpu_ratio']:.3f}")
    settings = {name: {"src": str(src), "overrides": common} for name, src in sides.items()}
    emit(mon.finish(result, settings), args.json)


if __name__ == "__main__":
    main()
