"""V(prefix) from a tree rollout's own outcomes: free Monte Carlo values.

In a tree rollout (``rollout.mode=tree``, :mod:`stepcredit.rollout.tree`) the leaves below a node are
samples of the policy continuing from the node's prefix, so

    V(node) = (1 / |L(node)|) * sum_{l in L(node)} R(l)          L(node): the scored leaves below it

is an unbiased Monte Carlo estimate of the policy's V(prefix) (SPO-tree's segment value, Guo et al.
2025, arXiv:2505.23564, eq. 7; TreeRL's V(s_n), Hou et al. 2025, arXiv:2506.11902, eq. 2). A leaf's values
along its path are V(root) = the group's mean outcome, the values of the nodes it branched off at, and
its own outcome R last, so with ``process.credit=difference`` the step credit of a segment is
V(child) - V(parent) and the utilities telescope to R - mean(group): the VinePPO-style advantages
(``vineppo``, ``grpo_vineppo``) and ``grpo_process`` take them unchanged (``terminal_is_reward``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch

from stepcredit.config import ProcessConfig, RolloutConfig
from stepcredit.process.continuation import continuation_estimator, monte_carlo
from stepcredit.process.segment import segment_episodes
from stepcredit.process.values import PrefixRequest, ScoreFn, ValueContext


def tree_values(
    group_B: Sequence[int],
    nodes: Sequence[Sequence[int]],
    score_B: Sequence[float],
    valid_B: Sequence[bool],
) -> list[list[float]]:
    """[V(root), V(n_1), ..., V(n_k), R] per response from the outcomes of the leaves below each node.

    ``nodes[b]``: response b's node ids (unique within its group ``group_B[b]``), root first. Only valid
    responses (a finite, computed outcome) count in a node's mean; a node with none below it takes its
    parent's value, a root with none 0 (its responses are all masked, so no credit is read). The last
    value is the response's own outcome (its parent's value when the response is not valid)."""
    sums: dict[tuple[int, int], float] = {}
    counts: dict[tuple[int, int], int] = {}
    for g, ns, score, ok in zip(group_B, nodes, score_B, valid_B, strict=True):
        if not ok or not math.isfinite(score):
            continue
        for n in ns:
            sums[(g, n)] = sums.get((g, n), 0.0) + float(score)
            counts[(g, n)] = counts.get((g, n), 0) + 1
    out = []
    for g, ns, score, ok in zip(group_B, nodes, score_B, valid_B, strict=True):
        values: list[float] = []
        for n in ns:
            c = counts.get((g, n), 0)
            values.append(sums[(g, n)] / c if c else (values[-1] if values else 0.0))
        values.append(float(score) if ok and math.isfinite(score) else values[-1])
        out.append(values)
    return out


def outcome_values(
    group_B: Sequence[int],
    tree_nodes: Sequence[Sequence[int]],
    episode_ends: Sequence[Sequence[int]],
    score_B: Sequence[float],
    valid_B: Sequence[bool],
) -> list[list[float]]:
    """:func:`tree_values` for the responses that have episodes (a process domain's), ``[]`` for the rest."""
    values = tree_values(group_B, tree_nodes, score_B, valid_B)
    return [v if ends else [] for v, ends in zip(values, episode_ends, strict=True)]


def tree_credits(
    group_B: Sequence[int],
    tree_nodes: Sequence[Sequence[int]],
    episode_ends: Sequence[Sequence[int]],
    score_B: Sequence[float],
    valid_B: Sequence[bool],
    cfg: ProcessConfig,
) -> list[list[float]] | None:
    """TreeRL's segment credit per response (``process.treerl``), or None (the credit form's, from
    :func:`outcome_values`). Hou et al. 2025, arXiv:2506.11902, eq. 3-5, with the leaves as the rows:

        G(s_n) = V(s_n) - V(root)            global advantage
        L(s_n) = V(s_n) - V(parent(s_n))     local advantage
        c(s_n) = (G(s_n) + L(s_n)) / sqrt(|L(s_n)|)

    for the segment that ends at node s_n (the last one ends at the leaf, V(leaf) = its outcome and
    |L| = 1). A shared segment sits in the row of every leaf below it, so the 1/sqrt weight keeps it
    from counting |L| times. V(node) is the mean outcome of the valid leaves below it; V(root) is
    leave-one-out in each leaf's row (the mean of the group's other valid leaves, the RLOO baseline of
    Ahmadian et al. 2024, so a leaf's own outcome never sits in its baseline; a group with one valid leaf
    keeps the plain mean). Invalid leaves count nowhere and get 0."""
    if not cfg.treerl:
        return None
    values = tree_values(group_B, tree_nodes, score_B, valid_B)
    ok_B = [bool(ok) and math.isfinite(float(s)) for s, ok in zip(score_B, valid_B, strict=True)]
    leaves: dict[tuple[int, int], int] = {}
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    for g, ns, s, ok in zip(group_B, tree_nodes, score_B, ok_B, strict=True):
        if ok:
            for n in ns:
                leaves[(g, n)] = leaves.get((g, n), 0) + 1
            total[g] = total.get(g, 0.0) + float(s)
            count[g] = count.get(g, 0) + 1
    out: list[list[float]] = []
    for g, ns, ends, v, s, ok in zip(group_B, tree_nodes, episode_ends, values, score_B, ok_B, strict=True):
        if not ends or not ok:
            out.append([0.0] * len(ends))
            continue
        root = (total[g] - float(s)) / (count[g] - 1) if count[g] > 1 else v[0]
        shared = [leaves[(g, n)] for n in ns[1:]] + [1]  # leaves below the end node of each segment
        row, parent = [], root
        for i, k in enumerate(shared, start=1):
            row.append(((v[i] - root) + (v[i] - parent)) / math.sqrt(k))
            parent = v[i]
        out.append(row)
    return out


@continuation_estimator("tree", from_outcomes=True)
def tree(ctx: ValueContext) -> list[list[float]]:
    """In training: the tree rollout's node values (:func:`tree_values`, no generation). On fixed traces
    (probe, explain), where no tree was grown, the same estimate as a tree rooted at each prefix with
    ``process.mc_samples`` leaves below it: the mean outcome of that many sampled continuations, which
    is ``monte_carlo``'s value (without tools: a tree is grown without them)."""
    return monte_carlo(ctx)


# ------------------------------------------------------------------ tree values of given traces (probe)
def trunk_values(
    path: Sequence[tuple[int, int]],
    node_values: Sequence[float],
    prefix_lens: Sequence[int],
    *,
    reward_at: int | None,
) -> list[float]:
    """V at each of a trace's prefix lengths from the tree grown over it (the trace is a leaf of it).

    ``path``: the trace's (node id, branch point = prefix length) from the root (point 0) down;
    ``node_values``: V of those nodes then the trace's own outcome R (:func:`tree_values`' row). A prefix
    of length L takes the value of the deepest node on the path with point <= L, the most the tree knows
    about it; so the change V(child) - V(parent) falls on the episode that holds the child's branch point
    (the token before it, where a tree rollout's own credit sits). ``reward_at``: from this prefix index
    on the value is R (the whole response of a trace that ended by itself), None for none."""
    out = []
    for i, n in enumerate(prefix_lens):
        if reward_at is not None and i >= reward_at:
            out.append(float(node_values[-1]))
            continue
        deepest = max(j for j, (_, point) in enumerate(path) if point <= n)
        out.append(float(node_values[deepest]))
    return out


def token_entropies(
    model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int], temperature: float
) -> list[float]:
    """Entropy (nats) of the policy's next-token distribution at each response token, after
    ``temperature``: what the sampler records for a token it draws (``rollout.sampling``), here for a
    token that was given."""
    dev = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=dev)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / max(temperature, 1e-6), dim=-1)
    return (-(logp.exp() * logp).sum(-1)).tolist()


def grown_tree_values(
    model: Any,
    tokenizer: Any,
    requests: Sequence[PrefixRequest],
    cfg: ProcessConfig,
    rollout: RolloutConfig,
    score_fn: ScoreFn,
) -> list[list[float]]:
    """[V_0, ..., V_S] of each request's trace as a tree rollout values it: a tree of ``rollout``'s shape
    (``rollout.branching()``, ``rollout.tree.branch_at`` (``entropy`` too), its quantile, temperature and
    length limit) is grown over each trace, the trace being its first leaf (it branches where the rule
    says, from its own prefix and entropies), the leaves are scored in one verifier call, and
    :func:`tree_values` gives the nodes on the trace's path their mean leaf outcome, mapped onto the trace's
    episodes by :func:`trunk_values`. The probe's ``--grow-trees``: the values a ``tree`` run would give the
    trace, rather than Monte Carlo continuations at every episode end."""
    from stepcredit.rollout.tree import BRANCH_RULES, Leaf, TreeSpec, grow_trees

    if not requests:
        return []
    needs_entropy = BRANCH_RULES.get(rollout.tree.branch_at).needs_entropy
    trunks = [
        Leaf(
            i,
            list(r.response_ids),
            token_entropies(model, r.prompt_ids, r.response_ids, rollout.temperature)
            if needs_entropy
            else [],
            [(0, 0)],
            observed=list(r.observed),  # a trace's results: its turns are where the tree branches
        )
        for i, r in enumerate(requests)
    ]
    trees = grow_trees(
        model,
        tokenizer,
        [list(r.prompt_ids) for r in requests],
        TreeSpec.of(rollout),
        boundaries=functools.partial(segment_episodes, tokenizer=tokenizer, cfg=cfg),
        trunks=trunks,
    )
    leaves = [(g, leaf) for g, tree in enumerate(trees) for leaf in tree]
    texts = [tokenizer.decode(leaf.ids, skip_special_tokens=True) for _, leaf in leaves]
    scores = [float(x) for x in score_fn([requests[g].sample for g, _ in leaves], texts)]
    if len(scores) != len(texts):
        raise ValueError(f"the verifier returned {len(scores)} scores for {len(texts)} texts")
    values = tree_values(
        [g for g, _ in leaves],
        [[node for node, _ in leaf.path] for _, leaf in leaves],
        scores,
        [math.isfinite(x) for x in scores],
    )
    first = {id(leaf): b for b, (_, leaf) in enumerate(leaves)}
    out = []
    for r, trunk in zip(requests, trunks, strict=True):
        whole = r.complete and r.prefix_lens[-1] >= len(r.response_ids) - 1
        row = values[first[id(trunk)]]
        if not math.isfinite(scores[first[id(trunk)]]):
            out.append([math.nan] * len(r.prefix_lens))  # the trace itself could not be scored
            continue
        out.append(
            trunk_values(trunk.path, row, r.prefix_lens, reward_at=len(r.prefix_lens) - 1 if whole else None)
        )
    return out
