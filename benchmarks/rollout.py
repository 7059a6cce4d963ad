"""Generation and training throughput of the default model (the baseline later changes compare to).

Generation: ``rollout.generate`` (Hugging Face generate with KV cache, n samples per prompt, plus the
behaviour log-prob pass) against a plain loop that re-runs the full forward pass for every new token
(no cache), on the same prompts, in the same process, alternating (``--repeats`` rounds; medians with
min/max). Training: one forward+backward of the policy loss over a batch of the same shape, in tokens
per second. The load of the machine around each side is recorded (``benchmarks/_harness.py``);
``"valid": false`` says the figures cannot be trusted, and why.

    python benchmarks/rollout.py [--json] [--prompts 16] [--n 8] [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from _harness import Monitor, emit, spread
from stepcredit.config import DataConfig, ModelConfig, from_dict
from stepcredit.data import load_task
from stepcredit.models import load_policy, token_logprobs
from stepcredit.rollout import generate, left_pad, render_prompts


@torch.no_grad()
def no_cache_generate(model, tok, samples, *, n: int, new_tokens: int) -> int:
    """The naive method: one full forward pass over the whole sequence per generated token."""
    ids, mask = left_pad(render_prompts(tok, samples), tok.pad_token_id)
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0).long()
    for _ in range(new_tokens):
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1]
        nxt = torch.multinomial(torch.softmax(logits.float(), -1), 1)
        ids = torch.cat([ids, nxt], 1)
        mask = torch.cat([mask, torch.ones_like(nxt)], 1)
    return ids.shape[0] * new_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from stepcredit.cli.common import load_preset

    cfg = from_dict(load_preset("default"))
    model, tok = load_policy(ModelConfig(tiny=cfg.model.tiny), seed=0)
    samples = load_task(DataConfig(train_size=args.prompts, val_size=1))[0]
    B = args.prompts * args.n

    mon = Monitor()
    gen_s: list[float] = []
    naive_s: list[float] = []
    gen_tokens = 0
    for _ in range(args.repeats):  # alternating: kv_cache, no_cache, kv_cache, ...
        torch.manual_seed(0)
        dt, b = mon.timed(
            "kv_cache_generate",
            lambda: generate(model, tok, samples, n=args.n, max_new_tokens=args.new_tokens),
        )
        gen_s.append(dt)
        gen_tokens = int(b.response_mask_BT.sum())
        dt, _ = mon.timed(
            "no_cache_generate",
            lambda: no_cache_generate(model, tok, samples, n=args.n, new_tokens=args.new_tokens),
        )
        naive_s.append(dt)

    ids = torch.cat([b.prompt_ids_BP, b.response_ids_BT], 1)
    attn = torch.cat([b.prompt_mask_BP, b.response_mask_BT], 1).long()
    T = b.response_ids_BT.shape[1]
    train_s = []
    model.train()

    def train_step() -> None:
        logp, _ = token_logprobs(model, ids, attn, n_response=T, with_entropy=True)
        loss = -(logp * b.response_mask_BT).sum() / b.response_mask_BT.sum()
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(args.repeats):
        train_s.append(mon.timed("train_step", train_step)[0])

    g, nv, tr = statistics.median(gen_s), statistics.median(naive_s), statistics.median(train_s)
    n_params = sum(p.numel() for p in model.parameters())
    res = {
        "model": f"tiny ({n_params / 1e6:.2f}M params)",
        "batch": B,
        "generation_tokens_per_s": gen_tokens / g,
        "no_cache_tokens_per_s": B * args.new_tokens / nv,
        "generation_speedup_vs_no_cache": (gen_tokens / g) / (B * args.new_tokens / nv),
        "train_tokens_per_s": int(attn.sum()) / tr,
        "train_response_tokens_per_s": int(b.response_mask_BT.sum()) / tr,
        "threads": args.threads,
    }
    print(f"{'what':<34}{'value':>14}")
    for k, v in res.items():
        print(f"{k:<34}{v:>14.1f}" if isinstance(v, float) else f"{k:<34}{v!s:>14}")
    common = {"prompts": args.prompts, "n": args.n, "threads": args.threads, "dtype": "float32"}
    settings = {
        "kv_cache_generate": {**common, "max_new_tokens": args.new_tokens, "kv_cache": True},
        "no_cache_generate": {**common, "new_tokens": args.new_tokens, "kv_cache": False},
        "train_step": {**common, "loss": "-mean logp over response tokens", "entropy": True},
    }
    spreads = {"generation_s": spread(gen_s), "no_cache_s": spread(naive_s), "train_step_s": spread(train_s)}
    emit(mon.finish({"benchmark": "rollout", **res, **spreads}, settings), args.json)


if __name__ == "__main__":
    main()
