"""``greedy_bisect``: greedy-continuation values only at the boundaries that matter, found by bisection.

``greedy_continuation`` continues every prefix of every response: a response of n steps costs up to n
continuations. Its values are verdicts (one greedy continuation, scored); along most responses they
change at most once, where a slip the greedy policy cannot recover from is made (or a step that
rescues what it could not solve). This estimator spends continuations only where that change is:

1. V_0 from one greedy continuation of the bare prompt (identical contexts are continued once, so one
   per prompt), and V_S, the value of the whole response (its reward when it is complete, or one
   continuation when it was cut off);
2. a response whose two ends agree gets no continuation: every value is V_0, and every step credit 0;
3. a response whose ends differ is searched for the boundary where the verdict changes: the middle
   boundary of the interval is continued, the half whose ends differ is kept, until the interval is one
   step wide; about log2(n) continuations, in rounds batched over the whole batch (one engine call and
   one verifier call per round).

Two things make the search shorter. Greedy decoding is deterministic: where the response's tokens from
a computed prefix to a later boundary are what that prefix's continuation wrote first, the later
boundary's verdict is the same and costs nothing (``greedy_continuation`` shares the same way). And the
first probe of a response is the episode in which it left V_0's greedy path: a sampled response that
departs from what the policy would write greedily has, more often than any other, made its slip there
(when that is the change, one continuation found it); the search bisects after that.

Each value is the last one computed at or before its boundary (as ``process.mc_prefixes`` fills the
prefixes it leaves out), so V is V_0 up to the boundary before the change and the new verdict from it
on. That is exactly ``greedy_continuation``'s values wherever its verdicts change at most once along a
response; where they change more often, only one change inside the searched interval is found (the
utilities still sum to V_S - V_0). A verdict that could not be computed (NaN) stops its response's
search and is carried, as NaN, to the next computed value. The first-error search is OmegaPRM's (Luo et
al. 2024, arXiv:2406.06592, section 3.2: binary search for the first step from which Monte Carlo
rollouts stop succeeding), here with Math-Shepherd's single-completer hard verdict (Wang et al. 2024,
arXiv:2312.08935) as the test. Everything it generates is counted as ``greedy_continuation``'s is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from stepcredit.process.continuation import continuation_estimator, generate_continuations
from stepcredit.process.continuation_plan import Context, Slot, answer_end, is_whole, plan_slots, shares_root
from stepcredit.process.values import PrefixRequest, ValueContext, count_verified
from stepcredit.rollout.engines import SamplingSpec


@dataclass
class _Search:
    """What a batch's search knows so far (the rounds fill it)."""

    known: dict[Slot, float] = field(default_factory=dict)
    """Each computed boundary's verdict."""
    whole: dict[int, float] = field(default_factory=dict)
    """A response's own reward, scored once across rounds."""
    conts: dict[Slot, list[int]] = field(default_factory=dict)
    """Each continued boundary's greedy continuation."""
    generated: dict[tuple[Context, str], list[int]] = field(default_factory=dict)
    """(context, its answer marker) -> its greedy continuation: a context met again in a later round
    (two responses to one prompt that share a prefix) is not continued again."""
    memo: dict[tuple[Context, int], float] = field(default_factory=dict)
    """(context, id of its sample) -> the verdict of its continuation: nor scored again."""


@continuation_estimator("greedy_bisect", takes_tools=True)
def greedy_bisect(ctx: ValueContext) -> list[list[float]]:
    """Greedy-continuation verdicts at V_0, at the end, and by bisection at the boundary where they
    change (the module's docstring): one continuation per prompt plus about log2(steps) per response
    whose outcome differs from V_0, fewer where the response follows a continuation's greedy path. On a
    tool rollout (``ctx.tools``) the continuations call tools."""
    reqs = ctx.requests
    last = [len(r.prefix_lens) - 1 for r in reqs]
    st = _Search()
    known = st.known
    ends = [(ri, 0) for ri in range(len(reqs))] + [(ri, last[ri]) for ri in range(len(reqs)) if last[ri] > 0]
    _verdicts(ctx, ends, st)
    search: dict[int, tuple[int, int]] = {}
    suspect: dict[int, int] = {}  # a response's first probe: the episode in which it left V_0's greedy path
    for ri, end in enumerate(last):
        a, b = known[(ri, 0)], known[(ri, end)]
        if end > 1 and math.isfinite(a) and math.isfinite(b) and a != b:
            lo = _follow(ctx, ri, 0, end, st)
            if end - lo > 1:
                search[ri] = (lo, end)
                if (ri, 0) in st.conts and ctx.tools is None:
                    suspect[ri] = lo + 1
    while search:
        mids = {ri: suspect.pop(ri, (lo + hi) // 2) for ri, (lo, hi) in search.items()}
        _verdicts(ctx, [(ri, m) for ri, m in mids.items()], st)
        narrower: dict[int, tuple[int, int]] = {}
        for ri, (lo, hi) in search.items():
            mid = mids[ri]
            v = known[(ri, mid)]
            if not math.isfinite(v):
                continue  # no verdict: the search of this response ends here (its NaN is carried)
            lo, hi = (_follow(ctx, ri, mid, hi, st), hi) if v == known[(ri, lo)] else (lo, mid)
            if hi - lo > 1:
                narrower[ri] = (lo, hi)
        search = narrower
    out: list[list[float]] = []
    for ri, end in enumerate(last):
        row, v = [], known[(ri, 0)]
        for pi in range(end + 1):
            v = known.get((ri, pi), v)
            row.append(v)
        out.append(row)
    return out


def _follow(ctx: ValueContext, ri: int, pi: int, hi: int, st: _Search) -> int:
    """The last boundary before ``hi`` that prefix ``pi``'s greedy continuation reaches along the
    response: greedy decoding is deterministic, so where the response's tokens from ``pi`` to a later
    boundary are what that continuation wrote first (and it ended by itself), the later prefix's
    continuation is the rest of it, with the same verdict, which is noted in ``st.known`` for free
    (:func:`~stepcredit.process.continuation_plan.shares_root`, as ``greedy_continuation`` shares).
    Not on a tool rollout (a result is not the policy's to write)."""
    cont = st.conts.get((ri, pi))
    if cont is None or ctx.tools is not None:
        return pi
    r = ctx.requests[ri]
    marker, cap, n0 = answer_end(r.sample), ctx.cfg.mc_max_new_tokens, r.prefix_lens[pi]
    reached = pi
    for q in range(pi + 1, hi):
        n = r.prefix_lens[q]
        # an answered prefix is worth the response's own reward, never a continuation's verdict (as in
        # greedy_continuation's plan): a continuation that began inside the marker, or an engine that
        # runs past it (vLLM), may go on through the rest of the response and past it to eos
        if is_whole(r, n, ctx.tokenizer) or not shares_root(
            cont, r.response_ids[n0:n], cap, ctx.tokenizer, marker
        ):
            break
        st.known[(ri, q)] = st.known[(ri, pi)]
        reached = q
    return reached


def _verdicts(ctx: ValueContext, slots: Sequence[Slot], st: _Search) -> None:
    """Fill ``st.known`` with the greedy verdict of every slot (and ``st.conts`` with the
    continuations): one engine call over the slots' new contexts (identical ones once, and none
    continued in an earlier round: ``st.generated``) and one verifier call over every new text; a
    response's own reward is scored at most once (``st.whole``), a text at most once (``st.memo``)."""
    tok = ctx.tokenizer
    todo = []
    for ri, pi in slots:
        r = ctx.requests[ri]
        key = (_context(r, pi), id(r.sample))
        if ri in st.whole and is_whole(r, r.prefix_lens[pi], tok):
            st.known[(ri, pi)] = st.whole[ri]
        elif key in st.memo:
            st.known[(ri, pi)] = st.memo[key]
            st.conts[(ri, pi)] = st.generated[_gen_key(ctx, ri, key[0])]
        else:
            todo.append((ri, pi))
    if not todo:
        return
    plan = plan_slots(ctx.requests, tok, todo)
    new = {c: owners for c, owners in plan.todo.items() if _gen_key(ctx, owners[0][0], c) not in st.generated}
    spec = SamplingSpec(n=1, temperature=0.0, max_tokens=ctx.cfg.mc_max_new_tokens)
    for context, rows in generate_continuations(ctx, new, spec).items():
        st.generated[_gen_key(ctx, new[context][0][0], context)] = rows[0]
    for context, owners in plan.todo.items():
        cont = st.generated[_gen_key(ctx, owners[0][0], context)]
        plan.add_continuations(context, owners, [cont])
        for slot in owners:
            st.conts[slot] = cont
    count_verified(len(plan.texts))
    scores = [float(x) for x in ctx.verifier(plan.to_score, plan.texts)] if plan.texts else []
    if len(scores) != len(plan.texts):
        raise ValueError(f"the verifier returned {len(scores)} scores for {len(plan.texts)} texts")
    for ri, first in plan.whole.items():
        st.whole[ri] = scores[first]
    for ri, pi in plan.is_whole:
        st.known[(ri, pi)] = scores[plan.whole[ri]]
    for ri, pi, first in plan.continued:
        st.known[(ri, pi)] = scores[first]
        r = ctx.requests[ri]
        st.memo[(_context(r, pi), id(r.sample))] = scores[first]


def _gen_key(ctx: ValueContext, ri: int, context: Context) -> tuple[Context, str]:
    """What a greedy continuation depends on: its context, and where it stops (the task's answer
    marker); on a tool rollout the sample too (its tools run in the continuation)."""
    sample = ctx.requests[ri].sample
    return context, answer_end(sample) if ctx.tools is None else str(id(sample))


def _context(r: PrefixRequest, pi: int) -> Context:
    return tuple(r.prompt_ids + r.response_ids[: r.prefix_lens[pi]])
