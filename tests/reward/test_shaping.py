"""Length shaping (DAPO's soft overlong punishment): hand values at the buffer's edges, verl's formula
as the reference, failed rewards left alone, per-domain entries, order with normalisation, start-up
checks, and a run through ``stepcredit train``."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stepcredit.cli.main import main
from stepcredit.config import LengthPenaltyConfig, OutcomeProcessConfig, PostprocessConfig, from_dict
from stepcredit.data import arith
from stepcredit.errors import ConfigError
from stepcredit.reward.postprocess import RunningStats, process_outcomes
from stepcredit.reward.shaping import check_config, length_penalty_metrics, overlong_penalty, shape_lengths


def test_overlong_penalty_by_hand_at_the_buffer_edges() -> None:
    # L_max = 96, L_cache = 16: free up to 96 - 16 = 80 tokens, then (80 - |y|) / 16, -1 beyond 96
    length = torch.tensor([0, 80, 81, 88, 95, 96, 97, 500])
    want = [0.0, 0.0, -1 / 16, -8 / 16, -15 / 16, -1.0, -1.0, -1.0]
    got = overlong_penalty(length, max_len=96, buffer_len=16)
    assert got.tolist() == pytest.approx(want, abs=1e-7)
    # a buffer as long as L_max: the ramp starts at 0 tokens (|y| = 24 of 96 -> -1/4)
    assert overlong_penalty(torch.tensor([0, 24, 96]), max_len=96, buffer_len=96).tolist() == [
        0.0,
        -0.25,
        -1.0,
    ]
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(length, max_len=96, buffer_len=97)


def _verl_overlong(length: int, *, max_resp_len: int, buffer_len: int, factor: float) -> float:
    """verl's DAPO reward manager, as a loop: ``min(-(|y| - (L_max - L_cache)) / L_cache * f, 0)``."""
    expected_len = max_resp_len - buffer_len
    exceed_len = length - expected_len
    return min(-exceed_len / buffer_len * factor, 0)


def test_equals_verls_formula_up_to_l_max() -> None:
    rng = random.Random(0)
    for _ in range(50):
        max_len = rng.randint(2, 300)
        buffer_len = rng.randint(1, max_len)
        factor = rng.choice([0.5, 1.0, 2.0])
        lengths = [rng.randint(0, max_len) for _ in range(20)]  # verl's generation stops at L_max
        ours = factor * overlong_penalty(torch.tensor(lengths), max_len=max_len, buffer_len=buffer_len)
        ref = [_verl_overlong(n, max_resp_len=max_len, buffer_len=buffer_len, factor=factor) for n in lengths]
        assert ours.tolist() == pytest.approx(ref, abs=1e-6)


def _post(form: str = "overlong", **domains: OutcomeProcessConfig) -> PostprocessConfig:
    lp = LengthPenaltyConfig(form=form, buffer_len=4, penalty_factor=0.5, max_len=10)
    return PostprocessConfig(outcome=OutcomeProcessConfig(length_penalty=lp), domains=domains)


def test_failed_rewards_are_never_shaped_and_domains_keep_their_own_entry() -> None:
    # free up to 10 - 4 = 6 tokens; 8 tokens -> (6 - 8) / 4 = -0.5, times 0.5 -> -0.25; 10 -> -0.5
    score = torch.tensor([1.0, 0.0, 1.0, 0.7, 1.0])
    verdict = torch.tensor([True, True, True, False, True])  # row 3: a failed reward with failure_score 0.7
    length = torch.tensor([6, 8, 10, 10, 10])
    domains = ["a", "a", "a", "a", "b"]
    out, added = shape_lengths(
        score, verdict, length, domain_B=domains, cfg=_post(b=OutcomeProcessConfig()), max_new_tokens=16
    )
    assert out.tolist() == pytest.approx([1.0, -0.25, 0.5, 0.7, 1.0])  # "b" has no length penalty
    assert added is not None and added.tolist() == pytest.approx([0.0, -0.25, -0.5, 0.0, 0.0])
    assert score.tolist() == pytest.approx([1.0, 0.0, 1.0, 0.7, 1.0])  # the input is not modified
    # metrics over the shaped rows (verdicts): (0 - 0.25 - 0.5 + 0) / 4; 2 of 4 penalised
    m = length_penalty_metrics(added, verdict)
    assert m["reward/overlong_penalty_mean"] == pytest.approx(-0.75 / 4)
    assert m["reward/overlong_frac"] == 0.5
    none, added = shape_lengths(
        score, verdict, length, domain_B=domains, cfg=PostprocessConfig(), max_new_tokens=16
    )
    assert added is None and none is score


def test_l_max_defaults_to_the_rollouts_max_new_tokens() -> None:
    lp = LengthPenaltyConfig(form="overlong", buffer_len=4)
    cfg = PostprocessConfig(outcome=OutcomeProcessConfig(length_penalty=lp))
    # L_max = 16: free up to 12; 14 -> -0.5
    out, _ = shape_lengths(
        torch.ones(2), torch.ones(2, dtype=torch.bool), torch.tensor([12, 14]), domain_B=["x", "x"], cfg=cfg,
        max_new_tokens=16,
    )  # fmt: skip
    assert out.tolist() == pytest.approx([1.0, 0.5])


def test_the_penalty_is_a_reward_term_before_group_normalisation() -> None:
    # one group of two right answers, 6 and 10 tokens: shaped 1 and 0.5 (see above), so group
    # normalisation gives (1 - 0.75) / 0.25 = +1 and -1: the long one loses though both are right
    post = _post()
    post = PostprocessConfig(
        outcome=OutcomeProcessConfig(mean="group", std="group", length_penalty=post.outcome.length_penalty)
    )
    score, verdict = torch.ones(2), torch.ones(2, dtype=torch.bool)
    shaped, _ = shape_lengths(
        score, verdict, torch.tensor([6, 10]), domain_B=["d", "d"], cfg=post, max_new_tokens=16
    )
    out, _ = process_outcomes(
        shaped, verdict, group_B=torch.zeros(2, dtype=torch.long), domain_B=["d", "d"],
        truncated_B=torch.zeros(2, dtype=torch.bool), cfg=post, eps=1e-6, running=RunningStats(),
    )  # fmt: skip
    assert out.tolist() == pytest.approx([1.0, -1.0], abs=1e-4)


def _cfg(**lp: object) -> object:
    return from_dict({"rollout": {"max_new_tokens": 16}, "postprocess": {"outcome": {"length_penalty": lp}}})


def test_start_up_checks_name_the_key() -> None:
    check_config(_cfg(form="overlong", buffer_len=16))  # a buffer as long as L_max is fine
    with pytest.raises(ConfigError, match=r"postprocess\.outcome\.length_penalty\.buffer_len: .*\[1, 16\]"):
        check_config(_cfg(form="overlong", buffer_len=17))
    with pytest.raises(ConfigError, match=r"length_penalty\.buffer_len: .*max_len = 8"):
        check_config(_cfg(form="overlong", buffer_len=9, max_len=8))
    with pytest.raises(ConfigError, match=r"length_penalty\.buffer_len"):
        check_config(_cfg(form="overlong"))  # no buffer: nothing to ramp over
    with pytest.raises(
        ConfigError, match=r"length_penalty\.form: unknown form 'kimi' \(valid: none, overlong"
    ):
        check_config(_cfg(form="kimi", buffer_len=4))
    with pytest.raises(ConfigError, match=r"length_penalty\.penalty_factor"):
        _cfg(form="overlong", buffer_len=4, penalty_factor=-1)
    bad = {"outcome": {}, "domains": {"code": {"length_penalty": {"form": "overlong", "buffer_len": 99}}}}
    with pytest.raises(ConfigError, match=r"postprocess\.domains\.code\.length_penalty\.buffer_len"):
        check_config(from_dict({"postprocess": bad}))


def test_wasted_episodes_are_counted_in_arith_traces() -> None:
    p = arith.ArithProblem(name="Ann", item="apples", start=3, ops=(("+", 4, "gets"), ("-", 2, "eats")))
    rng = random.Random(1)
    trace = arith.reference_trace(p, rng, mistake_prob=0.0, waste_prob=1.0)  # one after each operation
    assert arith.count_wasted(trace) == 2
    assert arith.count_wasted(arith.reference_trace(p, rng, mistake_prob=0.0)) == 0


TINY_CHANGES = [
    "data.train_size=32",
    "rollout.prompts_per_step=2",
    "rollout.n=4",
    "sft.steps=1",
    "trainer.steps=2",
    "trainer.val_every=2",
    "trainer.save_every=0",
]
"""What this file's runs change in the tiny run's overrides (``tiny_train``, tests/conftest.py)."""


def test_train_logs_the_penalty_and_a_buffer_longer_than_l_max_exits_2(
    tmp_path: Path, tiny_train: list[str]
) -> None:
    lp = [
        "postprocess.outcome.length_penalty.form=overlong",
        "postprocess.outcome.length_penalty.buffer_len=16",
    ]
    assert main(["train", "--out", str(tmp_path / "r"), *tiny_train, *TINY_CHANGES, *lp]) == 0
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    for r in steps:
        # a buffer as long as L_max = 16: every response of n tokens gets -n/16, none is free
        assert r["reward/overlong_frac"] == pytest.approx(1.0)
        assert r["reward/overlong_penalty_mean"] == pytest.approx(-r["response_length/mean"] / 16, abs=1e-5)
        assert "response/wasted_episodes_per_response" in r
    assert "val/response/wasted_episodes_per_response" in steps[-1]
    proc = subprocess.run(
        [sys.executable, "-m", "stepcredit.cli.main", "train", "--out", str(tmp_path / "bad"), *tiny_train, *TINY_CHANGES,
         "postprocess.outcome.length_penalty.form=overlong", "postprocess.outcome.length_penalty.buffer_len=17"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "postprocess.outcome.length_penalty.buffer_len" in lines[0], proc.stderr
