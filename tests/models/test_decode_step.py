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


def lora_policy(kv_heads: int) -> torch.nn.Module:
    """``llama(kv_heads)`` with LoRA adapters on every linear layer of attention and MLP, their B
    matrices random (fresh adapters have B = 0 and would compute the base model: nothing to tell)."""
    from stepcredit.config import LoRAConfig
    from stepcredit.models.lora import attach_lora

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    policy = attach_lora(llama(kv_heads), LoRAConfig(rank=4, alpha=8.0, dropout=0.1, target_modules=targets))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return policy.eval()


def _one_step(model: torch.nn.Module, step: object) -> tuple[torch.Tensor, torch.Tensor]:
    """(the model's own next-token logits after one more token on a left-padded batch, the step's)."""
    torch.manual_seed(2)
    ids = torch.randint(3, 50, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[0, :2] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        cache_ref = model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True
        ).past_key_values
        cache = copy.deepcopy(cache_ref)
        tok = torch.randint(3, 50, (3, 1))
        mask2 = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)
        nxt = mask.sum(1, keepdim=True)
        ref = model(
            input_ids=tok, attention_mask=mask2, position_ids=nxt, past_key_values=cache_ref, use_cache=True
        ).logits[:, -1]
        got = step(tok, nxt, mask2, cache)  # type: ignore[operator]
    return ref, got


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_a_lora_policy_takes_the_fast_step_with_its_adapters(kv_heads: int) -> None:
    policy = lora_policy(kv_heads)
    step = fast_step(policy)
    assert step is not None and supports_llama_step(policy)
    ref, got = _one_step(policy, step)
    assert torch.allclose(got, ref, atol=1e-5)
    # the adapters count: the base model's logits differ from the policy's
    with policy.disable_adapter():  # type: ignore[operator]
        base_ref, base_got = _one_step(policy, step)
    assert torch.allclose(base_got, base_ref, atol=1e-5)  # adapters off (the reference): the base's
    assert not torch.allclose(ref, base_ref, atol=1e-3)
    policy.train()  # LoRA dropout would be live: the module's forward, not the step
    assert fast_step(policy) is None


def test_a_lora_policy_draws_the_same_greedy_tokens_on_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepcredit.rollout import sampling as decode_mod

    policy = lora_policy(2)
    torch.manual_seed(0)
    ids = torch.randint(3, 50, (4, 7))
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    ids = ids.masked_fill(mask == 0, 0)
    used: list[int] = []
    real = decode_mod.fast_step
    monkeypatch.setattr(decode_mod, "fast_step", lambda m: used.append(1) or real(m))
    outs = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(decode_mod, "fast_step", lambda m: None)
        outs.append(
            decode_mod.decode(
                policy, ids, mask, max_new_tokens=24, eos_token_id=2, pad_token_id=0, temperature=0.0
            )
        )
    assert used and real(policy) is not None  # the fast path ran the first time
    assert outs[0].shape[1] > 5 and torch.equal(outs[0], outs[1])
