"""A step's rows reach training in index order, whatever order their rewards finish in, so two runs with
the same seed end with the same weights bit for bit (``pipeline.mini_batch=0``)."""

from __future__ import annotations

from pathlib import Path

import torch

from stepcredit.cli.main import main

# a reward whose latency is random per call: the thread backend finishes the step's groups in a
# different order in every run; its score depends only on the response
REWARD = """
import random, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
    time.sleep(random.random() * 0.02)
    return len(solution_str) / 7.0
"""


def test_two_runs_with_one_seed_end_with_the_same_weights_whatever_order_rewards_finish(
    tmp_path: Path, tiny_train: list[str]
) -> None:
    fn = tmp_path / "slow.py"
    fn.write_text(REWARD)
    args = [*tiny_train, "sft.steps=0", "trainer.steps=3", "trainer.val_every=0", "trainer.save_every=3",
            "rollout.prompts_per_step=8", "reward.agent.backend=thread", "reward.agent.max_chunk=1",
            "reward.agent.max_concurrency=8", f"reward.custom.path={fn}:compute_score",
            "reward.custom.isolate=false", "postprocess.outcome.mean=running",
            "postprocess.outcome.std=running"]  # fmt: skip
    states = []
    for name in ("a", "b"):
        assert main(["train", "--preset", "smoke", "--out", str(tmp_path / name), *args]) == 0
        states.append(
            torch.load(tmp_path / name / "checkpoints" / "step_000003" / "state.pt", weights_only=False)
        )
    a, b = states
    assert a["outcome_stats"] == b["outcome_stats"]
    assert a["outcome_stats"]["default"][0] == 3 * 8 * 2
    wa, wb = a["model"], b["model"]
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
