"""Tiny models and batches for the process-reward tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from stepcredit.config import TinyModelConfig
from stepcredit.models import build_tiny, build_tokenizer
from stepcredit.types import Batch, Sample


def _sharpen(model: Any, seed: int) -> Any:
    # Random init at std 0.02 gives near-uniform logits, so every V would be ~ -log|V| and equal across
    # prefixes; larger weights make the values differ so that agreement tests mean something.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval()


def make_model(arch: str, attn: str, seed: int = 0) -> tuple[Any, Any]:
    """A 2-layer random model of the given architecture with the built-in character tokenizer."""
    if arch == "llama":
        model, tok = build_tiny(
            TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64),
            seed=seed,
            attn_implementation=attn,
        )
        return _sharpen(model, seed), tok
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config._attn_implementation = attn
    torch.manual_seed(seed)
    return _sharpen(Qwen2ForCausalLM(config), seed), tok


def make_batch(tok: Any, rows: list[tuple[str, str, str]], *, eos: bool = True) -> Batch:
    """A batch of (prompt, response, answer): prompts left-padded, responses right-padded (+ eos)."""
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p, _, _ in rows
    ]
    p_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    r_ids = [
        tok(r, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
        for _, r, _ in rows
    ]
    P, T = max(map(len, p_ids)), max(map(len, r_ids))
    B = len(rows)
    prompt_BP = torch.zeros(B, P, dtype=torch.long)
    pmask_BP = torch.zeros(B, P, dtype=torch.bool)
    resp_BT = torch.zeros(B, T, dtype=torch.long)
    rmask_BT = torch.zeros(B, T, dtype=torch.bool)
    for b, (p, r) in enumerate(zip(p_ids, r_ids, strict=True)):
        prompt_BP[b, P - len(p) :] = torch.tensor(p)
        pmask_BP[b, P - len(p) :] = True
        resp_BT[b, : len(r)] = torch.tensor(r)
        rmask_BT[b, : len(r)] = True
    return Batch(
        samples=[
            Sample(prompt=({"role": "user", "content": p},), ground_truth=a, uid=f"t:{i}")
            for i, (p, _, a) in enumerate(rows)
        ],
        group_B=torch.arange(B),
        prompt_ids_BP=prompt_BP,
        prompt_mask_BP=pmask_BP,
        response_ids_BT=resp_BT,
        response_mask_BT=rmask_BT,
        behaviour_logp_BT=torch.zeros(B, T),
        texts=[r for _, r, _ in rows],
        truncated_B=torch.zeros(B, dtype=torch.bool),
    )


@pytest.fixture
def model_factory() -> Callable[..., tuple[Any, Any]]:
    return make_model


@pytest.fixture
def batch_factory() -> Callable[..., Batch]:
    return make_batch
