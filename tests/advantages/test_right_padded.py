"""``ops.is_right_padded`` (the check that lets token-level estimators skip the compaction of masked
gaps) against a loop over rows: every row's counted tokens form a prefix."""

from __future__ import annotations

import torch

from stepcredit.ops import is_right_padded


def _reference(mask_BT: torch.Tensor) -> bool:
    for row in mask_BT.bool().tolist():
        n = sum(row)
        if row != [True] * n + [False] * (len(row) - n):
            return False
    return True


def test_is_right_padded_equals_a_loop_over_rows_on_random_masks() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        B, T = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        lengths = torch.randint(0, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None, :] < lengths[:, None]  # right padded
        if trial % 2:  # a gap or a left-padded row somewhere, unless it happens to stay a prefix
            mask[int(torch.randint(B, (1,), generator=g)), int(torch.randint(T, (1,), generator=g))] ^= True
        assert is_right_padded(mask) == _reference(mask), mask
        assert is_right_padded(mask.long()) == _reference(mask)  # integer masks read the same


def test_is_right_padded_edge_cases() -> None:
    assert is_right_padded(torch.zeros(0, 5, dtype=torch.bool))  # no rows
    assert is_right_padded(torch.tensor([[False], [True]]))  # one token: always a prefix
    assert not is_right_padded(torch.tensor([[False, True, True]]))  # left padding
    assert not is_right_padded(torch.tensor([[True, False, True]]))  # a masked gap (an observation)
    assert is_right_padded(torch.tensor([[True, True, False], [False, False, False]]))
