"""Supervised warm-up: next-token loss on the task's reference traces (response tokens only).

The RL phase needs a policy whose pass rate is neither 0 nor 1; a few hundred SFT steps on the
``arith`` traces give the tiny model the answer format and some arithmetic.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch

from stepcredit.config import SFTConfig
from stepcredit.errors import DataError
from stepcredit.rollout import left_pad, render_prompts
from stepcredit.types import Sample


def sft_pairs(tok: Any, samples: list[Sample]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + eos) for every sample that carries ``extra_info['solution']``."""
    prompts = render_prompts(tok, samples)
    out = []
    for s, p in zip(samples, prompts, strict=True):
        sol = s.extra_info.get("solution")
        if not isinstance(sol, str) or not sol:
            continue
        r = tok(sol, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        out.append((p, r))
    if not out:
        raise DataError(
            "sft: no training row has extra_info.solution to imitate (set sft.steps=0 to skip SFT)"
        )
    return out


def sft_batch(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Left-padded prompt + right-padded response, and the loss mask over response tokens."""
    p_ids, p_mask = left_pad([p for p, _ in pairs], pad_id)
    T = max(len(r) for _, r in pairs)
    r_ids = torch.full((len(pairs), T), pad_id, dtype=torch.long)
    r_mask = torch.zeros((len(pairs), T), dtype=torch.bool)
    for i, (_, r) in enumerate(pairs):
        r_ids[i, : len(r)] = torch.tensor(r)
        r_mask[i, : len(r)] = True
    return torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1), r_mask


def run_sft(
    model: Any,
    tok: Any,
    samples: list[Sample],
    cfg: SFTConfig,
    *,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Train ``cfg.steps`` steps of cross-entropy on reference traces; returns the last metrics."""
    from stepcredit.models import token_logprobs

    if cfg.steps == 0:  # no warm-up (a real model, or data without reference solutions)
        return {}
    pairs = sft_pairs(tok, samples)
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
        ids, mask, r_mask = (x.to(dev) for x in sft_batch([pairs[i] for i in idx], tok.pad_token_id))
        logp, _ = token_logprobs(model, ids, mask.long(), n_response=r_mask.shape[1])
        loss = -(logp * r_mask).sum() / r_mask.sum()
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
