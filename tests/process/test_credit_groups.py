"""``process.credit_groups``: step credit only in the groups whose outcomes are all equal, or only in the rest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stepcredit.config import Config, ProcessConfig, from_dict
from stepcredit.errors import ConfigError
from stepcredit.process import check_config, credited_rows
from stepcredit.types import Batch, RewardResult, Status


def test_credited_rows_by_hand() -> None:
    # group 0 mixed (1, 0); group 1 all wrong; group 2 one valid outcome (the other failed: not valid);
    # group 3 all right, one a NaN score (not counted)
    group = [0, 0, 1, 1, 2, 2, 3, 3]
    score = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, float("nan")]
    valid = [True, True, True, True, True, False, True, True]
    assert credited_rows(group, score, valid, "all") == [True] * 8
    equal = [False, False, True, True, True, True, True, True]
    assert credited_rows(group, score, valid, "all_equal") == equal
    assert credited_rows(group, score, valid, "mixed") == [not e for e in equal]
    with pytest.raises(ValueError, match="credit_groups"):
        credited_rows(group, score, valid, "some")


def channels(
    make: Callable[..., Batch],
    which: str,
    rewards: list[RewardResult],
    truncated: list[bool] | None = None,
    **cfg_dict: Any,
) -> tuple[list[list[float]], list[list[bool]]]:
    """The trainer's process channel and mask for groups of two responses (ids 0, 0, 1, 1, ...), each
    with two episodes ending at tokens 2 and 5 and the values [1, 0.5, 0] (U = -0.5, -0.5)."""
    from stepcredit.reward import with_failure_policy
    from stepcredit.trainer.update import reward_channels

    B = len(rewards)
    batch = make(
        rewards,
        [b // 2 for b in range(B)],
        6,
        episode_ends=[[2, 5]] * B,
        prefix_values=[[1.0, 0.5, 0.0]] * B,
        truncated=truncated,
    )
    cfg = from_dict({**cfg_dict, "process": {"enabled": True, "credit_groups": which}})
    _, ch = reward_channels(with_failure_policy(batch, cfg.reward), cfg)
    assert ch.process_BT is not None and ch.process_mask_BT is not None
    return ch.process_BT.tolist(), ch.process_mask_BT.tolist()


ROW = [0.0, 0.0, -0.5, 0.0, 0.0, -0.5]
STEPS = [False, False, True, False, False, True]
NONE = ([0.0] * 6, [False] * 6)


def credited(make: Callable[..., Batch], which: str, rewards: list[RewardResult], **kw: Any) -> list[bool]:
    values, mask = channels(make, which, rewards, **kw)
    assert all((v, m) in ((ROW, STEPS), NONE) for v, m in zip(values, mask, strict=True))
    return [m == STEPS for m in mask]


def test_the_trainer_credits_only_the_chosen_groups(scored_batch: Callable[..., Batch]) -> None:
    # group 0 mixed (R = 1, 0), group 1 all wrong
    rewards = [RewardResult(1.0), RewardResult(0.0), RewardResult(0.0), RewardResult(0.0)]
    assert credited(scored_batch, "all", rewards) == [True] * 4
    assert credited(scored_batch, "mixed", rewards) == [True, True, False, False]
    assert credited(scored_batch, "all_equal", rewards) == [False, False, True, True]
    # outcomes within 1e-6 are equal, as groups/all_equal_frac counts them
    close = [RewardResult(1.0), RewardResult(1.0 + 1e-9)]
    assert credited(scored_batch, "all_equal", close) == [True, True]


def test_equal_outcomes_are_the_ones_grpo_sees(scored_batch: Callable[..., Batch]) -> None:
    # a truncated wrong answer masked by outcome processing is out of the group's baseline: the group's one
    # valid outcome is 1, so it counts as all equal
    rewards = [RewardResult(1.0), RewardResult(0.0)]
    masked = {"postprocess": {"outcome": {"mask_truncated": True}}}
    assert credited(scored_batch, "all_equal", rewards, truncated=[False, True], **masked) == [True, True]
    assert credited(scored_batch, "all_equal", rewards, truncated=[False, True]) == [False, False]
    # a failed reward scored by the failure policy (reward.failure_policy=score) counts as the outcome it
    # was given: right + failure_score 0 is a mixed group
    failed = [RewardResult(1.0), RewardResult(float("nan"), Status.ERROR)]
    scored = {"reward": {"failure_policy": "score", "failure_score": 0.0}}
    assert credited(scored_batch, "mixed", failed, **scored) == [True, True]
    # masked (the default policy), the failure is no outcome: one valid outcome, all equal
    assert credited(scored_batch, "all_equal", failed) == [True, True]


def test_reinforce_pp_is_refused_it_centres_the_step_term_on_the_batch() -> None:
    from stepcredit.advantages import check_config as check_advantages

    cfg = from_dict(
        {"process": {"enabled": True, "credit_groups": "mixed"}, "algorithm": {"advantage": "reinforce_pp"}}
    )
    with pytest.raises(ConfigError, match=r"process\.credit_groups: 'reinforce_pp' centres"):
        check_advantages(cfg)
    check_advantages(from_dict({"process": {"enabled": True}, "algorithm": {"advantage": "reinforce_pp"}}))


def test_refused_without_step_credit_or_with_a_filter_that_drops_equal_groups(tmp_path: Path) -> None:
    from stepcredit.trainer import train

    with pytest.raises(ConfigError, match=r"process\.credit_groups"):
        ProcessConfig(credit_groups="some")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"process\.credit_groups: all_equal .* process\.enabled=true"):
        check_config(replace(Config(), process=ProcessConfig(credit_groups="all_equal")))
    cfg = from_dict(
        {
            "process": {"enabled": True, "credit_groups": "all_equal"},
            "postprocess": {"dynamic_sampling": {"enabled": True}},
        }
    )
    with pytest.raises(ConfigError, match=r"process\.credit_groups: .*dynamic_sampling") as refused:
        train(cfg, tmp_path)
    assert "\n" not in str(refused.value)
