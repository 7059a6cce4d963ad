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


@dataclass(frozen=True)
class _Table:
    """Every kept row's positions as one token-major table per layer (``[tokens, H, D]``), so that the
    prefixes of many rows are one ``index_select`` per layer: row r's position w is table row
    ``base_R[r] + w``, its tokens' positions in order are ``order_RW[r, :count_R[r]]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    order_RW: torch.Tensor
    count_R: torch.Tensor
    base_R: torch.Tensor
    start: list[int]
    """The table row index of each chunk's first row."""


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
    _table: _Table | None = None

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

    def table(self) -> _Table:
        """The chunks as one :class:`_Table` (built on first use; the chunks are let go)."""
        if self._table is None:
            chunks = self.chunks
            W = max(c.valid_RW.shape[1] for c in chunks)
            R = sum(c.valid_RW.shape[0] for c in chunks)
            valid_RW = torch.zeros((R, W), dtype=torch.bool, device=chunks[0].valid_RW.device)
            base, start, r0, off = [], [], 0, 0
            for c in chunks:
                n_rows, w = c.valid_RW.shape
                valid_RW[r0 : r0 + n_rows, :w] = c.valid_RW
                base += [off + i * w for i in range(n_rows)]
                start.append(r0)
                r0, off = r0 + n_rows, off + n_rows * w

            def flat(parts: list[torch.Tensor]) -> torch.Tensor:  # [R_c, H, w, D] -> [R_c * w, H, D]
                return torch.cat([x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1]) for x in parts])

            self._table = _Table(
                [flat([c.keys[i] for c in chunks]) for i in range(len(chunks[0].keys))],
                [flat([c.values[i] for c in chunks]) for i in range(len(chunks[0].values))],
                # the valid positions of each row first, in order (a stable sort of "is padding")
                torch.argsort((~valid_RW).to(torch.int8), dim=1, stable=True),
                valid_RW.sum(1),
                torch.tensor(base, device=valid_RW.device),
                start,
            )
            self.chunks = []
        return self._table


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
        tables = {id(h.kept): h.kept.table() for h in self.rows}
        t0 = next(iter(tables.values()))
        device = t0.order_RW.device
        # token-major [N, width, H, D] here; the cache's layers take the [N, H, width, D] view
        keys = [k.new_zeros((N, width, *k.shape[1:])) for k in t0.keys]
        values = [v.new_zeros((N, width, *v.shape[1:])) for v in t0.values]
        mask_NW = torch.zeros((N, width), dtype=torch.bool, device=device)
        groups: dict[int, list[int]] = {}
        for i, h in enumerate(self.rows):
            groups.setdefault(id(h.kept), []).append(i)
        for key, members in groups.items():
            t = tables[key]
            dest_G = torch.tensor(members, device=device)
            r_G = torch.tensor(
                [t.start[self.rows[i].chunk] + self.rows[i].index for i in members], device=device
            )
            m_G = torch.tensor([self.lengths[i] for i in members], device=device)
            if bool((t.count_R[r_G] < m_G).any()):
                raise ValueError("PrefixKV: a prefix is longer than the tokens its row holds")
            # target column j holds the row's token of rank j - (width - m): right-aligned at width
            rank_GJ = torch.arange(width, device=device)[None, :] - (width - m_G)[:, None]
            mask_NW[dest_G] = rank_GJ >= 0
            pos_GJ = t.order_RW[r_G].gather(1, rank_GJ.clamp(min=0, max=t.order_RW.shape[1] - 1))
            idx = (t.base_R[r_G][:, None] + pos_GJ).reshape(-1)  # padding columns read some kept token
            for out, table in ((keys, t.keys), (values, t.values)):
                for o, k in zip(out, table, strict=True):
                    o[dest_G] = k.index_select(0, idx).view(len(members), width, *k.shape[1:])
        cache = DynamicCache()
        cache.layers = [
            buffer_layer_class()(k.transpose(1, 2), v.transpose(1, 2), capacity)
            for k, v in zip(keys, values, strict=True)
        ]
        return cache, mask_NW
