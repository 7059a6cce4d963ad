"""Continuation values: V(prefix) as the mean verifier score of the policy's continuations of the prefix.

* ``monte_carlo`` - VinePPO (Kazemnejad et al. 2024, arXiv:2410.01679, section 4): K continuations
  sampled from each prefix, V = mean verifier reward. Unbiased but K generations per prefix.
* ``greedy_continuation`` - the cheap continuation value: one greedy continuation per prefix scored by
  the verifier (V in {0, 1}); Math-Shepherd's "hard estimation" (Wang et al. 2024, arXiv:2312.08935)
  with a single deterministic completer instead of N sampled ones.

Every text a batch needs scored (continuations, complete responses) goes to the batched verifier
(:data:`~stepcredit.process.values.ScoreFn`) in one call, after the generation.

On a tool rollout (``rollout.mode=tools``, ``tools`` given) a continuation is a tool rollout from the
prefix (:func:`stepcredit.rollout.turns.run_turns`, the rollout's own turn loop): a prefix that ends at
a call (a turn's end) first gets that call run and its result appended, then turns go on with the
rollout's tools, parser and runner, its turn limit less the calls already in the prefix, and its length
budget (results count) capped at ``process.mc_max_new_tokens`` past the prefix. So V(prefix) is the
value under the policy that has the tool, which the rollout is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from stepcredit.config import ProcessConfig
from stepcredit.errors import ConfigError
from stepcredit.process.values import (
    PrefixRequest,
    ScoreFn,
    ToolContext,
    count_generated,
    count_verified,
    register_value_estimator,
)
from stepcredit.rollout.engines import SamplingSpec, engine_for
from stepcredit.rollout.turns import resume_row, run_turns
from stepcredit.types import RolloutCache, Sample


def mc_prefix_indices(n_prefixes: int, max_prefixes: int) -> list[int]:
    """Which of V_0..V_(n-1) are estimated when at most ``max_prefixes`` may be (0 = all).

    Evenly spaced, always with the first and the last (V_0 and the value after the whole response),
    so the utilities still telescope to V_S - V_0; a prefix left out takes the value of the nearest
    estimated one before it (its step gets U = 0 and the next estimated step the whole change).
    """
    if max_prefixes <= 0 or n_prefixes <= max_prefixes:
        return list(range(n_prefixes))
    if max_prefixes == 1:
        return [n_prefixes - 1]
    step = (n_prefixes - 1) / (max_prefixes - 1)
    return sorted({round(i * step) for i in range(max_prefixes)})


def continuation_values(
    model: Any,
    tokenizer: Any,
    requests: Sequence[PrefixRequest],
    score_fn: ScoreFn,
    *,
    samples: int,
    greedy: bool,
    temperature: float,
    max_new_tokens: int,
    max_prefixes: int,
    max_tokens_per_forward: int,
    v0_from_group: bool = False,
    tools: ToolContext | None = None,
) -> list[list[float]]:
    """V(prefix) = mean verifier score of ``samples`` continuations of prompt + prefix by the policy.

    Batched over the whole batch: every prefix to estimate becomes ``samples`` rows of one left-padded
    ``generate`` call (as many rows per call as ``max_tokens_per_forward`` allows); identical contexts
    (V_0 of the responses of one prompt) are generated once and shared. The full prefix of a response
    that ended by itself is scored as it is: its value is its own reward. Every text (continuations, whole
    responses) goes to ``score_fn`` in one call, after the generation.

    ``v0_from_group``: the other responses of the batch to the same prompt are already samples of the
    policy from the bare prompt, so V_0 of a response is their mean reward (leave-one-out, the RLOO
    baseline of Ahmadian et al. 2024, arXiv:2402.14740) and costs no generation. The utilities then
    telescope to R - mean(R of the others): the process channel's sum is the RLOO outcome advantage.

    ``tools``: the responses are a tool rollout's, and each continuation is one too (the module's
    docstring); ``max_new_tokens`` then caps a continuation's tokens, results included.
    """
    dev = next(model.parameters()).device
    out: list[list[float]] = [[0.0] * len(r.prefix_lens) for r in requests]
    # Every text to score, in one list for one verifier call at the end: each request's whole response
    # at most once, then every continuation.
    to_score: list[Sample] = []
    texts: list[str] = []
    whole: dict[int, int] = {}  # request -> index of its whole response in texts

    def score_whole(ri: int) -> int:
        if ri not in whole:
            whole[ri] = len(texts)
            to_score.append(requests[ri].sample)
            texts.append(tokenizer.decode(requests[ri].response_ids, skip_special_tokens=True))
        return whole[ri]

    group_v0: list[tuple[int, list[int]]] = []  # (request, its group's members) for v0_from_group
    if v0_from_group:
        groups: dict[tuple[int, ...], list[int]] = {}
        for ri, r in enumerate(requests):
            groups.setdefault(tuple(r.prompt_ids), []).append(ri)
        for members in groups.values():
            if len(members) < 2:
                continue
            for ri in members:
                score_whole(ri)
            group_v0 += [(ri, members) for ri in members]
    from_group = {ri for ri, _ in group_v0}
    is_whole: list[tuple[int, int]] = []  # (request, prefix index) valued by the whole response's reward
    todo: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # context -> (request, prefix index)
    for ri, r in enumerate(requests):
        for pi in mc_prefix_indices(len(r.prefix_lens), max_prefixes):
            n = r.prefix_lens[pi]
            if pi == 0 and ri in from_group:
                continue
            if r.complete and n >= len(r.response_ids) - 1:
                score_whole(ri)
                is_whole.append((ri, pi))
            else:
                todo.setdefault(tuple(r.prompt_ids + r.response_ids[:n]), []).append((ri, pi))
    jobs = list(todo.items())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    k = 1 if greedy else samples
    longest = max((len(c) for c, _ in jobs), default=1) + max_new_tokens
    per_call = max(1, max_tokens_per_forward // (longest * k))
    continued: list[tuple[int, int, int]] = []  # (request, prefix index, first of its k texts)
    for s in range(0, len(jobs), per_call):
        chunk = jobs[s : s + per_call]
        width = max(len(c) for c, _ in chunk)
        ids = torch.full((len(chunk) * k, width), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for j, (c, _) in enumerate(chunk):
            ids[j * k : (j + 1) * k, width - len(c) :] = torch.tensor(c, dtype=torch.long)
            att[j * k : (j + 1) * k, width - len(c) :] = 1
        engine = engine_for(model)
        if tools is not None:
            rows = _tool_continuations(
                model, tokenizer, requests, chunk, tools, k, greedy, temperature, max_new_tokens
            )
        elif engine.external:  # the rollout engine (vLLM) samples the continuations, k per context
            spec = SamplingSpec(n=k, temperature=0.0 if greedy else temperature, max_tokens=max_new_tokens)
            comps = engine.sample(model, tokenizer, [list(c) for c, _ in chunk], spec)
            rows = [c.ids for c in comps]
        else:
            sampling: dict[str, Any] = (
                {"do_sample": False}
                if greedy
                else {"do_sample": True, "temperature": temperature, "top_p": 1.0}
            )
            gen = model.generate(
                input_ids=ids.to(dev),
                attention_mask=att.to(dev),
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
                **sampling,
            )
            rows = [gen[r, width:].tolist() for r in range(gen.shape[0])]
        rows = [_upto_eos(r, tokenizer.eos_token_id) for r in rows]
        count_generated(sum(len(r) for r in rows))  # the experiment's compute accounting
        for j, (_, owners) in enumerate(chunk):
            conts = [rows[j * k + kk] for kk in range(k)]
            for ri, pi in owners:
                r = requests[ri]
                head = r.response_ids[: r.prefix_lens[pi]]
                continued.append((ri, pi, len(texts)))
                to_score += [r.sample] * k
                texts += [tokenizer.decode(head + cont, skip_special_tokens=True) for cont in conts]
    count_verified(len(texts))
    scores = [float(x) for x in score_fn(to_score, texts)] if texts else []
    if len(scores) != len(texts):
        raise ValueError(f"the verifier returned {len(scores)} scores for {len(texts)} texts")
    for ri, members in group_v0:
        # leave-one-out: the mean reward of the other responses to the same prompt
        total = sum(scores[whole[m]] for m in members)
        out[ri][0] = (total - scores[whole[ri]]) / (len(members) - 1)
    for ri, pi in is_whole:
        out[ri][pi] = scores[whole[ri]]
    for ri, pi, first in continued:
        out[ri][pi] = sum(scores[first : first + k]) / k
    for ri, r in enumerate(requests):  # prefixes left out repeat the estimated value before them
        chosen = set(mc_prefix_indices(len(r.prefix_lens), max_prefixes))
        for pi in range(1, len(r.prefix_lens)):
            if pi not in chosen:
                out[ri][pi] = out[ri][pi - 1]
    return out


def _upto_eos(row: list[int], eos: int | None) -> list[int]:
    """A continuation's own tokens: up to and including its first eos (``generate`` pads finished rows)."""
    return row[: row.index(eos) + 1] if eos is not None and eos in row else row


def _tool_continuations(
    model: Any,
    tokenizer: Any,
    requests: Sequence[PrefixRequest],
    chunk: Sequence[tuple[tuple[int, ...], list[tuple[int, int]]]],
    tools: ToolContext,
    k: int,
    greedy: bool,
    temperature: float,
    max_new_tokens: int,
) -> list[list[int]]:
    """``k`` tool-rollout continuations of each context of ``chunk`` (context-major), as the tokens
    after the prefix (the pending call's result, the turns, their results)."""
    rows, starts = [], []
    for _, owners in chunk:
        r = requests[owners[0][0]]  # the owners of one context share its prompt and prefix
        n = r.prefix_lens[owners[0][1]]
        limit = min(tools.max_new_tokens, n + max_new_tokens)
        for _ in range(k):
            # the prefix's results are the ones the rollout marked when it appended them (r.observed)
            marks = list(r.observed[:n]) if r.observed else [False] * n
            rows.append(
                resume_row(
                    tokenizer, r.prompt_ids, r.sample, r.response_ids[:n], tools, observed=marks, limit=limit
                )
            )
            starts.append(n)
    run_turns(model, tokenizer, rows, tools, temperature=0.0 if greedy else temperature)
    return [row.ids[n:] for row, n in zip(rows, starts, strict=True)]  # what the loop appended


def _need_verifier(name: str, score_fn: ScoreFn | None) -> ScoreFn:
    if score_fn is None:
        raise ConfigError(f"config key process.value_estimator: {name} needs a verifier (score_fn)")
    return score_fn


@register_value_estimator(
    "monte_carlo",
    needs_verifier=True,
    generates=True,
    terminal_is_reward=True,
    success_probability=True,
    takes_tools=True,
)
def monte_carlo(
    model: Any,
    tokenizer: Any,
    requests: Sequence[PrefixRequest],
    cfg: ProcessConfig,
    *,
    score_fn: ScoreFn | None = None,
    body: RolloutCache | None = None,
    tools: ToolContext | None = None,
) -> list[list[float]]:
    """VinePPO's value (Kazemnejad et al. 2024, arXiv:2410.01679, section 4): V(prefix) = (1/K) sum_k
    R(prefix + y_k), y_k ~ policy(. | prompt + prefix), K = ``process.mc_samples``, at most
    ``process.mc_prefixes`` prefixes per response. A complete response's last value is its reward;
    with ``process.mc_v0=group`` V_0 is the leave-one-out mean reward of the other responses to the
    same prompt (no continuations sampled for it). On a tool rollout (``tools``) the continuations
    call tools as the rollout does."""
    return continuation_values(
        model,
        tokenizer,
        requests,
        _need_verifier("monte_carlo", score_fn),
        samples=cfg.mc_samples,
        greedy=False,
        temperature=cfg.mc_temperature,
        max_new_tokens=cfg.mc_max_new_tokens,
        max_prefixes=cfg.mc_prefixes,
        max_tokens_per_forward=cfg.max_tokens_per_forward,
        v0_from_group=cfg.mc_v0 == "group",
        tools=tools,
    )


@register_value_estimator(
    "greedy_continuation",
    needs_verifier=True,
    generates=True,
    terminal_is_reward=True,
    success_probability=True,
    takes_tools=True,
)
def greedy_continuation(
    model: Any,
    tokenizer: Any,
    requests: Sequence[PrefixRequest],
    cfg: ProcessConfig,
    *,
    score_fn: ScoreFn | None = None,
    body: RolloutCache | None = None,
    tools: ToolContext | None = None,
) -> list[list[float]]:
    """One greedy continuation per prefix, scored by the verifier: V in {0, 1} (Math-Shepherd's hard
    estimate, Wang et al. 2024, arXiv:2312.08935, with one deterministic completer). K times
    cheaper than ``monte_carlo`` and without sampling noise, but blind to how likely other paths are.
    On a tool rollout (``tools``) the continuation calls tools as the rollout does."""
    return continuation_values(
        model,
        tokenizer,
        requests,
        _need_verifier("greedy_continuation", score_fn),
        samples=1,
        greedy=True,
        temperature=1.0,
        max_new_tokens=cfg.mc_max_new_tokens,
        max_prefixes=cfg.mc_prefixes,
        max_tokens_per_forward=cfg.max_tokens_per_forward,
        tools=tools,
    )
