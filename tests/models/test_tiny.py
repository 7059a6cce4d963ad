"""The built-in tiny model and tokenizer: chat template, special tokens, save/load round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stepcredit.config import ModelConfig, TinyModelConfig
from stepcredit.errors import UserError
from stepcredit.models import load_policy, save_pretrained, token_logprobs

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))


def test_tokenizer_is_character_level_with_chat_template() -> None:
    _, tok = load_policy(SMALL)
    text = "So 12 + 5 = 17."
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert len(enc["input_ids"]) == len(text)
    assert enc["offset_mapping"][3] == (3, 4)
    assert tok.decode(enc["input_ids"]) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|user|>hi<|end|><|assistant|>"
    assert tok.pad_token_id == 0 and tok.eos_token == "</s>" and tok.padding_side == "left"


def test_save_load_round_trip(tmp_path: Path) -> None:
    model, tok = load_policy(SMALL, seed=1)
    save_pretrained(model, tok, tmp_path / "m")
    model2, tok2 = load_policy(ModelConfig(path=str(tmp_path / "m")))
    ids = torch.tensor([tok("Let me start with 3.", add_special_tokens=False)["input_ids"]])
    assert torch.equal(model(ids).logits, model2(ids).logits)
    assert tok2("a b")["input_ids"] == tok("a b")["input_ids"]


def test_seeded_init_and_missing_path() -> None:
    a, _ = load_policy(SMALL, seed=0)
    b, _ = load_policy(SMALL, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    with pytest.raises(UserError, match=r"model\.path"):
        load_policy(ModelConfig(path="/no/such/model"))


def test_left_padding_does_not_change_logprobs() -> None:
    model, _ = load_policy(SMALL, seed=0)
    ids = torch.tensor([[5, 40, 41, 42, 43, 44]])
    lp1, _ = token_logprobs(model, ids, torch.ones_like(ids), n_response=3)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(ids)], 1)
    lp2, _ = token_logprobs(model, padded, mask, n_response=3)
    assert torch.allclose(lp1, lp2, atol=1e-5)


def test_bpe_tokenizer_is_deterministic_and_exact() -> None:
    from stepcredit.models import build_tokenizer

    a, b = build_tokenizer("bpe"), build_tokenizer("bpe")
    assert a.get_vocab() == b.get_vocab() and len(a) == 400
    text = "Let me start with 13. But 13 - 2 = 11.\nThe answer is 11."
    ids = a(text, add_special_tokens=False)["input_ids"]
    assert len(ids) < len(text) / 2  # words and numbers are single tokens
    assert a.decode(ids) == text
    assert [a.pad_token_id, a.bos_token_id, a.eos_token_id] == [0, 1, 2]  # the ids the model config assumes
