"""One training run on the current device, reported as steps/s, generated tokens/s and peak memory.

Runs ``train()`` in this process on ``--preset`` with ``key=value`` overrides (``trainer.device=cuda``,
``model.dtype=bfloat16``, ``model.lora.rank=8``, a larger ``model.tiny.*`` ...) and reads the run's own
``metrics.jsonl``: the median ``time/step_s`` over steps 2.. (step 1 warms kernels and caches), the
generated tokens per second of those steps (responses per step x mean generated tokens per response /
step time), the SFT time, the final greedy validation accuracy, and the peak memory the CUDA caching
allocator held (``torch.cuda.max_memory_allocated``; the process's peak RSS on a CPU). It times one
configuration, so it has no competitor: pair runs of it (hf against vllm, LoRA on against off) on the
same warm machine and compare their figures there.

    python benchmarks/gpu_run.py [--preset default] [--label NAME] [--json] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _harness import Monitor, emit  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="default")
    p.add_argument("--label", default="")
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()

    import torch

    from stepcredit.cli.common import apply_overrides, load_preset, setup_runtime
    from stepcredit.config import from_dict
    from stepcredit.trainer import train

    setup_runtime()
    cfg = from_dict(apply_overrides(load_preset(args.preset), ["trainer.progress=false", *args.overrides]))
    cuda = torch.cuda.is_available() and cfg.trainer.device != "cpu"
    mon = Monitor()
    with tempfile.TemporaryDirectory() as tmp:
        wall, _ = mon.timed("train", lambda: train(cfg, Path(tmp) / "run"))
        rows = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r for r in rows if r.get("step", 0) >= 2 and "time/step_s" in r]
    per_step = [r["time/step_s"] for r in steps]
    responses = cfg.rollout.prompts_per_step * cfg.rollout.n
    tok_s = [
        responses * r.get("rollout/generated_tokens_per_response", 0.0) / r["time/step_s"] for r in steps
    ]
    val = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    sft = [r["time/sft_s"] for r in rows if "time/sft_s" in r]
    from stepcredit.models import load_policy

    params = sum(x.numel() for x in load_policy(cfg.model, seed=0)[0].parameters())
    out = {
        "label": args.label or " ".join(args.overrides),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "overrides": args.overrides,
        "params": params,
        "wall_s": round(wall, 2),
        "sft_s": round(sft[0], 2) if sft else None,
        "step_s_median": round(statistics.median(per_step), 4) if per_step else None,
        "steps_per_s": round(1 / statistics.median(per_step), 3) if per_step else None,
        "generated_tokens_per_s": round(statistics.median(tok_s), 1) if tok_s else None,
        "peak_mem_gib": round(
            (
                torch.cuda.max_memory_allocated()
                if cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            )
            / 2**30,
            3,
        ),
        "val_first": val[0] if val else None,
        "val_last": val[-1] if val else None,
    }
    for k, v in out.items():
        if k != "overrides":
            print(f"{k:>24}: {v}")
    emit(mon.finish(out, settings={"train": {"preset": args.preset, "overrides": args.overrides}}), args.json)


if __name__ == "__main__":
    main()
