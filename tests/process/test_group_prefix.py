"""Values from a flat group's shared prefixes (``process.value_estimator=group_prefix``), by hand."""

from __future__ import annotations

import itertools
import math

import pytest

from stepcredit.config import ProcessConfig
from stepcredit.process import (
    VALUE_ESTIMATORS,
    group_prefix_values,
    process_channel,
    shared_prefix_share,
    tree_values,
)

# One group of three responses to a prompt, outcomes 1, 0, 1. Responses 0 and 1 share [1, 2], all three
# share [1]; response 2 ends an episode after its first token, which the others pass through mid-episode.
GROUP = [0, 0, 0]
RESPONSES = [[1, 2, 3, 4], [1, 2, 5, 6], [1, 7, 8]]
ENDS = [[1, 3], [1, 3], [0, 2]]
SCORE = [1.0, 0.0, 1.0]


def test_values_by_hand() -> None:
    # V_0 = the group's mean, 2/3. Response 0: V([1, 2]) = mean(R_0, R_1) = 0.5, then its own R = 1.
    # Response 1: the same 0.5, then 0. Response 2: V([1]) = mean of all three = 2/3 (the others carry
    # [1] inside an episode: membership is by tokens), then 1.
    got = group_prefix_values(GROUP, RESPONSES, ENDS, SCORE, [True] * 3)
    want = [[2 / 3, 0.5, 1.0], [2 / 3, 0.5, 0.0], [2 / 3, 2 / 3, 1.0]]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w)
    # the differences telescope to R - mean(group): what a VinePPO-style advantage needs
    for v, r in zip(got, SCORE, strict=True):
        assert sum(b - a for a, b in itertools.pairwise(v)) == pytest.approx(r - 2 / 3)


def test_a_response_alone_after_a_step_has_its_own_outcome_there() -> None:
    # response 1 parts from response 0 at token 2 and fails: its credit sits on the step where it parted
    got = group_prefix_values([0, 0], [[1, 2, 3], [1, 9, 3]], [[0, 1, 2], [0, 1, 2]], [1.0, 0.0], [True] * 2)
    assert got[1] == pytest.approx([0.5, 0.5, 0.0, 0.0])
    credit = [b - a for a, b in zip(got[1], got[1][1:], strict=False)]
    assert credit == pytest.approx([0.0, -0.5, 0.0])


def test_groups_do_not_mix_and_failed_rewards_count_nowhere() -> None:
    # the same tokens in another group are another prompt's: not counted
    got = group_prefix_values([0, 1], [[1, 2, 3], [1, 2, 4]], [[1, 2], [1, 2]], [1.0, 0.0], [True] * 2)
    assert got == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    # response 1's reward failed (valid False, or a NaN score): not a sample of anybody's value, and its
    # own last value is the one before it, so its credits add up to nothing it did not earn
    for score, valid in (([1.0, 0.0, 0.0], [True, False, True]), ([1.0, math.nan, 0.0], [True, True, True])):
        got = group_prefix_values([0, 0, 0], [[1, 2], [1, 2], [1, 3]], [[0, 1]] * 3, score, valid)
        assert got[0] == pytest.approx([0.5, 0.5, 1.0])
        assert got[1] == pytest.approx([0.5, 0.5, 0.5])
        assert got[2] == pytest.approx([0.5, 0.5, 0.0])
    # no valid response in the group: 0 throughout; a response without episodes: no values
    assert group_prefix_values([0, 0], [[1], [2]], [[0], []], [1.0, 1.0], [False, False]) == [[0.0, 0.0], []]


def test_equal_to_a_tree_s_values_when_the_prefixes_are_its_nodes() -> None:
    # a group whose shared prefixes end where episodes end is a tree rollout: branching (2, 2) with
    # nodes a = [1, 2] (responses 0, 1) and b = [1, 5] (2, 3) below the root
    responses = [[1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 5, 7]]
    ends = [[1, 2]] * 4
    score = [1.0, 0.0, 1.0, 1.0]
    got = group_prefix_values([0] * 4, responses, ends, score, [True] * 4)
    assert got == tree_values([0] * 4, [[0, 1], [0, 1], [0, 2], [0, 2]], score, [True] * 4)


def test_shared_prefix_share_by_hand() -> None:
    # inner ends: response 0's [1, 2] (shared with 1), response 1's (shared), response 2's [1] (shared);
    # the last ends do not count
    assert shared_prefix_share(GROUP, RESPONSES, ENDS) == 1.0
    assert shared_prefix_share([0, 0], [[1, 2, 3], [1, 9, 3]], [[0, 1, 2], [0, 1, 2]]) == pytest.approx(2 / 4)
    assert shared_prefix_share([0], [[1]], [[0]]) == 0.0


def test_registered_as_free_values_of_the_group() -> None:
    spec = VALUE_ESTIMATORS.get("group_prefix")
    assert spec.from_group and not spec.from_outcomes and not spec.generates
    assert spec.terminal_is_reward and spec.success_probability


def test_the_step_credit_lands_on_the_step_where_the_response_parted() -> None:
    import torch

    got = group_prefix_values([0, 0], [[1, 2, 3], [1, 9, 3]], [[0, 1, 2], [0, 1, 2]], [1.0, 0.0], [True] * 2)
    mask = torch.ones(2, 3, dtype=torch.bool)
    process_BT, process_mask_BT = process_channel(
        [[0, 1, 2], [0, 1, 2]], got, mask, ProcessConfig(enabled=True)
    )
    # response 1: -0.5 on token 1 (its second step), nothing elsewhere; response 0 the mirror image
    assert process_BT[1].tolist() == pytest.approx([0.0, -0.5, 0.0])
    assert process_BT[0].tolist() == pytest.approx([0.0, 0.5, 0.0])
    assert process_mask_BT.all()
