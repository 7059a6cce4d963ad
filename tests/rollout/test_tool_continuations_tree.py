"""Tree rollouts of tool-calling responses (``rollout.mode=tools_tree``): leaves branch at turn
boundaries (a call's end), a branch runs the call again and samples the turns after it, and the tree's
node values are Monte Carlo values of the turns' prefixes under the policy with the tools."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import stepcredit.reward.tools  # noqa: F401  (registers the arith_tools verifier)
import stepcredit.rollout.turns as rt
from stepcredit.cli.main import main
from stepcredit.config import (
    Config,
    ModelConfig,
    ProcessConfig,
    RolloutConfig,
    TinyModelConfig,
    ToolsConfig,
    TreeConfig,
)
from stepcredit.errors import ConfigError
from stepcredit.models import load_policy
from stepcredit.process.segment import segment_episodes
from stepcredit.process.tree import tree_values
from stepcredit.reward.base import REWARDS
from stepcredit.rollout import ROLLOUT_MODES, RolloutRequest, ToolContext
from stepcredit.rollout.engines import Completion
from stepcredit.rollout.tool_context import in_process_runner
from stepcredit.rollout.tree import BRANCH_RULES, BranchRule, Leaf
from stepcredit.tools import Observation, ToolCall
from stepcredit.types import Sample

SMALL = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
CALL = "```calculator\n 48 * 478\n```"  # 22944, the gold answer
WRONG = "```calculator\n 48 * 487\n```"  # 23376
RESULT = "\n```output\n{}\n```\n"


def first_call(leaf: Leaf, ctx: Any) -> int:
    # branch at the leaf's first turn boundary after its last branch point (deterministic, for the test)
    last = leaf.path[-1][1]
    after = [e + 1 for e in ctx.ends(leaf) if last < e + 1 < len(leaf.ids)]
    return after[0] if after else last


BRANCH_RULES.add("t_first_call", BranchRule(first_call, needs_entropy=False))


def scripted(monkeypatch: pytest.MonkeyPatch, tok: Any) -> list[str]:
    """First turns alternate between the right and the wrong call; after a result the answer copies it."""
    firsts: list[str] = []

    class Scripted:
        def sample(
            self, model: Any, tok: Any, contexts: Sequence[Sequence[int]], spec: Any, *, budgets: Any
        ) -> list:
            out = []
            for c, room in zip(contexts, budgets, strict=True):
                text = tok.decode(list(c), skip_special_tokens=True)
                if "```output\n" in text:
                    result = text.rsplit("```output\n", 1)[1].split("\n")[0]
                    ids = tok(f"The answer is\n{result}", add_special_tokens=False)["input_ids"] + [
                        tok.eos_token_id
                    ]
                else:
                    firsts.append(CALL if len(firsts) % 2 == 0 else WRONG)
                    ids = tok(firsts[-1], add_special_tokens=False)["input_ids"]
                out.append(Completion(list(ids)[:room]))
            return out

    monkeypatch.setattr(rt, "engine_for", lambda model: Scripted())
    return firsts


def test_a_tool_tree_branches_at_calls_and_values_the_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, tok = load_policy(SMALL, seed=0)
    firsts = scripted(monkeypatch, tok)
    ran: list[ToolCall] = []
    inner = in_process_runner(("calculator",), 256)

    def runner(calls: Sequence[ToolCall], kwargs: Sequence[Any]) -> list[Observation]:
        ran.extend(calls)
        return inner(calls, kwargs)

    cfg = RolloutConfig(
        mode="tools_tree",
        n=4,
        max_new_tokens=120,
        tools=ToolsConfig(names=("calculator",), parser="fenced", max_turns=2),
        tree=TreeConfig(branching=(2, 2), branch_at="t_first_call"),
    )
    sample = Sample(
        prompt=({"role": "user", "content": "Q?"},), ground_truth="22944", data_source="arith_tools"
    )
    mode = ROLLOUT_MODES.get("tools_tree")
    assert mode.shares_prefixes
    request = RolloutRequest(
        [sample],
        cfg,
        lambda ids: segment_episodes(ids, tok, ProcessConfig()),
        tools=ToolContext(cfg.tools, runner, cfg.max_new_tokens),
    )
    batch, counts = mode.fn(model, tok, request)
    right = CALL + RESULT.format(22944) + "The answer is\n22944"
    wrong = WRONG + RESULT.format(23376) + "The answer is\n23376"
    # level 1: a right and a wrong first call; level 2: each leaf branches at its call's end, the branch
    # runs the same call again (the script's second draw of a first turn is never needed) and copies the result
    assert batch.texts == [right, wrong, right, wrong] and firsts == [CALL, WRONG]
    assert [c.arguments["expression"] for c in ran] == [" 48 * 478", " 48 * 487"] * 2
    n_call = len(tok(CALL, add_special_tokens=False)["input_ids"])
    n_wrong = len(tok(WRONG, add_special_tokens=False)["input_ids"])
    assert batch.tree_nodes == [[0, 1], [0, 2], [0, 1], [0, 2]]
    assert [e[0] for e in batch.tree_ends] == [n_call - 1, n_wrong - 1] * 2  # each call's last token
    # a branch keeps the shared prefix's marks: its result tokens are observations, never trained on
    assert torch.equal(batch.observation_BT[0], batch.observation_BT[2]) and batch.observation_BT[0].any()
    assert not (batch.observation_BT & batch.response_mask_BT).any()
    # every response called once; only the branches' tails were generated again
    assert counts["tools/calls"] == 4 and counts["tools/failed_calls"] == 0
    tails = len(tok("The answer is\n22944", add_special_tokens=False)["input_ids"]) + 1
    assert counts["rollout/generated_tokens"] == n_call + n_wrong + 4 * tails
    # the node values: V_0 = 1/2 (two of four leaves right), V(after the right call) = 1, after the wrong one 0
    verify = REWARDS.get("arith_tools").fn
    scores = [verify("arith_tools", t, "22944", {}).score for t in batch.texts]
    values = tree_values(batch.group_B.tolist(), batch.tree_nodes, scores, [True] * 4)
    assert values == [[0.5, 1.0, 1.0], [0.5, 0.0, 0.0], [0.5, 1.0, 1.0], [0.5, 0.0, 0.0]]


def test_a_tool_tree_refuses_an_entropy_rule() -> None:
    cfg = replace(
        Config(), rollout=RolloutConfig(mode="tools_tree", n=4, tree=TreeConfig(branch_at="entropy"))
    )
    with pytest.raises(
        ConfigError, match=r"rollout\.tree\.branch_at: rollout\.mode=tools_tree records no token entropies"
    ):
        ROLLOUT_MODES.get("tools_tree").check(cfg)  # type: ignore[misc]


@pytest.mark.parametrize("treerl", ["false", "true"])
def test_tools_preset_with_tree_values_through_the_cli(
    tmp_path: Path, treerl: str, tools_smoke: list[str]
) -> None:
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "tools",
            *tools_smoke,
            "rollout.mode=tools_tree",
            "rollout.prompts_per_step=2",
            "rollout.n=4",
            "rollout.max_new_tokens=40",
            "process.value_estimator=tree",
            f"process.treerl={treerl}",
            "trainer.steps=2",
            "trainer.val_every=0",
            "trainer.save_every=0",
            "trainer.threads=1",
            "--out",
            str(out),
        ]
    )
    assert code in (0, None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2
    for key in ("tools/calls_per_response", "process/u_abs_mean", "tree/branch_points_per_leaf"):
        assert any(isinstance(r.get(key), (int, float)) for r in rows), key
