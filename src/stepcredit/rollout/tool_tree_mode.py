"""The rollout mode ``tools_tree``: a tree of tool rollouts per prompt, grown by
:func:`stepcredit.rollout.tree.grow_trees` (``rollout.n`` leaves, ``rollout.tree.branching``, the
``branch_at`` rule) with every leaf grown by the turn loop (:func:`stepcredit.rollout.turns.run_turns`).

A leaf's episode ends are its calls' ends, read from the result marks the turn loop recorded, so
``branch_at=episode`` branches at turn boundaries: a branch goes on from the prefix that ends at a call,
runs that call again and samples the turns after it, so the mean outcome of the leaves below a node is a
Monte Carlo value of the turn's prefix under the policy with the tools.
"""

from __future__ import annotations

from typing import Any

import torch

from stepcredit.config import Config
from stepcredit.errors import ConfigError
from stepcredit.rollout.modes import RolloutRequest
from stepcredit.rollout.tool_mode import check_tools, request_tools
from stepcredit.rollout.tool_render import render_tool_prompts
from stepcredit.rollout.tree import BRANCH_RULES, Leaf, TreeSpec, grow_trees, leaf_segments
from stepcredit.rollout.turns import TurnRow, branch_row, rows_batch, run_turns, turn_counters
from stepcredit.types import Batch


@torch.no_grad()
def tool_tree_rollout(model: Any, tok: Any, request: RolloutRequest) -> tuple[Batch, dict[str, float]]:
    """One tree of ``rollout.n`` tool-rollout leaves per prompt, each prompt's leaves contiguous. The
    batch carries ``tree_ends`` / ``tree_nodes`` (what ``process.value_estimator=tree`` reads) and the
    results' marks; the counters count each response's calls (a shared prefix's in every leaf) and the
    tokens generated (a shared prefix's once)."""
    cfg, samples = request.cfg, request.samples
    tools = request_tools(request)
    was_training = model.training
    model.eval()
    prompts = render_tool_prompts(tok, samples, tools.config.names)
    counts: dict[str, float] = {}

    def extend(jobs: list[tuple[int, Leaf | None, int]]) -> list[Leaf]:
        rows = [
            TurnRow(prompts[p], samples[p], cfg.max_new_tokens)
            if parent is None
            else branch_row(tok, parent.state, point, tools)
            for p, parent, point in jobs
        ]
        got = run_turns(model, tok, rows, tools, temperature=request.sampling_temperature, top_p=cfg.top_p)
        for key, v in got.items():
            counts[key] = counts.get(key, 0.0) + v
        return [
            Leaf(p, row.ids, [], [], row.generated, observed=row.obs, state=row)
            for (p, _, _), row in zip(jobs, rows, strict=True)
        ]

    # the leaves are grown by the turn loop (``extend``); the spec's sampling settings go unused
    trees = grow_trees(model, tok, prompts, TreeSpec.of(cfg), boundaries=request.boundaries, extend=extend)
    leaves = [leaf for tree in trees for leaf in tree]
    rows = [leaf.state for leaf in leaves]
    batch = rows_batch(model, tok, samples, rows, request)
    if was_training:
        model.train()
    segments = [leaf_segments(leaf) for leaf in leaves]
    batch.tree_ends = [e for e, _ in segments]
    batch.tree_nodes = [n for _, n in segments]
    counts.update(turn_counters(rows))
    counts["tree/branch_points"] = float(sum(len(n) - 1 for n in batch.tree_nodes))
    counts["tree/depth"] = float(len(cfg.branching()) * len(rows))
    return batch, counts


def check_tool_tree(cfg: Config) -> None:
    """:func:`check_tools`, and a branch rule that reads the prefix only (tool turns record no entropies)."""
    check_tools(cfg)
    if BRANCH_RULES.get(cfg.rollout.tree.branch_at).needs_entropy:
        ok = ", ".join(n for n in BRANCH_RULES if not BRANCH_RULES.get(n).needs_entropy)
        raise ConfigError(
            f"config key rollout.tree.branch_at: rollout.mode=tools_tree records no token entropies, which "
            f"{cfg.rollout.tree.branch_at} reads; use {ok} (it branches at turn boundaries)"
        )
