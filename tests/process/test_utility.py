"""Marginal utilities, computed by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from stepcredit.config import ProcessConfig
from stepcredit.process import marginal_utilities, process_channel
from stepcredit.types import Batch


def test_marginal_utilities_by_hand() -> None:
    v = [-2.0, -1.5, -1.75, -0.25]
    # U_i = V_i - V_(i-1): 0.5, -0.25, 1.5
    assert marginal_utilities(v) == [0.5, -0.25, 1.5]
    # clip to [-1, 1] then scale by 2: 1.0, -0.5, 2.0
    assert marginal_utilities(v, clip=1.0, scale=2.0) == [1.0, -0.5, 2.0]
    assert marginal_utilities(v, zero_last=True) == [0.5, -0.25, 0.0]
    assert marginal_utilities([-3.0]) == []
    # the utilities telescope: their sum is V_S - V_0
    assert sum(marginal_utilities(v)) == pytest.approx(v[-1] - v[0])


def test_process_channel_by_hand(batch_factory: Callable[..., Batch]) -> None:
    from stepcredit.models import build_tokenizer

    tok = build_tokenizer()
    batch = batch_factory(tok, [("q", "abcdefgh", "1"), ("q", "abcd", "2"), ("q", "", "3")], eos=False)
    batch.episode_ends = [[2, 5, 7], [3], []]
    batch.prefix_values = [[-4.0, -3.0, -3.5, -1.0], [-2.0, -2.5], [-1.0]]
    out, steps = process_channel(
        batch.episode_ends, batch.prefix_values, batch.response_mask_BT, ProcessConfig()
    )
    want = torch.zeros(3, 8)
    want[0, 2], want[0, 5], want[0, 7] = 1.0, -0.5, 2.5  # -3-(-4), -3.5-(-3), -1-(-3.5)
    want[1, 3] = -0.5
    assert torch.equal(out, want)
    assert out.dtype == torch.float32 and out.shape == batch.response_ids_BT.shape
    # nothing lands on padding
    assert not out[~batch.response_mask_BT].any()
    # the step mask marks exactly the episode ends
    assert steps.nonzero().tolist() == [[0, 2], [0, 5], [0, 7], [1, 3]]

    clipped, _ = process_channel(
        batch.episode_ends,
        batch.prefix_values,
        batch.response_mask_BT,
        ProcessConfig(clip=1.0, scale=0.5, last_episode="zero"),
    )
    want2 = torch.zeros(3, 8)
    want2[0, 2], want2[0, 5] = 0.5, -0.25  # clip(1.0)=1.0*0.5, clip(-0.5)*0.5; last episode -> 0
    assert torch.equal(clipped, want2)


def test_process_channel_rejects_inconsistent_values_and_skips_ends_outside(
    batch_factory: Callable[..., Batch],
) -> None:
    from stepcredit.models import build_tokenizer

    batch = batch_factory(build_tokenizer(), [("q", "abcd", "1")], eos=False)
    mask = batch.response_mask_BT
    with pytest.raises(ValueError, match="need 3 values"):
        process_channel([[1, 3]], [[0.0, 1.0]], mask, ProcessConfig())
    with pytest.raises(ValueError, match="expected 1 rows"):
        process_channel([[1], [2]], [[0.0, 1.0]], mask, ProcessConfig())
    # an end past the response carries nothing (and is not a step)
    out, steps = process_channel([[9]], [[0.0, 1.0]], mask, ProcessConfig())
    assert not out.any() and not steps.any()
