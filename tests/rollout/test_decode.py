"""The rollout's sampling loop: greedy output equal to ``model.generate`` (rows finishing at different
steps, so finished rows are dropped mid-way), padding after eos, and nucleus sampling by hand."""

from __future__ import annotations

import pytest
import torch

from stepcredit.rollout import left_pad, render_prompts
from stepcredit.rollout import sampling as decode_mod
from stepcredit.rollout.sampling import decode, sample_next

# the fixtures decode_policy (a fresh small policy, seed 1), prompt_batch (arithmetic prompts of
# different lengths, left-padded), samples and prefill_widths: tests/rollout/conftest.py


@pytest.mark.parametrize("compact", [0.125, 1.0])
def test_greedy_equals_generate_with_rows_finishing_early(
    compact: float, decode_policy, prompt_batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decode_mod, "COMPACT_FRACTION", compact)
    model, tok = decode_policy
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # larger weights than at init, so that greedy outputs depend on the prompt
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    ids, mask = prompt_batch(tok, 12)  # prompts of different lengths
    free = decode(model, ids, mask, max_new_tokens=16, eos_token_id=-1, pad_token_id=0, temperature=0)
    # as "eos" take a token that the greedy rows reach at different steps, or never: rows then end
    # at different times and the loop drops them as they finish
    firsts = {}
    for t in free.unique().tolist():
        pos = [int((r == t).nonzero()[0]) if (r == t).any() else 99 for r in free]
        firsts[t] = (len(set(pos)), pos)
    eos = max(firsts, key=lambda t: firsts[t][0])
    assert firsts[eos][0] >= 3
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask.long(),
        max_new_tokens=16,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=eos,
    )[:, ids.shape[1] :]
    got = decode(model, ids, mask, max_new_tokens=16, eos_token_id=eos, pad_token_id=0, temperature=0)
    assert torch.equal(got, ref[:, : got.shape[1]])
    # each row is the free run up to and including its first eos, then padding
    for r, f, first in zip(got, free, firsts[eos][1], strict=True):
        end = min(first + 1, 16)
        assert torch.equal(r[:end], f[:end]) and (r[end:] == 0).all()


def test_nucleus_sampling_keeps_the_top_mass() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05 with top_p = 0.8: sorted ascending, the cumulative mass is
    # 0.05, 0.2, 0.5, 1.0; tokens whose cumulative mass is <= 1 - 0.8 = 0.2 go (the 0.05 and 0.15 ones),
    # leaving tokens 0 and 1 with renormalised probabilities 0.5/0.8 and 0.3/0.8
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().repeat(4000, 1)
    torch.manual_seed(0)
    draws = sample_next(logits, temperature=1.0, top_p=0.8)
    assert set(draws.tolist()) == {0, 1}
    assert (draws == 0).float().mean().item() == pytest.approx(0.625, abs=0.03)
    # temperature 0 is argmax; top_p = 1 keeps every token
    assert sample_next(logits[:2], temperature=0.0, top_p=0.5).tolist() == [0, 0]
    assert set(sample_next(logits, temperature=1.0, top_p=1.0).tolist()) == {0, 1, 2, 3}


def test_shared_prompts_are_run_once_with_the_same_samples(
    decode_policy, prompt_batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GRPO batch (each prompt repeated n times) prefills each distinct prompt once and copies its
    cache to the rows: same seed, the same sampled tokens as prefilling every row's own copy."""
    model, tok = decode_policy
    ids, mask = prompt_batch(tok, 4)
    ids, mask = ids.repeat_interleave(3, dim=0), mask.repeat_interleave(3, dim=0)
    prefill_rows: list[int] = []
    forward = type(model).forward

    def counting(self: object, *a: object, **k: torch.Tensor) -> object:
        if k.get("past_key_values") is None:
            prefill_rows.append(k["input_ids"].shape[0])
        return forward(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(type(model), "forward", counting)
    outs = []
    for share in (True, False):
        if not share:
            monkeypatch.setattr(decode_mod, "shared_prompts", lambda *a: None)
        torch.manual_seed(5)
        outs.append(decode(model, ids, mask, max_new_tokens=12, eos_token_id=2, pad_token_id=0))
    assert prefill_rows == [4, 12]
    assert torch.equal(outs[0], outs[1])


def test_preallocated_cache_gives_the_same_samples_as_concatenation(
    decode_policy, prompt_batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode's keys and values written in place into one buffer per layer (rows dropped as they
    finish): same seed, the same sampled tokens as transformers' concatenating ``DynamicLayer``."""
    model, tok = decode_policy
    ids, mask = prompt_batch(tok, 6)
    eos = int(tok.convert_tokens_to_ids("1"))  # a common token: rows finish at different steps
    outs = []
    for prealloc in (True, False):
        if not prealloc:
            monkeypatch.setattr(decode_mod, "preallocate", lambda *a: False)
        torch.manual_seed(7)
        outs.append(decode(model, ids, mask, max_new_tokens=20, eos_token_id=eos, pad_token_id=0))
    assert torch.equal(outs[0], outs[1])
    lengths = (outs[0] != 0).sum(1)
    assert len(set(lengths.tolist())) > 1  # rows did finish at different steps (compaction ran)


def test_buffer_layer_refuses_more_tokens_than_its_capacity() -> None:
    layer = decode_mod.buffer_layer_class()(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4), 4)
    k, _ = layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    assert k.shape == (2, 1, 4, 4) and bool((k[:, :, 3] == 1).all()) and layer.get_seq_length() == 4
    with pytest.raises(RuntimeError, match="capacity"):
        layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))


def test_the_fast_llama_step_draws_the_same_tokens(
    decode_policy, prompt_batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tok = decode_policy
    ids, mask = prompt_batch(tok, 6)
    used: list[int] = []
    real = decode_mod.fast_step
    monkeypatch.setattr(decode_mod, "fast_step", lambda m: used.append(1) or real(m))
    outs = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(decode_mod, "fast_step", lambda m: None)
        torch.manual_seed(3)
        outs.append(decode(model, ids, mask, max_new_tokens=20, eos_token_id=2, pad_token_id=0))
    assert used and real(model) is not None
    assert torch.equal(outs[0], outs[1])


def test_bucketed_prefill_of_ragged_contexts_draws_the_same_tokens(
    decode_policy, samples, prefill_widths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Contexts of very different lengths (a tree's prompt + prefix continuations) are prefilled in
    buckets of similar length: the same sampled and greedy tokens as one padded prefill, and the
    buckets really ran (each pass only as wide as its longest context)."""
    model, tok = decode_policy
    prompts = render_prompts(tok, samples(12, max_steps=5))
    # the first 20, 30, ..., 130 tokens of each prompt: widths far apart, padding well over a quarter
    contexts = [(p * 2)[: 20 + 10 * i] for i, p in enumerate(prompts)]
    ids, mask = left_pad(contexts, 0)
    assert float(mask.sum()) < (1 - decode_mod.BUCKET_PAD_SHARE) * mask.numel()
    widths = prefill_widths(model)
    outs = []
    for bucketed in (True, False):
        if not bucketed:
            monkeypatch.setattr(decode_mod, "BUCKET_PAD_SHARE", 2.0)  # never: one padded pass
        for temperature in (1.0, 0.0):
            torch.manual_seed(5)
            outs.append(
                decode(
                    model,
                    ids,
                    mask,
                    max_new_tokens=12,
                    eos_token_id=2,
                    pad_token_id=0,
                    temperature=temperature,
                )
            )
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
    # bucketed: 4 passes per decode, the narrowest far narrower than the padded width; then one each
    assert len(widths) == 2 * decode_mod.BUCKETS + 2
    assert min(widths[: decode_mod.BUCKETS]) < ids.shape[1] // 2 and widths[-1] == ids.shape[1]
