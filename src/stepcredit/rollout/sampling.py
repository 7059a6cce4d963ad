"""A lean sampling loop for rollouts: what ``model.generate`` does for plain sampling, without its
per-token machinery, and without spending compute on rows that are done.

Per step the loop runs the model on one new token per *active* row; a row that has produced eos is
dropped from the batch (and from the KV cache, ``Cache.batch_select_indices``) once enough rows have
finished to be worth the copy. Tokens go into one preallocated ``[B, max_new_tokens]`` buffer and the
attention mask is one preallocated ``[B, P + max_new_tokens]`` buffer viewed by width, so the loop
allocates nothing per token beyond the model's own activations. Rows that share a prompt (a GRPO
group) are prefilled once; the keys and values are written in place into one buffer per layer
(:func:`preallocate`), and a plain Llama model's token steps skip transformers' per-call work
(:func:`stepcredit.models.decode_step.llama_step`).

Sampling follows ``generate``'s order of warpers: logits / temperature, then nucleus (top-p) filtering
(Holtzman et al. 2020), then a multinomial draw; temperature 0 is greedy (argmax).

Per-row random streams (``row_keys_B``): each row draws its token at position t by the Gumbel-max trick
with noise that is a hash of (the row's key, t, token id) (:func:`row_gumbel_BV`), in place of a draw
from torch's global stream. A row's tokens then depend on its own key and logits only: two identical
models given the same keys sample the same tokens, and a row that finishes early (and leaves the
batch) or runs longer never shifts another row's draws. Validation uses it for common random numbers.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

import torch

from stepcredit.models import shared_prompts, takes_logits_to_keep
from stepcredit.models.decode_step import (
    DecodeOptions,
    current_options,
    fast_step,
    static_step,
    static_width,
)
from stepcredit.models.lora import adapters_merged
from stepcredit.rollout.stops import PatternStop

if TYPE_CHECKING:
    from stepcredit.rollout.prefix_kv import KeptKV, PrefixKV

COMPACT_FRACTION = 0.125
"""Drop finished rows from the batch once at least this share of the active rows has finished: each
drop copies the KV cache, so dropping rows one at a time would cost more than it saves."""


@functools.cache
def buffer_layer_class() -> Any:
    """The ``BufferLayer`` class, built on first use (importing transformers costs seconds)."""
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        """A KV-cache layer whose keys and values live in one buffer allocated for the whole decode: each
        token writes its keys in place, where ``DynamicLayer`` concatenates (copies) the whole cache
        (``[B, heads, length, head_dim]`` per layer, every token: quadratic in the length)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
            super().__init__()
            B, H, n, _ = keys.shape
            self.buf_k = keys.new_empty((B, H, capacity, keys.shape[-1]))
            self.buf_v = values.new_empty((B, H, capacity, values.shape[-1]))
            self.buf_k[:, :, :n], self.buf_v[:, :, :n] = keys, values
            self.n = n
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self._views()

        def _views(self) -> None:
            self.keys, self.values = self.buf_k[:, :, : self.n], self.buf_v[:, :, : self.n]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            q = key_states.shape[-2]
            if self.n + q > self.buf_k.shape[-2]:
                raise RuntimeError(
                    f"BufferLayer: {self.n + q} tokens exceed the capacity {self.buf_k.shape[-2]}"
                )
            self.buf_k[:, :, self.n : self.n + q] = key_states
            self.buf_v[:, :, self.n : self.n + q] = value_states
            self.n += q
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.n

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.buf_k, self.buf_v = self.buf_k[indices], self.buf_v[indices]
            self._views()

    return BufferLayer


def preallocate(cache: Any, rows_B: torch.Tensor, capacity: int) -> bool:
    """Swap each layer of a prefilled ``DynamicCache`` for a ``BufferLayer`` (``buffer_layer_class``)
    of ``capacity`` tokens holding the prefill's rows ``rows_B`` (row b of the result = row ``rows_B[b]``).
    False (the cache left as it was) when a layer is not a plain full-attention ``DynamicLayer``."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if not isinstance(cache, DynamicCache) or any(type(x) is not DynamicLayer for x in cache.layers):
        return False
    for i, layer in enumerate(cache.layers):
        assert isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None
        cache.layers[i] = buffer_layer_class()(layer.keys[rows_B], layer.values[rows_B], capacity)
    return True


BUCKET_PAD_SHARE = 0.25
"""Prefill left-padded prompts of very different lengths in buckets of similar length when at least this
share of the padded positions is padding (:func:`_bucketed_prefill`)."""
BUCKETS = 4
"""Most buckets of a bucketed prefill (each is one forward pass)."""


def _bucketed_prefill(
    model: Any,
    ids_NP: torch.Tensor,
    mask_NP: torch.Tensor,
    pos_NP: torch.Tensor,
    rows_B: torch.Tensor,
    capacity: int,
) -> tuple[torch.Tensor, Any] | None:
    """The prefill of N left-padded prompts as ``BUCKETS`` forward passes over rows of similar length,
    each only as wide as its longest prompt: (last-position logits of the rows ``rows_B``, a cache whose
    layers are ``BufferLayer`` objects holding those rows, keys and values right-aligned at ``P``).

    Why: a tree rollout's later levels continue from prompt + prefix contexts of very different lengths
    (e.g. 64 contexts of 24 to 118 tokens, half of the padded positions padding), and a prefill over the
    padded batch pays for every padding position (issue 48: 365 ms of CPU for one such pass). Positions
    follow the mask and padding is masked, so each row's keys, values and logits are the same as in one
    padded pass (up to floating-point rounding of differently shaped products). None, for one padded
    pass instead, when padding is under ``BUCKET_PAD_SHARE``, there are fewer than two rows per bucket,
    or the model's cache is not transformers' plain ``DynamicCache`` (checked on the first bucket)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    N, P = ids_NP.shape
    len_N = mask_NP.long().sum(1)
    if N < 2 * BUCKETS or float(len_N.sum()) > (1 - BUCKET_PAD_SHARE) * N * P:
        return None
    order = torch.argsort(len_N, stable=True)
    keep = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    logits_NV: torch.Tensor | None = None
    cache: Any = None
    for rows in torch.tensor_split(order, BUCKETS):
        w = int(len_N[rows].max())
        out = model(
            input_ids=ids_NP[rows, P - w :],
            attention_mask=mask_NP[rows, P - w :],
            position_ids=pos_NP[rows, P - w :],
            use_cache=True,
            **keep,
        )
        c = out.past_key_values
        if not isinstance(c, DynamicCache) or any(type(x) is not DynamicLayer for x in c.layers):
            return None
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in c.layers:
            assert isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None
            kv.append((layer.keys, layer.values))
        if cache is None:  # the first bucket sets the shapes (and its cache object carries the result)
            cache = c
            logits_NV = out.logits.new_zeros((N, out.logits.shape[-1]))
            for k, v in kv:
                keys.append(k.new_zeros((N, k.shape[1], P, k.shape[-1])))
                values.append(v.new_zeros((N, v.shape[1], P, v.shape[-1])))
        assert logits_NV is not None
        logits_NV[rows] = out.logits[:, -1, :]
        for i, (k, v) in enumerate(kv):
            keys[i][rows, :, P - w :] = k
            values[i][rows, :, P - w :] = v
    for i in range(len(keys)):
        cache.layers[i] = buffer_layer_class()(keys[i][rows_B], values[i][rows_B], capacity)
    assert logits_NV is not None
    return logits_NV[rows_B], cache


_M32 = 0xFFFFFFFF


def _mul32(x: Any, m: int) -> Any:
    """``x * m mod 2**32`` for ``0 <= x < 2**32`` (a Python int or an int64 tensor) without int64
    overflow: the 32-bit constant is split in two 16-bit halves, every partial product stays < 2**49."""
    return (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & _M32


def mix32(x: Any) -> Any:
    """A 32-bit integer hash with good avalanche (``lowbias32`` from C. Wellons' hash-prospector:
    xorshift-multiply rounds, constants 0x7feb352d and 0x846ca68b); Python ints or int64 tensors."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_key(*parts: int) -> int:
    """One 32-bit key from integers (e.g. seed, step, prompt index), each folded in by :func:`mix32`:
    the seed of one row's random stream (``decode(row_keys_B=...)``)."""
    h = 0x9E3779B9  # any non-zero start; this is 2**32 / golden ratio
    for p in parts:
        h = mix32(h ^ mix32((int(p) + 0x632BE5AB) & _M32))
    return int(h)


def row_gumbel_BV(keys_B: torch.Tensor, t: int, V: int) -> torch.Tensor:
    """Standard Gumbel noise ``[B, V]`` (float32) for position ``t``, a function of (key, t, token id)
    alone: u = (24 bits of the hash + 1/2) / 2**24 in (0, 1), g = -log(-log u) (Gumbel 1954)."""
    k_B = mix32(keys_B.long() ^ mix32(t + 1))
    v_V = torch.arange(V, device=keys_B.device, dtype=torch.long)
    h_BV = mix32(mix32(k_B[:, None] ^ v_V[None, :]) + 0x2545F491)
    u_BV = ((h_BV >> 8).float() + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u_BV))


def sample_next(
    logits_BV: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    keys_B: torch.Tensor | None = None,
    t: int = 0,
) -> torch.Tensor:
    """One token per row from the last-position logits: greedy when ``temperature <= 0``. ``keys_B``
    (int64, one 32-bit key per row): draw with each row's own stream at position ``t``
    (:func:`row_gumbel_BV`), not torch's global one."""
    if temperature <= 0:
        return logits_BV.argmax(dim=-1)
    logits_BV = logits_BV.float()
    if temperature != 1.0:  # x / 1.0 is x: no copy of [B, V] per token
        logits_BV = logits_BV / temperature
    if top_p < 1.0:
        # nucleus: keep the smallest set of tokens whose probability mass reaches top_p (the most
        # likely token always stays), as transformers' TopPLogitsWarper
        sorted_logits, order = torch.sort(logits_BV, descending=False, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(1, order, remove_sorted)
        logits_BV = logits_BV.masked_fill(remove, float("-inf"))
    if keys_B is not None:
        # Gumbel-max: argmax_v (z_v + g_v) with g iid Gumbel(0, 1) is a draw from softmax(z) (Gumbel 1954;
        # Maddison, Tarlow & Minka 2014, "A* Sampling"); tokens top-p removed are -inf and never win
        return (logits_BV + row_gumbel_BV(keys_B, t, logits_BV.shape[-1])).argmax(dim=-1)
    probs = torch.softmax(logits_BV, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


@torch.no_grad()
def decode(
    model: Any,
    prompt_ids_BP: torch.Tensor,
    prompt_mask_BP: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    entropy_BT: torch.Tensor | None = None,
    limit_B: torch.Tensor | None = None,
    logp_BT: torch.Tensor | None = None,
    row_keys_B: torch.Tensor | None = None,
    prefix: PrefixKV | None = None,
    keep: KeptKV | None = None,
    stop: PatternStop | None = None,
) -> torch.Tensor:
    """Sampled continuations ``[B, T]`` (T <= max_new_tokens) of left-padded prompts: each row up to
    and including its first eos, then ``pad_token_id``.

    ``entropy_BT`` (``[B, max_new_tokens]``, float, on the model's device): filled with the entropy
    (nats) of the next-token distribution after temperature (before top-p) at each token, for tree
    rollouts that branch where the policy was least sure (TreeRL's EPTree, arXiv:2506.11902).
    ``limit_B`` (``[B]`` ints): row b stops after ``limit_B[b]`` tokens (its own budget; a tree's
    continuations from different branch points), with no eos: it is truncated there.
    ``logp_BT`` (``[B, max_new_tokens]``, float32, zeros, on the model's device): filled with the
    log-probability of each sampled token under ``softmax(logits / temperature)`` (before top-p; 1 when
    greedy), the distribution the training pass scores: the behaviour log-probs without a pass of their own.
    ``row_keys_B`` (``[B]`` int64, 32-bit keys, e.g. :func:`row_key` of (seed, step, prompt index)):
    row b draws from its own stream (the module docstring), not from torch's global one.
    ``prefix``: the keys and values of each context's tokens but the last, kept from an earlier decode
    (:mod:`stepcredit.rollout.prefix_kv`): no prefill, only the last tokens are fed (ignored by a
    compiled step). ``keep``: filled with every row's keys and values as it finishes, for such a decode.
    ``stop`` (a :class:`~stepcredit.rollout.stops.PatternStop`): a row also ends at the token with which
    the rule says its text completed a match (that token kept, padding after it).

    The same result as ``model.generate(do_sample=temperature > 0, top_k=0, ...)`` would draw from the
    same distribution (greedy: the same tokens up to floating-point ties), computed with less work.
    How the token steps run (a compiled step over a static cache, LoRA adapters merged for the decode)
    is the enclosing engine's :func:`~stepcredit.models.decode_step.decode_options`."""
    options = current_options()
    merge = adapters_merged(model) if options.merge_lora else contextlib.nullcontext(0)
    with merge:
        return _decode(
            model, prompt_ids_BP, prompt_mask_BP, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
            pad_token_id=pad_token_id, temperature=temperature, top_p=top_p, entropy_BT=entropy_BT,
            limit_B=limit_B, logp_BT=logp_BT, options=options, row_keys_B=row_keys_B, prefix=prefix,
            keep=keep, stop=stop,
        )  # fmt: skip


def _decode(
    model: Any,
    prompt_ids_BP: torch.Tensor,
    prompt_mask_BP: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float,
    top_p: float,
    entropy_BT: torch.Tensor | None,
    limit_B: torch.Tensor | None,
    logp_BT: torch.Tensor | None,
    options: DecodeOptions,
    row_keys_B: torch.Tensor | None = None,
    prefix: PrefixKV | None = None,
    keep: KeptKV | None = None,
    stop: PatternStop | None = None,
) -> torch.Tensor:
    B, P = prompt_ids_BP.shape
    device = prompt_ids_BP.device
    out_BT = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    # a static step attends over a fixed width (rounded up: prompts of other lengths share its compilation)
    width = P + max_new_tokens if not options.compiled else static_width(P + max_new_tokens)
    mask_BW = torch.zeros((B, width), dtype=torch.long, device=device)
    mask_BW[:, :P] = prompt_mask_BP.long()
    # positions follow the mask, so left padding does not shift them (as generate does)
    next_pos_B = prompt_mask_BP.long().sum(dim=1)
    if prefix is not None and not options.compiled:
        logits_BV, cache, step = _prefill_from_kv(model, prompt_ids_BP, mask_BW, prefix, P + max_new_tokens)
        static = None
    else:
        logits_BV, cache, step, static = _prefill(
            model,
            prompt_ids_BP,
            prompt_mask_BP,
            mask_BW,
            capacity=P + max_new_tokens,
            width=width,
            options=options,
        )
    rows = torch.arange(B, device=device)  # the original row of each active row
    done_A = torch.zeros(B, dtype=torch.bool, device=device)  # active rows that have produced eos
    T = 0
    for t in range(max_new_tokens):
        tok_A = _sample_token(
            logits_BV, rows, done_A, t, temperature=temperature, top_p=top_p, pad_token_id=pad_token_id,
            row_keys_B=row_keys_B, entropy_BT=entropy_BT, logp_BT=logp_BT,
        )  # fmt: skip
        out_BT[rows, t] = tok_A
        T = t + 1
        done_A |= tok_A == eos_token_id
        if limit_B is not None:
            done_A |= limit_B[rows] <= t + 1
        if stop is not None:
            done_A |= stop(rows, out_BT, t, done_A)
        n_done = int(done_A.sum())
        if t == max_new_tokens - 1 or n_done == len(rows):
            break
        if static is None and n_done >= max(1, int(COMPACT_FRACTION * len(rows))):
            if keep is not None:
                keep.take(cache, rows, done_A.nonzero().squeeze(1), mask_BW)
            rows, tok_A, next_pos_B, mask_BW, done_A = _drop_finished(
                cache, done_A, rows, tok_A, next_pos_B, mask_BW
            )
        mask_BW[:, P + t] = 1
        logits_BV = _step_logits(model, cache, step, static, tok_A, next_pos_B, mask_BW, P + t)
        next_pos_B = next_pos_B + 1
    if keep is not None:
        keep.take(cache, rows, torch.arange(len(rows), device=device), mask_BW)
    return out_BT[:, :T]


def _prefill(
    model: Any,
    prompt_ids_BP: torch.Tensor,
    prompt_mask_BP: torch.Tensor,
    mask_BW: torch.Tensor,
    *,
    capacity: int,
    width: int,
    options: DecodeOptions,
) -> tuple[torch.Tensor, Any, Any, Any]:
    """The prompts' pass: (next-token logits ``[B, V]``, the cache, the fast token step or None, the
    static step or None). At most one of the two steps is set; with neither, tokens run through
    ``model(...)`` on the cache."""
    B, P = prompt_ids_BP.shape
    pos_BP = (prompt_mask_BP.long().cumsum(-1) - 1).clamp(min=0)
    # a GRPO group's rows share one prompt: each distinct prompt is run once, and its keys and values
    # (and its next-token logits) are copied to its rows
    shared = shared_prompts(prompt_ids_BP, prompt_mask_BP.bool())
    first = shared[0] if shared is not None else slice(None)
    rows_of = shared[1] if shared is not None else torch.arange(B, device=prompt_ids_BP.device)
    # the bucketed prefill leaves its own buffer cache; a static step starts from the plain prefill's
    bucketed = (
        _bucketed_prefill(model, prompt_ids_BP[first], mask_BW[first, :P], pos_BP[first], rows_of, capacity)
        if not options.compiled
        else None
    )
    if bucketed is not None:
        logits_BV, cache = bucketed
        return logits_BV, cache, fast_step(model), None
    step = None
    out = model(
        input_ids=prompt_ids_BP[first],
        attention_mask=mask_BW[first, :P],
        position_ids=pos_BP[first],
        use_cache=True,
        **({"logits_to_keep": 1} if takes_logits_to_keep(model) else {}),
    )
    cache = out.past_key_values
    logits_BV = out.logits[:, -1, :]
    # the static cache keeps every row to the end (fixed shapes); otherwise finished rows are dropped
    static = static_step(model, cache, rows_of, width, options)
    if static is None:
        if preallocate(cache, rows_of, capacity):
            step = fast_step(model)  # a Llama model's token steps without transformers' per-call work
        elif shared is not None:
            cache.batch_select_indices(rows_of)
    logits_BV = logits_BV[rows_of] if shared is not None else logits_BV
    return logits_BV, cache, step, static


def _prefill_from_kv(
    model: Any, prompt_ids_BP: torch.Tensor, mask_BW: torch.Tensor, prefix: PrefixKV, capacity: int
) -> tuple[torch.Tensor, Any, Any]:
    """:func:`_prefill` for contexts whose tokens but the last have kept keys and values: the cache
    built from them, then one token step over each context's last token (its next-token logits, the
    cache, the fast token step or None)."""
    P = prompt_ids_BP.shape[1]
    len_B = mask_BW[:, :P].sum(1)
    if [int(x) - 1 for x in len_B.tolist()] != [int(m) for m in prefix.lengths]:
        raise ValueError("decode: a prefix must hold its context's tokens but the last")
    cache, held_BW = prefix.cache(P - 1, capacity)
    if not torch.equal(held_BW, mask_BW[:, : P - 1].bool()):
        raise ValueError("decode: the kept prefixes do not match the contexts' padding")
    step = fast_step(model)
    logits_BV = _step_logits(model, cache, step, None, prompt_ids_BP[:, -1], len_B - 1, mask_BW, P - 1)
    return logits_BV, cache, step


def _sample_token(
    logits_AV: torch.Tensor,
    rows: torch.Tensor,
    done_A: torch.Tensor,
    t: int,
    *,
    temperature: float,
    top_p: float,
    pad_token_id: int,
    row_keys_B: torch.Tensor | None,
    entropy_BT: torch.Tensor | None,
    logp_BT: torch.Tensor | None,
) -> torch.Tensor:
    """The token at position ``t`` of each active row (original rows ``rows``), with its entropy and
    log-probability written to the original rows of ``entropy_BT`` / ``logp_BT`` when given."""
    # a finished row that is still in the batch (until the next compaction) emits padding
    keys_A = None if row_keys_B is None else row_keys_B.to(rows.device)[rows]
    tok_A = sample_next(logits_AV, temperature=temperature, top_p=top_p, keys_B=keys_A, t=t)
    tok_A = tok_A.masked_fill(done_A, pad_token_id)
    if entropy_BT is not None:
        logp_AV = torch.log_softmax(logits_AV.float() / max(temperature, 1e-6), dim=-1)
        entropy_BT[rows, t] = -(logp_AV.exp() * logp_AV).sum(-1).to(entropy_BT.dtype)
    if logp_BT is not None:
        z_AV = logits_AV.float() / (temperature if temperature > 0 else 1.0)
        lp_A = z_AV.gather(1, tok_A.unsqueeze(1)).squeeze(1) - torch.logsumexp(z_AV, dim=-1)
        logp_BT[rows, t] = lp_A.masked_fill(done_A, 0.0)
    return tok_A


def _drop_finished(cache: Any, done_A: torch.Tensor, *active: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows still running, taken out of each of ``active`` (per-row tensors) and of the KV cache, then
    the all-False ``done_A`` of what remains: later steps spend nothing on finished rows."""
    idx = (~done_A).nonzero().squeeze(1)
    cache.batch_select_indices(idx)
    return (*(x[idx] for x in active), done_A[idx])


def _step_logits(
    model: Any,
    cache: Any,
    step: Any,
    static: Any,
    tok_A: torch.Tensor,
    next_pos_B: torch.Tensor,
    mask_BW: torch.Tensor,
    past: int,
) -> torch.Tensor:
    """One token step of every active row: the next-token logits after ``tok_A`` at ``next_pos_B``, the
    mask's first ``past + 1`` columns visible (``past``: the positions before this token; the static
    step takes the whole fixed-width mask)."""
    if static is not None:
        return static(tok_A.unsqueeze(1), next_pos_B.unsqueeze(1), mask_BW, past)  # type: ignore[no-any-return]
    if step is not None:
        return step(tok_A.unsqueeze(1), next_pos_B.unsqueeze(1), mask_BW[:, : past + 1], cache)  # type: ignore[no-any-return]
    out = model(
        input_ids=tok_A.unsqueeze(1),
        attention_mask=mask_BW[:, : past + 1],
        position_ids=next_pos_B.unsqueeze(1),
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[:, -1, :]  # type: ignore[no-any-return]
