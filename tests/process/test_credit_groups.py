"""``process.credit_groups``: step credit only in the groups whose outcomes are all equal, or only in the rest."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from stepcredit.config import Config, ProcessConfig, from_dict
from stepcredit.errors import ConfigError
from stepcredit.process import check_config, credited_rows
from stepcredit.types import Batch, RewardResult, Sample


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


def test_the_trainer_credits_only_the_chosen_groups() -> None:
    from stepcredit.reward import with_failure_policy
    from stepcredit.trainer.update import reward_channels

    # two groups of two responses with two episodes each and the same values (U = -0.5, then -0.5):
    # group 0 mixed (R = 1, 0), group 1 all wrong
    B, T = 4, 6
    batch = Batch(
        samples=[Sample(prompt=({"role": "user", "content": "q"},), ground_truth="1")] * B,
        group_B=torch.tensor([0, 0, 1, 1]),
        prompt_ids_BP=torch.ones(B, 1, dtype=torch.long),
        prompt_mask_BP=torch.ones(B, 1, dtype=torch.bool),
        response_ids_BT=torch.ones(B, T, dtype=torch.long),
        response_mask_BT=torch.ones(B, T, dtype=torch.bool),
        behaviour_logp_BT=torch.zeros(B, T),
        texts=["a"] * B,
        truncated_B=torch.zeros(B, dtype=torch.bool),
        rewards=[RewardResult(1.0), RewardResult(0.0), RewardResult(0.0), RewardResult(0.0)],
        episode_ends=[[2, 5]] * B,
        prefix_values=[[1.0, 0.5, 0.0]] * B,
    )

    def channels(which: str) -> tuple[list[list[float]], list[list[bool]]]:
        cfg = replace(Config(), process=ProcessConfig(enabled=True, credit_groups=which))  # type: ignore[arg-type]
        _, ch = reward_channels(with_failure_policy(batch, cfg.reward), cfg)
        assert ch.process_BT is not None and ch.process_mask_BT is not None
        return ch.process_BT.tolist(), ch.process_mask_BT.tolist()

    row = [0.0, 0.0, -0.5, 0.0, 0.0, -0.5]
    steps = [False, False, True, False, False, True]
    none = ([0.0] * T, [False] * T)
    values, mask = channels("all")
    assert values == [row] * 4 and mask == [steps] * 4
    values, mask = channels("mixed")  # group 0 only
    assert list(zip(values, mask, strict=True)) == [(row, steps)] * 2 + [none] * 2
    values, mask = channels("all_equal")  # group 1 only
    assert list(zip(values, mask, strict=True)) == [none] * 2 + [(row, steps)] * 2


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
