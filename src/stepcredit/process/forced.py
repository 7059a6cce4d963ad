"""Forced-answer values: V(prefix) as the policy's mean log-probability of the gold answer forced after it.

After the prefix, append a force-answer prompt and the gold answer and take the mean log-probability
of the answer tokens:

    V(prefix) = 1/|a| * sum_j log p(a_j | prompt + prefix + force + a_<j)

This is the "forced answer" probe of training-free process rewards (the policy's own belief that the
prefix leads to the answer, as in VinePPO's value without rollouts, and the answer-probability probes
of e.g. Wang et al. 2024 "Math-Shepherd" / PRIME-style implicit rewards). Execution strategies
(:data:`STRATEGIES`: ``naive``, ``kv_cache``, ``packed_single``, ``kv_packed``, ``packed``) give the
same numbers at different costs; ``packed`` values all prefixes of a response in one evaluation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from stepcredit.errors import ConfigError, DataError
from stepcredit.process.values import PrefixRequest, ToolContext, ValueContext, register_value_estimator
from stepcredit.registry import Registry
from stepcredit.rollout.turns import observation_runs
from stepcredit.types import RolloutCache


# ------------------------------------------------------------------------------------ queries
@dataclass(frozen=True)
class ValueQuery:
    """Token-level form of one response for the forced-answer probe."""

    context_ids: list[int]
    """Prompt tokens."""
    response_ids: list[int]
    """Response tokens; only ``response_ids[:max(prefix_lens)]`` are read."""
    prefix_lens: list[int]
    """Response tokens seen by each evaluation."""
    suffix_ids: list[int]
    """Force prompt followed by the answer, tokenised together."""
    n_answer: int
    """The last ``n_answer`` suffix tokens are the answer (scored); at least one force token precedes."""

    def __post_init__(self) -> None:
        if not 0 < self.n_answer < len(self.suffix_ids):
            raise ValueError(
                f"need 0 < n_answer < len(suffix_ids), got {self.n_answer}, {len(self.suffix_ids)}"
            )
        if any(not 0 <= n <= len(self.response_ids) for n in self.prefix_lens):
            raise ValueError("prefix_lens must lie in [0, len(response_ids)]")


def resolve_force_prompt(tokenizer: Any, force_prompt: str) -> str:
    """``auto`` follows the chat format: thinking models close their thoughts before answering."""
    if force_prompt != "auto":
        return force_prompt
    template = getattr(tokenizer, "chat_template", None) or ""
    return "</think>\n\nThe answer is " if "</think>" in str(template) else "\nThe answer is "


def answer_suffix(tokenizer: Any, force: str, answer: str) -> tuple[list[int], int]:
    """(tok(force + answer), number of answer tokens).

    The answer tokens are tok(force + answer) minus tok(force); when tokenising the two together merges
    across the seam (e.g. " " + "42" -> " 42"), the tokens after their longest common prefix count.
    """
    both = list(tokenizer(force + answer, add_special_tokens=False)["input_ids"])
    alone = list(tokenizer(force, add_special_tokens=False)["input_ids"])
    k = 0
    while k < min(len(both), len(alone)) and both[k] == alone[k]:
        k += 1
    return both, len(both) - k


def request_suffixes(
    tokenizer: Any,
    requests: Sequence[PrefixRequest],
    force_prompt: str,
    *,
    row: Callable[[int, PrefixRequest], str],
    key: str,
) -> list[tuple[list[int], int]]:
    """:func:`answer_suffix` of every request's gold answer (each distinct answer tokenised once).

    DataError for an answer without tokens (named by ``row(index, request)``); ConfigError, naming the
    config ``key``, when the force prompt merges entirely with an answer.
    """
    force = resolve_force_prompt(tokenizer, force_prompt)
    cache: dict[str, tuple[list[int], int]] = {}
    out = []
    for b, r in enumerate(requests):
        if r.answer not in cache:
            cache[r.answer] = answer_suffix(tokenizer, force, r.answer)
        suffix, n_answer = cache[r.answer]
        if n_answer == 0:
            raise DataError(f"{row(b, r)}: the gold answer {r.answer!r} has no tokens")
        if n_answer == len(suffix):
            raise ConfigError(
                f"config key {key}: {force!r} merges entirely with the answer {r.answer!r} "
                "when tokenised; end it with a separator"
            )
        out.append((suffix, n_answer))
    return out


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _answer_logp(logits_KV: torch.Tensor, targets_K: torch.Tensor) -> float:
    logp = torch.log_softmax(logits_KV.float(), dim=-1)
    return float(logp.gather(-1, targets_K.unsqueeze(-1)).mean())


# --------------------------------------------------------------------- forced answer: strategies
class Strategy(Protocol):
    """``(model, queries, max_tokens, body=None) -> values``; ``body`` is the rollout's cache over the
    queries' prompt + response tokens, which a strategy may use or ignore."""

    def __call__(
        self, model: Any, queries: Sequence[ValueQuery], max_tokens: int, body: RolloutCache | None = None
    ) -> list[list[float]]: ...


STRATEGIES: Registry[Strategy] = Registry("value strategy")


@STRATEGIES.register("naive")
def _naive(
    model: Any, queries: Sequence[ValueQuery], max_tokens: int, body: RolloutCache | None = None
) -> list[list[float]]:
    """One forward pass per prefix over prompt + prefix + suffix (the reference)."""
    dev = _device(model)
    out = []
    for q in queries:
        vals = []
        tgt = torch.tensor(q.suffix_ids[-q.n_answer :], device=dev)
        for n in q.prefix_lens:
            ids = torch.tensor([q.context_ids + q.response_ids[:n] + q.suffix_ids], device=dev)
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=q.n_answer + 1).logits
            vals.append(_answer_logp(logits[0, :-1], tgt))
        out.append(vals)
    return out


def _shallow(cache: Any) -> Any:
    """A cache sharing ``cache``'s tensors; a pass that appends to it leaves ``cache`` as it was."""
    c = copy.copy(cache)
    c.layers = [copy.copy(layer) for layer in cache.layers]
    return c


def _cropped(cache: Any, length: int) -> Any:
    # A shallow copy shares the tensors; crop re-slices (a view) and the suffix pass concatenates into
    # new tensors, so the full cache is never modified and never copied.
    c = _shallow(cache)
    drop = c.get_seq_length() - length
    if drop > 0:  # crop(-k) drops the last k tokens (newer transformers accept only a negative k)
        c.crop(-drop)
    return c


@STRATEGIES.register("kv_cache")
def _kv_cache(
    model: Any, queries: Sequence[ValueQuery], max_tokens: int, body: RolloutCache | None = None
) -> list[list[float]]:
    """One pass over prompt + response, then each suffix on a cropped copy of its cache."""
    dev = _device(model)
    out = []
    for q in queries:
        ctx = q.context_ids + q.response_ids[: max(q.prefix_lens)]
        cache = None
        if ctx:
            cache = model(
                input_ids=torch.tensor([ctx], device=dev), use_cache=True, logits_to_keep=1
            ).past_key_values
        tgt = torch.tensor(q.suffix_ids[-q.n_answer :], device=dev)
        suffix = torch.tensor([q.suffix_ids], device=dev)
        a = len(q.suffix_ids)
        vals = []
        for n in q.prefix_lens:
            start = len(q.context_ids) + n
            past = _cropped(cache, start) if cache is not None and start > 0 else None
            pos = torch.arange(start, start + a, device=dev).unsqueeze(0)
            logits = model(
                input_ids=suffix, position_ids=pos, past_key_values=past, use_cache=True, logits_to_keep=a
            ).logits
            vals.append(_answer_logp(logits[0, a - q.n_answer - 1 : a - 1], tgt))
        out.append(vals)
    return out


def packed_layout(q: ValueQuery) -> tuple[list[int], list[int], list[tuple[int, int, int]]]:
    """Tokens, position ids and hidden key ranges of one packed sequence.

    Layout: prompt + response[:max(prefix_lens)] + N copies of the suffix. Suffix copy i sees the
    first ``P + prefix_lens[i]`` tokens and itself (causally) and is positioned right after them, so
    every copy computes exactly what a separate forward over prompt + prefix_i + suffix would. On top of
    the causal mask, copy i's rows ``[r, r + A)`` must not see keys ``[P + prefix_lens[i], r)``: those
    ranges are returned as ``(r, A, P + prefix_lens[i])``.
    """
    p, a = len(q.context_ids), len(q.suffix_ids)
    body = p + max(q.prefix_lens)
    ids = q.context_ids + q.response_ids[: body - p] + q.suffix_ids * len(q.prefix_lens)
    pos = list(range(body))
    hidden = []
    for i, n in enumerate(q.prefix_lens):
        pos.extend(range(p + n, p + n + a))
        hidden.append((body + i * a, a, p + n))
    return ids, pos, hidden


def packed_mask(
    layouts: Sequence[tuple[list[int], list[int], list[tuple[int, int, int]]]], dtype: torch.dtype
) -> torch.Tensor:
    """Additive mask [B, 1, W, W] (0 = may attend, dtype min = may not) of left-padded packed rows.

    Additive float, not boolean: transformers passes a 4D mask through as given and eager attention
    adds it to the scores, where a boolean mask would be silently wrong (see NOTES). Padding rows see
    only themselves, so no softmax row is empty.
    """
    width = max(len(ids) for ids, _, _ in layouts)
    neg = torch.finfo(dtype).min
    causal = torch.full((width, width), neg, dtype=dtype).triu_(1)
    mask = torch.full((len(layouts), 1, width, width), neg, dtype=dtype)
    for r, (ids, _, hidden) in enumerate(layouts):
        off = width - len(ids)
        sub = mask[r, 0, off:, off:]
        sub.copy_(causal[: len(ids), : len(ids)])
        for row, n_rows, key_from in hidden:
            sub[row : row + n_rows, key_from:row] = neg
        mask[r, 0].diagonal()[:off] = 0
    return mask


def _packed_groups(queries: Sequence[ValueQuery], max_tokens: int) -> list[list[int]]:
    lengths = [
        len(q.context_ids) + max(q.prefix_lens) + len(q.suffix_ids) * len(q.prefix_lens) for q in queries
    ]
    order = sorted(range(len(queries)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        # sorted by length, so the first member of a group is its longest (its padded width)
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@STRATEGIES.register("packed_single")
def _packed_one_call(
    model: Any, queries: Sequence[ValueQuery], max_tokens: int, body: RolloutCache | None = None
) -> list[list[float]]:
    """One forward pass per response (several responses per pass, up to ``max_tokens`` padded tokens)
    over prompt + response + N suffixes, with the mask of :func:`packed_mask`.

    Rows are left-padded so every row's suffix copies sit at the end and one ``logits_to_keep``
    covers them.
    """
    dev = _device(model)
    dtype = next(model.parameters()).dtype
    out: list[list[float]] = [[] for _ in queries]
    for group in _packed_groups(queries, max_tokens):
        layouts = [packed_layout(queries[i]) for i in group]
        mask = packed_mask(layouts, dtype)
        width = mask.shape[-1]
        ids_BM = torch.zeros(len(group), width, dtype=torch.long)
        pos_BM = torch.zeros(len(group), width, dtype=torch.long)
        for r, (ids, pos, _) in enumerate(layouts):
            ids_BM[r, width - len(ids) :] = torch.tensor(ids)
            pos_BM[r, width - len(ids) :] = torch.tensor(pos)
        keep = max(len(queries[i].suffix_ids) * len(queries[i].prefix_lens) for i in group)
        logits = model(
            input_ids=ids_BM.to(dev),
            position_ids=pos_BM.to(dev),
            attention_mask=mask.to(dev),
            use_cache=False,
            logits_to_keep=keep,
        ).logits
        for r, qi in enumerate(group):
            q = queries[qi]
            a, n_s = len(q.suffix_ids), len(q.prefix_lens)
            tgt = torch.tensor(q.suffix_ids[-q.n_answer :], device=dev)
            base = keep - a * n_s
            for i in range(n_s):
                s = base + i * a
                out[qi].append(_answer_logp(logits[r, s + a - q.n_answer - 1 : s + a - 1], tgt))
    return out


def _select_rows(cache: Any, idx: list[int]) -> Any:
    """A cache holding only rows ``idx`` (new tensors; ``cache`` itself is never modified)."""
    c = _shallow(cache)
    index = torch.tensor(idx, dtype=torch.long, device=cache.layers[0].keys.device)
    for layer in c.layers:
        layer.keys = layer.keys.index_select(0, index)
        layer.values = layer.values.index_select(0, index)
    return c


def _suffix_pass(
    model: Any, cache: Any, width: int, queries: Sequence[ValueQuery], starts: Sequence[int]
) -> list[list[float]]:
    """All N suffixes of every query in one pass over a cache of their prompt + response tokens.

    Row r of ``cache`` (``width`` columns) holds query r's prompt from column ``starts[r]`` on, then its
    response. Suffix copy i of query r sees columns ``[starts[r], starts[r] + P + prefix_lens[i])`` and
    itself (causally), at positions ``P + prefix_lens[i] + j``: exactly what a separate forward over
    prompt + prefix_i + suffix computes. The cache is consumed (the pass appends to it).
    """
    dev = _device(model)
    dtype = next(model.parameters()).dtype
    neg = torch.finfo(dtype).min
    b = len(queries)
    ws = max(len(q.suffix_ids) * len(q.prefix_lens) for q in queries)
    suf_ids = torch.zeros(b, ws, dtype=torch.long)
    suf_pos = torch.zeros(b, ws, dtype=torch.long)
    mask = torch.full((b, 1, ws, width + ws), neg, dtype=dtype)
    for r, (q, s0) in enumerate(zip(queries, starts, strict=True)):
        p, a, n_s = len(q.context_ids), len(q.suffix_ids), len(q.prefix_lens)
        suf_ids[r, : a * n_s] = torch.tensor(q.suffix_ids * n_s, dtype=torch.long)
        own = torch.full((a, a), neg, dtype=dtype).triu_(1)
        for i, n in enumerate(q.prefix_lens):
            suf_pos[r, i * a : (i + 1) * a] = torch.arange(p + n, p + n + a)
            mask[r, 0, i * a : (i + 1) * a, s0 : s0 + p + n] = 0
            mask[r, 0, i * a : (i + 1) * a, width + i * a : width + (i + 1) * a] = own
        idx = torch.arange(a * n_s, ws)
        mask[r, 0, idx, width + idx] = 0  # padding queries see themselves only
    logits = model(
        input_ids=suf_ids.to(dev),
        position_ids=suf_pos.to(dev),
        attention_mask=mask.to(dev),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=ws,
    ).logits
    out = []
    for r, q in enumerate(queries):
        a = len(q.suffix_ids)
        tgt = torch.tensor(q.suffix_ids[-q.n_answer :], device=dev)
        out.append(
            [
                _answer_logp(logits[r, i * a + a - q.n_answer - 1 : i * a + a - 1], tgt)
                for i in range(len(q.prefix_lens))
            ]
        )
    return out


def _on_rollout_cache(
    model: Any, queries: Sequence[ValueQuery], max_tokens: int, body: RolloutCache
) -> list[list[float]]:
    """Suffix passes over the rollout's own cache, all rows at once when they fit the budget."""
    if len(body.starts) != len(queries):
        raise ValueError(f"the rollout cache holds {len(body.starts)} rows for {len(queries)} responses")
    ws = max(len(q.suffix_ids) * len(q.prefix_lens) for q in queries)
    # The keys are in memory already; a pass adds its suffix tokens and a [rows, ws, width + ws] mask:
    # at most max_tokens suffix tokens and max_tokens * 1024 mask entries per pass.
    per = max(1, min(max_tokens // ws, max_tokens * 1024 // (ws * (body.width + ws))))
    if per >= len(queries):
        return _suffix_pass(model, _shallow(body.cache), body.width, queries, body.starts)
    out: list[list[float]] = []
    for s in range(0, len(queries), per):
        idx = list(range(s, min(s + per, len(queries))))
        out += _suffix_pass(
            model,
            _select_rows(body.cache, idx),
            body.width,
            queries[s : idx[-1] + 1],
            body.starts[s : idx[-1] + 1],
        )
    return out


@STRATEGIES.register("kv_packed")
def _kv_packed(
    model: Any, queries: Sequence[ValueQuery], max_tokens: int, body: RolloutCache | None = None
) -> list[list[float]]:
    """Two calls: a causal pass over prompt + response that keeps its cache, then all N suffixes of
    every response in one pass over that cache (4D mask, explicit positions).

    The long first call needs no custom mask (right padding only, so sdpa keeps its causal kernel) and
    only the N*A suffix queries pay for the dense mask. With ``body`` (the cache of the rollout's
    behaviour log-prob pass over the same tokens) the first call is skipped altogether.
    """
    if body is not None:
        return _on_rollout_cache(model, queries, max_tokens, body)
    dev = _device(model)
    out: list[list[float]] = [[] for _ in queries]
    for group in _packed_groups(queries, max_tokens):
        qs = [queries[i] for i in group]
        bodies = [len(q.context_ids) + max(q.prefix_lens) for q in qs]
        wb = max(bodies)
        body_ids = torch.zeros(len(qs), wb, dtype=torch.long)
        body_att = torch.zeros(len(qs), wb, dtype=torch.long)
        for r, (q, n) in enumerate(zip(qs, bodies, strict=True)):
            body_ids[r, :n] = torch.tensor(q.context_ids + q.response_ids[: n - len(q.context_ids)])
            body_att[r, :n] = 1
        if wb == 0:  # nothing before the suffixes: a zero-width cache
            vals = _packed_one_call(model, qs, max_tokens)
        else:
            cache = model(
                input_ids=body_ids.to(dev),
                attention_mask=body_att.to(dev) if any(n != wb for n in bodies) else None,
                use_cache=True,
                logits_to_keep=1,
            ).past_key_values
            vals = _suffix_pass(model, cache, wb, qs, [0] * len(qs))
        for qi, v in zip(group, vals, strict=True):
            out[qi] = v
    return out


# Below this many tokens before the suffixes, one call with the dense mask beats two calls (the
# second call's fixed cost dominates); above it, the causal kernel over the body wins. Measured with
# benchmarks/process_values.py: one call 19.0 ms vs two 23.1 ms at 200 tokens (tiny model), 565 vs
# 678 ms on a 110M Llama; two calls 74.5 vs 95.6 ms at 800 tokens and 233 vs 398 ms at 2048.
ONE_CALL_MAX_BODY = 384


@STRATEGIES.register("packed")
def _packed(
    model: Any, queries: Sequence[ValueQuery], max_tokens: int, body: RolloutCache | None = None
) -> list[list[float]]:
    """All prefixes of a response in one packed evaluation: the response's tokens are run once and all
    N force-answer suffixes attend to them through an additive 4D mask with explicit positions.

    With the rollout's cache (``body``) only the suffixes run. Otherwise short responses go in one
    call (``packed_single``) and long ones as a causal pass plus a suffix pass over its cache
    (``kv_packed``): same values, the layout that costs less at that length.
    """
    if body is not None:
        return _on_rollout_cache(model, queries, max_tokens, body)
    short = [i for i, q in enumerate(queries) if len(q.context_ids) + max(q.prefix_lens) <= ONE_CALL_MAX_BODY]
    is_short = set(short)
    long = [i for i in range(len(queries)) if i not in is_short]
    out: list[list[float]] = [[] for _ in queries]
    for part, fn in ((short, _packed_one_call), (long, _kv_packed)):
        if part:
            for qi, v in zip(part, fn(model, [queries[i] for i in part], max_tokens), strict=True):
                out[qi] = v
    return out


def forced_answer_values(
    model: Any,
    queries: Sequence[ValueQuery],
    *,
    strategy: str = "packed",
    max_tokens_per_forward: int = 8192,
    body: RolloutCache | None = None,
) -> list[list[float]]:
    """V for every prefix of every query, by the named execution strategy (all give the same values).
    ``body``: the rollout's cache over the queries' prompt + response tokens (row r = query r)."""
    if not queries:
        return []
    with torch.no_grad():
        return STRATEGIES.get(strategy)(model, queries, max_tokens_per_forward, body)


def past_results(
    tokenizer: Any, requests: Sequence[PrefixRequest], tools: ToolContext
) -> list[PrefixRequest]:
    """The requests with each prefix that ends at a call (a turn's end) extended over the call's result,
    which follows it in the response (the rollout's own result tokens, as it marked them in
    ``observed``): a forced answer at a turn's end then reads the result, as a continuation from there
    does after running the call."""
    out = []
    for r in requests:
        result_end = dict(observation_runs(r.observed))  # where a result starts -> where it ends (tokens)
        out.append(replace(r, prefix_lens=[result_end.get(n, n) if n > 0 else n for n in r.prefix_lens]))
    return out


# a mean log-probability (<= 0, on the answer's own scale), not a chance of success: blame cannot read it
@register_value_estimator(
    "forced_answer_logprob",
    needs_verifier=False,
    generates=False,
    success_probability=False,
    takes_tools=True,
)
def forced_answer_logprob(ctx: ValueContext) -> list[list[float]]:
    """Mean log-prob of the gold answer after each prefix and a force-answer prompt (``ctx.body``: the
    rollout's cache of the same responses, which the packed strategies continue from). On a tool
    rollout (``ctx.tools``) a prefix that ends at a call is valued after its result (:func:`past_results`):
    the answer a call's turn leads to is read from the result, not computed before it."""
    tokenizer, requests, cfg = ctx.tokenizer, ctx.requests, ctx.cfg
    if ctx.tools is not None:
        requests = past_results(tokenizer, requests, ctx.tools)

    def where(_b: int, r: PrefixRequest) -> str:  # the row an error names
        return f"sample {r.sample.uid or '?'}"

    suffixes = request_suffixes(tokenizer, requests, cfg.force_prompt, row=where, key="process.force_prompt")
    queries = [
        ValueQuery(r.prompt_ids, r.response_ids, r.prefix_lens, suffix, n_answer)
        for r, (suffix, n_answer) in zip(requests, suffixes, strict=True)
    ]
    return forced_answer_values(
        ctx.model,
        queries,
        strategy=cfg.strategy,
        max_tokens_per_forward=cfg.max_tokens_per_forward,
        body=ctx.body,
    )
