"""``llama_step``: one decoding step without transformers' per-call work gives the logits and the cache
that ``LlamaForCausalLM.forward`` gives (with and without padding, with grouped key/value heads), and
the sampling loop draws the same tokens with it as without it."""

from __future__ import annotations

import copy

import pytest
import torch

from stepcredit.models.decode_step import (
    DecodeOptions,
    decode_options,
    fast_step,
    llama_step,
    static_width,
    supports_llama_step,
)


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
    model.forward = lambda *a, **k: None  # a forward wrapper of someone else's: it must run
    assert fast_step(model) is None


def test_a_bf16_autocast_model_takes_the_fast_step_under_its_autocast() -> None:
    from stepcredit.models import use_bf16_autocast

    model = llama(2)
    use_bf16_autocast(model)  # model.dtype=bfloat16: float32 weights, bfloat16 products
    step = fast_step(model)
    assert step is not None
    ref, got = _one_step(model, step)
    assert ref.dtype == got.dtype == torch.bfloat16  # the step ran under the same autocast
    assert torch.equal(got, ref)  # the same operations in the same order: bit for bit


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


# ------------------------------------------------------------------- static cache, compiled step, merged LoRA
def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Four left-padded prompts, two of them the same (a group shares its prefill)."""
    torch.manual_seed(0)
    ids = torch.randint(3, 50, (4, 7))
    ids[3] = ids[2]
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    return ids.masked_fill(mask == 0, 0), mask


def _greedy(model: torch.nn.Module, options: DecodeOptions, max_new: int = 24, eos: int = 2) -> torch.Tensor:
    from stepcredit.rollout.sampling import decode

    ids, mask = _prompts()
    with decode_options(options):
        return decode(
            model, ids, mask, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=0, temperature=0.0
        )


# aot_eager: dynamo traces the step into one graph and runs it (what inductor would compile on a GPU),
# in a second here instead of a C++ build
STATIC = DecodeOptions(compile="default", backend="aot_eager")


def test_static_width_rounds_up_to_a_multiple_of_64() -> None:
    assert [static_width(n) for n in (1, 64, 65, 200)] == [64, 64, 128, 256]


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_the_compiled_static_step_draws_the_same_greedy_tokens(kv_heads: int) -> None:
    import stepcredit.models.decode_step as ds

    model = llama(kv_heads)
    eager = _greedy(model, DecodeOptions())
    compiled = _greedy(model, STATIC)
    assert eager.shape[1] > 5 and torch.equal(compiled, eager)
    # a second decode reuses the compiled step and the buffers of its shape
    state = ds._STATIC[model]
    fns = [k for k in state if k[0] == "fn"]
    assert fns == [("fn", "default", "aot_eager")]
    assert torch.equal(_greedy(model, STATIC), eager)
    assert [k for k in state if k[0] == "fn"] == fns and len([k for k in state if k[0] == "bufs"]) == 1


def test_the_static_step_stops_rows_at_eos_like_the_eager_loop() -> None:
    # an eos that the greedy rows reach at different steps: finished rows stay in the static batch
    # (fixed shapes) and emit padding, as the eager loop's dropped rows do
    model = llama(4)
    free = _greedy(model, DecodeOptions(), eos=-1)  # no eos: every row runs 24 tokens
    eos = int(free[0, 4])  # a token row 0 draws: as eos it ends row 0 by its 5th token
    eager = _greedy(model, DecodeOptions(), eos=eos)
    assert torch.equal(_greedy(model, STATIC, eos=eos), eager)
    ended = (eager == eos).any(dim=1)
    assert ended.any() and eager.shape[1] > 5


def test_a_bf16_autocast_model_draws_the_same_greedy_tokens_compiled() -> None:
    from stepcredit.models import use_bf16_autocast

    model = llama(2)
    use_bf16_autocast(model)
    assert torch.equal(_greedy(model, STATIC), _greedy(model, DecodeOptions()))


def test_a_lora_policy_draws_the_same_greedy_tokens_merged_and_compiled() -> None:
    from peft.tuners.lora import LoraLayer

    from stepcredit.models.lora import adapters_merged

    policy = lora_policy(2)
    base = {n: p.detach().clone() for n, p in policy.named_parameters()}
    unmerged = _greedy(policy, DecodeOptions(merge_lora=False))
    merged = _greedy(policy, DecodeOptions(merge_lora=True))
    assert unmerged.shape[1] > 5 and torch.equal(merged, unmerged)
    assert torch.equal(_greedy(policy, DecodeOptions(compile="default", backend="aot_eager")), unmerged)
    # afterwards every weight is what it was, bit for bit, and no layer is left marked merged
    assert all(torch.equal(base[n], p) for n, p in policy.named_parameters())
    layers = [m for m in policy.modules() if isinstance(m, LoraLayer)]
    assert layers and not any(m.merged for m in layers)
    # inside the block: W + (alpha / r) B A in the base weight, and the layer runs its base layer alone
    q = next(m for m in layers if m.get_base_layer().out_features == 32)
    with adapters_merged(policy) as n:
        assert n == len(layers) and q.merged
        delta = q.get_delta_weight("default")
        assert torch.allclose(q.get_base_layer().weight, base_weight(base, q, policy) + delta, atol=1e-6)
    policy.train()  # training mode (LoRA dropout live): nothing is merged
    with adapters_merged(policy) as n:
        assert n == 0


def base_weight(
    base: dict[str, torch.Tensor], layer: torch.nn.Module, policy: torch.nn.Module
) -> torch.Tensor:
    name = next(n for n, m in policy.named_modules() if m is layer)
    return base[f"{name}.base_layer.weight"]


def test_decode_compile_on_a_model_the_step_cannot_run_is_refused_at_start() -> None:
    # the compiled step is the Llama step: a policy it cannot run would decode eagerly, unasked
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from stepcredit.config import from_dict
    from stepcredit.errors import ConfigError
    from stepcredit.rollout.engines.hf import build_hf

    cfg = from_dict({"rollout": {"decode_compile": "default"}})
    qwen = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    with pytest.raises(ConfigError, match=r"rollout\.decode_compile.*Qwen2ForCausalLM.*decode_compile=off"):
        build_hf(cfg, qwen, None)
    lora = lora_policy(2).train()  # a LoRA Llama in training mode decodes in eval mode: accepted
    assert build_hf(cfg, lora, None).options.compiled
    assert not build_hf(from_dict({}), qwen, None).options.compiled
