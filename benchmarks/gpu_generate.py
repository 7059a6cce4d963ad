"""Generation speed of the ``hf`` engine's sampling loop against transformers' ``generate()``, same process.

The model is the 0.39B Llama built from the config (``model.tiny.hidden_size=896 num_layers=24
num_heads=14 intermediate_size=4864``, random weights) in ``model.dtype=bfloat16`` (float32 weights
under bfloat16 autocast, as training runs it); ``--batch`` prompts of the arith task (default 128),
each continued by exactly ``--new-tokens`` tokens (default 256; no eos stops a row, so every side
generates the same count), sampled at temperature 1. Sides, alternating (``--repeats`` rounds) after
one untimed warm-up each (CUDA kernels, ``torch.compile``):

- ``ours`` (``stepcredit.rollout.sampling.decode``, eager lean step: ``rollout.decode_compile=off``);
- ``ours_compiled`` (the static-cache step under ``torch.compile``, ``--compile-mode``, default
  ``reduce-overhead``: CUDA graphs);
- ``transformers`` (``model.generate(do_sample=True, top_k=0, ...)`` on the same model object).

Reported: generated tokens per second of each side (median over rounds) and the ratios
ours / transformers. ``--lora R`` adds adapters of rank R (B random, so they count) and the sides
``ours_lora_merged`` / ``ours_lora_unmerged`` (``model.lora.merge_for_generation``).

    python benchmarks/gpu_generate.py [--batch 128] [--new-tokens 256] [--repeats 2] [--lora 8] [--json]

Needs a GPU for its figures; ``--device cpu`` with small sizes only checks that it runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _harness import Monitor, emit, spread  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--compile-mode", default="reduce-overhead")
    p.add_argument("--compile-backend", default="inductor", help="aot_eager: trace only (a CPU check)")
    p.add_argument("--lora", type=int, default=0, help="adapters of this rank (0: none)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import torch

    from stepcredit.cli.common import setup_runtime
    from stepcredit.config import LoRAConfig, ModelConfig, TinyModelConfig, from_dict
    from stepcredit.data import load_task
    from stepcredit.models import load_policy
    from stepcredit.models.decode_step import DecodeOptions, decode_options
    from stepcredit.rollout.batching import left_pad, render_prompts
    from stepcredit.rollout.sampling import decode

    setup_runtime()
    dev = torch.device(args.device)
    tiny = TinyModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=args.intermediate,
    )
    model, tok = load_policy(ModelConfig(tiny=tiny, dtype=args.dtype), seed=0)
    model.to(dev).eval()
    params = sum(x.numel() for x in model.parameters())
    if args.lora:
        from stepcredit.models.lora import attach_lora

        model = attach_lora(model, LoRAConfig(rank=args.lora)).eval()
        with torch.no_grad():
            for name, w in model.named_parameters():
                if ".lora_B." in name:  # fresh adapters have B = 0 (they would compute the base model)
                    w.normal_(0.0, 0.01)
    samples, _ = load_task(from_dict({"data": {"train_size": args.batch, "val_size": 0}}).data)
    ids, mask = left_pad(render_prompts(tok, samples[: args.batch]), tok.pad_token_id)
    ids, mask = ids.to(dev), mask.to(dev)
    n_tokens = args.batch * args.new_tokens

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def ours(options: DecodeOptions) -> Callable[[], float]:
        def run() -> float:
            sync()
            t0 = time.perf_counter()
            with decode_options(options):
                out = decode(
                    model, ids, mask, max_new_tokens=args.new_tokens, eos_token_id=-1,
                    pad_token_id=tok.pad_token_id, temperature=1.0,
                )  # fmt: skip
            sync()
            assert out.shape == (args.batch, args.new_tokens), out.shape
            return time.perf_counter() - t0

        return run

    def theirs() -> float:
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                pad_token_id=tok.pad_token_id, eos_token_id=None,
            )  # fmt: skip
        sync()
        assert out.shape[1] - ids.shape[1] == args.new_tokens, out.shape
        return time.perf_counter() - t0

    compiled = DecodeOptions(compile=args.compile_mode, backend=args.compile_backend)
    sides: dict[str, Callable[[], float]] = {
        "ours": ours(DecodeOptions()),
        "ours_compiled": ours(compiled),
        "transformers": theirs,
    }
    if args.lora:
        sides["ours_lora_merged"] = ours(DecodeOptions(merge_lora=True))
        sides["ours_lora_unmerged"] = ours(DecodeOptions(merge_lora=False))
    mon = Monitor()
    warm: dict[str, float] = {}
    for name, fn in sides.items():  # kernels, autotuning and torch.compile: not timed
        warm[name] = mon.timed(f"{name} (warm-up)", fn)[0]
    runs = mon.alternate(sides, repeats=args.repeats)
    tok_s = {name: [n_tokens / t for t in ts] for name, ts in runs.items()}
    med = {name: statistics.median(v) for name, v in tok_s.items()}
    res: dict[str, Any] = {
        "benchmark": "gpu_generate",
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "params": params,
        "dtype": args.dtype,
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "lora_rank": args.lora,
        "tokens_per_s": {name: spread(v) for name, v in tok_s.items()},
        "warmup_s": {name: round(t, 2) for name, t in warm.items()},
        "ours_vs_transformers": med["ours"] / med["transformers"],
        "compiled_vs_transformers": med["ours_compiled"] / med["transformers"],
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev.type == "cuda" else None,
    }
    print(
        f"{params / 1e6:.0f}M parameters, {args.dtype}, batch {args.batch} x {args.new_tokens} new tokens, "
        f"{res['device']}, {args.repeats} alternating rounds"
    )
    for name, v in med.items():
        print(f"{name:<20} {v:12.0f} tokens/s   (warm-up {warm[name]:.1f} s)")
    print(f"ours / transformers generate(): {res['ours_vs_transformers']:.2f}x eager, "
          f"{res['compiled_vs_transformers']:.2f}x compiled ({args.compile_mode})")  # fmt: skip
    settings = {
        name: {"batch": args.batch, "new_tokens": args.new_tokens, "dtype": args.dtype} for name in sides
    }
    emit(mon.finish(res, settings), args.json)


if __name__ == "__main__":
    main()
