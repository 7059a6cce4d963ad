"""LoRA adapters (models/lora.py): what trains, the adapters-off reference, merged weights, export."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from stepcredit.cli.common import load_preset
from stepcredit.config import LoRAConfig, ModelConfig, TinyModelConfig, from_dict
from stepcredit.errors import ConfigError
from stepcredit.models import build_tiny, load_policy, token_logprobs, use_bf16_autocast
from stepcredit.models.lora import (
    AdapterOffView,
    adapter_parameters,
    attach_lora,
    base_parameters,
    check_lora,
    export_lora,
    load_lora_state_dict,
    lora_state_dict,
    merged_state_dict,
)

SMOKE = TinyModelConfig(
    hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64
)  # a small model for the maths


def _policy(rank: int = 8, **kw: object) -> tuple[torch.nn.Module, torch.nn.Module, object]:
    """A LoRA policy with nonzero B (as after training), and an untouched copy of the plain model."""
    model, tok = build_tiny(SMOKE, seed=0)
    plain = copy.deepcopy(model)
    policy = attach_lora(model, LoRAConfig(rank=rank, **kw))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return policy, plain, tok


def _ids() -> torch.Tensor:
    return torch.randint(3, 100, (3, 12), generator=torch.Generator().manual_seed(2))


def test_only_adapters_train_and_under_5_percent_on_the_smoke_preset() -> None:
    # the smoke preset with model.lora.rank=8, as `stepcredit train --preset smoke model.lora.rank=8` builds
    # it: adapters on q_proj and v_proj (64 -> 64) of each of the 2 blocks, r * (64 + 64) = 1,024 each,
    # 4,096 in all beside the model's 88,960 weights: 4.4 %
    data = load_preset("smoke")
    data["model"]["lora"] = {**data["model"].get("lora", {}), "rank": 8}
    cfg = from_dict(data)
    model, _ = build_tiny(cfg.model.tiny, seed=0)
    n_base = sum(p.numel() for p in model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # as SFT's last step leaves them
    policy = attach_lora(model, cfg.model.lora)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    assert all(p.grad is None for p in base_parameters(policy))  # no stale gradient in the clipped norm
    assert {id(p) for p in trainable} == {id(p) for p in adapter_parameters(policy)}
    n_train = sum(p.numel() for p in trainable)
    assert (n_base, n_train) == (88_960, 4_096)
    assert n_train / (n_base + n_train) < 0.05
    # with the default target modules (all seven projections) the share is under 5 % at the widths
    # LoRA is for, e.g. SmolLM2-135M's shape (576 wide, 30 blocks; built on the meta device, no weights)
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        big = attach_lora(LlamaForCausalLM(shape), LoRAConfig(rank=8))
    n_all = sum(p.numel() for p in big.parameters())
    n_lora = sum(p.numel() for p in adapter_parameters(big))
    # per block: q, o 8 * (576 + 576); k, v 8 * (576 + 192); gate, up, down 8 * (576 + 1536)
    assert n_lora == 30 * (2 * 9216 + 2 * 6144 + 3 * 16896)
    assert n_lora / n_all < 0.05


def test_fresh_adapters_compute_the_plain_model_and_the_reference_is_the_base() -> None:
    model, _ = build_tiny(SMOKE, seed=0)
    plain = copy.deepcopy(model)
    fresh = attach_lora(model, LoRAConfig(rank=8))
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, plain(input_ids=ids).logits)  # B = 0
    policy, plain, _ = _policy()
    ref = AdapterOffView(policy)
    policy.train()
    with torch.no_grad():
        moved = policy(input_ids=ids).logits
        base = ref(input_ids=ids).logits
        assert torch.equal(base, plain(input_ids=ids).logits)
        assert (moved - base).abs().max() > 1e-2
    assert policy.training  # the view's eval mode is undone
    # the view holds no weights: its parameters are the policy's base tensors themselves
    assert [id(p) for p in ref.parameters()] == [id(p) for p in base_parameters(policy)]
    assert all(not p.requires_grad for p in ref.parameters())


def test_the_reference_view_gives_the_frozen_copys_log_probs() -> None:
    policy, plain, _ = _policy()
    ids = _ids()
    attn = torch.ones_like(ids)
    with torch.no_grad():
        want, _ = token_logprobs(plain.eval(), ids, attn, n_response=5)
        got, _ = token_logprobs(AdapterOffView(policy), ids, attn, n_response=5)
    assert torch.equal(got, want)


def test_merged_state_dict_is_peft_merge_under_the_plain_names() -> None:
    policy, plain, _ = _policy()
    got = merged_state_dict(policy)
    assert list(got) == list(plain.state_dict())  # the plain model's names, in its order
    want = copy.deepcopy(policy).merge_and_unload().state_dict()
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-6)
    # W + (alpha / r) B A by hand for one layer (alpha 16, r 8: scale 2)
    q = policy.get_base_model().model.layers[0].self_attn.q_proj
    by_hand = q.base_layer.weight + 2.0 * q.lora_B["default"].weight @ q.lora_A["default"].weight
    torch.testing.assert_close(got["model.layers.0.self_attn.q_proj.weight"], by_hand)
    # layers without adapters are the policy's own tensors, and the policy is unchanged
    emb = policy.get_base_model().model.embed_tokens.weight
    assert got["model.embed_tokens.weight"].data_ptr() == emb.data_ptr()
    base = merged_state_dict(policy, merge=False)
    for k, v in plain.state_dict().items():
        assert torch.equal(base[k], v), k
    ids = _ids()
    with torch.no_grad():
        loaded = copy.deepcopy(plain)
        loaded.load_state_dict(got)
        torch.testing.assert_close(
            loaded(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("with_base", [False, True])
def test_checkpoint_state_round_trips(with_base: bool) -> None:
    policy, _, _ = _policy()
    state = lora_state_dict(policy, with_base=with_base)
    n_base = sum(1 for k in state if ".lora_" not in k)
    assert (n_base > 0) == with_base  # adapters only, unless SFT moved the base
    other, _ = build_tiny(SMOKE, seed=0)
    if with_base:
        with torch.no_grad():
            for p in other.parameters():
                p.add_(1.0)  # a different base: the checkpoint's must replace it
    restored = attach_lora(other, LoRAConfig(rank=8))
    load_lora_state_dict(restored, state, with_base=with_base)
    for (n, a), (m, b) in zip(policy.state_dict().items(), restored.state_dict().items(), strict=True):
        assert n == m and torch.equal(a, b), n


def test_export_writes_adapters_base_and_merged_model(tmp_path: Path) -> None:
    from peft import PeftModel

    policy, _, tok = _policy()
    export_lora(policy, tok, tmp_path, LoRAConfig(rank=8, merge_on_export=True), base_source=None)
    assert {p.name for p in tmp_path.iterdir()} == {"adapter", "base", "model"}
    ids = _ids()
    with torch.no_grad():
        want = policy(input_ids=ids).logits
        merged, _ = load_policy(ModelConfig(path=str(tmp_path / "model")))  # a plain model directory
        torch.testing.assert_close(merged(input_ids=ids).logits, want, atol=1e-5, rtol=0)
        base, _ = load_policy(ModelConfig(path=str(tmp_path / "base")))
        adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
        assert torch.equal(adapted(input_ids=ids).logits, want)


def test_a_target_that_is_not_a_linear_layer_is_one_line() -> None:
    model, _ = build_tiny(SMOKE, seed=0)
    with pytest.raises(
        ConfigError, match=r"^config key model\.lora\.target_modules: qkv_proj is no linear"
    ) as e:
        attach_lora(model, LoRAConfig(rank=4, target_modules=("q_proj", "qkv_proj")))
    assert "\n" not in str(e.value) and "down_proj" in str(e.value)


def test_lora_without_peft_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a)
    )
    model, _ = build_tiny(SMOKE, seed=0)
    with pytest.raises(
        ConfigError,
        match=r"^config key model\.lora\.rank: LoRA needs peft: pip install 'stepcredit\[lora\]'$",
    ):
        check_lora(model, LoRAConfig(rank=4))


def test_adapters_take_the_models_dtype_and_run_under_its_autocast() -> None:
    # bfloat16 weights: bfloat16 adapters (peft's default would keep them float32)
    model, _ = build_tiny(SMOKE, seed=0)
    policy = attach_lora(model.to(torch.bfloat16), LoRAConfig(rank=4))
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    # model.dtype=bfloat16 (float32 weights under autocast): the wrapped model's autocast still applies
    model, _ = build_tiny(SMOKE, seed=0)
    use_bf16_autocast(model)
    policy = attach_lora(model, LoRAConfig(rank=4))
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    with torch.no_grad():
        assert policy(input_ids=_ids()).logits.dtype == torch.bfloat16
        assert AdapterOffView(policy)(input_ids=_ids()).logits.dtype == torch.bfloat16
