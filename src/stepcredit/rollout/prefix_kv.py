"""Keys and values kept from one decode for the next, so that a tree's branches continue from their
parent's prefix without running it through the model again.

A tree rollout's later levels continue each branch from the prompt and a prefix of a leaf sampled at an
earlier level (:mod:`stepcredit.rollout.tree`). Prefilling those contexts again is a forward pass over
every context token (issue 48: the tree step's largest extra over a flat step on the tiny model), though
the leaf's own decode already computed the keys and values of each of them. :class:`KeptKV` collects
the keys and values of a decode's rows as they finish (before compaction drops them from the batch),
:class:`RowKV` points at one row's, and :class:`PrefixKV` lays the first tokens of several rows out as
the left-padded cache a new decode starts from; the decode then feeds only each context's last token
(:func:`stepcredit.rollout.sampling.decode`, ``prefix=``).

The keys and values of a position are the same function of the tokens up to it whether they were
computed in a prefill or one token at a time, so the continuations are drawn from the same distribution;
the numbers differ only by floating-point rounding (products of other shapes), as with the bucketed
prefill. Only transformers' plain full-attention cache laid out by the decode loop is kept
(``BufferLayer``); any other cache (a compiled static step, a sliding window) keeps nothing and the
next decode prefills as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class _Chunk:
    """The rows a decode let go at one moment: per layer keys and values ``[R, H, W, D]`` and which of
    the W positions hold a token (``valid_RW``: the prompt's left padding does not)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid_RW: torch.Tensor


@dataclass
class KeptKV:
    """The keys and values of one decode's rows (original row indices), filled by the decode as rows
    finish. A row's positions hold its context, then its sampled tokens but the last (which was never
    fed), then possibly padding fed after its end: a prefix of its tokens is always its first valid
    positions."""

    chunks: list[_Chunk] = field(default_factory=list)
    where: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Original row -> (chunk, row within the chunk)."""
    kept: bool = True
    """False once a cache could not be read (then no row has a handle)."""

    def take(self, cache: Any, rows_A: torch.Tensor, sel_S: torch.Tensor, mask_AW: torch.Tensor) -> None:
        """Keep the active rows ``sel_S`` (indices into the active batch, whose original rows are
        ``rows_A``) of ``cache``, every position written so far (``mask_AW``: the decode's mask)."""
        from stepcredit.rollout.sampling import buffer_layer_class

        if not self.kept or len(sel_S) == 0:
            return
        layers = getattr(cache, "layers", None)
        if not layers or any(not isinstance(x, buffer_layer_class()) for x in layers):
            self.kept = False
            return
        n = layers[0].n
        chunk = _Chunk(
            [x.buf_k[sel_S, :, :n] for x in layers],
            [x.buf_v[sel_S, :, :n] for x in layers],
            mask_AW[sel_S, :n].bool(),
        )
        for i, r in enumerate(rows_A[sel_S].tolist()):
            self.where[int(r)] = (len(self.chunks), i)
        self.chunks.append(chunk)

    def row(self, r: int) -> RowKV | None:
        """The handle of original row ``r`` (None when nothing was kept)."""
        if not self.kept or r not in self.where:
            return None
        c, i = self.where[r]
        return RowKV(self, c, i)


@dataclass(frozen=True)
class RowKV:
    """One decoded row's keys and values (:attr:`stepcredit.rollout.engines.Completion.kv`)."""

    kept: KeptKV
    chunk: int
    index: int


@dataclass(frozen=True)
class PrefixKV:
    """The start of a decode's contexts: context i's first ``lengths[i]`` tokens are the first tokens of
    the row ``rows[i]`` points at (its context's tokens but the last, in a tree)."""

    rows: Sequence[RowKV]
    lengths: Sequence[int]

    def cache(self, width: int, capacity: int) -> tuple[Any, torch.Tensor]:
        """(a ``DynamicCache`` of ``BufferLayer`` layers with room for ``capacity`` positions, holding
        each context's prefix right-aligned at ``width``; the ``[N, width]`` bool mask of its tokens)."""
        from transformers.cache_utils import DynamicCache

        from stepcredit.rollout.sampling import buffer_layer_class

        N = len(self.rows)
        if N == 0 or len(self.lengths) != N or max(self.lengths) > width:
            raise ValueError(f"PrefixKV: {N} rows, lengths {list(self.lengths)[:8]}..., width {width}")
        c0 = self.rows[0].kept.chunks[self.rows[0].chunk]
        keys = [k.new_zeros((N, k.shape[1], width, k.shape[-1])) for k in c0.keys]
        values = [v.new_zeros((N, v.shape[1], width, v.shape[-1])) for v in c0.values]
        device = c0.valid_RW.device
        mask_NW = torch.zeros((N, width), dtype=torch.bool, device=device)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, h in enumerate(self.rows):
            groups.setdefault((id(h.kept), h.chunk), []).append(i)
        for members in groups.values():
            h = self.rows[members[0]]
            chunk = h.kept.chunks[h.chunk]
            dest_G = torch.tensor(members, device=device)
            src_G = torch.tensor([self.rows[i].index for i in members], device=device)
            m_G = torch.tensor([self.lengths[i] for i in members], device=device)
            valid_GW = chunk.valid_RW[src_G]
            if bool((valid_GW.sum(1) < m_G).any()):
                raise ValueError("PrefixKV: a prefix is longer than the tokens its row holds")
            # the valid positions of each row first, in order (a stable sort of "is padding")
            order_GW = torch.argsort((~valid_GW).to(torch.int8), dim=1, stable=True)
            # target column j holds the row's token of rank j - (width - m): right-aligned at width
            rank_GJ = torch.arange(width, device=device)[None, :] - (width - m_G)[:, None]
            ok_GJ = rank_GJ >= 0
            src_GJ = order_GW.gather(1, rank_GJ.clamp(min=0, max=order_GW.shape[1] - 1))
            mask_NW[dest_G] = ok_GJ
            for out, kept in ((keys, chunk.keys), (values, chunk.values)):
                for o, k in zip(out, kept, strict=True):
                    idx = src_GJ[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[-1])
                    o[dest_G] = k[src_G].gather(2, idx) * ok_GJ[:, None, :, None]
        cache = DynamicCache()
        cache.layers = [buffer_layer_class()(k, v, capacity) for k, v in zip(keys, values, strict=True)]
        return cache, mask_NW
