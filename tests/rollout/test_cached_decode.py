"""Continuations from the rollout's KV cache and the answer-marker stop rule of the sampling loop: the
same tokens as a decode that prefills each context, and nothing generated after the marker."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from stepcredit.config import TinyModelConfig
from stepcredit.models import build_tiny, build_tokenizer
from stepcredit.models.logprobs import token_logprobs
from stepcredit.rollout.cached_decode import decode_cached
from stepcredit.rollout.engines import CachedContexts, SamplingSpec, sample_cached
from stepcredit.rollout.engines.api import left_pad
from stepcredit.rollout.engines.hf import HFEngine
from stepcredit.rollout.sampling import decode
from stepcredit.rollout.stops import PatternStop
from stepcredit.types import RolloutCache


def make_model(arch: str) -> tuple[Any, Any]:
    """A 2-layer random model with the character tokenizer, its weights scaled up so that its
    next-token distributions are far from uniform (greedy decodes without near-ties)."""
    if arch == "llama":
        model, tok = build_tiny(
            TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64), seed=0
        )
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tok = build_tokenizer()
        config = Qwen2Config(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval(), tok


def _rollout(model: Any, tok: Any) -> tuple[list[list[int]], list[list[int]], RolloutCache]:
    """Two prompts of different lengths with responses of different lengths, and the behaviour pass's
    cache over them (as ``generate(keep_cache=True)`` keeps it)."""
    prompts = [tok("q: 3 + 4?")["input_ids"], tok("question: 12 - 5 + 1?")["input_ids"]]
    responses = [tok("So 3 + 4 = 7. So done.")["input_ids"], tok("So 12 - 5 = 7. So 7 + 1 = 8.")["input_ids"]]
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    T = max(map(len, responses))
    r_ids = torch.full((2, T), tok.pad_token_id, dtype=torch.long)
    r_mask = torch.zeros((2, T), dtype=torch.bool)
    for b, r in enumerate(responses):
        r_ids[b, : len(r)], r_mask[b, : len(r)] = torch.tensor(r), True
    caches: list[Any] = []
    token_logprobs(
        model,
        torch.cat([p_ids, r_ids], 1),
        torch.cat([p_mask, r_mask], 1).long(),
        n_response=T,
        cache_out=caches,
    )
    starts = (p_ids.shape[1] - p_mask.sum(1)).tolist()
    return prompts, responses, RolloutCache(caches[0], starts, p_ids.shape[1] + T)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # llama: the fast token step; qwen2: model(...)
def test_continuing_the_rollout_cache_gives_the_prefilled_decodes_tokens(arch: str) -> None:
    model, tok = make_model(arch)
    prompts, responses, body = _rollout(model, tok)
    # prefixes of 0 (the bare prompt), some and all tokens of each response; both rows twice
    rows = [0, 0, 0, 1, 1, 1]
    lens = [0, 6, len(responses[0]), 0, 9, len(responses[1])]
    contexts = [prompts[r] + responses[r][:n] for r, n in zip(rows, lens, strict=True)]
    kw = {"max_new_tokens": 12, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    got = decode_cached(model, body, rows, contexts, temperature=0.0, **kw)
    ids, mask = left_pad(contexts, tok.pad_token_id)
    want = decode(model, ids, mask, temperature=0.0, **kw)
    assert got is not None and torch.equal(got, want)
    # through the engine: the same completions as sampling the contexts' tokens
    spec = SamplingSpec(n=1, temperature=0.0, max_tokens=12)
    cached = CachedContexts(body, tuple(rows), tuple(tuple(c) for c in contexts))
    assert [c.ids for c in sample_cached(model, tok, cached, spec)] == [
        c.ids for c in HFEngine().sample(model, tok, contexts, spec)
    ]
    # the rollout's cache is read, never written
    assert body.cache.get_seq_length() == body.width


def test_the_answer_marker_ends_a_row_at_the_token_that_completes_it() -> None:
    model, tok = make_model("llama")
    ids, mask = left_pad([tok("q: 3 + 4?")["input_ids"], tok("q: 9 - 2?")["input_ids"]], tok.pad_token_id)
    kw = {"max_new_tokens": 16, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    free = decode(model, ids, mask, temperature=0.0, **kw)
    text0 = tok.decode(free[0].tolist(), skip_special_tokens=True)
    # a marker the first row writes at its 6th character (and, as a regular expression, nowhere before);
    # the second row writes something else
    marker = re.escape(text0[:6])
    assert not re.search(marker, tok.decode(free[1].tolist(), skip_special_tokens=True))
    stop = PatternStop(tok, marker, 2)
    got = decode(model, ids, mask, temperature=0.0, stop=stop, **kw)
    n = next(t + 1 for t in range(16) if re.search(marker, tok.decode(free[0, : t + 1].tolist())))
    assert stop.ended == [n, 0]
    # the stopped row keeps the tokens up to the marker and generates nothing after it; the other runs on
    assert torch.equal(got[0, :n], free[0, :n]) and bool((got[0, n:] == tok.pad_token_id).all())
    assert torch.equal(got[1], free[1, : got.shape[1]])
    # through the engine (SamplingSpec.stop_pattern): the completion ends at the marker
    spec = SamplingSpec(n=1, temperature=0.0, max_tokens=16, stop_pattern=marker)
    rows = [ids[b][mask[b]].tolist() for b in range(2)]
    comps = HFEngine().sample(model, tok, rows, spec)
    assert comps[0].ids == free[0, :n].tolist() and len(comps[1].ids) == 16
