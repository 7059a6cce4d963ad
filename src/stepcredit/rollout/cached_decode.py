"""Continuations of prefixes of a rollout's responses that start from the rollout's own KV cache.

The behaviour log-prob pass runs the policy over every prompt + response and can keep its cache
(:class:`~stepcredit.types.RolloutCache`, ``generate(keep_cache=True)``). A context that is the prompt and
the first n tokens of response b occupies columns ``[starts[b], starts[b] + len(context))`` of row b of
that cache (the prompt is right-aligned at the prompt width, the response follows it), and by causality
those columns' keys and values are exactly what a prefill of the context alone would compute (up to
floating-point rounding of differently shaped products). So :func:`decode_cached` copies each context's
row of the cache, masks the columns after the context, feeds the context's last token once (for the
next-token logits) and samples as :func:`stepcredit.rollout.sampling.decode` does: no context is
prefilled again, and the contexts of many prefixes of one response share one cached row.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from stepcredit.rollout.sampling import (
    COMPACT_FRACTION,
    _drop_finished,
    _sample_token,
    _step_logits,
    buffer_layer_class,
)
from stepcredit.rollout.stops import PatternStop
from stepcredit.types import RolloutCache


def cache_rows(body: RolloutCache, rows_B: Sequence[int], width: int, capacity: int) -> Any | None:
    """A new cache of the first ``width`` columns of the rollout cache's rows ``rows_B`` (row b of the
    result = row ``rows_B[b]``), each layer a ``BufferLayer`` of ``capacity`` columns; None when the
    rollout's cache is not transformers' plain ``DynamicCache`` (the caller prefills instead)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    src = body.cache
    if not isinstance(src, DynamicCache) or any(type(x) is not DynamicLayer for x in src.layers):
        return None
    out = copy.copy(src)  # the rollout's cache object, with layers of its own (``src`` is never modified)
    out.layers = []
    for layer in src.layers:
        assert isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None
        idx = torch.tensor(list(rows_B), dtype=torch.long, device=layer.keys.device)
        keys = layer.keys[:, :, :width].index_select(0, idx)
        values = layer.values[:, :, :width].index_select(0, idx)
        out.layers.append(buffer_layer_class()(keys, values, capacity))
    return out


@torch.no_grad()
def decode_cached(
    model: Any,
    body: RolloutCache,
    rows_B: Sequence[int],
    contexts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop: PatternStop | None = None,
) -> torch.Tensor | None:
    """Sampled continuations ``[B, T]`` of ``contexts`` (each the prompt and a prefix of response
    ``rows_B[b]`` of ``body``, at least one token), as :func:`~stepcredit.rollout.sampling.decode` gives
    them for the same contexts: each row up to and including its first eos (or the token with which
    ``stop`` ends it), then ``pad_token_id``. None when the rollout's cache cannot be read this way."""
    from stepcredit.models.decode_step import fast_step

    dev = next(model.parameters()).device
    B = len(rows_B)
    ends = [body.starts[r] + len(c) - 1 for r, c in zip(rows_B, contexts, strict=True)]  # last token's column
    W0 = max(ends)
    cache = cache_rows(body, rows_B, W0, W0 + max_new_tokens)
    if cache is None:
        return None
    mask_BW = torch.zeros((B, W0 + max_new_tokens), dtype=torch.long, device=dev)
    for b, (r, e) in enumerate(zip(rows_B, ends, strict=True)):
        mask_BW[b, body.starts[r] : e] = 1  # the context but its last token; later columns are not its own
    mask_BW[:, W0] = 1
    last_B = torch.tensor([c[-1] for c in contexts], dtype=torch.long, device=dev)
    pos_B = torch.tensor([len(c) - 1 for c in contexts], dtype=torch.long, device=dev)  # positions from 0
    step = fast_step(model)
    logits_BV = _step_logits(model, cache, step, None, last_B, pos_B, mask_BW, W0)
    out_BT = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=dev)
    rows = torch.arange(B, device=dev)  # the original row of each active row
    done_A = torch.zeros(B, dtype=torch.bool, device=dev)
    next_pos_B, T = pos_B + 1, 0
    for t in range(max_new_tokens):
        tok_A = _sample_token(
            logits_BV, rows, done_A, t, temperature=temperature, top_p=top_p, pad_token_id=pad_token_id,
            row_keys_B=None, entropy_BT=None, logp_BT=None,
        )  # fmt: skip
        out_BT[rows, t] = tok_A
        T = t + 1
        done_A |= tok_A == eos_token_id
        if stop is not None:
            done_A |= stop(rows, out_BT, t, done_A)
        n_done = int(done_A.sum())
        if t == max_new_tokens - 1 or n_done == len(rows):
            break
        if n_done >= max(1, int(COMPACT_FRACTION * len(rows))):
            rows, tok_A, next_pos_B, mask_BW, done_A = _drop_finished(
                cache, done_A, rows, tok_A, next_pos_B, mask_BW
            )
        mask_BW[:, W0 + 1 + t] = 1
        logits_BV = _step_logits(model, cache, step, None, tok_A, next_pos_B, mask_BW, W0 + 1 + t)
        next_pos_B = next_pos_B + 1
    return out_BT[:, :T]
