"""``token_logprobs`` (logsumexp form) equals the log-softmax reference, values and gradients."""

from __future__ import annotations

import torch

from stepcredit.config import ModelConfig, TinyModelConfig
from stepcredit.models import load_policy, token_logprobs

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))


def test_logprobs_and_entropy_equal_the_log_softmax_reference() -> None:
    model, _ = load_policy(SMALL, seed=0)
    ids = torch.randint(8, 100, (3, 12), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    lp, ent = token_logprobs(model, ids, attn, n_response=5, temperature=0.7, with_entropy=True)
    assert ent is not None
    (lp.sum() + ent.sum()).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    # reference: the whole log-softmax, as written in most RL code
    logits = model(input_ids=ids, attention_mask=attn).logits[:, -6:-1].float() / 0.7
    logp_all = torch.log_softmax(logits, dim=-1)
    ref = logp_all.gather(-1, ids[:, -5:, None]).squeeze(-1)
    ref_ent = -(logp_all.exp() * logp_all).sum(-1)
    assert torch.allclose(lp, ref, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    (ref.sum() + ref_ent.sum()).backward()
    for g, p in zip(got, model.parameters(), strict=True):
        assert torch.allclose(g, p.grad, atol=1e-5)
