"""``process.placebo``: the credit path with each response's step credits permuted among its own episodes
(issue 44's control for a process-credit arm)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from stepcredit.config import ProcessConfig, from_dict
from stepcredit.errors import ConfigError
from stepcredit.process import apply_placebo, process_channel, step_credits

SHUFFLE = ProcessConfig(enabled=True, placebo="shuffle_within_response", placebo_seed=3)


def test_the_placebo_keeps_each_responses_credits_and_moves_them() -> None:
    # values V_0..V_5 of a response: the difference credits are 0.5, -0.5, 0.25, 0, 0.75
    values = [0.0, 0.5, 0.0, 0.25, 0.25, 1.0]
    real = step_credits(values, ProcessConfig(enabled=True))
    assert real == [0.5, -0.5, 0.25, 0.0, 0.75]
    moved = [step_credits(values, SHUFFLE, row_key=k) for k in range(20)]
    for m in moved:
        assert Counter(m) == Counter(real)  # the same multiset: sum, sparsity and scale kept
    assert any(m != real for m in moved)  # and the location changes
    assert len({tuple(m) for m in moved}) > 3  # a permutation of its own per response
    # seeded: the same key, the same permutation
    assert step_credits(values, SHUFFLE, row_key=7) == step_credits(values, SHUFFLE, row_key=7)
    # another placebo seed moves the 20 responses otherwise
    other = [step_credits(values, replace(SHUFFLE, placebo_seed=4), row_key=k) for k in range(20)]
    assert other != moved


def test_last_episode_zero_keeps_its_zero_on_the_last_step() -> None:
    cfg = replace(SHUFFLE, last_episode="zero")
    credits = [0.1, 0.2, 0.3, 0.4, 9.0]
    for k in range(10):
        out = apply_placebo(credits, cfg, row_key=k)
        assert out[-1] == 9.0 and sorted(out[:-1]) == [0.1, 0.2, 0.3, 0.4]


def test_the_channel_keeps_each_rows_multiset_and_mask() -> None:
    # three responses of 12 tokens with 4, 3 and 1 episodes; the placebo channel has the same episode
    # ends (process_mask_BT) and, row by row, the same multiset of values at them
    ends = [[1, 4, 7, 10], [2, 5, 11], [6]]
    values = [[0.0, 1.0, 0.5, 0.5, 1.0], [0.2, 0.0, 0.4, 1.0], [0.5, 0.0]]
    mask = torch.ones(3, 12, dtype=torch.bool)
    real, real_m = process_channel(ends, values, mask, ProcessConfig(enabled=True))
    keys = [1001, 1002, 1003]
    fake, fake_m = process_channel(ends, values, mask, SHUFFLE, row_keys=keys)
    assert torch.equal(real_m, fake_m)
    for b in range(3):
        assert sorted(real[b][real_m[b]].tolist()) == sorted(fake[b][fake_m[b]].tolist())
    assert not torch.equal(real, fake)
    again, _ = process_channel(ends, values, mask, SHUFFLE, row_keys=keys)
    assert torch.equal(fake, again)
    # the step cost is charged after the permutation: every step still pays the same 0.1 (token form)
    cost = replace(SHUFFLE, step_cost=0.1)
    charged, _ = process_channel(ends, values, mask, cost, row_keys=keys)
    assert torch.allclose(charged[fake_m], fake[fake_m] - 0.1)


def test_the_placebo_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"process\.placebo"):
        from_dict({"process": {"enabled": True, "placebo": "reverse"}})
    from stepcredit.process import check_config

    with pytest.raises(ConfigError, match=r"process\.placebo: .*process\.enabled=true"):
        check_config(from_dict({"process": {"placebo": "shuffle_within_response"}}))
