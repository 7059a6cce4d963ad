"""Per-domain outcome processing and the dynamic-sampling group filter, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from stepcredit.config import OutcomeProcessConfig, PostprocessConfig
from stepcredit.reward.postprocess import (
    RunningStats,
    normalize_outcomes,
    process_outcomes,
    zero_signal_groups,
)

EPS = 1e-6
# Two groups of three: scores 1 0 0 | 1 1 1.
S = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
G = torch.tensor([0, 0, 0, 1, 1, 1])
V = torch.ones(6, dtype=torch.bool)
R2 = math.sqrt(2.0)
# batch: mean 4/6 = 2/3, population std sqrt(E[x^2] - mean^2) = sqrt(2/3 - 4/9) = sqrt(2/9) = 0.4714
# group 0: mean 1/3, std sqrt(1/3 - 1/9) = sqrt(2/9); group 1: mean 1, std 0 (so (1 - 1) / eps = 0)
SD = math.sqrt(2.0 / 9.0)


@pytest.mark.parametrize(
    ("mean", "std", "want"),
    [
        ("none", "none", [1, 0, 0, 1, 1, 1]),
        # (1 - 2/3) / sqrt(2/9) = 1/sqrt(2); (0 - 2/3) / sqrt(2/9) = -sqrt(2)
        ("batch", "batch", [1 / R2, -R2, -R2, 1 / R2, 1 / R2, 1 / R2]),
        # (1 - 1/3) / sqrt(2/9) = sqrt(2); (0 - 1/3) / sqrt(2/9) = -1/sqrt(2); group 1 all 0
        ("group", "group", [R2, -1 / R2, -1 / R2, 0, 0, 0]),
        ("group", "none", [2 / 3, -1 / 3, -1 / 3, 0, 0, 0]),
        ("batch", "none", [1 / 3, -2 / 3, -2 / 3, 1 / 3, 1 / 3, 1 / 3]),
        # x / sqrt(2/9) = 3x / sqrt(2)
        ("none", "batch", [3 / R2, 0, 0, 3 / R2, 3 / R2, 3 / R2]),
        # group 0's std for the first group, group 1's std 0 -> 1 / eps for its ones
        ("none", "group", [3 / R2, 0, 0, 1 / EPS, 1 / EPS, 1 / EPS]),
    ],
)
def test_modes_by_hand(mean: str, std: str, want: list[float]) -> None:
    got = normalize_outcomes(S, V, G, mean=mean, std=std, eps=EPS)
    assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-4, atol=1e-5)


def test_invalid_scores_are_out_of_the_statistics_and_get_zero() -> None:
    v = torch.tensor([True, True, False, True, True, True])
    # valid scores 1 0 1 1 1: mean 4/5, population std sqrt(4/5 - 16/25) = 0.4
    got = normalize_outcomes(S, v, G, mean="batch", std="batch", eps=EPS)
    want = torch.tensor([0.5, -2.0, 0.0, 0.5, 0.5, 0.5])
    assert torch.allclose(got, want, atol=1e-5)


def test_running_statistics_across_steps_and_after_a_state_round_trip() -> None:
    rs = RunningStats()
    rs.update("a", torch.tensor([1.0, 0.0]))
    assert rs.mean_std("a") == pytest.approx((0.5, 0.5))
    rs.update("a", torch.tensor([1.0, 1.0]))
    # all four: mean 3/4, population std sqrt(3/4 - 9/16) = sqrt(3)/4
    assert rs.mean_std("a") == pytest.approx((0.75, math.sqrt(3) / 4))
    assert rs.mean_std("other") == (0.0, 1.0)
    again = RunningStats()
    again.load_state_dict(rs.state_dict())
    assert again.mean_std("a") == rs.mean_std("a")


def test_process_outcomes_per_domain_in_order_mask_normalise_clip_scale() -> None:
    cfg = PostprocessConfig(
        domains={
            "a": OutcomeProcessConfig(
                mask_truncated=True, mean="running", std="running", clip=1.0, scale=2.0
            ),
            "b": OutcomeProcessConfig(mean="batch"),
        }
    )
    rs = RunningStats()
    domains = ["a", "a", "a", "b", "b", "b"]
    trunc = torch.tensor([False, False, True, False, False, False])
    score = torch.tensor([1.0, 0.0, 5.0, 1.0, 0.0, 0.0])
    out, valid = process_outcomes(
        score, V, group_B=G, domain_B=domains, truncated_B=trunc, cfg=cfg, eps=EPS, running=rs
    )
    assert valid.tolist() == [True, True, False, True, True, True]  # the truncated response is masked
    # a: running stats of its valid scores 1, 0 -> mean 0.5, std 0.5: (1, -1), clip 1, scale 2 -> (2, -2)
    # b: mean of 1 0 0 = 1/3 subtracted
    want = torch.tensor([2.0, -2.0, 0.0, 2 / 3, -1 / 3, -1 / 3])
    assert torch.allclose(out, want, atol=1e-4)
    assert rs.mean_std("a") == pytest.approx((0.5, 0.5)) and "b" not in rs.stats
    # next step: a's stats include this step's scores too (cumulative, updated before use)
    out2, _ = process_outcomes(
        torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]),
        V,
        group_B=G,
        domain_B=domains,
        truncated_B=torch.zeros(6, dtype=torch.bool),
        cfg=cfg,
        eps=EPS,
        running=rs,
    )
    # a's five scores 1 0 1 1 1: mean 0.8, std 0.4 -> (1 - 0.8) / 0.4 = 0.5, scaled 1.0
    assert torch.allclose(out2[:3], torch.tensor([1.0, 1.0, 1.0]), atol=1e-4)


def test_zero_signal_groups() -> None:
    score = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    valid = torch.ones(8, dtype=torch.bool)
    assert zero_signal_groups(score, valid, group, criterion="std") == {1, 2, 3}
    # mean bounds (0, 1) exclusive: group 0 mean 0.5 and group 3 mean 0.5 kept
    assert zero_signal_groups(score, valid, group, criterion="mean_bounds") == {1, 2}
    # an invalid member does not count: group 0 keeps only its 1 -> all equal
    valid[1] = False
    assert zero_signal_groups(score, valid, group, criterion="std") == {0, 1, 2, 3}
