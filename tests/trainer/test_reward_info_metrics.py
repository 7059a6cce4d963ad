"""Custom rewards are not a black box in the logs: verl-style extra keys and each TRL-style function's
mean are metrics (issue 37, item 6)."""

from __future__ import annotations

import pytest

from stepcredit.reward.base import to_result
from stepcredit.reward.custom import combine
from stepcredit.trainer.metrics import reward_info_metrics


def test_verl_style_extra_keys_are_averaged_per_source() -> None:
    # what a verl-style compute_score returns: a dict with "score" and extra keys (verl's reward_extra_info)
    rs = [
        to_result({"score": 1.0, "acc": True, "format_ok": 1, "pred": "7"}, source="custom"),
        to_result({"score": 0.0, "acc": False, "format_ok": 0, "pred": "8"}, source="custom"),
        to_result({"score": 0.5, "acc": False, "format_ok": 1, "pred": "9"}, source="custom"),
    ]
    m = reward_info_metrics(rs)
    # acc: (1 + 0 + 0) / 3; format_ok: (1 + 0 + 1) / 3; "pred" is text, not a metric
    assert m["reward/custom/extra/acc"] == pytest.approx(1 / 3)
    assert m["reward/custom/extra/format_ok"] == pytest.approx(2 / 3)
    assert not any("pred" in k for k in m)


def test_each_trl_function_mean_beside_the_weighted_sum() -> None:
    names = ["/x/rewards.py:math_reward", "/x/rewards.py:length_reward"]
    # per function, per sample; None = "does not apply" (left out of that function's mean, as TRL's nanmean)
    res = combine([[1.0, None, 0.0], [-0.5, -1.0, 0.0]], [1.0, 0.5], names)
    for r in res:
        r.source = "custom"
    assert [r.score for r in res] == [0.75, -0.5, 0.0]  # 1 - 0.25, -0.5, 0
    m = reward_info_metrics(res)
    assert m["reward/fn/math_reward/mean"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert m["reward/fn/length_reward/mean"] == pytest.approx(-0.5)  # (-0.5 - 1 + 0) / 3
    # two functions of the same name in different files keep their whole spec
    twin = combine([[1.0], [0.0]], [1.0, 1.0], ["/a.py:f", "/b.py:f"])
    assert set(reward_info_metrics(twin)) == {"reward/fn//a.py:f/mean", "reward/fn//b.py:f/mean"}
