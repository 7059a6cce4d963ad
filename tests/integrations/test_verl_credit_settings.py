"""The verl plugin's credit settings against stepcredit's own trainer, without verl installed.

The pure halves of the ``stepcredit_sync`` trainer (``integrations/verl/process.py`` imports no verl):
``process.step_cost_as=outcome`` charged on verl's outcome tensor as stepcredit's trainer charges its
own, and the start-up refusals of what verl cannot serve (``process.treerl``: verl makes no tree
rollouts). The trainer glue around them runs in .venv-verl (tests/integrations/test_verl_process.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from stepcredit.advantages import AdvantageInputs, compute_advantages
from stepcredit.config import from_dict
from stepcredit.errors import ConfigError
from stepcredit.integrations.verl.estimators import verl_advantages
from stepcredit.integrations.verl.process import check_process_config, outcome_less_step_cost
from stepcredit.process import process_channel
from stepcredit.reward import with_failure_policy
from stepcredit.trainer.update import reward_channels
from stepcredit.types import Batch, RewardResult, Sample, Status

# two prompts, two responses each; response lengths 5, 6, 4, 6 tokens
LENS = [5, 6, 4, 6]
ENDS = [[1, 4], [0, 2, 5], [3], [1, 3, 5]]  # episode ends (token indices), 2 + 3 + 1 + 3 episodes
VALUES = [[0.5, 0.75, 1.0], [0.5, 0.5, 0.25, 0.0], [0.5, 1.0], [0.25, 0.5, 0.5, 0.0]]
RESULTS = [
    RewardResult(1.0, source="math"),
    RewardResult(0.0, source="math"),
    RewardResult(1.0, source="math"),
    RewardResult.failure(Status.ERROR, "verifier crashed"),  # no verdict: never charged
]


def _batch() -> Batch:
    B, T = len(LENS), max(LENS)
    mask_BT = torch.tensor([[t < n for t in range(T)] for n in LENS])
    return Batch(
        samples=[
            Sample(prompt=({"role": "user", "content": f"q{b // 2}"},), ground_truth=1) for b in range(B)
        ],
        group_B=torch.tensor([0, 0, 1, 1]),
        prompt_ids_BP=torch.ones(B, 2, dtype=torch.long),
        prompt_mask_BP=torch.ones(B, 2, dtype=torch.bool),
        response_ids_BT=torch.ones(B, T, dtype=torch.long),
        response_mask_BT=mask_BT,
        behaviour_logp_BT=torch.zeros(B, T),
        texts=["x"] * B,
        truncated_B=torch.zeros(B, dtype=torch.bool),
        rewards=[
            RewardResult(r.score, r.status, r.extracted, dict(r.info), source=r.source) for r in RESULTS
        ],
        episode_ends=[list(e) for e in ENDS],
        prefix_values=[list(v) for v in VALUES],
    )


def test_step_cost_on_the_outcome_by_hand() -> None:
    cfg = from_dict({"process": {"enabled": True, "step_cost": 0.1, "step_cost_as": "outcome"}}).process
    mask_BT = _batch().response_mask_BT.float()  # verl's masks are numeric
    scores_BT = torch.zeros_like(mask_BT)
    scores_BT[torch.arange(4), torch.tensor(LENS) - 1] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    verdict_B = torch.tensor([r.ok for r in RESULTS])
    got = outcome_less_step_cost(scores_BT, mask_BT, ENDS, verdict_B, cfg)
    # c x episodes at each last token: 1 - 0.2, 0 - 0.3, 1 - 0.1; the failed row pays nothing
    want = scores_BT.clone()
    want[0, 4], want[1, 5], want[2, 3] = 0.8, -0.3, 0.9
    torch.testing.assert_close(got, want)
    assert bool((scores_BT[0] == torch.tensor([0, 0, 0, 0, 1.0, 0])).all())  # the input is left as it was
    # the other forms charge the credits, not the outcome: the tensor comes back untouched
    for how in ("token", "return"):
        other = replace(cfg, step_cost_as=how)
        assert outcome_less_step_cost(scores_BT, mask_BT, ENDS, verdict_B, other) is scores_BT
    off = replace(cfg, step_cost=0.0)
    assert outcome_less_step_cost(scores_BT, mask_BT, ENDS, verdict_B, off) is scores_BT


@pytest.mark.parametrize("step_cost_as", ["outcome", "token"])
def test_verl_advantages_with_a_step_cost_equal_the_trainer(step_cost_as: str) -> None:
    # stepcredit's trainer: reward_channels charges the outcome (or the credits) and builds both channels
    cfg = from_dict(
        {
            "process": {"enabled": True, "step_cost": 0.25, "step_cost_as": step_cost_as},
            "algorithm": {"advantage": "grpo_process", "process_weight": 0.5},
            "reward": {"failure_policy": "mask"},
        }
    )
    batch, ch = reward_channels(with_failure_policy(_batch(), cfg.reward), cfg)
    want = compute_advantages(
        cfg.algorithm,
        AdvantageInputs(
            outcome_BT=ch.outcome_BT,
            mask_BT=batch.response_mask_BT,
            group_B=batch.group_B,
            valid_B=ch.valid_B,
            process_BT=ch.process_BT,
            process_mask_BT=ch.process_mask_BT,
        ),
    )
    # the stepcredit_sync trainer's path on verl's tensors: rm_scores at the last token (the failure
    # policy's 0 for the failed row), the cost charged on real verdicts, the channel, the adapter
    mask_BT = batch.response_mask_BT.float()
    rm_scores = torch.zeros_like(mask_BT)
    rm_scores[torch.arange(4), torch.tensor(LENS) - 1] = torch.tensor([r.score for r in RESULTS]).nan_to_num(
        0.0
    )
    verdict_B = torch.tensor([r.ok for r in RESULTS])
    scores = outcome_less_step_cost(rm_scores, mask_BT, ENDS, verdict_B, cfg.process)
    process_BT, process_mask_BT = process_channel(ENDS, VALUES, mask_BT, cfg.process)
    adv, ret = verl_advantages(
        "grpo_process",
        scores,
        mask_BT,
        index=np.array(["p0", "p0", "p1", "p1"], dtype=object),
        config={"stepcredit": {"process_weight": 0.5}},
        process_rewards=process_BT,
        process_mask=process_mask_BT,
        valid=ch.valid_B,
    )
    torch.testing.assert_close(adv, want.adv_BT, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, want.ret_BT, atol=1e-5, rtol=0)
    if step_cost_as == "outcome":  # the cost reached the advantages: group 0's longer response lost
        free = reward_channels(
            with_failure_policy(_batch(), cfg.reward),
            replace(cfg, process=replace(cfg.process, step_cost=0.0)),
        )[1]
        assert float(ch.outcome_BT[1].sum()) < float(free.outcome_BT[1].sum())


def test_the_verl_trainer_refuses_what_it_cannot_apply_in_one_line() -> None:
    def sc(**process: Any) -> Any:
        return from_dict({"process": {"enabled": True, **process}})

    est = "stepcredit_grpo_process"
    check_process_config(sc(), est)  # forced answer + grpo_process: served
    check_process_config(sc(step_cost=0.1, step_cost_as="outcome"), est)  # charged on verl's outcome
    check_process_config(sc(step_cost=0.1, step_cost_as="token"), est)
    check_process_config(from_dict({"process": {"treerl": True}}), est)  # process rewards off: not read

    def refused(cfg: Any, match: str, estimator: str = est) -> str:
        with pytest.raises(ConfigError, match=match) as e:
            check_process_config(cfg, estimator, {"stepcredit": {"process_weight": 0.5}})
        assert "\n" not in str(e.value)
        return str(e.value)

    # TreeRL's credit is read off a tree rollout's leaves, which verl does not make
    msg = refused(sc(treerl=True), r"stepcredit\.process\.treerl")
    assert "verl does not make" in msg and "set it to false" in msg
    # the checks stepcredit's own trainer runs, with verl's estimator: blame on log-probabilities ...
    refused(sc(credit="blame"), r"process\.credit=blame and process\.value_estimator=forced_answer_logprob")
    # ... a cost-to-go in the credits of an estimator that sums credits into returns itself ...
    refused(sc(step_cost=0.1, step_cost_as="return"), r"process\.step_cost_as: return")
    # ... an unknown credit form
    refused(sc(credit="sum_of_squares"), r"process\.credit: unknown 'sum_of_squares'")
    # the verl-only refusals are unchanged
    refused(sc(value_estimator="monte_carlo"), r"stepcredit\.process\.value_estimator: monte_carlo")
    refused(sc(), r"algorithm\.adv_estimator: stepcredit_vineppo", "stepcredit_vineppo")
    refused(sc(), "needs a stepcredit estimator", "grpo")
