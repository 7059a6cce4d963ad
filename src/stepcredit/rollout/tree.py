"""Tree rollouts: a prompt's group is a tree whose leaves are complete responses.

Segment-level tree sampling (SPO-tree: Guo et al. 2025, "Segment Policy Optimization", arXiv:2505.23564,
sec. 4; TreeRL: Hou et al. 2025, arXiv:2506.11902, sec. 3.1): responses branch at step boundaries, so
siblings share their prefix, and the mean verified outcome of the leaves below a node is an unbiased
Monte Carlo estimate of the policy's own V(prefix) (each leaf below the node is a sample of the policy
continuing from that prefix), with no generation beyond the group itself.

Construction with branching factors (b_1, ..., b_d), prod b_l = n leaves:

    depth 1: b_1 responses are sampled from the bare prompt (the root's children);
    depth l > 1: every response so far picks a branch point after the one it was created at, and
             b_l - 1 new responses continue from its prefix there (it is itself the b_l-th child).

A leaf created at depth l generates only its tail, so a tree costs fewer generated tokens than n
independent responses. Where a response branches: ``episode`` (an episode end drawn uniformly after
the parent's branch point, SPO's segment boundaries) or ``entropy`` (the token with the highest
next-token entropy after it, TreeRL's EPTree). A response with no admissible branch point branches at
the parent's point (its new siblings are further samples from the same prefix), so the leaf count never
changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from stepcredit.config import RolloutConfig
from stepcredit.rollout.sampling import decode
from stepcredit.types import Batch, Sample

Boundaries = Callable[[list[int]], list[int]]
"""Episode ends (token indices of each episode's last token) of a response's token ids."""


@dataclass
class Leaf:
    """One response of a tree under construction."""

    prompt: int
    """Index of the prompt (the tree) it answers."""
    ids: list[int]
    """Response tokens (eos included when it stopped)."""
    entropy: list[float]
    """Entropy of the distribution each token was drawn from (``entropy`` branching only)."""
    path: list[tuple[int, int]] = field(default_factory=list)
    """(node id, branch point = prefix length) from the root (node 0, point 0) down."""
    generated: int = 0
    """Tokens generated for this leaf: its tail after the point it branched off at."""


def choose_branch_point(
    leaf: Leaf,
    *,
    branch_at: str,
    boundaries: Boundaries,
    min_tail_tokens: int,
    generator: torch.Generator | None = None,
) -> int:
    """The prefix length at which ``leaf`` branches: after its last branch point, leaving at least
    ``min_tail_tokens`` of its tokens to re-sample; its last branch point when none qualifies."""
    last = leaf.path[-1][1]
    hi = len(leaf.ids) - min_tail_tokens
    if branch_at == "episode":
        points = [e + 1 for e in boundaries(leaf.ids) if last < e + 1 <= hi]
        if not points:
            return last
        return points[int(torch.randint(len(points), (1,), generator=generator))]
    if hi <= last:
        return last
    # branch before the least certain token: the continuations re-draw it (EPTree)
    window = leaf.entropy[last + 1 : hi + 1]
    return last + 1 + max(range(len(window)), key=window.__getitem__)


def leaf_segments(leaf: Leaf) -> tuple[list[int], list[int]]:
    """(ends, nodes): the last token before each distinct branch point on the leaf's path, then its
    own last token; the node ids whose values are V_0 (root), V_1, ... at those ends. Of several nodes
    at the same prefix length (a branch that found no later point) the shallowest, which has the most
    leaves below it, stands for the prefix."""
    ends: list[int] = []
    nodes = [leaf.path[0][0]]
    prev = 0
    for node, point in leaf.path[1:]:
        if prev < point < len(leaf.ids):
            ends.append(point - 1)
            nodes.append(node)
            prev = point
    ends.append(len(leaf.ids) - 1)
    return ends, nodes


def _sample(
    model: Any,
    tok: Any,
    contexts: list[list[int]],
    budgets: list[int],
    *,
    temperature: float,
    top_p: float,
    want_entropy: bool,
) -> list[tuple[list[int], list[float]]]:
    """One sampled continuation per context, each cut at its first eos and at its own token budget."""
    from stepcredit.rollout import left_pad

    dev = next(model.parameters()).device
    ids, mask = left_pad(contexts, tok.pad_token_id)
    width = max(budgets)
    ent = torch.zeros(len(contexts), width) if want_entropy else None
    resp = decode(
        model,
        ids.to(dev),
        mask.to(dev),
        max_new_tokens=width,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        temperature=temperature,
        top_p=top_p,
        entropy_BT=ent.to(dev) if ent is not None else None,
    ).cpu()
    out = []
    for r, budget in enumerate(budgets):
        row = resp[r, :budget].tolist()
        if tok.eos_token_id in row:
            row = row[: row.index(tok.eos_token_id) + 1]
        out.append((row, ent[r, : len(row)].tolist() if ent is not None else []))
    return out


@torch.no_grad()
def grow_trees(
    model: Any,
    tok: Any,
    prompt_ids: list[list[int]],
    *,
    branching: tuple[int, ...],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    branch_at: str,
    boundaries: Boundaries,
    min_tail_tokens: int,
) -> list[list[Leaf]]:
    """The leaves of one tree per prompt (prod(branching) each, in creation order)."""
    want_entropy = branch_at == "entropy"
    first = _sample(
        model,
        tok,
        [p for p in prompt_ids for _ in range(branching[0])],
        [max_new_tokens] * (len(prompt_ids) * branching[0]),
        temperature=temperature,
        top_p=top_p,
        want_entropy=want_entropy,
    )
    trees: list[list[Leaf]] = [[] for _ in prompt_ids]
    next_node = [1] * len(prompt_ids)  # node 0 is each tree's root
    for j, (ids, ent) in enumerate(first):
        p = j // branching[0]
        trees[p].append(Leaf(p, ids, ent, [(0, 0)], len(ids)))
    for b in branching[1:]:
        if b == 1:  # one child per node: nothing branches, no node to value
            continue
        jobs: list[tuple[Leaf, int]] = []
        for leaves in trees:
            for leaf in list(leaves):
                point = choose_branch_point(
                    leaf, branch_at=branch_at, boundaries=boundaries, min_tail_tokens=min_tail_tokens
                )
                node = next_node[leaf.prompt]
                next_node[leaf.prompt] += 1
                leaf.path.append((node, point))
                jobs.extend((leaf, point) for _ in range(b - 1))
        conts = _sample(
            model,
            tok,
            [prompt_ids[leaf.prompt] + leaf.ids[:point] for leaf, point in jobs],
            [max(1, max_new_tokens - point) for _, point in jobs],
            temperature=temperature,
            top_p=top_p,
            want_entropy=want_entropy,
        )
        for (parent, point), (ids, ent) in zip(jobs, conts, strict=True):
            child = Leaf(
                parent.prompt,
                parent.ids[:point] + ids,
                parent.entropy[:point] + ent if want_entropy else [],
                list(parent.path),
                len(ids),
            )
            trees[parent.prompt].append(child)
    return trees


def tree_rollout(
    model: Any,
    tok: Any,
    samples: list[Sample],
    cfg: RolloutConfig,
    *,
    group_offset: int,
    policy_version: int,
    with_logprobs: bool,
    keep_cache: bool,
    boundaries: Boundaries,
) -> tuple[Batch, dict[str, float]]:
    """``rollout.n`` leaves of one tree per prompt as a batch (each prompt's leaves contiguous, one
    group per tree) with ``tree_ends`` / ``tree_nodes``, and the rollout's counters: responses,
    generated and response tokens, branch points on the leaves' paths and the tree depth per leaf."""
    from stepcredit.rollout import finish_batch, left_pad, render_prompts

    was_training = model.training
    model.eval()
    prompts = render_prompts(tok, samples)
    trees = grow_trees(
        model,
        tok,
        prompts,
        branching=cfg.branching(),
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        branch_at=cfg.tree.branch_at,
        boundaries=boundaries,
        min_tail_tokens=cfg.tree.min_tail_tokens,
    )
    leaves = [leaf for tree in trees for leaf in tree]
    dev = next(model.parameters()).device
    p_ids, p_mask = left_pad([prompts[leaf.prompt] for leaf in leaves], tok.pad_token_id)
    T = max(len(leaf.ids) for leaf in leaves)
    resp = torch.full((len(leaves), max(T, 1)), tok.pad_token_id, dtype=torch.long)
    for b, leaf in enumerate(leaves):
        resp[b, : len(leaf.ids)] = torch.tensor(leaf.ids, dtype=torch.long)
    batch = finish_batch(
        model,
        tok,
        samples,
        n=cfg.n,
        p_ids=p_ids.to(dev),
        p_mask=p_mask.to(dev),
        resp=resp.to(dev),
        temperature=cfg.temperature,
        group_offset=group_offset,
        with_logprobs=with_logprobs,
        policy_version=policy_version,
        keep_cache=keep_cache,
    )
    if was_training:
        model.train()
    segments = [leaf_segments(leaf) for leaf in leaves]
    batch.tree_ends = [e for e, _ in segments]
    batch.tree_nodes = [n for _, n in segments]
    stats = {
        "rollout/responses": float(len(leaves)),
        "rollout/generated_tokens": float(sum(leaf.generated for leaf in leaves)),
        "rollout/response_tokens": float(sum(len(leaf.ids) for leaf in leaves)),
        "tree/branch_points": float(sum(len(n) - 1 for n in batch.tree_nodes)),
        "tree/depth": float(len(cfg.branching()) * len(leaves)),
    }
    return batch, stats
