"""Kept keys and values (a tree's branches continue from their parent's decode, no prefill): the same
tokens as prefilling the contexts again, rows kept as they finish (compaction) and at the end, and a
tree rollout that prefills only its first level and grows the same tree as one that prefills every level."""

from __future__ import annotations

import functools

import pytest
import torch

from stepcredit.config import ProcessConfig, RolloutConfig, TreeConfig
from stepcredit.process import segment_episodes
from stepcredit.rollout import ROLLOUT_MODES, RolloutRequest, render_prompts
from stepcredit.rollout import prefix_kv as prefix_mod
from stepcredit.rollout import sampling as decode_mod
from stepcredit.rollout.engines import SamplingSpec
from stepcredit.rollout.engines.hf import HF_ENGINE

# the fixtures policy (rows finish at different steps: compaction runs), samples and prefill_widths:
# tests/rollout/conftest.py


@pytest.mark.parametrize("fast", [True, False])
def test_continuing_from_kept_keys_and_values_draws_what_a_prefill_draws(
    policy, samples, prefill_widths, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    model, tok = policy
    if not fast:  # the model's own forward over the kept cache, not the lean Llama step
        monkeypatch.setattr(decode_mod, "fast_step", lambda m: None)
    prompts = render_prompts(tok, samples(6))
    torch.manual_seed(0)
    parents = HF_ENGINE.sample(model, tok, prompts, SamplingSpec(max_tokens=16, keep_kv=True))
    assert all(c.kv is not None for c in parents)
    assert len({len(c.ids) for c in parents}) > 1  # rows finished at different steps
    assert len({c.kv.chunk for c in parents}) > 1  # some were kept as they left the batch
    # each context: the prompt and a prefix of the parent's response of another length (0 = the bare
    # prompt), every token but the last held by the parent's kept row
    contexts = [
        p + c.ids[: i % max(1, len(c.ids))] for i, (p, c) in enumerate(zip(prompts, parents, strict=True))
    ]
    widths = prefill_widths(model)
    for temperature in (1.0, 0.0):
        spec = SamplingSpec(max_tokens=12, temperature=temperature, entropy=True)
        torch.manual_seed(5)
        kept = HF_ENGINE.sample(model, tok, contexts, spec, prefixes=[c.kv for c in parents])
        n_kept = len(widths)
        torch.manual_seed(5)
        fresh = HF_ENGINE.sample(model, tok, contexts, spec)
        assert n_kept == len(widths) - 1  # no prefill with kept prefixes; one without
        assert [c.ids for c in kept] == [c.ids for c in fresh]
        for a, b in zip(kept, fresh, strict=True):
            assert a.entropy == pytest.approx(b.entropy, abs=1e-5)


def test_nothing_is_kept_unless_asked(policy, samples) -> None:
    model, tok = policy
    comps = HF_ENGINE.sample(model, tok, render_prompts(tok, samples(2)), SamplingSpec(max_tokens=4))
    assert all(c.kv is None for c in comps)


def test_a_prefix_longer_than_the_kept_row_is_refused(policy, samples) -> None:
    model, tok = policy
    prompts = render_prompts(tok, samples(1))
    parent = HF_ENGINE.sample(model, tok, prompts, SamplingSpec(max_tokens=4, keep_kv=True))[0]
    too_long = prompts[0] + parent.ids + [5, 6, 7]
    with pytest.raises(ValueError, match="longer than the tokens its row holds"):
        HF_ENGINE.sample(model, tok, [too_long], SamplingSpec(max_tokens=4), prefixes=[parent.kv])


@pytest.mark.parametrize(("branching", "branch_at"), [((2, 2, 2), "episode"), ((2, 4), "entropy")])
def test_a_tree_grown_from_kept_prefixes_is_the_tree_grown_with_prefills(
    policy,
    samples,
    prefill_widths,
    monkeypatch: pytest.MonkeyPatch,
    branching: tuple[int, ...],
    branch_at: str,
) -> None:
    """The rewritten tree construction against the one it replaces (every level prefilled): the same
    leaves, segments and counters under the same seed; only the first level (the prompts) is prefilled."""
    model, tok = policy
    n = 1
    for b in branching:
        n *= b
    cfg = RolloutConfig(
        n=n, max_new_tokens=24, mode="tree", tree=TreeConfig(branching=branching, branch_at=branch_at)
    )
    seg = functools.partial(segment_episodes, tokenizer=tok, cfg=ProcessConfig(min_episode_tokens=1))
    widths = prefill_widths(model)
    out = []
    for reuse in (True, False):
        if not reuse:  # the engine keeps nothing: every level prefills prompt + prefix as before
            monkeypatch.setattr(prefix_mod.KeptKV, "row", lambda self, r: None)
        request = RolloutRequest(samples(3), cfg, seg, group_offset=0, with_logprobs=False)
        torch.manual_seed(0)
        batch, stats = ROLLOUT_MODES.get("tree").fn(model, tok, request)
        out.append((batch, stats, len(widths)))
        widths.clear()
    (a, sa, prefills_kept), (b, sb, prefills_fresh) = out
    assert torch.equal(a.response_ids_BT, b.response_ids_BT) and torch.equal(
        a.response_mask_BT, b.response_mask_BT
    )
    assert a.tree_ends == b.tree_ends and a.tree_nodes == b.tree_nodes and sa == sb
    assert sa["tree/branch_points"] > 0
    assert prefills_kept == 1 and prefills_fresh > 1  # the shared prompts once; then every level
