"""The supervised warm-up: skipped cleanly when ``sft.steps=0``, refused when there is nothing to imitate."""

from __future__ import annotations

import pytest

from stepcredit.config import SFTConfig, TinyModelConfig
from stepcredit.errors import DataError
from stepcredit.models import build_tiny
from stepcredit.trainer.sft import run_sft
from stepcredit.types import Sample


def _samples(with_solution: bool) -> list[Sample]:
    extra = {"solution": "Let me start with 3. So 3 + 4 = 7. The answer is 7."} if with_solution else {}
    return [
        Sample(
            prompt=({"role": "user", "content": "3 and 4 more?"},),
            ground_truth="7",
            uid=str(i),
            extra_info=extra,
        )
        for i in range(4)
    ]


def test_zero_steps_needs_no_solutions_and_leaves_the_model_alone() -> None:
    # GSM8K rows from `stepcredit data prepare` have answers, not solutions: a real-model preset with
    # sft.steps=0 must start RL on them (it used to stop with "no training row has extra_info.solution")
    model, tok = build_tiny(
        TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), seed=0
    )
    before = [p.detach().clone() for p in model.parameters()]
    assert run_sft(model, tok, _samples(False), SFTConfig(steps=0), seed=0) == {}
    assert all((a == b).all() for a, b in zip(before, model.parameters(), strict=True))


def test_steps_without_solutions_is_one_data_error() -> None:
    model, tok = build_tiny(
        TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), seed=0
    )
    with pytest.raises(DataError, match=r"sft\.steps=0"):
        run_sft(model, tok, _samples(False), SFTConfig(steps=2, batch_size=2), seed=0)
    got = run_sft(model, tok, _samples(True), SFTConfig(steps=2, batch_size=2), seed=0)
    assert got["sft/loss"] > 0
