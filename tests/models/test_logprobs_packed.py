"""``token_logprobs`` lays rows out without padding (sorted, trimmed passes, logits only where a
response token is predicted): the same log-probs, entropies and gradients as one padded pass."""

from __future__ import annotations

import pytest
import torch

from stepcredit.config import ModelConfig, TinyModelConfig
from stepcredit.models import load_policy, token_logprobs
from stepcredit.models import logprobs as models
from stepcredit.models.logprobs import _padded_logprobs

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))


def ragged_batch(B: int = 10, P: int = 9, T: int = 11, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of 1..P tokens and right-padded responses of 0..T tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, 100, (B, P + T), generator=g)
    plen = torch.randint(1, P + 1, (B,), generator=g)
    rlen = torch.randint(0, T + 1, (B,), generator=g)
    rlen[0] = T  # at least one full-length response
    col = torch.arange(P + T)
    mask = ((col >= P - plen[:, None]) & (col < P)) | ((col >= P) & (col < P + rlen[:, None]))
    ids = torch.where(mask, ids, torch.zeros_like(ids))  # padding id 0
    return ids, mask.long()


def assert_equals_one_padded_pass(
    model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, T: int, lp: torch.Tensor, ent: torch.Tensor
) -> None:
    """``lp`` and ``ent`` (temperature 0.7) and their gradients equal one padded pass over every row;
    padding gets nothing."""
    resp = attn[:, -T:].bool()
    (lp.sum() + ent.sum()).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref, ref_ent = _padded_logprobs(model, ids, attn, T, 0.7, True, None)
    assert torch.allclose(lp[resp], ref[resp], atol=1e-5)
    assert torch.allclose(ent[resp], ref_ent[resp], atol=1e-5)
    assert bool((lp[~resp] == 0).all()) and bool((ent[~resp] == 0).all())  # padding gets nothing
    (ref.sum() + ref_ent.sum()).backward()
    for g, p in zip(got, model.parameters(), strict=True):
        assert torch.allclose(g, p.grad, atol=1e-5)


def test_packed_passes_equal_one_padded_pass_values_and_gradients() -> None:
    model, _ = load_policy(SMALL, seed=0)
    ids, attn = ragged_batch()
    T = 11
    lp, ent = token_logprobs(
        model, ids, attn, n_response=T, temperature=0.7, with_entropy=True, rows_per_pass=3
    )
    assert ent is not None
    assert_equals_one_padded_pass(model, ids, attn, T, lp, ent)


def test_extra_padding_does_not_change_the_log_probs() -> None:
    """Property: more left padding on the prompts and right padding on the responses, or another
    number of rows per pass, leaves every response token's log-prob as it was."""
    model, _ = load_policy(SMALL, seed=0)
    ids, attn = ragged_batch(seed=1)
    T = 11
    with torch.no_grad():
        base, _ = token_logprobs(model, ids, attn, n_response=T)
        wide_ids = torch.cat(
            [torch.zeros(10, 5, dtype=torch.long), ids, torch.zeros(10, 4, dtype=torch.long)], 1
        )
        wide_attn = torch.cat(
            [torch.zeros(10, 5, dtype=torch.long), attn, torch.zeros(10, 4, dtype=torch.long)], 1
        )
        wide, _ = token_logprobs(model, wide_ids, wide_attn, n_response=T + 4)
        one, _ = token_logprobs(model, ids, attn, n_response=T, rows_per_pass=1)
    assert torch.allclose(wide[:, :T], base, atol=1e-5) and bool((wide[:, T:] == 0).all())
    assert torch.allclose(one, base, atol=1e-5)


def test_a_row_with_a_gap_falls_back_to_the_padded_pass() -> None:
    model, _ = load_policy(SMALL, seed=0)
    ids, attn = ragged_batch(seed=2)
    attn[3, 9 + 1] = 0  # a hole inside a response: not [pad, prompt] + [response, pad]
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, attn, n_response=11)
        ref, _ = _padded_logprobs(model, ids, attn, 11, 1.0, False, None)
    assert torch.equal(lp, ref)


def grouped_batch(G: int = 4, n: int = 3, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` responses to each of ``G`` prompts (a GRPO batch): the prompt part of rows
    ``g * n .. g * n + n - 1`` is one prompt, their responses differ in tokens and length."""
    ids, attn = ragged_batch(B=G * n, seed=seed)
    P = 9
    first = torch.arange(G).repeat_interleave(n) * n
    ids[:, :P], attn[:, :P] = ids[first, :P], attn[first, :P]
    attn[1, P:] = 0  # an empty response in a group
    ids[1, P:] = 0
    attn[2, P + 1 :] = 0  # and a one-token one
    ids[2, P + 1 :] = 0
    return ids, attn


def test_shared_prompts_go_through_once_with_the_same_values_and_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group's rows read one pass over their prompt: log-probs, entropies and gradients equal one
    padded pass over every row's own copy (the copies' gradients add up through the shared keys)."""
    model, _ = load_policy(SMALL, seed=0)
    ids, attn = grouped_batch()
    T = 11
    calls: list[int] = []
    real = models._shared_prefix_logprobs
    monkeypatch.setattr(models, "_shared_prefix_logprobs", lambda *a: calls.append(1) or real(*a))
    lp, ent = token_logprobs(
        model, ids, attn, n_response=T, temperature=0.7, with_entropy=True, rows_per_pass=5
    )
    assert calls and ent is not None  # the shared path ran
    assert_equals_one_padded_pass(model, ids, attn, T, lp, ent)


def test_prompts_shared_by_few_rows_take_the_packed_passes() -> None:
    """Property: the shared path is taken only where it saves work (at most half the rows distinct)."""
    ids, attn = ragged_batch()
    assert models.shared_prompts(ids[:, :9], attn[:, :9].bool()) is None
    ids, attn = grouped_batch(G=4, n=2)
    first, group = models.shared_prompts(ids[:, :9], attn[:, :9].bool())
    assert torch.equal(group[first], torch.arange(4)) and torch.equal(ids[first[group], :9], ids[:, :9])
