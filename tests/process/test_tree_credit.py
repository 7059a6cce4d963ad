"""TreeRL's tree credit (``process.treerl``) on a hand-built tree, derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from stepcredit.config import Config, ProcessConfig, RolloutConfig, TreeConfig
from stepcredit.errors import ConfigError
from stepcredit.process import check_config, process_channel, tree_credits

# One group, branching (2, 2): root -> a, b; a -> leaves l1, l2; b -> l3, l4. Each leaf's row has two
# segments: root -> its branch node, then branch node -> the leaf. Outcomes R = 1, 0, 1, 1.
GROUP = [0, 0, 0, 0]
NODES = [[0, 1], [0, 1], [0, 2], [0, 2]]  # root 0, a = 1, b = 2
ENDS = [[3, 7], [3, 8], [2, 6], [2, 9]]
SCORE = [1.0, 0.0, 1.0, 1.0]
ON = ProcessConfig(enabled=True, value_estimator="tree", treerl=True)


def test_treerl_credit_by_hand() -> None:
    # V(a) = (1 + 0) / 2 = 0.5, V(b) = 1. Leave-one-out roots: l1: (0 + 1 + 1) / 3 = 2/3, l2: 3/3 = 1,
    # l3 and l4: (1 + 0 + 1) / 3 = 2/3. c = (G + L) / sqrt(|L|), G = V - V(root), L = V - V(parent):
    # segment 1 (parent = root, shared by 2 leaves):
    #   l1: (0.5 - 2/3) * 2 / sqrt 2 = -1/(3 sqrt 2);  l2: (0.5 - 1) * 2 / sqrt 2 = -1/sqrt 2;
    #   l3, l4: (1 - 2/3) * 2 / sqrt 2 = 2/(3 sqrt 2)
    # segment 2 (the leaf's own, |L| = 1, V = R):
    #   l1: (1 - 2/3) + (1 - 0.5) = 5/6;  l2: (0 - 1) + (0 - 0.5) = -3/2;  l3, l4: (1 - 2/3) + (1 - 1) = 1/3
    r2 = math.sqrt(2)
    want = [[-1 / (3 * r2), 5 / 6], [-1 / r2, -1.5], [2 / (3 * r2), 1 / 3], [2 / (3 * r2), 1 / 3]]
    got = tree_credits(GROUP, NODES, ENDS, SCORE, [True] * 4, ON)
    assert got is not None
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w)
    # off: None (the credit form runs on the node values instead)
    assert tree_credits(GROUP, NODES, ENDS, SCORE, [True] * 4, ProcessConfig()) is None


def test_treerl_invalid_leaves_count_nowhere() -> None:
    # l2's reward failed: V(a) = 1 (l1 alone), |L(a)| = 1; roots: l1: (1 + 1) / 2 = 1, l3, l4: (1 + 1) / 2 = 1.
    # l1: segment 1 (1 - 1) * 2 / 1 = 0, segment 2 (1 - 1) + (1 - 1) = 0; l2 gets 0; l3, l4: all 0.
    got = tree_credits(GROUP, NODES, ENDS, SCORE, [True, False, True, True], ON)
    assert got == [[0.0, 0.0]] * 4
    # a row without episodes (not a process domain) gets none
    got = tree_credits(GROUP, NODES, [[3, 7], [], [2, 6], [2, 9]], SCORE, [True] * 4, ON)
    assert got is not None and got[1] == []


def test_treerl_credit_enters_the_process_channel() -> None:
    got = tree_credits(GROUP, NODES, ENDS, SCORE, [True] * 4, ON)
    assert got is not None
    mask_BT = torch.ones(4, 10, dtype=torch.bool)
    values = [[0.5, 0.5, 1.0]] * 4  # ignored when credits are given
    process_BT, steps_BT = process_channel(ENDS, values, mask_BT, ON, credits=got)
    assert process_BT[1, 3].item() == pytest.approx(-1 / math.sqrt(2)) and process_BT[1, 8].item() == -1.5
    assert steps_BT.sum().item() == 8
    # the step cost is charged on them as on any credit (token form: -c each)
    cost = ProcessConfig(enabled=True, value_estimator="tree", treerl=True, step_cost=0.25)
    charged, _ = process_channel(ENDS, values, mask_BT, cost, credits=got)
    assert charged[1, 8].item() == -1.75


def test_treerl_needs_tree_values() -> None:
    from dataclasses import replace

    tree = RolloutConfig(mode="tree", tree=TreeConfig())
    check_config(replace(Config(), process=ON, rollout=tree))
    bad = ProcessConfig(enabled=True, value_estimator="monte_carlo", treerl=True)
    with pytest.raises(ConfigError, match=r"process\.treerl"):
        check_config(replace(Config(), process=bad))
