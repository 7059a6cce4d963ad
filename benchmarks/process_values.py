"""Time of V(prefix) per response: naive vs kv_cache vs the packed layouts, against one plain forward pass.

For each model and (response tokens, boundaries) the same response is valued at V_0 and at
``boundaries`` evenly spaced episode ends by every execution strategy of ``forced_answer_logprob``:
``naive`` (a pass per prefix), ``kv_cache`` (a cropped cache per prefix), ``kv_packed`` (a causal pass,
then all suffixes over its cache), ``packed_single`` (one pass over everything with a 4D mask) and
``packed`` (what ``process.strategy=packed`` runs on a response alone: the single pass for short
responses, the two-call layout for long ones). ``packed_cached`` is ``packed`` as training runs it,
continuing from the KV cache that the rollout's behaviour log-prob pass already built (only the
suffixes run; that cache is built outside the timing). ``max_abs_diff`` is the largest difference of
any strategy from naive. The floor is one plain forward pass (built-in causal mask, no cache) over as
many tokens as the packed sequence holds (prompt + response + one force/answer suffix per boundary),
keeping as many logits: the least any method that evaluates those tokens from scratch can cost.

    python benchmarks/process_values.py [--quick] [--json]

Timings are the minimum over round-robin repeats (5 on the tiny model, 3 on the big one, where naive
runs once: it is the slow reference); --quick uses fewer. Other work on the machine makes single
runs noisy, hence the minimum and the round robin.

Models: ``tiny`` is the built-in default model (``ModelConfig().tiny``, built with a longer
max_position_embeddings), ``llama-100m`` a random Llama (hidden 768, 12 layers, vocabulary 32000,
~110M parameters). The machine's load is recorded around each (model, size) (``benchmarks/_harness.py``;
``"valid": false`` says the figures cannot be trusted, and why); ``*_ms_max`` beside each minimum is the
slowest repeat. With --json the last line is ``{"results": [...], "settings", "valid", "load", ...}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from _harness import Monitor, emit
from stepcredit.config import ModelConfig
from stepcredit.models import build_tiny
from stepcredit.process import ValueQuery, answer_suffix, forced_answer_values
from stepcredit.types import RolloutCache

SIZES = [(200, 4), (800, 16), (2048, 32)]
PROMPT_TOKENS = 32


def tiny_model() -> tuple[Any, list[int], int]:
    cfg = dataclasses.replace(ModelConfig().tiny, max_position_embeddings=4096)
    model, tok = build_tiny(cfg, seed=0, attn_implementation="sdpa")
    suffix, n_answer = answer_suffix(tok, "\nThe answer is ", "42")
    return model.eval(), suffix, n_answer


def llama_100m() -> tuple[Any, list[int], int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    # a BPE model's "\nThe answer is 42" is about 6 tokens, the answer 1-2 of them
    return model, [13, 450, 1234, 338, 29871, 29946, 29906], 2


def make_query(vocab: int, tokens: int, boundaries: int, suffix: list[int], n_answer: int) -> ValueQuery:
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(8, vocab, (PROMPT_TOKENS + tokens,), generator=g).tolist()
    lens = [0] + [round(tokens * (i + 1) / boundaries) for i in range(boundaries)]
    return ValueQuery(ids[:PROMPT_TOKENS], ids[PROMPT_TOKENS:], lens, suffix, n_answer)


def rollout_cache(model: Any, q: ValueQuery) -> RolloutCache:
    """The KV cache a rollout's behaviour log-prob pass leaves over prompt + response."""
    ids = torch.tensor([q.context_ids + q.response_ids])
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
    return RolloutCache(cache, [0], ids.shape[1])


def floor_pass(model: Any, q: ValueQuery) -> Callable[[], Any]:
    n = len(q.context_ids) + max(q.prefix_lens) + len(q.suffix_ids) * len(q.prefix_lens)
    keep = len(q.suffix_ids) * len(q.prefix_lens)
    ids = torch.randint(8, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(1))

    def run() -> Any:
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits

    return run


def bench(
    name: str,
    model: Any,
    suffix: list[int],
    n_answer: int,
    sizes: list[tuple[int, int]],
    repeats: int,
    warmup: bool,
    naive_repeats: int,
    mon: Monitor,
) -> list[dict[str, Any]]:
    rows = []
    for tokens, boundaries in sizes:
        with mon.side(f"{name} {tokens} tokens {boundaries} boundaries (strategies round-robin)"):
            rows.append(
                one_size(name, model, suffix, n_answer, tokens, boundaries, repeats, warmup, naive_repeats)
            )
    return rows


def one_size(
    name: str,
    model: Any,
    suffix: list[int],
    n_answer: int,
    tokens: int,
    boundaries: int,
    repeats: int,
    warmup: bool,
    naive_repeats: int,
) -> dict[str, Any]:
    q = make_query(model.config.vocab_size, tokens, boundaries, suffix, n_answer)
    res: dict[str, Any] = {"model": name, "tokens": tokens, "boundaries": boundaries}
    vals: dict[str, list[float]] = {}
    run_floor = floor_pass(model, q)
    runs: dict[str, Callable[[], Any]] = {
        s: (lambda s=s, q=q: forced_answer_values(model, [q], strategy=s))
        for s in ("naive", "kv_cache", "kv_packed", "packed_single", "packed")
    }
    # in training: generation's behaviour log-prob pass already holds the response's cache, so
    # only the suffixes run (the cache itself is built outside the timing)
    body = rollout_cache(model, q)
    runs["packed_cached"] = lambda q=q, body=body: forced_answer_values(
        model, [q], strategy="packed", body=body
    )
    runs["floor"] = run_floor
    times: dict[str, list[float]] = {k: [] for k in runs}
    # warm-up (allocator, kernels, lazy imports); on the big model only the cheap floor pass
    for fn in runs.values() if warmup else [run_floor]:
        fn()
    # round-robin repeats, so that load from other work on the machine hits every method alike;
    # the minimum is the least disturbed run
    for rep in range(repeats):
        for k, fn in runs.items():
            if k == "naive" and rep >= naive_repeats:
                continue  # naive is the slow reference: its minimum needs fewer samples
            t0 = time.perf_counter()
            out = fn()
            times[k].append((time.perf_counter() - t0) * 1000)
            if k != "floor":
                vals[k] = out[0]
    for k in runs:
        res[f"{k}_ms"] = round(min(times[k]), 2)
        res[f"{k}_ms_max"] = round(max(times[k]), 2)
    res["max_abs_diff"] = max(
        abs(a - b)
        for s in ("kv_cache", "kv_packed", "packed_single", "packed", "packed_cached")
        for a, b in zip(vals[s], vals["naive"], strict=True)
    )
    print(
        f"{name:>10} {tokens:>6} {boundaries:>4} {res['naive_ms']:>10.1f} {res['kv_cache_ms']:>10.1f} "
        f"{res['kv_packed_ms']:>10.1f} {res['packed_single_ms']:>10.1f} {res['packed_ms']:>10.1f} "
        f"{res['packed_cached_ms']:>10.1f} {res['floor_ms']:>10.1f} {res['naive_ms'] / res['packed_ms']:>8.2f}x "
        f"{res['packed_ms'] / res['floor_ms']:>8.2f}x {res['max_abs_diff']:>9.1e}",
        flush=True,
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument(
        "--quick", action="store_true", help="fewer repeats; the 100M model only at (200, 4) and (800, 16)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (2 oversubscribe a busy 2-core machine)",
    )
    ap.add_argument("--models", default="tiny,llama-100m", help="comma-separated subset of tiny,llama-100m")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{'model':>10} {'tokens':>6} {'bnd':>4} {'naive ms':>10} {'kv ms':>10} {'kvpack ms':>10} {'single ms':>10} "
        f"{'packed ms':>10} {'cached ms':>10} "
        f"{'floor ms':>10} {'naive/pk':>9} {'pk/floor':>9} {'max diff':>9}"
    )
    results = []
    mon = Monitor()
    wanted = args.models.split(",")
    if "tiny" in wanted:
        results += bench(
            "tiny",
            *tiny_model(),
            SIZES,
            repeats=3 if args.quick else 5,
            warmup=True,
            naive_repeats=3,
            mon=mon,
        )
    if "llama-100m" in wanted:
        sizes = SIZES[:2] if args.quick else SIZES
        results += bench(
            "llama-100m",
            *llama_100m(),
            sizes,
            repeats=2 if args.quick else 3,
            warmup=False,
            naive_repeats=1,
            mon=mon,
        )
    side = {"threads": args.threads, "dtype": "float32", "attn": "sdpa", "no_grad": True}
    settings = {
        **{s: {**side, "strategy": s} for s in ("naive", "kv_cache", "kv_packed", "packed_single", "packed")},
        "packed_cached": {**side, "strategy": "packed", "body": "rollout cache (built untimed)"},
        "floor": {**side, "what": "one causal forward pass, as many tokens and logits as packed"},
    }
    emit(mon.finish({"benchmark": "process_values", "results": results}, settings), args.json)


if __name__ == "__main__":
    main()
