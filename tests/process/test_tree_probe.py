"""Tree values of given traces (the probe's ``--grow-trees``): a tree grown over each trace, the trace
one of its leaves, branching by the rollout's rule (``entropy`` too), valued as a tree run values it."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from stepcredit.config import ProcessConfig, RolloutConfig, TreeConfig
from stepcredit.process import build_requests, segment_episodes, tree_values
from stepcredit.process.tree import grown_tree_values, token_entropies, trunk_values
from stepcredit.rollout.tree import Leaf, TreeSpec, grow_trees

ROWS = [
    ("What is 3 + 4?", "First, add 3 and 4. So we get 7. Therefore the answer is 7.", "7"),
    ("What is 10 - 7?", "Let me subtract. 10 - 7 = 3. Finally, the answer: 3", "3"),
]


def test_trunk_values_by_hand() -> None:
    # The trace's path: root (point 0), node 5 branched at prefix length 4, node 9 at 11. Its row of
    # tree_values: V(root) = 0.5, V(5) = 0.25, V(9) = 0.0, then its own outcome R = 0.
    path = [(0, 0), (5, 4), (9, 11)]
    row = [0.5, 0.25, 0.0, 0.0]
    # prefixes 0, 3, 8, 12, 15: 0 and 3 see only the root; 8 the node at 4; 12 and 15 the node at 11.
    # The drops land on the episodes (3, 8] (holds token 3, the last before the branch point 4) and (8, 12]
    assert trunk_values(path, row, [0, 3, 8, 12, 15], reward_at=None) == [0.5, 0.5, 0.25, 0.0, 0.0]
    # a trace that ended by itself: its whole response is valued by its outcome
    assert trunk_values(path, [0.5, 0.75, 1.0, 1.0], [0, 3, 8, 12, 15], reward_at=4)[-1] == 1.0
    # a branch point exactly at a prefix end values that prefix (the node's prefix is that prefix)
    assert trunk_values(path, row, [0, 4, 11], reward_at=None) == [0.5, 0.25, 0.0]


@pytest.fixture
def model_tok(model_factory: Any) -> tuple[Any, Any]:
    return model_factory("llama", "sdpa", seed=1)


def test_token_entropies_equal_the_samplers(model_tok: Any, batch_factory: Any) -> None:
    # the entropy a trunk's token gets from a forward pass equals what the sampler records when it
    # draws that token (the entropy rule must see the same numbers on a given trace as on a sampled one)
    model, tok = model_tok
    batch = batch_factory(tok, ROWS)
    prompt = batch.prompt_ids_BP[0][batch.prompt_mask_BP[0]].tolist()
    torch.manual_seed(0)
    spec = TreeSpec(branching=(1,), max_new_tokens=12, temperature=0.7, top_p=1.0, branch_at="entropy")
    (leaf,) = grow_trees(model, tok, [prompt], spec, boundaries=lambda ids: [len(ids) - 1])[0]
    got = token_entropies(model, prompt, leaf.ids, 0.7)
    assert len(got) == len(leaf.ids) and got == pytest.approx(leaf.entropy[: len(leaf.ids)], abs=1e-4)


def test_a_tree_grown_over_a_trunk_branches_by_the_entropy_rule(model_tok: Any, batch_factory: Any) -> None:
    model, tok = model_tok
    batch = batch_factory(tok, ROWS)
    cfg = ProcessConfig(enabled=True, value_estimator="tree")
    prompts = [batch.prompt_ids_BP[b][batch.prompt_mask_BP[b]].tolist() for b in range(2)]
    responses = [batch.response_ids_BT[b][batch.response_mask_BT[b]].tolist() for b in range(2)]
    trunks = [
        Leaf(b, list(r), token_entropies(model, p, r, 1.0), [(0, 0)])
        for b, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]
    entropies = [list(t.entropy) for t in trunks]
    torch.manual_seed(0)
    spec = TreeSpec(
        branching=(2, 2, 2), max_new_tokens=16, temperature=1.0, top_p=1.0, branch_at="entropy",
        entropy_quantile=0.8,
    )  # fmt: skip
    trees = grow_trees(
        model, tok, prompts, spec, boundaries=functools.partial(segment_episodes, tokenizer=tok, cfg=cfg),
        trunks=trunks,
    )  # fmt: skip
    for b, tree in enumerate(trees):
        assert len(tree) == 8 and tree[0] is trunks[b] and tree[0].ids == responses[b]  # the trunk stays
        # the first level: the trunk and one sampled sibling; the threshold is the 0.8 quantile of
        # their token entropies (all first-level leaves of the batch, as in training)
    level1 = [x for t in trees for x in (t[0].entropy, t[1].entropy[: len(t[1].ids)])]
    every = sorted(x for e in level1 for x in e)
    threshold = every[min(len(every) - 1, int(0.8 * len(every)))]
    for b, tree in enumerate(trees):
        trunk = tree[0]
        points = [point for _, point in trunk.path]
        last = 0
        for point in points[1:]:
            # before the first token after the last branch point whose entropy reaches the threshold
            # (or at the last point again when none does)
            later = [t for t in range(last + 1, len(trunk.ids)) if entropies[b][t] >= threshold - 1e-6]
            assert point == (later[0] if later else last)
            last = point
        # every other leaf that branched off the trunk shares its prefix up to the branch point
        for leaf in tree[1:]:
            shared = [(n, p) for n, p in leaf.path if (n, p) in trunk.path]
            assert leaf.ids[: shared[-1][1]] == trunk.ids[: shared[-1][1]]


def test_grown_tree_values_are_the_trees_node_values(model_tok: Any, batch_factory: Any) -> None:
    # The trunk's V_0 is its tree's mean leaf outcome (every leaf, the trace's own included), its last
    # value its own outcome; with one leaf per tree (rollout.n = 1) every value is the trace's outcome.
    model, tok = model_tok
    batch = batch_factory(tok, ROWS)
    cfg = ProcessConfig(enabled=True, value_estimator="tree")
    prompts = [batch.prompt_ids_BP[b][batch.prompt_mask_BP[b]].tolist() for b in range(2)]
    responses = [batch.response_ids_BT[b][batch.response_mask_BT[b]].tolist() for b in range(2)]
    _, requests = build_requests(batch.samples, prompts, responses, tok, cfg)
    seen: list[tuple[str, str, float]] = []

    def score(samples: Any, texts: Any) -> list[float]:
        out = [float(len(t) % 3 == 0) for t in texts]  # deterministic, varied
        seen.extend((s.uid, t, x) for s, t, x in zip(samples, texts, out, strict=True))
        return out

    rollout = RolloutConfig(
        n=8, max_new_tokens=16, tree=TreeConfig(branch_at="entropy", entropy_quantile=0.8)
    )
    torch.manual_seed(0)
    values = grown_tree_values(model, tok, requests, cfg, rollout, score)
    assert len(seen) == 16  # one verifier call, 8 leaves per trace's tree
    for b, (r, v) in enumerate(zip(requests, values, strict=True)):
        leaves = [x for uid, _, x in seen if uid == batch.samples[b].uid]
        own = float(len(ROWS[b][1]) % 3 == 0)
        assert len(v) == len(r.prefix_lens) and v[0] == pytest.approx(sum(leaves) / 8)
        assert v[-1] == own  # the trace ended by itself: its whole response is worth its outcome
        assert all(0.0 <= x <= 1.0 for x in v)
    one = grown_tree_values(model, tok, requests, cfg, RolloutConfig(n=1, max_new_tokens=16), score)
    for b, v in enumerate(one):
        assert set(v) == {float(len(ROWS[b][1]) % 3 == 0)}
    # a trace the verifier cannot score has no values (NaN), as for the other estimators
    nan = grown_tree_values(model, tok, requests[:1], cfg, rollout, lambda s, t: [math.nan] * len(t))
    assert all(math.isnan(x) for x in nan[0])
    # tree_values itself: the same function a tree run's values come from (hand check of one node)
    assert tree_values([0, 0], [[0], [0]], [1.0, 0.0], [True, True]) == [[0.5, 1.0], [0.5, 0.0]]


def test_probe_scores_entropy_branched_tree_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stepcredit.cli.main import main

    argv = ["probe", "--model", "tiny", "--data", "arith", "--n", "2", "--json", "--grow-trees"]
    argv += ["--estimators", "tree,greedy_continuation", "trainer.threads=1", "process.mc_max_new_tokens=6"]
    argv += ["rollout.n=4", "rollout.tree.branch_at=entropy", "rollout.max_new_tokens=12"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tree = summary["estimators"]["tree"]
    assert summary["n"] == 2 and tree["n_scored"] == 2 and tree["s_per_trace"] > 0
    assert 0.0 <= tree["argmin"] <= 1.0 and "blame" in tree["credits"]  # tree values are chances
    # a tree grown over the trace counts the trace's own outcome in V_0: it never judges solvability
    assert summary["solvable_by"] == "greedy_continuation"
