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
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from stepcredit.models import shared_prompts, takes_logits_to_keep
from stepcredit.models.decode_step import fast_step

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


def sample_next(logits_BV: torch.Tensor, *, temperature: float, top_p: float) -> torch.Tensor:
    """One token per row from the last-position logits: greedy when ``temperature <= 0``."""
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
    probs = torch.softmax(logits_BV, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def _prefill(
    model: Any,
    prompt_ids_BP: torch.Tensor,
    prompt_mask_BP: torch.Tensor,
    mask_BP: torch.Tensor,
    pos_BP: torch.Tensor,
    max_new_tokens: int,
) -> tuple[Any, torch.Tensor, Any]:
    """The prompts' pass: (KV cache with one row per prompt row, last-position logits ``[B, V]``, the
    fast token step or None). A GRPO group's rows share one prompt: each distinct prompt is run once, and
    its keys and values (and its next-token logits) are copied to its rows."""
    B, P = prompt_ids_BP.shape
    shared = shared_prompts(prompt_ids_BP, prompt_mask_BP.bool())
    first = shared[0] if shared is not None else slice(None)
    out = model(
        input_ids=prompt_ids_BP[first],
        attention_mask=mask_BP[first],
        position_ids=pos_BP[first],
        use_cache=True,
        **({"logits_to_keep": 1} if takes_logits_to_keep(model) else {}),
    )
    cache = out.past_key_values
    logits_BV = out.logits[:, -1, :]
    rows_of = shared[1] if shared is not None else torch.arange(B, device=prompt_ids_BP.device)
    step = None
    if preallocate(cache, rows_of, P + max_new_tokens):
        step = fast_step(model)  # a Llama model's token steps without transformers' per-call work
    elif shared is not None:
        cache.batch_select_indices(rows_of)
    return cache, logits_BV[rows_of] if shared is not None else logits_BV, step


def _record(
    logits_BV: torch.Tensor,
    tok_A: torch.Tensor,
    done_A: torch.Tensor,
    rows: torch.Tensor,
    t: int,
    *,
    temperature: float,
    entropy_BT: torch.Tensor | None,
    logp_BT: torch.Tensor | None,
) -> None:
    """Write step ``t``'s entropy (after temperature, before top-p) and the sampled tokens' log-probs
    under softmax(logits / temperature) (1 when greedy) into the active rows ``rows`` of the buffers."""
    if entropy_BT is not None:
        logp_AV = torch.log_softmax(logits_BV.float() / max(temperature, 1e-6), dim=-1)
        entropy_BT[rows, t] = -(logp_AV.exp() * logp_AV).sum(-1).to(entropy_BT.dtype)
    if logp_BT is not None:
        z_AV = logits_BV.float() / (temperature if temperature > 0 else 1.0)
        lp_A = z_AV.gather(1, tok_A.unsqueeze(1)).squeeze(1) - torch.logsumexp(z_AV, dim=-1)
        logp_BT[rows, t] = lp_A.masked_fill(done_A, 0.0)


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

    The same result as ``model.generate(do_sample=temperature > 0, top_k=0, ...)`` would draw from the
    same distribution (greedy: the same tokens up to floating-point ties), computed with less work."""
    B, P = prompt_ids_BP.shape
    device = prompt_ids_BP.device
    out_BT = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    mask_BW = torch.zeros((B, P + max_new_tokens), dtype=torch.long, device=device)
    mask_BW[:, :P] = prompt_mask_BP.long()
    # positions follow the mask, so left padding does not shift them (as generate does)
    next_pos_B = prompt_mask_BP.long().sum(dim=1)
    pos_BP = (prompt_mask_BP.long().cumsum(-1) - 1).clamp(min=0)
    cache, logits_BV, step = _prefill(
        model, prompt_ids_BP, prompt_mask_BP, mask_BW[:, :P], pos_BP, max_new_tokens
    )
    rows = torch.arange(B, device=device)  # the original row of each active row
    done_A = torch.zeros(B, dtype=torch.bool, device=device)  # active rows that have produced eos
    T = 0
    for t in range(max_new_tokens):
        # a finished row that is still in the batch (until the next compaction) emits padding
        tok_A = sample_next(logits_BV, temperature=temperature, top_p=top_p).masked_fill(done_A, pad_token_id)
        _record(
            logits_BV, tok_A, done_A, rows, t, temperature=temperature, entropy_BT=entropy_BT, logp_BT=logp_BT
        )
        out_BT[rows, t] = tok_A
        T = t + 1
        done_A |= tok_A == eos_token_id
        if limit_B is not None:
            done_A |= limit_B[rows] <= t + 1
        n_done = int(done_A.sum())
        if t == max_new_tokens - 1 or n_done == len(rows):
            break
        if n_done >= max(1, int(COMPACT_FRACTION * len(rows))):
            idx = (~done_A).nonzero().squeeze(1)
            rows, tok_A, next_pos_B, mask_BW = rows[idx], tok_A[idx], next_pos_B[idx], mask_BW[idx]
            done_A = done_A[idx]
            cache.batch_select_indices(idx)
        mask_BW[:, P + t] = 1
        if step is not None:
            logits_BV = step(tok_A.unsqueeze(1), next_pos_B.unsqueeze(1), mask_BW[:, : P + t + 1], cache)
        else:
            out = model(
                input_ids=tok_A.unsqueeze(1),
                attention_mask=mask_BW[:, : P + t + 1],
                position_ids=next_pos_B.unsqueeze(1),
                past_key_values=cache,
                use_cache=True,
            )
            logits_BV = out.logits[:, -1, :]
        next_pos_B = next_pos_B + 1
    return out_BT[:, :T]
