"""Tree rollouts: a prompt's group is a tree whose leaves are complete responses.

Segment-level tree sampling (SPO-tree: Guo et al. 2025, "Segment Policy Optimization", arXiv:2505.23564,
sec. 4; TreeRL: Hou et al. 2025, arXiv:2506.11902, sec. 3.1): responses branch at step boundaries, so
siblings share their prefix, and the mean outcome of the leaves below a node is a Monte Carlo estimate
of the policy's own V(prefix) (each leaf below the node is a sample of the policy continuing from that
prefix), with no generation beyond the group itself. The estimate is unbiased because where a leaf
branches is decided from its prefix alone (:data:`BRANCH_RULES`); the leaf's own outcome counts in its
node's mean, as in SPO (a leaf's V_0 is the group mean including itself).

Construction with branching factors (b_1, ..., b_d), prod b_l = n leaves:

    depth 1: b_1 responses are sampled from the bare prompt (the root's children);
    depth l > 1: every response so far picks a branch point after the one it was created at, and
             b_l - 1 new responses continue from its prefix there (it is itself the b_l-th child).

A leaf created at depth l generates only its tail, so a tree costs fewer generated tokens than n
independent responses, but the depths are sampled one after another (a level's continuations start once
the level before has finished), so generation takes about d passes of decreasing length. A response
for which the rule finds no branch point branches at its last one (its new siblings are further samples
from the parent's prefix), so the leaf count never changes. ``rollout.mode`` applies to every domain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from stepcredit.config import RolloutConfig
from stepcredit.registry import Registry
from stepcredit.rollout.engines import SamplingSpec, engine_for
from stepcredit.rollout.turns import turn_ends

Boundaries = Callable[[list[int]], list[int]]
"""Episode ends (token indices of each episode's last token) of a response's token ids."""


@dataclass(frozen=True)
class TreeSpec:
    """The shape of the trees :func:`grow_trees` grows and how their leaves are sampled: the ``rollout``
    settings a tree reads (:meth:`of`), so every caller states them once."""

    branching: tuple[int, ...]
    """Children per node at each depth, root first (their product: leaves per tree)."""
    max_new_tokens: int
    """A leaf's length limit (a continuation gets what its branch point leaves of it)."""
    temperature: float
    """Sampling temperature of the default leaf sampler."""
    top_p: float
    """Nucleus threshold of the default leaf sampler."""
    branch_at: str
    """The branch rule (:data:`BRANCH_RULES`)."""
    entropy_quantile: float = 0.9
    """``branch_at=entropy``: the quantile of the first level's token entropies a token must reach."""

    @classmethod
    def of(cls, cfg: RolloutConfig) -> TreeSpec:
        """The tree of the run's ``rollout`` settings (``rollout.tree``, lengths, temperature, top-p)."""
        return cls(
            branching=cfg.branching(),
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            branch_at=cfg.tree.branch_at,
            entropy_quantile=cfg.tree.entropy_quantile,
        )


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
    logp: list[float] = field(default_factory=list)
    """Per token, the engine's log-prob (an external engine's only; else empty)."""
    observed: list[bool] = field(default_factory=list)
    """Per token, a tool result's (recorded by the turn loop; empty for a response without tools)."""
    state: Any = None
    """What grew the leaf keeps with it (a tool tree's :class:`~stepcredit.rollout.turns.TurnRow`)."""
    kv: Any = None
    """The engine's kept keys and values of its prompt and tokens (``Completion.kv``): its children
    continue from them without a prefill; dropped once the tree is grown."""


@dataclass(frozen=True)
class BranchContext:
    """What a branch rule may read besides the leaf's own prefix: statistics of the first level's
    responses, so that where a leaf branches never depends on how the leaf itself goes on."""

    boundaries: Boundaries
    """Episode ends of a response's token ids."""
    mean_ends: float
    """Episode ends per response at the first level, the batch mean."""
    entropy_threshold: float
    """The ``rollout.tree.entropy_quantile`` of every first-level token's entropy."""
    generator: torch.Generator | None = None

    def ends(self, leaf: Leaf) -> list[int]:
        """The leaf's episode ends: its turns' ends from the recorded result marks when it called tools
        (never re-parsed from its text), else :attr:`boundaries` of its ids."""
        if any(leaf.observed):
            return turn_ends(leaf.observed)
        return self.boundaries(leaf.ids)


@dataclass(frozen=True)
class BranchRule:
    """A registered branch rule and what generation must record for it."""

    fn: Callable[[Leaf, BranchContext], int]
    """(leaf, context) -> the prefix length it branches at."""
    needs_entropy: bool
    """It reads each token's next-token entropy (recorded during sampling)."""


BRANCH_RULES: Registry[BranchRule] = Registry("tree branch rule")
"""``rollout.tree.branch_at``: where a leaf branches, as a prefix length after its last branch point.

A rule decides from the leaf's prefix up to the point (and batch statistics) only, never from the rest
of the leaf: then the leaf's own continuation after the point is an ordinary sample of the policy from
that prefix and the mean outcome of the leaves below the node is an unbiased estimate of V(prefix). A
point chosen after seeing the whole response (uniformly among its episode ends, or at its highest
entropy) would not be: short and long continuations would be picked at different rates. A leaf for which
the rule finds no point branches at its last one (further samples from the parent's prefix)."""


def branch_at_episode(leaf: Leaf, ctx: BranchContext) -> int:
    """The k-th episode end after the last branch point, k uniform in 1..K with K the episode ends a
    first-level response has on average beyond the ones before that point (SPO's segment boundaries)."""
    last = leaf.path[-1][1]
    ends = [e + 1 for e in ctx.ends(leaf) if e + 1 < len(leaf.ids)]  # a token must follow
    before = sum(1 for p in ends if p <= last)
    k = 1 + int(torch.randint(max(1, round(ctx.mean_ends - before)), (1,), generator=ctx.generator))
    after = [p for p in ends if p > last]
    return after[k - 1] if k <= len(after) else last


def branch_at_entropy(leaf: Leaf, ctx: BranchContext) -> int:
    """Before the first token after the last branch point whose next-token entropy reaches the batch's
    ``entropy_quantile`` (the continuations re-draw it: TreeRL's EPTree forks at high-entropy tokens)."""
    last = leaf.path[-1][1]
    for t in range(last + 1, len(leaf.ids)):
        if leaf.entropy[t] >= ctx.entropy_threshold:
            return t
    return last


BRANCH_RULES.add("episode", BranchRule(branch_at_episode, needs_entropy=False))
BRANCH_RULES.add("entropy", BranchRule(branch_at_entropy, needs_entropy=True))


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
    prefixes: list[Any] | None = None,
) -> list[tuple[list[int], list[float], int, list[float], Any]]:
    """One sampled continuation per context by the model's engine, each cut at its first eos and at
    its own token budget (decoding stops there), with each token's entropy (``want_entropy``), the
    number of tokens decoded for it, from an external engine its log-probs, and the engine's kept keys
    and values (None where it keeps none). ``prefixes``: per context, the kept keys and values of a
    leaf that begins with the context (the parent's), so the engine skips the context's prefill."""
    engine = engine_for(model)
    # only when every context has one: an engine that keeps nothing is never handed the argument
    given = {"prefixes": prefixes} if prefixes and all(p is not None for p in prefixes) else {}
    comps = engine.sample(
        model,
        tok,
        contexts,
        SamplingSpec(
            n=1,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max(budgets),
            logprobs=engine.external,
            entropy=want_entropy,
            keep_kv=True,
        ),
        budgets=budgets,
        **given,
    )
    return [(c.ids, c.entropy, len(c.ids), c.logprobs, c.kv) for c in comps]


Extend = Callable[[list[tuple[int, "Leaf | None", int]]], list[Leaf]]
"""How a tree's leaves are grown: for each new leaf (prompt index, the parent leaf or None at the first
level, the branch point), the new leaf: the parent's first ``point`` tokens, then what was sampled after
them (:func:`grow_trees` sets its path)."""


def sampled_leaves(
    model: Any,
    tok: Any,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    want_entropy: bool,
) -> Extend:
    """Leaves sampled by the model's engine: one continuation of the parent's prefix each (of the bare
    prompt at the first level) within the length budget left."""

    def extend(jobs: list[tuple[int, Leaf | None, int]]) -> list[Leaf]:
        got = _sample(
            model,
            tok,
            [prompt_ids[p] + (parent.ids[:point] if parent is not None else []) for p, parent, point in jobs],
            [
                max_new_tokens if parent is None else max(1, max_new_tokens - point)
                for _, parent, point in jobs
            ],
            temperature=temperature,
            top_p=top_p,
            want_entropy=want_entropy,
            prefixes=[parent.kv if parent is not None else None for _, parent, _ in jobs],
        )
        out = []
        for (p, parent, point), (ids, ent, n, lp, kv) in zip(jobs, got, strict=True):
            if parent is None:
                out.append(Leaf(p, ids, ent, [], n, lp, kv=kv))
            else:
                logp = parent.logp[:point] + lp if parent.logp else []
                leaf = Leaf(p, parent.ids[:point] + ids, parent.entropy[:point] + ent, [], n, logp)
                # a prefix's results stay marked (a trace's, in the probe's trees); the tail is sampled
                leaf.observed = parent.observed[:point] + [False] * len(ids) if parent.observed else []
                leaf.kv = kv
                out.append(leaf)
        return out

    return extend


@torch.no_grad()
def grow_trees(
    model: Any,
    tok: Any,
    prompt_ids: list[list[int]],
    spec: TreeSpec,
    *,
    boundaries: Boundaries,
    trunks: list[Leaf] | None = None,
    extend: Extend | None = None,
) -> list[list[Leaf]]:
    """The leaves of one tree per prompt (prod(spec.branching) each, in creation order).

    ``trunks`` (one per prompt): a fixed response that is the first of its tree's first-level leaves in
    place of a sampled one (its ``ids``, and its ``entropy`` for rules that read it); it branches like
    any leaf and is updated in place. The probe grows trees over given traces this way. ``extend``:
    how new leaves are grown (default: :func:`sampled_leaves`; a tool tree grows them with the turn
    loop), so every kind of tree is built by this one construction."""
    rule = BRANCH_RULES.get(spec.branch_at)
    grow = extend or sampled_leaves(
        model,
        tok,
        prompt_ids,
        max_new_tokens=spec.max_new_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        want_entropy=rule.needs_entropy,
    )
    k = spec.branching[0] - (1 if trunks is not None else 0)  # sampled first-level leaves per prompt
    first = grow([(p, None, 0) for p in range(len(prompt_ids)) for _ in range(k)]) if k > 0 else []
    trees: list[list[Leaf]] = [[t] for t in trunks] if trunks is not None else [[] for _ in prompt_ids]
    next_node = [1] * len(prompt_ids)  # node 0 is each tree's root
    for leaf in first:
        leaf.path = [(0, 0)]
        trees[leaf.prompt].append(leaf)
    level1 = [leaf for tree in trees for leaf in tree]
    every = sorted(x for leaf in level1 for x in leaf.entropy)
    quantile = every[min(len(every) - 1, int(spec.entropy_quantile * len(every)))] if every else 0.0
    ctx = BranchContext(boundaries=boundaries, mean_ends=0.0, entropy_threshold=quantile)
    ctx = replace(ctx, mean_ends=sum(len(ctx.ends(leaf)) for leaf in level1) / max(1, len(level1)))
    for b in spec.branching[1:]:
        if b == 1:  # one child per node: nothing branches, no node to value
            continue
        jobs: list[tuple[Leaf, int]] = []
        for leaves in trees:
            for leaf in list(leaves):
                point = rule.fn(leaf, ctx)
                node = next_node[leaf.prompt]
                next_node[leaf.prompt] += 1
                leaf.path.append((node, point))
                jobs.extend((leaf, point) for _ in range(b - 1))
        children = grow([(parent.prompt, parent, point) for parent, point in jobs])
        for (parent, _), child in zip(jobs, children, strict=True):
            child.path = list(parent.path)
            trees[parent.prompt].append(child)
    for tree in trees:
        for leaf in tree:
            leaf.kv = None  # every branch is grown: free the kept keys and values
    return trees
