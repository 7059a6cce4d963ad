"""Batch.select: every per-response field is indexed, the whole-batch ones are kept."""

from __future__ import annotations

import dataclasses

import torch

from stepcredit.types import Batch, RewardResult, Sample, Status


def _batch(B: int = 4, T: int = 5, P: int = 3) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(
        samples=[Sample(prompt=(), ground_truth=str(i), uid=f"s{i}") for i in range(B)],
        group_B=torch.tensor([0, 0, 1, 1][:B]),
        prompt_ids_BP=torch.randint(0, 9, (B, P), generator=g),
        prompt_mask_BP=torch.ones(B, P, dtype=torch.bool),
        response_ids_BT=torch.randint(0, 9, (B, T), generator=g),
        response_mask_BT=torch.rand(B, T, generator=g) > 0.3,
        behaviour_logp_BT=torch.randn(B, T, generator=g),
        texts=[f"t{i}" for i in range(B)],
        truncated_B=torch.tensor([False, True, False, True][:B]),
        policy_version=3,
        policy_updates=7,
        values_BT=torch.randn(B, T, generator=g),
        rewards=[RewardResult(score=float(i), status=Status.OK) for i in range(B)],
        episode_ends=[[i] for i in range(B)],
        prefix_values=[[0.5, float(i)] for i in range(B)],
        observation_BT=torch.rand(B, T, generator=g) > 0.5,
        engine_logp_BT=None,
        kv_cache=None,
    )


def test_select_indexes_every_per_response_field_and_keeps_the_batch_fields() -> None:
    b = _batch()
    idx = [2, 0, 3]
    s = b.select(idx)
    for f in dataclasses.fields(Batch):
        old, new = getattr(b, f.name), getattr(s, f.name)
        if f.name in ("policy_version", "policy_updates"):
            assert new == old  # the weights that generated the batch, not a per-response value
        elif f.name == "kv_cache" or old is None:
            assert new is None
        elif isinstance(old, torch.Tensor):
            assert torch.equal(new, old[idx]), f.name
        else:
            assert new == [old[i] for i in idx], f.name


def test_select_of_every_index_in_order_is_the_batch() -> None:
    # a property: selecting everything changes nothing, and concat of two selections restores it
    b = _batch()
    halves = Batch.concat([b.select([0, 1]), b.select([2, 3])])
    for s in (b.select([0, 1, 2, 3]), halves):
        for f in dataclasses.fields(Batch):
            old, new = getattr(b, f.name), getattr(s, f.name)
            assert torch.equal(new, old) if isinstance(old, torch.Tensor) else new == old, f.name
