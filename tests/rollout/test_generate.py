"""Rollout: groups, masks up to and including eos, truncation flags and behaviour log-probs."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from stepcredit.config import ArithConfig, ModelConfig, TinyModelConfig
from stepcredit.data import row_to_sample
from stepcredit.data.arith import make_rows
from stepcredit.models import load_policy, token_logprobs
from stepcredit.rollout import generate, sampling_logprobs_exact

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))


def test_generate_shapes_masks_and_logprobs() -> None:
    torch.manual_seed(0)
    model, tok = load_policy(SMALL, seed=0)
    # bias the model towards eos so that some responses stop early and some are truncated
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += 0.3
    samples = [
        row_to_sample(r, f"t:{i}") for i, r in enumerate(make_rows(ArithConfig(), 3, seed=0, split="train"))
    ]
    b = generate(model, tok, samples, n=4, max_new_tokens=12, group_offset=10)
    assert len(b) == 12 and b.group_B.tolist() == [10] * 4 + [11] * 4 + [12] * 4
    B, T = b.response_ids_BT.shape
    assert T <= 12 and b.response_mask_BT.dtype == torch.bool
    lens = b.response_mask_BT.sum(1)
    for i in range(B):
        ids = b.response_ids_BT[i, : lens[i]].tolist()
        assert (ids[-1] == tok.eos_token_id) != bool(b.truncated_B[i])
        assert tok.eos_token_id not in ids[:-1]
        assert (b.response_ids_BT[i, lens[i] :] == tok.pad_token_id).all()
        assert (b.behaviour_logp_BT[i, lens[i] :] == 0).all()
    # behaviour log-probs equal a fresh forward pass over prompt + response
    ids = torch.cat([b.prompt_ids_BP, b.response_ids_BT], 1)
    attn = torch.cat([b.prompt_mask_BP, b.response_mask_BT], 1).long()
    lp, _ = token_logprobs(model, ids, attn, n_response=T)
    assert torch.allclose(lp[b.response_mask_BT], b.behaviour_logp_BT[b.response_mask_BT], atol=1e-5)


def test_greedy_is_deterministic() -> None:
    model, tok = load_policy(SMALL, seed=0)
    samples = [
        row_to_sample(r, f"t:{i}") for i, r in enumerate(make_rows(ArithConfig(), 2, seed=1, split="val"))
    ]
    a = generate(model, tok, samples, n=1, max_new_tokens=10, temperature=0)
    b = generate(model, tok, samples, n=1, max_new_tokens=10, temperature=0)
    assert a.texts == b.texts


def test_logprobs_from_the_sampling_loop_equal_the_pass() -> None:
    """The sampling loop's log-probs of its own draws (log_softmax(logits / temperature) at the token)
    are the separate pass's to float rounding in float32, the tokens are the same draws, and padding
    gets 0; rows finish early (eos bias) so the loop drops rows from its batch on the way."""
    model, tok = load_policy(SMALL, seed=0)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += 0.3
    samples = [
        row_to_sample(r, f"t:{i}") for i, r in enumerate(make_rows(ArithConfig(), 3, seed=0, split="train"))
    ]
    kw: dict[str, Any] = {"n": 4, "max_new_tokens": 12, "temperature": 0.7, "top_p": 0.9}
    torch.manual_seed(1)
    times: dict[str, float] = {}
    a = generate(model, tok, samples, logprobs_from_sampling=True, times=times, **kw)
    torch.manual_seed(1)
    b = generate(model, tok, samples, **kw)
    assert torch.equal(a.response_ids_BT, b.response_ids_BT)
    assert a.behaviour_logp_BT is not None and b.behaviour_logp_BT is not None
    assert torch.allclose(a.behaviour_logp_BT, b.behaviour_logp_BT, atol=1e-5, rtol=0)
    assert (a.behaviour_logp_BT[~a.response_mask_BT] == 0).all()
    assert (a.behaviour_logp_BT[a.response_mask_BT] < 0).all()
    assert times == {"time/behaviour_logp_s": 0.0}  # no pass ran
    assert 0 < int(a.response_mask_BT.sum()) < a.response_mask_BT.numel()  # some rows ended early


def test_bfloat16_falls_back_to_the_pass() -> None:
    """Under bfloat16 autocast the step-by-step decode rounds differently from the whole-sequence
    pass: the loop's log-probs are not used, the pass runs."""
    model, tok = load_policy(dataclasses.replace(SMALL, dtype="bfloat16"), seed=0)
    assert not sampling_logprobs_exact(model)
    assert sampling_logprobs_exact(load_policy(SMALL, seed=0)[0])
    samples = [
        row_to_sample(r, f"t:{i}") for i, r in enumerate(make_rows(ArithConfig(), 2, seed=0, split="train"))
    ]
    times: dict[str, float] = {}
    b = generate(model, tok, samples, n=2, max_new_tokens=8, logprobs_from_sampling=True, times=times)
    assert times["time/behaviour_logp_s"] > 0
    ids = torch.cat([b.prompt_ids_BP, b.response_ids_BT], 1)
    attn = torch.cat([b.prompt_mask_BP, b.response_mask_BT], 1).long()
    lp, _ = token_logprobs(model, ids, attn, n_response=b.response_ids_BT.shape[1])
    assert b.behaviour_logp_BT is not None
    assert torch.allclose(lp[b.response_mask_BT], b.behaviour_logp_BT[b.response_mask_BT], atol=1e-6)
