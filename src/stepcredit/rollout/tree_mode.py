"""The rollout mode ``tree``: ``rollout.n`` leaves of one tree per prompt (:mod:`stepcredit.rollout.tree`'s
construction), as a batch with the tree's segments."""

from __future__ import annotations

from typing import Any

import torch

from stepcredit.rollout.batching import finish_batch, left_pad, render_prompts
from stepcredit.rollout.engines import as_tensor_rows
from stepcredit.rollout.modes import RolloutRequest
from stepcredit.rollout.tree import TreeSpec, grow_trees, leaf_segments
from stepcredit.types import Batch


@torch.no_grad()
def tree_rollout(model: Any, tok: Any, request: RolloutRequest) -> tuple[Batch, dict[str, float]]:
    """``rollout.n`` leaves of one tree per prompt as a batch (each prompt's leaves contiguous, one
    group per tree) with ``tree_ends`` / ``tree_nodes``, and the rollout's counters: responses,
    generated and response tokens, branch points on the leaves' paths and the tree depth per leaf."""
    cfg, samples = request.cfg, request.samples
    was_training = model.training
    model.eval()
    prompts = render_prompts(tok, samples)
    trees = grow_trees(model, tok, prompts, TreeSpec.of(cfg), boundaries=request.boundaries)
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
        request.generation(),
        p_ids=p_ids.to(dev),
        p_mask=p_mask.to(dev),
        resp=resp.to(dev),
        engine_logp_BT=(
            as_tensor_rows([leaf.logp for leaf in leaves], max(T, 1), 0.0) if leaves[0].logp else None
        ),
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
