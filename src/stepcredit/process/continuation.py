"""Continuation values: V(prefix) as the mean verifier score of the policy's continuations of the prefix.

* ``monte_carlo`` - VinePPO (Kazemnejad et al. 2024, arXiv:2410.01679, section 4): K continuations
  sampled from each prefix, V = mean verifier reward. Unbiased but K generations per prefix.
* ``greedy_continuation`` - the cheap continuation value: one greedy continuation per prefix scored by
  the verifier (V in {0, 1}); Math-Shepherd's "hard estimation" (Wang et al. 2024, arXiv:2312.08935)
  with a single deterministic completer instead of N sampled ones.

Every continuation is sampled by the engine bound to the policy (:func:`stepcredit.rollout.engines.engine_for`:
our decode loop, or vLLM), as every other generating stage is. Every text a batch needs scored
(continuations, complete responses) goes to the batched verifier
(:data:`~stepcredit.process.values.ScoreFn`) in one call, after the generation.

On a tool rollout (``rollout.mode=tools``, ``tools`` given) a continuation is a tool rollout from the
prefix (:func:`stepcredit.rollout.turns.run_turns`, the rollout's own turn loop): a prefix that ends at
a call (a turn's end) first gets that call run and its result appended, then turns go on with the
rollout's tools, parser and runner, its turn limit less the calls already in the prefix, and its length
budget (results count) capped at ``process.mc_max_new_tokens`` past the prefix. So V(prefix) is the
value under the policy that has the tool, which the rollout is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Unpack

from stepcredit.process.continuation_plan import (
    Context,
    Plan,
    Slot,
    answer_end,
    make_plan,
    mc_prefix_indices,
)
from stepcredit.process.values import (
    Capabilities,
    ValueContext,
    ValueEstimator,
    count_generated,
    count_verified,
    register_value_estimator,
)
from stepcredit.rollout.engines import CachedContexts, SamplingSpec, engine_for, sample_cached
from stepcredit.rollout.turns import resume_row, run_turns


def continuation_values(
    ctx: ValueContext, *, samples: int, greedy: bool, temperature: float, v0_from_group: bool = False
) -> list[list[float]]:
    """V(prefix) = mean verifier score of ``samples`` continuations of prompt + prefix by the policy, at
    most ``process.mc_prefixes`` prefixes per response, each at most ``process.mc_max_new_tokens`` long.

    Batched over the whole batch: every prefix to estimate becomes ``samples`` continuations in one
    engine call (as many contexts per call as ``process.max_tokens_per_forward`` allows); identical
    contexts (V_0 of the responses of one prompt) are continued once and shared. The full prefix of a
    response that ended by itself is scored as it is: its value is its own reward. Every text
    (continuations, whole responses) goes to the verifier in one call, after the generation.

    Where the task marks its answer (``stepcredit.data.ANSWER_ENDS``, e.g. arith's "The answer is 7."),
    a continuation stops at the token that completes the marker (the task's contract: the response is
    finished there), and a prefix that already holds the marker is worth the response's own reward.
    Greedy continuations (``greedy``) of later prefixes of a response that the earlier prefix's
    continuation already wrote are shared, not generated again (:mod:`.continuation_plan`); the
    accounting (:func:`count_generated`) counts the tokens actually generated.

    ``v0_from_group``: the other responses of the batch to the same prompt are already samples of the
    policy from the bare prompt, so V_0 of a response is their mean reward (leave-one-out, the RLOO
    baseline of Ahmadian et al. 2024, arXiv:2402.14740) and costs no generation. The utilities then
    telescope to R - mean(R of the others): the process channel's sum is the RLOO outcome advantage.

    ``ctx.tools``: the responses are a tool rollout's, and each continuation is one too (the module's
    docstring); ``process.mc_max_new_tokens`` then caps a continuation's tokens, results included.
    """
    cfg = ctx.cfg
    plan = make_plan(
        ctx.requests, ctx.tokenizer, cfg.mc_prefixes, v0_from_group, greedy and ctx.tools is None
    )
    k = 1 if greedy else samples
    spec = SamplingSpec(n=k, temperature=0.0 if greedy else temperature, max_tokens=cfg.mc_max_new_tokens)
    conts = generate_continuations(ctx, plan.todo, spec)
    for context, owners in plan.todo.items():
        plan.add_continuations(context, owners, conts[context])
    left = plan.resolve(conts, cfg.mc_max_new_tokens)  # shares the tokens did not bear out
    more = generate_continuations(ctx, left, spec)
    for context, owners in left.items():
        plan.add_continuations(context, owners, more[context])
    count_verified(len(plan.texts))
    scores = [float(x) for x in ctx.verifier(plan.to_score, plan.texts)] if plan.texts else []
    if len(scores) != len(plan.texts):
        raise ValueError(f"the verifier returned {len(scores)} scores for {len(plan.texts)} texts")
    return _values(plan, scores, k, cfg.mc_prefixes)


def generate_continuations(
    ctx: ValueContext, todo: dict[Context, list[Slot]], spec: SamplingSpec
) -> dict[Context, list[list[int]]]:
    """``spec.n`` continuations of every context of ``todo`` (each stopping at its task's answer marker,
    except on a tool rollout), as many contexts per engine call as ``process.max_tokens_per_forward``
    allows; every token generated is counted (the experiment's compute accounting)."""
    cfg, k = ctx.cfg, spec.n
    by_marker: dict[str, list[tuple[Context, list[Slot]]]] = {}
    for context, owners in todo.items():
        marker = answer_end(ctx.requests[owners[0][0]].sample) if ctx.tools is None else ""
        by_marker.setdefault(marker, []).append((context, owners))
    out: dict[Context, list[list[int]]] = {}
    for marker, jobs in by_marker.items():
        longest = max(len(c) for c, _ in jobs) + cfg.mc_max_new_tokens
        per_call = max(1, cfg.max_tokens_per_forward // (longest * k))
        for s in range(0, len(jobs), per_call):
            chunk = jobs[s : s + per_call]
            rows = _continue(ctx, chunk, replace(spec, stop_pattern=marker))
            count_generated(sum(len(r) for r in rows))
            out.update((c, rows[j * k : (j + 1) * k]) for j, (c, _) in enumerate(chunk))
    return out


def _continue(
    ctx: ValueContext, chunk: Sequence[tuple[Context, list[tuple[int, int]]]], spec: SamplingSpec
) -> list[list[int]]:
    """``spec.n`` continuations of each context of ``chunk`` (context-major), as the tokens after it: by
    the policy's engine, or on a tool rollout by the rollout's own turn loop (which samples through the
    same engine)."""
    body = ctx.body
    if ctx.tools is None and body is not None and len(body.starts) == len(ctx.requests):
        # the rollout's cache holds every context's prompt and prefix (a context's owners share them)
        cached = CachedContexts(body, tuple(owners[0][0] for _, owners in chunk), tuple(c for c, _ in chunk))
        return [c.ids for c in sample_cached(ctx.model, ctx.tokenizer, cached, spec)]
    if ctx.tools is None:
        comps = engine_for(ctx.model).sample(ctx.model, ctx.tokenizer, [list(c) for c, _ in chunk], spec)
        return [c.ids for c in comps]
    tools = ctx.tools
    rows, starts = [], []
    for _, owners in chunk:
        r = ctx.requests[owners[0][0]]  # the owners of one context share its prompt and prefix
        n = r.prefix_lens[owners[0][1]]
        limit = min(tools.max_new_tokens, n + spec.max_tokens)
        # the prefix's results are the ones the rollout marked when it appended them (r.observed)
        marks = list(r.observed[:n]) if r.observed else [False] * n
        for _ in range(spec.n):
            rows.append(
                resume_row(
                    ctx.tokenizer,
                    r.prompt_ids,
                    r.sample,
                    r.response_ids[:n],
                    tools,
                    observed=marks,
                    limit=limit,
                )
            )
            starts.append(n)
    run_turns(ctx.model, ctx.tokenizer, rows, tools, temperature=spec.temperature)
    return [row.ids[n:] for row, n in zip(rows, starts, strict=True)]  # what the loop appended


def _values(plan: Plan, scores: list[float], k: int, max_prefixes: int) -> list[list[float]]:
    """Each request's values from the scored texts of its plan."""
    out: list[list[float]] = [[0.0] * len(r.prefix_lens) for r in plan.requests]
    for ri, members in plan.group_v0:
        # leave-one-out: the mean reward of the other responses to the same prompt
        total = sum(scores[plan.whole[m]] for m in members)
        out[ri][0] = (total - scores[plan.whole[ri]]) / (len(members) - 1)
    for ri, pi in plan.is_whole:
        out[ri][pi] = scores[plan.whole[ri]]
    for ri, pi, first in plan.continued:
        out[ri][pi] = sum(scores[first : first + k]) / k
    for ri, r in enumerate(plan.requests):  # prefixes left out repeat the estimated value before them
        chosen = set(mc_prefix_indices(len(r.prefix_lens), max_prefixes))
        for pi in range(1, len(r.prefix_lens)):
            if pi not in chosen:
                out[ri][pi] = out[ri][pi - 1]
    return out


def continuation_estimator(
    name: str, **more: Unpack[Capabilities]
) -> Callable[[ValueEstimator], ValueEstimator]:
    """Register a continuation value: it samples from the policy and scores text with the verifier, and
    its V is a chance of success whose value after a complete response is that response's reward."""
    caps = Capabilities(
        needs_verifier=True, generates=True, terminal_is_reward=True, success_probability=True
    )
    return register_value_estimator(name, **(caps | more))


@continuation_estimator("monte_carlo", takes_tools=True)
def monte_carlo(ctx: ValueContext) -> list[list[float]]:
    """VinePPO's value (Kazemnejad et al. 2024, arXiv:2410.01679, section 4): V(prefix) = (1/K) sum_k
    R(prefix + y_k), y_k ~ policy(. | prompt + prefix), K = ``process.mc_samples``, at most
    ``process.mc_prefixes`` prefixes per response. A complete response's last value is its reward;
    with ``process.mc_v0=group`` V_0 is the leave-one-out mean reward of the other responses to the
    same prompt (no continuations sampled for it). On a tool rollout (``ctx.tools``) the continuations
    call tools as the rollout does."""
    c = ctx.cfg
    return continuation_values(
        ctx,
        samples=c.mc_samples,
        greedy=False,
        temperature=c.mc_temperature,
        v0_from_group=c.v0_from_group,
    )


@continuation_estimator("greedy_continuation", takes_tools=True)
def greedy_continuation(ctx: ValueContext) -> list[list[float]]:
    """One greedy continuation per prefix, scored by the verifier: V in {0, 1} (Math-Shepherd's hard
    estimate, Wang et al. 2024, arXiv:2312.08935, with one deterministic completer). K times
    cheaper than ``monte_carlo`` and without sampling noise, but blind to how likely other paths are.
    On a tool rollout (``ctx.tools``) the continuation calls tools as the rollout does."""
    return continuation_values(ctx, samples=1, greedy=True, temperature=1.0)
