"""Which continuations a batch of value requests needs, and which values need none.

:func:`make_plan` sorts every (response, prefix) to value into: V_0 from the group's other rewards
(``mc_v0=group``), the response's own reward (the whole response, or a prefix that already holds the
task's answer marker: ``stepcredit.data.ANSWER_ENDS``), a continuation of its context (identical
contexts continued once), or, for greedy continuations, a share of an earlier prefix's continuation.

Sharing greedy continuations: greedy decoding is deterministic, so when the response's tokens between
prefix i and a later prefix j are exactly what the greedy continuation of prefix i wrote first, the
greedy continuation of prefix j is the rest of it, and prefix j's full text (prefix + continuation) is
prefix i's: the same verdict. Which prefixes to plan as shares is read from the behaviour
log-probabilities (a sampled token with probability above 1/2 was the greedy choice); each share is
then checked on the tokens (:meth:`Plan.resolve`), and one that fails gets its own continuation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stepcredit.data import ANSWER_ENDS
from stepcredit.process.values import PrefixRequest
from stepcredit.rollout.stops import WINDOW
from stepcredit.types import Sample

Context = tuple[int, ...]
"""Prompt + prefix token ids: what a continuation continues (requests that share one share its samples)."""

Slot = tuple[int, int]
"""(request, prefix index): one value to fill."""

SURE_GREEDY_LOGP = math.log(0.51)
"""A sampled token whose probability was above 1/2 was the policy's greedy choice (no other token can be
as likely); 0.51 leaves a logit gap of at least log(0.51 / 0.49) = 0.04 for the rounding between the
behaviour pass and the decode. Only the plan reads it: every share is checked on the tokens."""


def answer_end(sample: Sample) -> str:
    """The answer marker of the sample's data source ('' when it has none)."""
    return ANSWER_ENDS.get(sample.data_source) if sample.data_source in ANSWER_ENDS else ""


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


@dataclass
class Plan:
    """What a batch of requests needs: whole responses scored, contexts continued, and where each
    value comes from once the verifier has scored every text (indices into ``texts``)."""

    requests: Sequence[PrefixRequest]
    tokenizer: Any
    to_score: list[Sample] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    whole: dict[int, int] = field(default_factory=dict)
    """request -> index of its whole response in ``texts`` (each scored at most once)."""
    group_v0: list[tuple[int, list[int]]] = field(default_factory=list)
    """(request, its group's members): V_0 from the others' rewards (``v0_from_group``)."""
    is_whole: list[Slot] = field(default_factory=list)
    """Slots valued by the whole response's reward."""
    todo: dict[Context, list[Slot]] = field(default_factory=dict)
    """context -> the slots it values."""
    shares: dict[Slot, Slot] = field(default_factory=dict)
    """slot -> the earlier slot of the same response whose greedy continuation it is planned to share."""
    continued: list[tuple[int, int, int]] = field(default_factory=list)
    """(request, prefix index, first of its k texts)."""
    scored: dict[tuple[Context, int], int] = field(default_factory=dict)
    """(context, id of the sample) -> first of its k texts: identical texts are scored once."""

    def context(self, slot: Slot) -> Context:
        r = self.requests[slot[0]]
        return tuple(r.prompt_ids + r.response_ids[: r.prefix_lens[slot[1]]])

    def score_whole(self, ri: int) -> int:
        if ri not in self.whole:
            self.whole[ri] = len(self.texts)
            self.to_score.append(self.requests[ri].sample)
            self.texts.append(self.tokenizer.decode(self.requests[ri].response_ids, skip_special_tokens=True))
        return self.whole[ri]

    def add_continuations(self, context: Context, owners: list[Slot], conts: list[list[int]]) -> None:
        """The texts of ``context``'s continuations ``conts`` (once per sample), for every owner."""
        for ri, pi in owners:
            r = self.requests[ri]
            key = (context, id(r.sample))
            if key not in self.scored:
                self.scored[key] = len(self.texts)
                head = r.response_ids[: r.prefix_lens[pi]]
                self.to_score += [r.sample] * len(conts)
                self.texts += [self.tokenizer.decode(head + c, skip_special_tokens=True) for c in conts]
            self.continued.append((ri, pi, self.scored[key]))

    def resolve(self, conts: dict[Context, list[list[int]]], cap: int) -> dict[Context, list[Slot]]:
        """Fill each planned share from its root's greedy continuation where the tokens bear the plan out
        (:func:`shares_root`); the contexts of those that do not, for a continuation of their own."""
        left: dict[Context, list[Slot]] = {}
        for slot, root in self.shares.items():
            r = self.requests[slot[0]]
            root_ctx = self.context(root)
            n0, n1 = r.prefix_lens[root[1]], r.prefix_lens[slot[1]]
            cont = conts[root_ctx][0]
            if shares_root(cont, r.response_ids[n0:n1], cap, self.tokenizer, answer_end(r.sample)):
                self.continued.append((slot[0], slot[1], self.scored[(root_ctx, id(r.sample))]))
            else:
                left.setdefault(self.context(slot), []).append(slot)
        return left


def shares_root(cont: list[int], between: list[int], cap: int, tok: Any, marker: str) -> bool:
    """Is ``cont[len(between):]`` the greedy continuation of the later prefix, given that ``cont`` is the
    greedy continuation of the earlier one and ``between`` the response's tokens from one to the other?
    It is when ``cont`` starts with ``between``, goes on past it, and ended by itself (eos, or the
    answer marker completed within the part after ``between``, which is all the later continuation's
    stop rule sees), not at the length cap ``cap`` (the later continuation may run further)."""
    d = len(between)
    if len(cont) <= d or cont[:d] != between:
        return False
    if cont[-1] == tok.eos_token_id:
        return True
    rest = cont[d:]
    return (
        len(cont) < cap
        and bool(marker)
        and re.search(marker, tok.decode(rest[-WINDOW:], skip_special_tokens=True)) is not None
    )


def _sure_greedy(r: PrefixRequest, n0: int, n1: int) -> bool:
    """Were the response's tokens ``[n0, n1)`` all the policy's greedy choices (by their log-probs)?"""
    return len(r.logp) >= n1 and all(lp > SURE_GREEDY_LOGP for lp in r.logp[n0:n1])


def _answered(r: PrefixRequest, n: int, tokenizer: Any) -> bool:
    """Does the prefix of ``n`` tokens already hold its task's answer marker?"""
    marker = answer_end(r.sample)
    return (
        bool(marker)
        and re.search(marker, tokenizer.decode(r.response_ids[:n], skip_special_tokens=True)) is not None
    )


def is_whole(r: PrefixRequest, n: int, tokenizer: Any) -> bool:
    """Is the prefix of ``n`` tokens valued by the response's own reward: the whole (complete) response,
    or a prefix that already holds its task's answer marker (the task's contract: it is finished)?"""
    return (r.complete and n >= len(r.response_ids) - 1) or _answered(r, n, tokenizer)


def plan_slots(requests: Sequence[PrefixRequest], tokenizer: Any, slots: Sequence[Slot]) -> Plan:
    """A plan for exactly ``slots``: each valued by its response's reward (:func:`is_whole`) or by its own
    continuation (identical contexts continued once); no shares (the slots of an adaptive search, which
    picks the next ones from these values)."""
    plan = Plan(requests, tokenizer)
    for ri, pi in slots:
        if is_whole(requests[ri], requests[ri].prefix_lens[pi], tokenizer):
            plan.score_whole(ri)
            plan.is_whole.append((ri, pi))
        else:
            plan.todo.setdefault(plan.context((ri, pi)), []).append((ri, pi))
    return plan


def make_plan(
    requests: Sequence[PrefixRequest], tokenizer: Any, max_prefixes: int, v0_from_group: bool, share: bool
) -> Plan:
    """Which values come from the group, from whole responses, from continuations of which context, and
    (``share``: greedy continuations) from an earlier prefix's continuation."""
    plan = Plan(requests, tokenizer)
    if v0_from_group:
        groups: dict[Context, list[int]] = {}
        for ri, r in enumerate(requests):
            groups.setdefault(tuple(r.prompt_ids), []).append(ri)
        for members in groups.values():
            if len(members) < 2:
                continue
            for ri in members:
                plan.score_whole(ri)
            plan.group_v0 += [(ri, members) for ri in members]
    from_group = {ri for ri, _ in plan.group_v0}
    for ri, r in enumerate(requests):
        prev: Slot | None = None  # the last slot of this response that is continued or shared
        for pi in mc_prefix_indices(len(r.prefix_lens), max_prefixes):
            n = r.prefix_lens[pi]
            if pi == 0 and ri in from_group:
                continue
            if is_whole(r, n, tokenizer):
                # the response's own reward: it is whole, or its answer is written (the task's contract)
                plan.score_whole(ri)
                plan.is_whole.append((ri, pi))
            elif share and prev is not None and _sure_greedy(r, r.prefix_lens[prev[1]], n):
                plan.shares[(ri, pi)] = plan.shares.get(prev, prev)
                prev = (ri, pi)
            else:
                plan.todo.setdefault(plan.context((ri, pi)), []).append((ri, pi))
                prev = (ri, pi)
    return plan
