"""Tree rollouts: shape, shared prefixes, every leaf once, node values = leaf means, and a tree with one
branch per node is a flat group."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from stepcredit.config import ProcessConfig, RolloutConfig, TreeConfig
from stepcredit.models import token_logprobs
from stepcredit.process import segment_episodes, tree_values
from stepcredit.rollout import ROLLOUT_MODES, RolloutRequest, generate
from stepcredit.rollout.tree import BRANCH_RULES, BranchContext, Leaf, leaf_segments


@pytest.fixture
def rollout(policy, samples):
    """``rollout(cfg)``: the policy's rollout of 3 arithmetic prompts (groups 5, 6, 7) in ``cfg.mode``
    (the policy and samples fixtures: tests/rollout/conftest.py)."""
    model, tok = policy
    seg = functools.partial(segment_episodes, tokenizer=tok, cfg=ProcessConfig(min_episode_tokens=1))

    def run(cfg: RolloutConfig, *, with_logprobs: bool = True):
        request = RolloutRequest(samples(3), cfg, seg, group_offset=5, with_logprobs=with_logprobs)
        return ROLLOUT_MODES.get(cfg.mode).fn(model, tok, request)

    return run


@pytest.mark.parametrize("branch_at", ["episode", "entropy"])
def test_a_tree_is_a_group_of_n_complete_leaves_that_share_their_prefixes(
    policy, rollout, branch_at: str
) -> None:
    model, tok = policy
    cfg = RolloutConfig(n=8, max_new_tokens=24, mode="tree", tree=TreeConfig(branch_at=branch_at))
    torch.manual_seed(0)
    b, stats = rollout(cfg)
    assert cfg.branching() == (2, 2, 2)
    assert len(b) == 24 and b.group_B.tolist() == [5] * 8 + [6] * 8 + [7] * 8
    assert b.tree_ends is not None and b.tree_nodes is not None
    lens = b.response_mask_BT.sum(1).tolist()
    branched = 0
    for i in range(len(b)):
        ids = b.response_ids_BT[i, : lens[i]].tolist()
        # every leaf is a complete response: it ends at its first eos, or is flagged truncated
        assert (ids[-1] == tok.eos_token_id) != bool(b.truncated_B[i]) and tok.eos_token_id not in ids[:-1]
        ends, nodes = b.tree_ends[i], b.tree_nodes[i]
        assert len(ends) == len(nodes) and nodes[0] == 0 and ends[-1] == lens[i] - 1
        assert ends == sorted(set(ends))
        branched += len(ends) - 1
        # every leaf that passed through a node shares the node's prefix token for token
        for j in range(len(b)):
            if b.group_B[j] != b.group_B[i] or j == i:
                continue
            for e, node in zip(ends[:-1], nodes[1:], strict=True):
                if node in b.tree_nodes[j]:
                    assert b.response_ids_BT[j, : e + 1].tolist() == ids[: e + 1]
    assert branched > 0
    # a leaf generates only its tail: fewer tokens generated than the leaves hold
    assert stats["rollout/responses"] == 24 and stats["tree/depth"] == 3 * 24
    assert stats["rollout/generated_tokens"] < stats["rollout/response_tokens"] == sum(lens)
    # behaviour log-probs equal a fresh forward pass over each leaf (the batch is an ordinary batch)
    ids = torch.cat([b.prompt_ids_BP, b.response_ids_BT], 1)
    attn = torch.cat([b.prompt_mask_BP, b.response_mask_BT], 1).long()
    lp, _ = token_logprobs(model, ids, attn, n_response=b.response_ids_BT.shape[1])
    assert torch.allclose(lp[b.response_mask_BT], b.behaviour_logp_BT[b.response_mask_BT], atol=1e-5)


@pytest.mark.parametrize("branching", [(4,), (4, 1, 1)])
def test_a_tree_with_one_branch_per_node_is_a_flat_group(rollout, branching: tuple[int, ...]) -> None:
    cfg = RolloutConfig(n=4, max_new_tokens=16, mode="tree", tree=TreeConfig(branching=branching))
    torch.manual_seed(3)
    tree, _ = rollout(cfg)
    torch.manual_seed(3)
    flat, _ = rollout(replace(cfg, mode="flat"))
    assert tree.texts == flat.texts
    assert torch.equal(tree.response_ids_BT, flat.response_ids_BT)
    assert torch.allclose(tree.behaviour_logp_BT, flat.behaviour_logp_BT)
    assert all(len(n) == 1 for n in tree.tree_nodes)  # one segment: V_0 is the group's mean outcome


def test_node_values_are_the_means_of_the_leaves_below() -> None:
    """A hand-built tree (one group): root 0 -> nodes 1, 2; node 1 -> leaves a, b, c; node 2 -> leaves d
    and (via node 3) e, f. Outcomes a..f = 1, 0, 1, 0, 1, 1.
        V(0) = (1+0+1+0+1+1)/6 = 2/3;  V(1) = (1+0+1)/3 = 2/3;  V(2) = (0+1+1)/3 = 2/3;  V(3) = (1+1)/2 = 1
    and each leaf ends at its own outcome."""
    nodes = [[0, 1], [0, 1], [0, 1], [0, 2], [0, 2, 3], [0, 2, 3]]
    score = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    v = tree_values([7] * 6, nodes, score, [True] * 6)
    assert v[0] == pytest.approx([2 / 3, 2 / 3, 1.0]) and v[1] == pytest.approx([2 / 3, 2 / 3, 0.0])
    assert v[3] == pytest.approx([2 / 3, 2 / 3, 0.0]) and v[4] == pytest.approx([2 / 3, 2 / 3, 1.0, 1.0])
    # a failed reward (not valid) leaves the means; node 3 then has one leaf: V(3) = 1, V(2) = (0+1)/2
    v = tree_values([7] * 6, nodes, score, [True] * 5 + [False])
    assert v[4] == pytest.approx([3 / 5, 1 / 2, 1.0, 1.0]) and v[5] == pytest.approx([3 / 5, 1 / 2, 1.0, 1.0])
    # node ids are per group: the same ids in another group are other nodes
    v = tree_values([1, 1, 2, 2], [[0, 1], [0, 1], [0, 1], [0, 1]], [1.0, 1.0, 0.0, 0.0], [True] * 4)
    assert v == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_tree_values_of_a_real_tree_equal_brute_force_leaf_means(rollout) -> None:
    """With a deterministic verifier (reward 1 for an even number of tokens), every node's value equals
    the mean reward of the leaves whose responses start with the node's prefix and pass through it."""
    cfg = RolloutConfig(n=8, max_new_tokens=24, mode="tree", tree=TreeConfig(branching=(2, 4)))
    torch.manual_seed(1)
    b, _ = rollout(cfg, with_logprobs=False)
    lens = b.response_mask_BT.sum(1).tolist()
    score = [float(n % 2 == 0) for n in lens]
    values = tree_values(b.group_B.tolist(), b.tree_nodes, score, [True] * len(b))
    for i in range(len(b)):
        for k, node in enumerate(b.tree_nodes[i]):
            below = [j for j in range(len(b)) if b.group_B[j] == b.group_B[i] and node in b.tree_nodes[j]]
            assert values[i][k] == pytest.approx(sum(score[j] for j in below) / len(below))
        assert values[i][-1] == score[i]


def _ctx(mean_ends: float, seed: int) -> BranchContext:
    ends = lambda ids: [i for i, x in enumerate(ids) if x == 0]  # noqa: E731  (token 0 ends an episode)
    return BranchContext(ends, mean_ends, 2.0, torch.Generator().manual_seed(seed))


def test_branch_rules_decide_from_the_prefix_only() -> None:
    """Two leaves with the same prefix and different futures branch at the same point whenever the
    point lies in the shared prefix: the choice cannot favour one kind of continuation."""
    prefix = [5, 0, 5, 5, 0, 5, 0, 5]  # episode ends at 1, 4, 6: points 2, 5, 7
    short, long = [*prefix, 9], [*prefix, 5, 0, 5, 5, 0, 5, 0, 9]
    rule = BRANCH_RULES.get("episode")
    for seed in range(30):
        a = rule.fn(Leaf(0, short, [], [(0, 0)]), _ctx(6.0, seed))
        b = rule.fn(Leaf(0, long, [], [(0, 0)]), _ctx(6.0, seed))
        assert a in (0, 2, 5, 7)  # a point of the prefix, or none (k beyond its ends: the last point)
        if a != 0:
            assert a == b
        else:
            assert b > len(prefix)  # the long one found its k-th end in its own future
    # after the last branch point only; entropy: before the first token at the threshold
    assert rule.fn(Leaf(0, long, [], [(0, 0), (1, 5)]), _ctx(1.0, 0)) == 7
    ent = [0.1] * len(long)
    ent[3], ent[10] = 2.5, 3.0
    entropy = BRANCH_RULES.get("entropy")
    assert entropy.needs_entropy and not rule.needs_entropy
    assert entropy.fn(Leaf(0, long, ent, [(0, 0)]), _ctx(1.0, 0)) == 3
    assert entropy.fn(Leaf(0, long, ent, [(0, 0), (1, 3)]), _ctx(1.0, 0)) == 10
    assert entropy.fn(Leaf(0, long, ent, [(0, 0), (1, 10)]), _ctx(1.0, 0)) == 10  # none after: the last


def test_leaf_segments_count_a_repeated_point_once() -> None:
    leaf = Leaf(0, list(range(10)), [], [(0, 0), (1, 3), (4, 3), (5, 6)])
    assert leaf_segments(leaf) == ([2, 5, 9], [0, 1, 5])  # the shallowest node at a point; own end last


def test_tree_log_probs_carry_no_graph(rollout) -> None:
    b, _ = rollout(RolloutConfig(n=4, max_new_tokens=8, mode="tree"))
    assert b.behaviour_logp_BT is not None and not b.behaviour_logp_BT.requires_grad


def test_generate_and_the_flat_mode_agree(policy, rollout, samples) -> None:
    model, tok = policy
    torch.manual_seed(2)
    a = generate(model, tok, samples(3), n=2, max_new_tokens=12, group_offset=5)
    torch.manual_seed(2)
    b, stats = rollout(RolloutConfig(n=2, max_new_tokens=12))
    assert a.texts == b.texts and b.tree_nodes is None
    assert (
        stats["rollout/generated_tokens"]
        == stats["rollout/response_tokens"]
        == float(a.response_mask_BT.sum())
    )
