"""V(prefix) from a flat group's own outcomes: free Monte Carlo values where responses agree.

A group's responses to one prompt are independent samples of the policy. Every response that begins
with the token prefix p continued from p as the policy does, so among the group's scored responses

    V(p) = (1 / |G(p)|) * sum_{j in G(p)} R_j          G(p): the group's valid responses that begin with p

is a Monte Carlo estimate of the policy's chance of success from p, with no generation: the same
estimate a tree rollout's node gives (:mod:`stepcredit.process.tree`; SPO-tree, Guo et al. 2025,
arXiv:2505.23564, eq. 7), on the tree that a flat group grows by itself. A response's values are
V(root) = the group's mean outcome, V at each of its episode ends, then its own outcome R, so with
``process.credit=difference`` the credits telescope to R - mean(group), as the tree's do. Where a
response has left every other one, V is its own outcome: its credit sits at the episode where it
parted from the responses it shared a prefix with, the step that a first-error search looks for.

Membership is by tokens, not by episode ends: a response counts in V(p) whenever its first |p| tokens
are p, wherever its own episodes end. ``process.value_estimator=group_prefix`` (capability
``from_group``): the trainer segments the responses at rollout time and computes the values in
:func:`stepcredit.trainer.update.reward_channels` once the outcomes are verified.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stepcredit.process.continuation import continuation_estimator, generate_continuations
from stepcredit.process.continuation_plan import Context, Slot
from stepcredit.process.values import ValueContext, count_verified
from stepcredit.rollout.engines import SamplingSpec


def _groups(group_B: Sequence[int]) -> dict[int, list[int]]:
    """Each group's rows, in batch order."""
    members: dict[int, list[int]] = {}
    for b, g in enumerate(group_B):
        members.setdefault(int(g), []).append(b)
    return members


def _sharing(rows: Sequence[int], ids: Sequence[list[int]], b: int, ends: Sequence[int]) -> list[list[int]]:
    """For each end e of ``ends`` (increasing), the rows of ``rows`` whose first e + 1 response tokens are
    response ``b``'s. The rows still sharing at one end are narrowed by the tokens up to the next, so
    a response costs O(rows x its length), whatever its number of episodes."""
    alive, start, out = list(rows), 0, []
    for e in ends:
        n = e + 1
        if n < start:
            raise ValueError(f"episode ends must increase, got {list(ends)}")
        piece = ids[b][start:n]
        alive = [j for j in alive if len(ids[j]) >= n and ids[j][start:n] == piece]
        start = n
        out.append(alive)
    return out


def group_prefix_values(
    group_B: Sequence[int],
    response_ids: Sequence[Sequence[int]],
    episode_ends: Sequence[Sequence[int]],
    score_B: Sequence[float],
    valid_B: Sequence[bool],
) -> list[list[float]]:
    """[V_0, V_1, ..., V_S] per response (``[]`` for one without episodes) from its group's outcomes.

    ``episode_ends[b]``: token indices (into ``response_ids[b]``) of its episodes' last tokens, the last
    one its last token. V_0 is the mean outcome of the group's valid responses (a finite, computed
    score); V_i (i < S) the mean outcome of the group's valid responses whose first ``ends[i-1] + 1``
    tokens are the response's; V_S its own outcome. A prefix that no valid response carries (only an
    invalid response has it) takes the value before it, a group with no valid response 0; an invalid
    response's last value is the one before it, so its credits sum to nothing it did not earn."""
    ok_B = [bool(ok) and math.isfinite(float(s)) for s, ok in zip(score_B, valid_B, strict=True)]
    groups = _groups(group_B)
    ids = [list(r) for r in response_ids]

    def mean(rows: list[int], default: float) -> float:
        return sum(float(score_B[j]) for j in rows) / len(rows) if rows else default

    out: list[list[float]] = []
    for b, (g, ends) in enumerate(zip(group_B, episode_ends, strict=True)):
        if not ends:
            out.append([])
            continue
        scored = [j for j in groups[int(g)] if ok_B[j]]
        values = [mean(scored, 0.0)]
        for rows in _sharing(scored, ids, b, ends[:-1]):
            values.append(mean(rows, values[-1]))
        values.append(float(score_B[b]) if ok_B[b] else values[-1])
        out.append(values)
    return out


def shared_prefix_share(
    group_B: Sequence[int], response_ids: Sequence[Sequence[int]], episode_ends: Sequence[Sequence[int]]
) -> float | None:
    """The share of responses' inner episode ends (all but the last) whose prefix another response of
    the group also begins with: how much of the group's credit rests on more than one outcome
    (``process/shared_prefix_frac``; None when there are no inner ends, so nothing is logged)."""
    groups = _groups(group_B)
    ids = [list(r) for r in response_ids]
    shared = total = 0
    for b, (g, ends) in enumerate(zip(group_B, episode_ends, strict=True)):
        others = [j for j in groups[int(g)] if j != b]
        for rows in _sharing(others, ids, b, ends[:-1]):
            total += 1
            shared += bool(rows)
    return shared / total if total else None


@continuation_estimator("group_prefix", generates=False, from_group=True, takes_tools=True)
def group_prefix(ctx: ValueContext) -> list[list[float]]:
    """In training: :func:`group_prefix_values` from the group's own outcomes (no generation, no extra
    verifier call; ``generates=False`` describes this). On fixed traces (probe, explain), which come
    without a group, each trace's group is ``process.mc_samples`` responses sampled from its prompt (at
    ``process.mc_temperature``, at most ``process.mc_max_new_tokens`` tokens, stopping at the task's
    answer marker; with tools as the rollout calls them) plus the trace itself, valued the same way, so
    a probe scores what training computes. Traces of one prompt share its samples; every text goes to
    the verifier in one call; a trace that could not be scored gets NaN values."""
    requests, cfg = ctx.requests, ctx.cfg
    if not requests:
        return []
    todo: dict[Context, list[Slot]] = {}
    for i, r in enumerate(requests):
        todo.setdefault(tuple(r.prompt_ids), []).append((i, 0))  # prefix 0: the bare prompt
    spec = SamplingSpec(n=cfg.mc_samples, temperature=cfg.mc_temperature, max_tokens=cfg.mc_max_new_tokens)
    sampled = generate_continuations(ctx, todo, spec)
    contexts = list(sampled)
    texts = [ctx.tokenizer.decode(r.response_ids, skip_special_tokens=True) for r in requests]
    to_score = [r.sample for r in requests]
    first: dict[Context, int] = {}
    for c in contexts:
        first[c] = len(texts)
        owner = requests[todo[c][0][0]].sample
        texts += [ctx.tokenizer.decode(ids, skip_special_tokens=True) for ids in sampled[c]]
        to_score += [owner] * len(sampled[c])
    count_verified(len(texts))
    scores = [float(x) for x in ctx.verifier(to_score, texts)]
    if len(scores) != len(texts):
        raise ValueError(f"the verifier returned {len(scores)} scores for {len(texts)} texts")
    out: list[list[float]] = []
    for b, r in enumerate(requests):
        if not math.isfinite(scores[b]):
            out.append([math.nan] * len(r.prefix_lens))  # the trace itself could not be scored
            continue
        c = tuple(r.prompt_ids)
        others = sampled[c]
        group_scores = [scores[b], *scores[first[c] : first[c] + len(others)]]
        rows = [list(r.response_ids), *(list(ids) for ids in others)]
        ends = [[n - 1 for n in r.prefix_lens[1:]]] + [[] for _ in others]
        if not ends[0]:  # an empty trace: V_0 alone
            ok = [x for x in group_scores if math.isfinite(x)]
            out.append([sum(ok) / len(ok)])
            continue
        values = group_prefix_values([0] * len(rows), rows, ends, group_scores, [True] * len(rows))
        out.append(values[0])
    return out
