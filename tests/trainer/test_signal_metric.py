"""The metric for groups without outcome signal that still get a non-zero advantage."""

from __future__ import annotations

from collections.abc import Callable

import torch

from stepcredit.trainer.metrics import outcome_free_signal
from stepcredit.types import Batch, RewardResult


def test_counts_equal_groups_and_those_with_advantage(scored_batch: Callable[..., Batch]) -> None:
    # group 0: outcomes 1,1 (all equal) with a process advantage on sample 1 -> equal and moved
    # group 1: outcomes 0,0 (all equal), zero advantage everywhere -> equal, not moved
    # group 2: outcomes 0,1 -> has outcome signal, not counted
    batch = scored_batch([RewardResult(score=s) for s in [1, 1, 0, 0, 0, 1]], [0, 0, 1, 1, 2, 2], 3)
    adv = torch.zeros(6, 3)
    adv[1, 0] = 0.3
    adv[4:] = 1.0
    valid_B = torch.ones(6, dtype=torch.bool)
    m = outcome_free_signal(batch.rewards, batch.group_B, valid_B, adv, batch.response_mask_BT)
    assert m == {"groups/all_equal_adv_frac": 2 / 3, "groups/all_equal_nonzero_adv_frac": 1 / 3}


def test_masked_samples_and_masked_tokens_do_not_count(scored_batch: Callable[..., Batch]) -> None:
    # group 0: sample 1 is invalid (masked), so the valid outcomes {1} are all equal; its advantage
    # sits on a padding token only, which is not live -> equal, not moved
    batch = scored_batch([RewardResult(score=1), RewardResult(score=0)], [0, 0], 3)
    valid = torch.tensor([True, False])
    live = batch.response_mask_BT.clone()
    live[0, 2] = False
    adv = torch.zeros(2, 3)
    adv[0, 2] = 5.0
    adv[1, 0] = 5.0  # invalid sample: ignored
    valid_B = valid
    m = outcome_free_signal(batch.rewards, batch.group_B, valid_B, adv, live & valid[:, None])
    assert m == {"groups/all_equal_adv_frac": 1.0, "groups/all_equal_nonzero_adv_frac": 0.0}
