"""Supervised warm-up: next-token loss on the task's reference traces (response tokens only; a tool
trace's results are attended to but never trained on, and are the tokens the tool rollout appends:
the chat template's own tool turn where the rollout renders results with it).

The RL phase needs a policy whose pass rate is neither 0 nor 1; a few hundred SFT steps on the
``arith`` traces give the tiny model the answer format and some arithmetic.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from typing import Any

import torch

from stepcredit.config import SFTConfig, ToolsConfig
from stepcredit.errors import DataError
from stepcredit.rollout import left_pad, render_prompts
from stepcredit.rollout.tool_render import check_tool_template, render_tool_prompts, trace_observation_ids
from stepcredit.types import Sample

Pair = tuple[list[int], list[int], list[bool]]
"""(prompt ids, response ids + eos, per response token: trained on)."""


def _response_ids(
    tok: Any, solution: str, observations: Any, turn: Callable[[str], list[int]] | None = None
) -> tuple[list[int], list[bool]]:
    """The solution's tokens and which are trained on: the character spans in ``observations``
    (tool results) are tokenized on their own, as the tool rollout appends them, and not trained on.
    ``turn``: a result block's text -> the tokens the rollout appends for it (the chat template's tool
    turn); None: the block's own tokens (the convention's text)."""
    spans = sorted((int(a), int(b)) for a, b in (observations or ()))
    ids: list[int] = []
    trained: list[bool] = []
    at = 0
    for a, b in [*spans, (len(solution), len(solution))]:
        if not 0 <= at <= a <= b <= len(solution):
            raise DataError(f"sft: solution_observations span {[a, b]} is not inside the solution's text")
        for text, train in ((solution[at:a], True), (solution[a:b], False)):
            if not text:
                got = []
            elif turn is not None and not train:
                got = turn(text)
            else:
                got = tok(text, add_special_tokens=False)["input_ids"]
            ids += got
            trained += [train] * len(got)
        at = b
    return [*ids, tok.eos_token_id], [*trained, True]


def _template_turn(tok: Any, tools: ToolsConfig, sample: Sample, row: int, block: str) -> list[int]:
    """The chat template's tool turn tokens for a result block of ``sample``'s trace (one line naming the
    row when the block is not the convention's result text)."""
    try:
        return trace_observation_ids(tok, block, tools=tools, prompt=sample.prompt)
    except ValueError as e:
        raise DataError(f"sft: row {row} ({sample.uid}): solution_observations: {e}") from None


def sft_pairs(tok: Any, samples: list[Sample], tools: ToolsConfig | None = None) -> list[Pair]:
    """One :data:`Pair` for every sample that carries ``extra_info['solution']``; a tool trace's
    results (``extra_info['solution_observations']``: character spans of the solution) are never
    trained on, exactly as the tool rollout leaves them out of ``response_mask_BT``.

    ``tools``: the run's ``rollout.tools`` when its rollouts call tools. The prompts are then the
    rollout's (the offered tools' schemas where the chat template prints them), and where results are
    rendered by the chat template (:func:`~stepcredit.rollout.tool_render.check_tool_template`) each result
    block, written in the ``tools.parser`` convention's text, becomes the template's own tool turn
    tokens, as the rollout appends them; otherwise the block's own tokens, as without ``tools``."""
    prompts = (
        render_prompts(tok, samples) if tools is None else render_tool_prompts(tok, samples, tools.names)
    )
    template = tools is not None and check_tool_template(tok, tools)
    out = []
    for i, (s, p) in enumerate(zip(samples, prompts, strict=True)):
        sol = s.extra_info.get("solution")
        if not isinstance(sol, str) or not sol:
            continue
        turn = functools.partial(_template_turn, tok, tools, s, i) if template and tools else None
        r, trained = _response_ids(tok, sol, s.extra_info.get("solution_observations"), turn)
        out.append((p, r, trained))
    if not out:
        raise DataError(
            "sft: no training row has extra_info.solution to imitate (set sft.steps=0 to skip SFT)"
        )
    return out


def sft_batch(pairs: list[Pair], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Left-padded prompt + right-padded response, its attention mask, and the loss mask over the
    response's trained tokens (results are attended to, not trained on)."""
    p_ids, p_mask = left_pad([p for p, _, _ in pairs], pad_id)
    T = max(len(r) for _, r, _ in pairs)
    r_ids = torch.full((len(pairs), T), pad_id, dtype=torch.long)
    r_mask = torch.zeros((len(pairs), T), dtype=torch.bool)
    loss_mask = torch.zeros((len(pairs), T), dtype=torch.bool)
    for i, (_, r, trained) in enumerate(pairs):
        r_ids[i, : len(r)] = torch.tensor(r)
        r_mask[i, : len(r)] = True
        loss_mask[i, : len(r)] = torch.tensor(trained, dtype=torch.bool)
    return torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1), loss_mask


def sft_loss(logp_BT: torch.Tensor, loss_mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood over the trained response tokens."""
    return -(logp_BT * loss_mask_BT).sum() / loss_mask_BT.sum().clamp(min=1)


def run_sft(
    model: Any,
    tok: Any,
    samples: list[Sample],
    cfg: SFTConfig,
    *,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    tools: ToolsConfig | None = None,
) -> dict[str, float]:
    """Train ``cfg.steps`` steps of cross-entropy on reference traces; returns the last metrics.
    ``tools``: the run's ``rollout.tools`` when its rollouts call tools (:func:`sft_pairs`)."""
    from stepcredit.models import token_logprobs

    if cfg.steps == 0:  # no warm-up (a real model, or data without reference solutions)
        return {}
    pairs = sft_pairs(tok, samples, tools)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.98))
    model.train()
    dev = next(model.parameters()).device
    metrics: dict[str, float] = {}
    order: list[int] = []
    for step in range(cfg.steps):
        # cosine decay to 10% of the peak after a short linear warm-up
        warm = max(1, cfg.steps // 20)
        frac = (step + 1) / warm if step < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * step / cfg.steps))
        for g in opt.param_groups:
            g["lr"] = cfg.lr * min(1.0, frac)
        if len(order) < cfg.batch_size:
            extra = list(range(len(pairs)))
            rng.shuffle(extra)
            order.extend(extra)
        idx, order = order[: cfg.batch_size], order[cfg.batch_size :]
        ids, mask, loss_mask = (x.to(dev) for x in sft_batch([pairs[i] for i in idx], tok.pad_token_id))
        logp, _ = token_logprobs(model, ids, mask.long(), n_response=loss_mask.shape[1])
        loss = sft_loss(logp, loss_mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        metrics = {
            "sft/loss": float(loss.detach()),
            "sft/grad_norm": float(gn),
            "sft/lr": opt.param_groups[0]["lr"],
        }
        if on_step is not None:
            on_step(step, metrics)
    return metrics
