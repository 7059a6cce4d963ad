"""The `stepcredit` reward manager in verl's reward loop agrees with `stepcredit score` on the same rows."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

from stepcredit.cli.main import main as cli_main
from stepcredit.integrations.verl.reward_manager import EXTRA_KEYS, StepCreditRewardManager, result_of
from stepcredit.models import build_tokenizer
from stepcredit.types import Status

pytestmark = pytest.mark.verl  # runs in .venv-verl (make test)

MATH_ROWS = [
    {"data_source": "openai/gsm8k", "response": "3 + 4 = 7 apples.\n#### 7", "ground_truth": "7"},
    {"data_source": "openai/gsm8k", "response": "So she has 8.\n#### 8", "ground_truth": "7"},
    {"data_source": "openai/gsm8k", "response": "I am not sure.", "ground_truth": "7"},
    {
        "data_source": "lighteval/MATH",
        "response": "Half: $\\boxed{\\frac{1}{2}}$",
        "ground_truth": "\\frac{1}{2}",
    },
    {"data_source": "lighteval/MATH", "response": "It is $\\boxed{0.5}$", "ground_truth": "\\frac{1}{2}"},
]

CUSTOM = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    if ground_truth == "boom":
        raise ValueError("boom")
    if ground_truth == "hang":
        time.sleep(60)
    return (1.0 if solution_str.strip().endswith(ground_truth) else 0.0) + bonus
"""
CUSTOM_ROWS = [
    {"data_source": "mine", "response": "the end is near", "ground_truth": "near"},
    {"data_source": "mine", "response": "far away", "ground_truth": "near"},
    {"data_source": "mine", "response": "anything", "ground_truth": "boom"},
    {"data_source": "mine", "response": "anything", "ground_truth": "hang"},
]


def _proto(tok: Any, row: dict[str, Any], i: int) -> DataProto:
    # verl's layout: left-padded prompt, right-padded response, attention mask over both
    prompt = tok("<|user|>question<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    resp = [*tok(row["response"], add_special_tokens=False)["input_ids"], tok.eos_token_id]
    P, T = len(prompt) + 2, len(resp) + 3
    prompts = torch.full((1, P), tok.pad_token_id)
    prompts[0, P - len(prompt) :] = torch.tensor(prompt)
    responses = torch.full((1, T), tok.pad_token_id)
    responses[0, : len(resp)] = torch.tensor(resp)
    attn = torch.zeros(1, P + T, dtype=torch.long)
    attn[0, P - len(prompt) : P + len(resp)] = 1
    non_tensors = {
        "data_source": np.array([row["data_source"]], dtype=object),
        "reward_model": np.array([{"ground_truth": row["ground_truth"], "style": "rule"}], dtype=object),
        "extra_info": np.array([{"index": i}], dtype=object),
        "uid": np.array([f"u{i}"], dtype=object),
    }
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attn}, non_tensors=non_tensors
    )


def _verl_scores(config: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tok = build_tokenizer()
    cls = get_reward_manager_cls("stepcredit")
    assert cls is StepCreditRewardManager
    mgr = cls(config=config, tokenizer=tok, compute_score=None)
    try:

        async def all_rows() -> list[dict[str, Any]]:
            # as verl's RewardLoopWorker: one run_single task per response, gathered
            return await asyncio.gather(*(mgr.run_single(_proto(tok, r, i)) for i, r in enumerate(rows)))

        return asyncio.run(all_rows())
    finally:
        mgr.rewarder.close()


def _cli_scores(
    tmp_path: Path, rows: list[dict[str, Any]], *, timeout: float, custom: str = ""
) -> list[dict]:
    inp, out = tmp_path / "rows.jsonl", tmp_path / "scored.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["score", "--in", str(inp), "--out", str(out), "--workers", "1", "--timeout", str(timeout)]
    assert cli_main([*argv, "--mode", "flexible", *(["--custom", custom] if custom else [])]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _assert_same(verl_out: list[dict[str, Any]], cli_out: list[dict[str, Any]]) -> None:
    assert len(verl_out) == len(cli_out)
    for v, c in zip(verl_out, cli_out, strict=True):
        info = v["reward_extra_info"]
        assert tuple(info) == EXTRA_KEYS  # the same keys for every response, as verl requires
        assert info["status"] == c["status"], (v, c)
        assert info["extracted"] == (c["extracted"] or "")
        assert info["source"] == c["source"]
        if c["score"] is None:  # could not score: not a verdict; the failure policy (mask) gives 0
            assert info["ok"] == 0.0 and v["reward_score"] == 0.0
        else:
            assert info["ok"] == 1.0 and math.isclose(v["reward_score"], c["score"])
        assert info["acc"] == v["reward_score"]


def test_same_scores_and_statuses_as_stepcredit_score(tmp_path: Path) -> None:
    config = OmegaConf.create(
        {
            "reward": {"custom_reward_function": {"path": None, "name": "compute_score"}},
            "stepcredit": {
                "reward": {"workers": 1, "timeout_s": 10, "kwargs": {"math": {"mode": "flexible"}}}
            },
        }
    )
    verl_out = _verl_scores(config, MATH_ROWS)
    _assert_same(verl_out, _cli_scores(tmp_path, MATH_ROWS, timeout=10))
    statuses = [v["reward_extra_info"]["status"] for v in verl_out]
    assert [v["reward_score"] for v in verl_out] == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert statuses[2] == "unparseable" and statuses[0] == "ok"


def test_custom_function_raise_and_hang_are_typed_not_crashes(tmp_path: Path) -> None:
    fn = tmp_path / "my_reward.py"
    fn.write_text(CUSTOM)
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": str(fn),
                    "name": "compute_score",
                    "reward_kwargs": {"bonus": 0.5},
                }
            },
            "stepcredit": {"reward": {"workers": 1, "timeout_s": 2.0}},
        }
    )
    verl_out = _verl_scores(config, CUSTOM_ROWS)
    cli_rows = [{**r, "extra_info": {}} for r in CUSTOM_ROWS]
    cli_out = _cli_scores(tmp_path, cli_rows, timeout=2.0, custom=f"{fn}:compute_score")
    statuses = [v["reward_extra_info"]["status"] for v in verl_out]
    assert statuses == ["ok", "ok", "error", "timeout"]
    assert [v["reward_score"] for v in verl_out] == [1.5, 0.5, 0.0, 0.0]
    # the CLI has no reward_kwargs: compare statuses and the failures, and the scores less the bonus
    for v, c in zip(verl_out, cli_out, strict=True):
        assert v["reward_extra_info"]["status"] == c["status"]
        if c["score"] is not None:
            assert math.isclose(v["reward_score"] - 0.5, c["score"])
    # the typed result comes back from reward_extra_info for the stepcredit_sync trainer
    back = result_of(verl_out[2]["reward_extra_info"], verl_out[2]["reward_score"])
    assert back.status is Status.ERROR and not back.ok
    assert result_of(verl_out[0]["reward_extra_info"], 1.5).ok


SLOW_IMPORT = """
import time

time.sleep(2.5)  # as a module that imports verl (~9 s on a loaded machine) at the top


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if ground_truth == "slow":
        time.sleep(30)
    return 1.0
"""


def test_first_import_of_the_custom_function_is_not_charged_to_the_deadline(tmp_path: Path) -> None:
    # Issue 19: a fresh pool worker imported the user's module inside the first job's deadline, so with
    # timeout_s=10 a function importing verl timed out on its first response. The import now has its own
    # allowance; the call itself keeps the deadline (the "slow" row still times out after 1 s).
    fn = tmp_path / "slow_import.py"
    fn.write_text(SLOW_IMPORT)
    config = OmegaConf.create(
        {
            "reward": {"custom_reward_function": {"path": str(fn), "name": "compute_score"}},
            "stepcredit": {"reward": {"workers": 1, "timeout_s": 1.0}},
        }
    )
    rows = [
        {"data_source": "mine", "response": "a", "ground_truth": "x"},
        {"data_source": "mine", "response": "b", "ground_truth": "slow"},
        {"data_source": "mine", "response": "c", "ground_truth": "x"},  # a replacement worker imports again
    ]
    out = _verl_scores(config, rows)
    assert [v["reward_extra_info"]["status"] for v in out] == ["ok", "timeout", "ok"]
    assert [v["reward_score"] for v in out] == [1.0, 0.0, 1.0]
