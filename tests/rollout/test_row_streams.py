"""Per-row random streams in the sampling loop (validation's common random numbers, issue 44): identical
models given the same row keys sample identical tokens; a row that finishes earlier (and leaves the
batch) never shifts another row's draws; the Gumbel-max draws follow softmax(logits / T)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from stepcredit.config import ArithConfig, ModelConfig, TinyModelConfig
from stepcredit.data import row_to_sample
from stepcredit.data.arith import make_rows
from stepcredit.models import load_policy
from stepcredit.rollout import generate, left_pad, render_prompts
from stepcredit.rollout import sampling as decode_mod
from stepcredit.rollout.sampling import decode, mix32, row_gumbel_BV, row_key, sample_next

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
W = 24  # new tokens


def _setup() -> tuple[object, object, torch.Tensor, torch.Tensor, list[object]]:
    model, tok = load_policy(SMALL, seed=3)
    model.eval()
    rows = make_rows(ArithConfig(max_steps=5), 6, seed=0, split="val")
    samples = [row_to_sample(r, f"t:{i}") for i, r in enumerate(rows)]
    ids, mask = left_pad(render_prompts(tok, samples), tok.pad_token_id)
    return model, tok, ids, mask, samples


def _keys(n: int, step: int = 5) -> torch.Tensor:
    return torch.tensor([row_key(7, step, i) for i in range(n)], dtype=torch.long)


def test_identical_models_sample_identical_tokens() -> None:
    model, tok, ids, mask, _ = _setup()
    twin = copy.deepcopy(model)
    kw = {"max_new_tokens": W, "eos_token_id": -1, "pad_token_id": 0, "temperature": 1.0}
    a = decode(model, ids, mask, row_keys_B=_keys(len(ids)), **kw)
    # torch's global stream moved in between: the row streams do not read it
    torch.manual_seed(12345)
    torch.rand(1000)
    b = decode(twin, ids, mask, row_keys_B=_keys(len(ids)), **kw)
    assert torch.equal(a, b)
    # the draws are random, not fixed: another step's keys give other samples
    c = decode(model, ids, mask, row_keys_B=_keys(len(ids), step=6), **kw)
    assert not torch.equal(a, c)
    # through the engine's batch path (validation's call): the same prompt seeds, the same responses
    _, _, _, _, samples = _setup()
    seeds = [row_key(7, 5, i) for i in range(len(samples))]
    g1 = generate(model, tok, samples, n=2, max_new_tokens=W, with_logprobs=False, row_seeds=seeds)
    g2 = generate(twin, tok, samples, n=2, max_new_tokens=W, with_logprobs=False, row_seeds=seeds)
    assert g1.texts == g2.texts
    assert g1.texts[0] != g1.texts[1]  # the two responses of a prompt draw from different streams


@pytest.mark.parametrize("compact", [0.125, 1.0])
def test_a_row_finishing_early_does_not_shift_another_rows_draws(
    compact: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # row 0 gets a budget of 2 tokens (it finishes and, once compaction runs, leaves the batch); the
    # other rows must sample exactly what they sample when row 0 runs as long as they do
    monkeypatch.setattr(decode_mod, "COMPACT_FRACTION", compact)
    model, _, ids, mask, _ = _setup()
    kw = {"max_new_tokens": W, "eos_token_id": -1, "pad_token_id": 0, "temperature": 1.0}
    full = torch.full((len(ids),), W, dtype=torch.long)
    short = full.clone()
    short[0] = 2
    a = decode(model, ids, mask, row_keys_B=_keys(len(ids)), limit_B=full, **kw)
    b = decode(model, ids, mask, row_keys_B=_keys(len(ids)), limit_B=short, **kw)
    assert torch.equal(a[1:], b[1:])
    assert torch.equal(a[0, :2], b[0, :2])  # row 0's own first tokens are its own stream's too
    if compact == 1.0:
        return  # finished rows stay in the batch (emitting padding): the shared stream keeps its draws
    # the defect this fixes: with the shared stream, dropping row 0 shifts every later row's draws
    torch.manual_seed(0)
    c = decode(model, ids, mask, limit_B=full, **kw)
    torch.manual_seed(0)
    d = decode(model, ids, mask, limit_B=short, **kw)
    assert not torch.equal(c[1:], d[1:])


def test_gumbel_max_draws_follow_the_softmax() -> None:
    # 30,000 rows of the same logits z = (0, 1, 2) at T = 2: p = softmax(z / 2) = (0.186, 0.307, 0.506);
    # each frequency within 5 standard errors sqrt(p (1 - p) / n) <= 0.0029 of p
    n = 30_000
    z = torch.tensor([[0.0, 1.0, 2.0]]).repeat(n, 1)
    keys = torch.tensor([row_key(11, i) for i in range(n)], dtype=torch.long)
    tok = sample_next(z, temperature=2.0, top_p=1.0, keys_B=keys, t=4)
    freq = torch.bincount(tok, minlength=3).double() / n
    p = torch.softmax(torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64), 0)
    assert torch.all((freq - p).abs() < 5 * torch.sqrt(p * (1 - p) / n)), (freq, p)
    # top-p: with probabilities (0.1, 0.2, 0.7) and top_p = 0.75 the 0.1 token is removed (its
    # cumulative mass 0.1 <= 0.25) and is never drawn
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7]])).repeat(n, 1)
    tok = sample_next(logits, temperature=1.0, top_p=0.75, keys_B=keys, t=0)
    assert int((tok == 0).sum()) == 0


def test_the_noise_is_a_function_of_key_position_and_token() -> None:
    keys = _keys(4)
    g = row_gumbel_BV(keys, 3, 10)
    assert torch.equal(g, row_gumbel_BV(keys, 3, 10))
    assert torch.equal(g[2:3], row_gumbel_BV(keys[2:3], 3, 10))  # a row's noise ignores the batch
    assert torch.equal(g[:, :5], row_gumbel_BV(keys, 3, 5))  # and the vocabulary size
    assert not torch.equal(g, row_gumbel_BV(keys, 4, 10))
    # mean of a standard Gumbel is the Euler-Mascheroni constant 0.5772, variance pi^2 / 6 = 1.645
    big = row_gumbel_BV(torch.tensor([row_key(i) for i in range(200)]), 0, 500)
    assert abs(float(big.mean()) - 0.5772) < 0.02
    assert abs(float(big.var()) - math.pi**2 / 6) < 0.05
    # the tensor hash equals the Python one (row keys are made in Python, noise on the device)
    xs = [0, 1, 2**31 + 5, 2**32 - 1]
    assert mix32(torch.tensor(xs)).tolist() == [mix32(x) for x in xs]


def test_sample_with_row_seeds_ignores_the_other_contexts() -> None:
    # the engine's sampling primitive: a context's continuations depend on its own seed, not on which
    # other contexts share the call (nor on their order)
    from stepcredit.rollout.engines import SamplingSpec
    from stepcredit.rollout.engines.hf import HF_ENGINE

    model, tok, _, _, samples = _setup()
    ctx = render_prompts(tok, samples[:3])
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=W, row_seeds=(5, 6, 7))
    all3 = HF_ENGINE.sample(model, tok, ctx, spec)
    two = HF_ENGINE.sample(model, tok, [ctx[2], ctx[0]], SamplingSpec(n=2, max_tokens=W, row_seeds=(7, 5)))
    assert [c.ids for c in two] == [c.ids for c in all3[4:6] + all3[0:2]]
    with pytest.raises(ValueError, match="row_seeds"):
        HF_ENGINE.sample(model, tok, ctx, SamplingSpec(max_tokens=W, row_seeds=(1,)))
