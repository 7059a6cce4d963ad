"""``llama_step``: one decoding step without transformers' per-call work gives the logits and the cache
that ``LlamaForCausalLM.forward`` gives (with and without padding, with grouped key/value heads), and
the sampling loop draws the same tokens with it as without it."""

from __future__ import annotations

import copy

import pytest
import torch

from stepcredit.models.decode_step import fast_step, llama_step, supports_llama_step


def llama(kv_heads: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("padded", [True, False])
def test_one_step_equals_the_forward_pass(kv_heads: int, padded: bool) -> None:
    model = llama(kv_heads)
    assert supports_llama_step(model)
    ids = torch.randint(3, 50, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.long)
    if padded:
        mask[0, :2] = 0  # left padding: the step needs a mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        cache_ref = out.past_key_values
        cache = copy.deepcopy(cache_ref)
        tok = torch.randint(3, 50, (3, 1))
        mask2 = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)
        nxt = mask.sum(1, keepdim=True)
        ref = model(
            input_ids=tok, attention_mask=mask2, position_ids=nxt, past_key_values=cache_ref, use_cache=True
        ).logits[:, -1]
        got = llama_step(model, tok, nxt, mask2, cache)
    assert torch.allclose(got, ref, atol=1e-5)
    for a, b in zip(cache.layers, cache_ref.layers, strict=True):
        assert torch.allclose(a.keys, b.keys) and torch.allclose(a.values, b.values)


def test_models_it_cannot_stand_in_for_are_left_to_their_forward() -> None:
    model = llama(4)
    model.train()
    assert fast_step(model) is None  # training mode (dropout settings would be the module's)
    model.eval()
    model.config._attn_implementation = "eager"
    assert fast_step(model) is None
    model.config._attn_implementation = "sdpa"
    from stepcredit.models import use_bf16_autocast

    use_bf16_autocast(model)  # the autocast wrapper must run: its forward is the model's
    assert fast_step(model) is None
