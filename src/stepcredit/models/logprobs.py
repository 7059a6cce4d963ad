"""Log-probabilities of response tokens under a model: the behaviour and training passes, with no
compute on padding (rows packed by length), a GRPO group's shared prompt run once, and the vocabulary
projection only where a response token is predicted.

    log pi(y_t | x, y_<t) = z_(y_t) / tau - logsumexp(z / tau)      (z: the logits, tau: the temperature)

the distribution the tokens were sampled from (softmax of the temperature-scaled logits), so the loss
compares like with like; the entropy is that distribution's, -sum p log p.
"""

from __future__ import annotations

from typing import Any

LOGP_ROWS_PER_PASS = 32
"""Rows per forward pass of :func:`token_logprobs`: rows of similar length share a pass, so each
pass is only as wide as its longest row (enough rows per pass to keep the matrix products efficient)."""


def token_logprobs(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    *,
    n_response: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    cache_out: list[Any] | None = None,
    rows_per_pass: int = LOGP_ROWS_PER_PASS,
) -> tuple[Any, Any]:
    """Log-probs (and optionally entropies) of the last ``n_response`` tokens of each row.

    ``input_ids`` is prompt (left-padded) + response (right-padded); position ids follow the
    attention mask so left padding does not shift positions. Returns ``logp_BT`` and ``entropy_BT``
    (or None), both ``[B, n_response]``, 0 at response padding. With ``cache_out`` (a list) the pass
    keeps its KV cache and appends it there, for a later pass that continues from these tokens (the
    process stage's suffixes): one pass over the batch as laid out.

    Otherwise no compute goes to padding: each row's real tokens (prompt then response) are laid out
    contiguously, rows sorted by length go ``rows_per_pass`` at a time through passes as wide as their
    longest row, and the vocabulary projection runs only where a response token is predicted. The
    result equals the padded pass's up to floating-point summation order (``tests/models``).
    """

    L = input_ids.shape[1]
    P = L - n_response
    m = attention_mask.bool()
    plen_B, rlen_B = m[:, :P].sum(1), m[:, P:].sum(1)
    # the compact layout needs each row to be [pad, prompt] + [response, pad] with a non-empty prompt
    compact = (
        cache_out is None
        and P > 0
        and bool((plen_B > 0).all())
        and bool((m[:, 1:P] >= m[:, : P - 1]).all())
        and bool((m[:, P + 1 :] <= m[:, P:-1]).all())
    )
    if not compact:
        return _padded_logprobs(
            model, input_ids, attention_mask, n_response, temperature, with_entropy, cache_out
        )
    shared = shared_prompts(input_ids[:, :P], m[:, :P])
    if shared is not None:
        out = _shared_prefix_logprobs(
            model, input_ids, m, shared, n_response, temperature, with_entropy, rows_per_pass
        )
        if out is not None:
            return out
    return _compact_logprobs(
        model, input_ids, m, n_response, temperature, with_entropy, rows_per_pass, plen_B, rlen_B
    )


def _compact_logprobs(
    model: Any,
    input_ids: Any,
    m: Any,
    n_response: int,
    temperature: float,
    with_entropy: bool,
    rows_per_pass: int,
    plen_B: Any,
    rlen_B: Any,
) -> tuple[Any, Any]:
    """:func:`token_logprobs` with no compute on padding: rows sorted by length, each pass as wide as
    its longest row, each row's real tokens (prompt then response) contiguous."""
    import torch

    B, L = input_ids.shape
    P = L - n_response
    dev = input_ids.device
    logp_BT = torch.zeros((B, n_response), dtype=torch.float32, device=dev)
    ent_BT = torch.zeros((B, n_response), dtype=torch.float32, device=dev) if with_entropy else None
    total_B = plen_B + rlen_B
    order = torch.argsort(total_B, stable=True)
    keep_kw = takes_logits_to_keep(model)
    for rows in order.split(max(1, rows_per_pass)):
        plen, rlen, total = plen_B[rows, None], rlen_B[rows, None], total_B[rows, None]
        W, Tc = int(total.max()), int(rlen.max())
        if Tc == 0:
            continue
        # column c of the pass holds the row's real token k = c - (W - total): prompt, then response
        k = torch.arange(W, device=dev)[None, :] - (W - total)
        src = torch.where(k < plen, P - plen + k, P + k - plen).clamp(0, L - 1)
        real = k >= 0
        ids = torch.where(real, input_ids[rows].gather(1, src), torch.zeros_like(src))
        K = Tc + 1 if keep_kw else W  # logits of the last K columns: every response token's predictor
        out = model(
            input_ids=ids,
            attention_mask=real.long(),
            position_ids=k.clamp(min=0),
            use_cache=False,
            **({"logits_to_keep": K} if keep_kw else {}),
        )
        # response token j of a row is predicted at column W - rlen - 1 + j, i.e. K - rlen - 1 + j of the kept
        j = torch.arange(Tc, device=dev)[None, :]
        valid = j < rlen
        at = (K - rlen - 1 + j).clamp(0, K - 1)
        logits = out.logits.gather(1, at[..., None].expand(-1, -1, out.logits.shape[-1])).float()
        target = input_ids[rows, P : P + Tc]
        lp, ent = _logp_from_logits(logits, target, temperature, with_entropy)
        logp_BT[rows, :Tc] = torch.where(valid, lp, torch.zeros_like(lp))
        if ent_BT is not None and ent is not None:
            ent_BT[rows, :Tc] = torch.where(valid, ent, torch.zeros_like(ent))
    return logp_BT, ent_BT


def shared_prompts(prompt_ids_BP: Any, prompt_mask_BP: Any) -> tuple[Any, Any] | None:
    """``(first_G, group_B)`` when the rows' prompts repeat (a GRPO group's responses share one prompt):
    row b's prompt is row ``first_G[group_B[b]]``'s. None when at most half of the rows share theirs
    (too little to save)."""
    import torch

    B = prompt_ids_BP.shape[0]
    key_BP = torch.where(prompt_mask_BP, prompt_ids_BP, torch.full_like(prompt_ids_BP, -1))
    uniq, group_B = torch.unique(key_BP, dim=0, return_inverse=True)
    G = uniq.shape[0]
    if 2 * G > B:
        return None
    first_G = torch.full((G,), B, dtype=torch.long, device=group_B.device)
    first_G = first_G.scatter_reduce(0, group_B, torch.arange(B, device=group_B.device), "amin")
    return first_G, group_B


def _shared_prefix_logprobs(
    model: Any,
    input_ids: Any,
    m: Any,
    shared: tuple[Any, Any],
    n_response: int,
    temperature: float,
    with_entropy: bool,
    rows_per_pass: int,
) -> tuple[Any, Any] | None:
    """:func:`token_logprobs` when rows share prompts: each distinct prompt goes through the model once
    (with gradient), and its rows' responses continue from its keys and values.

    The gradient is the same as with one copy of the prompt per row: a prompt's keys and values feed
    every row that reads them, so their gradients add up as the copies' would. GRPO's ``n`` responses
    per prompt then pay for the prompt once instead of ``n`` times (TRL and the padded pass run it per
    row). Response token 0 is predicted by the prompt's last position; token j > 0 by response token
    j - 1, so a row's last token is never fed. None when the model's cache is not a plain
    :class:`~transformers.DynamicCache` of full-attention layers (the caller then runs its own pass).
    """
    import torch
    from transformers.cache_utils import DynamicCache, DynamicLayer

    first_G, group_B = shared
    B, L = input_ids.shape
    P = L - n_response
    dev = input_ids.device
    keep_kw = takes_logits_to_keep(model)
    p_mask = m[first_G, :P]
    out = model(
        input_ids=input_ids[first_G, :P],
        attention_mask=p_mask.long(),
        position_ids=(p_mask.long().cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        **({"logits_to_keep": 1} if keep_kw else {}),
    )
    cache = out.past_key_values
    if not isinstance(cache, DynamicCache) or any(type(x) is not DynamicLayer for x in cache.layers):
        return None
    kv = [(x.keys, x.values) for x in cache.layers if isinstance(x, DynamicLayer)]
    first_logits_G1V = out.logits[:, -1:, :]
    plen_B, rlen_B = m[:, :P].sum(1), m[:, P:].sum(1)
    logp_BT = torch.zeros((B, n_response), dtype=torch.float32, device=dev)
    ent_BT = torch.zeros((B, n_response), dtype=torch.float32, device=dev) if with_entropy else None
    for rows in torch.argsort(rlen_B, stable=True).split(max(1, rows_per_pass)):
        Tc = int(rlen_B[rows].max())
        if Tc == 0:
            continue
        g = group_B[rows]
        logits = first_logits_G1V[g]
        if Tc > 1:
            rows_cache = DynamicCache()
            for i, (k, v) in enumerate(kv):
                assert k is not None and v is not None
                rows_cache.update(k[g], v[g], i)
            j = torch.arange(Tc - 1, device=dev)[None, :]
            more = model(
                input_ids=input_ids[rows, P : P + Tc - 1],
                attention_mask=m[rows, : P + Tc - 1].long(),
                position_ids=plen_B[rows, None] + j,
                past_key_values=rows_cache,
                use_cache=True,
            )
            logits = torch.cat([logits, more.logits], dim=1)
        valid = torch.arange(Tc, device=dev)[None, :] < rlen_B[rows, None]
        lp, ent = _logp_from_logits(logits.float(), input_ids[rows, P : P + Tc], temperature, with_entropy)
        logp_BT[rows, :Tc] = torch.where(valid, lp, torch.zeros_like(lp))
        if ent_BT is not None and ent is not None:
            ent_BT[rows, :Tc] = torch.where(valid, ent, torch.zeros_like(ent))
    return logp_BT, ent_BT


def takes_logits_to_keep(model: Any) -> bool:
    """Does the model's forward take ``logits_to_keep`` (transformers' causal LMs do)? A peft model
    (LoRA) and the adapters-off reference pass it on to the model they wrap."""
    import inspect

    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    try:
        # the class's forward: an instance may wrap it (``use_bf16_autocast``)
        return "logits_to_keep" in inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False


def _logp_from_logits(logits: Any, target: Any, temperature: float, with_entropy: bool) -> tuple[Any, Any]:
    import torch

    if temperature != 1.0:
        logits = logits / temperature
    # log p(y) = z_y - logsumexp(z): no [B, T, V] log-softmax tensor is materialised (nor kept for the
    # backward pass), which matters at real vocabularies (SmolLM2: 49,152)
    lse_BT = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - lse_BT
    ent = None
    if with_entropy:
        # H = logsumexp(z) - sum_v p_v z_v
        ent = lse_BT - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, ent


def _padded_logprobs(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    n_response: int,
    temperature: float,
    with_entropy: bool,
    cache_out: list[Any] | None,
) -> tuple[Any, Any]:
    """The straightforward pass over the batch as laid out (padding included)."""
    import torch

    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    keep = {"logits_to_keep": n_response + 1} if takes_logits_to_keep(model) else {}
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=pos,
        use_cache=cache_out is not None,
        **keep,
    )
    if cache_out is not None:
        cache_out.append(out.past_key_values)
    logits = out.logits[:, -n_response - 1 : -1, :].float()
    logp, ent = _logp_from_logits(logits, input_ids[:, -n_response:], temperature, with_entropy)
    mask = attention_mask[:, -n_response:].bool()
    logp = torch.where(mask, logp, torch.zeros_like(logp))
    if ent is not None:
        ent = torch.where(mask, ent, torch.zeros_like(ent))
    return logp, ent
