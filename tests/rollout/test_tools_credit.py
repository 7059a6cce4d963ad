"""Turn-level credit: turns are episodes, the exact per-turn oracle of ``arith_tools`` values them, and
the per-turn baseline is not biased by how many turns the group's responses took (verl#7244)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from stepcredit.advantages import AdvantageInputs
from stepcredit.advantages.token import grpo_process, grpo_vineppo, vineppo
from stepcredit.config import ArithConfig, ModelConfig, ProcessConfig, TinyModelConfig
from stepcredit.data import row_to_sample
from stepcredit.data.arith import make_tool_rows
from stepcredit.models import load_policy
from stepcredit.process import build_requests, step_credits
from stepcredit.process.oracle import step_oracle
from stepcredit.process.segment import trace_observed
from stepcredit.process.values import ValueContext
from stepcredit.tools import PARSERS

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_policy(SMALL, seed=0)[1]


def test_oracle_values_turns_of_a_response(tok: Any) -> None:
    row = make_tool_rows(ArithConfig(min_steps=2, max_steps=2), 1, seed=3, split="train")[0]
    s = row_to_sample(row, "t:0")
    good = row["extra_info"]["solution"]
    first = good.split("```calculator\n")[1].split("\n")[0]  # " a * b"
    a, b = first.split(" * ")
    # a slip in the first call (a wrong operand) whose result is ignored: the second call adds to the
    # true product as in the good trace, so the answer is right
    wrong_first = f"{a} * {int(b) + 1}"
    bad = good.replace(first, wrong_first, 1)
    obs = PARSERS.get("fenced").observation
    cfg = ProcessConfig(enabled=True, value_estimator="step_oracle")
    resp = [tok(t)["input_ids"] + [tok.eos_token_id] for t in (good, bad)]
    # the result marks a rollout of these traces records (their result blocks)
    ends, reqs = build_requests([s, s], [[1], [1]], resp, tok, cfg, [trace_observed(r, tok) for r in resp])
    # three turns each: two calls and the answer
    assert [len(e) for e in ends] == [3, 3]
    for e, t in zip(ends, (good, bad), strict=True):
        # the first turn ends on the call's last token, just before its result block
        assert tok.decode(tok(t)["input_ids"][: e[0] + 1]).endswith("```") and obs("") not in t[: e[0] + 1]

    def score(samples: list[Any], texts: list[str]) -> list[float]:
        return [
            float(t.rstrip(".").endswith(str(x.ground_truth))) for x, t in zip(samples, texts, strict=True)
        ]

    values = step_oracle(ValueContext(None, tok, reqs, cfg, score))
    # good: every call is on the chain (V = 1 throughout), the reward is 1
    assert values[0] == [1.0, 1.0, 1.0, 1.0]
    # bad: the first call computes the wrong product (V = 0), the second is on the chain again (V = 1)
    assert values[1] == [1.0, 0.0, 1.0, 1.0]
    # credit per turn: -1 on the turn that went wrong, +1 on the one that put it right, 0 on the answer
    assert step_credits(values[1], cfg) == [-1.0, 1.0, 0.0]
    # and a third trace that carries the wrong product on: 0 from the slip to the (wrong) answer
    s1 = int(a) * int(b)
    carried = bad.replace(f"{s1} +", f"{int(a) * (int(b) + 1)} +").replace(
        f"{s1} -", f"{int(a) * (int(b) + 1)} -"
    )
    ids = tok(carried)["input_ids"] + [tok.eos_token_id]
    _, (req,) = build_requests([s], [[1]], [ids], tok, cfg, [trace_observed(ids, tok)])
    assert step_oracle(ValueContext(None, tok, [req], cfg, lambda xs, ts: [0.0]))[0] == [1.0, 0.0, 0.0, 0.0]


def _group(turns: list[list[float]], T: int = 12) -> AdvantageInputs:
    """One group; response i has its turns' utilities ``turns[i]`` at evenly spaced turn ends."""
    B = len(turns)
    p = torch.zeros(B, T, dtype=torch.float64)
    at = torch.zeros(B, T, dtype=torch.bool)
    for i, us in enumerate(turns):
        for j, u in enumerate(us):
            e = (j + 1) * T // len(us) - 1
            p[i, e], at[i, e] = u, True
    outcome = torch.zeros(B, T, dtype=torch.float64)
    outcome[:, -1] = torch.tensor([sum(us) for us in turns], dtype=torch.float64)
    return AdvantageInputs(
        outcome_BT=outcome,
        mask_BT=torch.ones(B, T, dtype=torch.bool),
        group_B=torch.zeros(B, dtype=torch.long),
        process_BT=p,
        process_mask_BT=at,
    )


def test_turn_baseline_is_not_biased_by_turn_counts() -> None:
    # Response 0 gains +1 in its one turn. Response 1 gains +1 in one turn, or in the last of three
    # turns whose first two change nothing: the same trajectory, more turns.
    short = _group([[1.0], [1.0]])
    long = _group([[1.0], [0.0, 0.0, 1.0]])
    # VinePPO's per-turn advantage (the tools preset adds it to GRPO's outcome: grpo_vineppo) is
    # U_j = V_j - V_(j-1): each turn's
    # baseline is the value of its own prefix, so response 0's advantage cannot depend on how many
    # turns response 1 took
    a_short = vineppo(short, norm_by_std=False).adv_BT
    a_long = vineppo(long, norm_by_std=False).adv_BT
    assert torch.equal(a_short[0], a_long[0]) and a_short[0].tolist() == [1.0] * 12
    # and its zero-change turns get exactly 0 (the credit lands on the turn that lost the value)
    assert a_long[1].tolist() == [0.0] * 8 + [1.0] * 4
    # the pooled per-turn normalisation of grpo_process is the bias verl#7244 describes: the group's
    # step mean moves from 1 (steps 1, 1) to 0.5 (steps 1, 0, 0, 1) because response 1 took more
    # turns, so response 0's identical turn gets 0 in one group and +0.5 in the other
    g_short = grpo_process(short, norm_by_std=False).adv_BT
    g_long = grpo_process(long, norm_by_std=False).adv_BT
    assert g_short[0, 0] == 0.0 and g_long[0, 0] == 0.5
    # grpo_vineppo (the tools preset): the outcome part is per response (both groups score 1, 1) and the
    # turn part is U_j, so without the batch-wide rescaling response 0 is untouched too
    gv_short = grpo_vineppo(short, norm_by_std=False).adv_BT
    gv_long = grpo_vineppo(long, norm_by_std=False).adv_BT
    assert torch.equal(gv_short[0], gv_long[0]) and gv_long[1].tolist() == [0.0] * 8 + [1.0] * 4
    # with it (the default), rms(U) over the batch's tokens is one positive scale for every response:
    # it changes no sign and no ratio between turns, only how large U is beside the outcome term
    n_short = grpo_vineppo(short).adv_BT
    n_long = grpo_vineppo(long).adv_BT
    rms_long = float(torch.cat([torch.ones(12), torch.zeros(8), torch.ones(4)]).pow(2).mean().sqrt())
    assert torch.allclose(n_short[0], torch.ones(12, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(n_long[0], torch.full((12,), 1 / rms_long, dtype=torch.float64), atol=1e-5)
