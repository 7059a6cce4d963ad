"""The turn loop of a tool rollout (:func:`run_turns`) and the state it grows (:class:`TurnRow`): run
the pending calls of every row at once and append their results, then sample the next turn of every
active row at once, cut at its first call. The ``tools`` and ``tools_tree`` modes, and the process
stage's continuations of a tool rollout's prefixes, all grow rows with this one loop.

Each row records which of its tokens are a result's (``obs``) as it appends them: turn boundaries are
read from these marks (:func:`turn_ends`), never by parsing the text again, so a tool whose output
prints a convention's markup cannot move a boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from stepcredit.rollout.batching import finish_batch, left_pad
from stepcredit.rollout.engines import SamplingSpec, engine_for
from stepcredit.rollout.tool_context import ToolContext
from stepcredit.rollout.tool_render import observation_ids
from stepcredit.tools import PARSERS, TOOLS, ToolCall, ToolParser
from stepcredit.types import Batch, Sample

if TYPE_CHECKING:  # the modes' request (modes.py imports the tree, which imports this module)
    from stepcredit.rollout.modes import RolloutRequest


@dataclass
class TurnRow:
    """One multi-turn response as the turn loop (:func:`run_turns`) grows it: its own state, mutated
    by the loop only."""

    prompt: list[int]
    sample: Sample
    limit: int
    """Most response tokens (results included): the length budget."""
    ids: list[int] = field(default_factory=list)
    """Response tokens so far (the policy's and the results')."""
    obs: list[bool] = field(default_factory=list)
    """Per token of ``ids``: a result's token (never trained on), recorded when it was appended."""
    calls: int = 0
    """Calls executed so far (the turn limit counts them)."""
    pending: ToolCall | None = None
    """A call that ends ``ids`` and has not run yet: the loop runs it before sampling the next turn."""
    outcomes: list[str] = field(default_factory=list)
    """Per call run so far: its failure's kind, "" when the tool answered."""
    done: bool = False
    generated: int = 0
    """Tokens this row sampled (results and a prefix it was resumed from not counted)."""


def observation_runs(obs: Sequence[bool]) -> list[tuple[int, int]]:
    """``[start, end)`` token spans of each run of result tokens in ``obs`` (the recorded marks)."""
    runs: list[tuple[int, int]] = []
    for t, o in enumerate(obs):
        if o and (t == 0 or not obs[t - 1]):
            runs.append((t, t + 1))
        elif o:
            runs[-1] = (runs[-1][0], t + 1)
    return runs


def turn_ends(obs: Sequence[bool]) -> list[int]:
    """Token indices of each turn's last token from the recorded marks: the token before each result
    (a call's last token), then the last token. Empty when the response has no results."""
    runs = observation_runs(obs)
    if not runs:
        return []
    ends = [a - 1 for a, _ in runs if a > 0]
    if ends[-1:] != [len(obs) - 1]:
        ends.append(len(obs) - 1)
    return ends


def cut_at(tok: Any, ids: list[int], end: int) -> int:
    """The fewest leading tokens of ``ids`` whose decoded text covers ``end`` characters."""
    lo, hi = 1, len(ids)
    while lo < hi:  # decoded length grows with the prefix: binary search
        mid = (lo + hi) // 2
        if len(tok.decode(ids[:mid], skip_special_tokens=True)) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo


def run_turns(
    model: Any,
    tok: Any,
    rows: Sequence[TurnRow],
    tools: ToolContext,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> dict[str, float]:
    """The turn loop of a tool rollout, from each row's state (an empty response, or a prefix of one
    with its results, perhaps ending at a ``pending`` call): run the pending calls of every row at once
    (``tools.runner``) and append their results, then sample the next turn of every active row at once
    (cut at its first call), until every row ends: with eos, at its length budget ``limit`` (results
    count), or at a call past ``tools.config.max_turns`` (not run). The rows are grown in place; returns
    the loop's counters (``tools/turn_limit_reached``, ``rollout/generated_tokens``)."""
    tc = tools.config
    parser: ToolParser = PARSERS.get(tc.parser)
    offered = {n: TOOLS.get(n) for n in tc.names}
    counts = {"tools/turn_limit_reached": 0.0, "rollout/generated_tokens": 0.0}
    for r in rows:
        if r.pending is not None and r.calls >= tc.max_turns:
            # a call past the limit ends its response unexecuted, as when the loop found it
            counts["tools/turn_limit_reached"] += 1
            r.pending, r.done = None, True
        if len(r.ids) >= r.limit:
            r.pending, r.done = None, True  # no room for a result, nor for another turn
    while True:
        calls = [r for r in rows if r.pending is not None]
        if calls:
            results = tools.runner(
                [r.pending for r in calls if r.pending is not None],
                [r.sample.extra_info.get("tools_kwargs") for r in calls],
            )
            for r, res in zip(calls, results, strict=True):
                r.calls += 1
                r.pending = None
                r.outcomes.append(res.error)
                obs = observation_ids(tok, res.text, parser=parser, tools=tc, prompt=r.sample.prompt)
                obs = obs[: r.limit - len(r.ids)]
                r.ids += obs
                r.obs += [True] * len(obs)
                if len(r.ids) >= r.limit:
                    r.done = True
        active = [r for r in rows if not r.done]
        if not active:
            return counts
        budget = [r.limit - len(r.ids) for r in active]
        # the run's engine samples each turn (for every active response at once); a convention whose
        # calls end in a fixed string stops there, the others are cut at the call below
        spec = SamplingSpec(temperature=temperature, top_p=top_p, max_tokens=max(budget), stop=parser.stop)
        turns = engine_for(model).sample(model, tok, [r.prompt + r.ids for r in active], spec, budgets=budget)
        for r, done in zip(active, turns, strict=True):
            got = list(done.ids)
            text = tok.decode(got, skip_special_tokens=True)
            found = parser.find(text, offered)
            if found is not None:
                got = got[: cut_at(tok, got, found.end)]
            if found is not None and r.calls >= tc.max_turns:
                # the policy wanted another call past the limit: the response ends there, unexecuted
                counts["tools/turn_limit_reached"] += 1
                found = None
            if found is not None:
                r.pending = found.call
            else:
                r.done = True
            r.ids += got
            r.obs += [False] * len(got)
            r.generated += len(got)
            counts["rollout/generated_tokens"] += len(got)
            if len(r.ids) >= r.limit:
                r.done = True  # out of budget (a call cut at the limit is not run: no room for its result)
                r.pending = None


def resume_row(
    tok: Any,
    prompt: list[int],
    sample: Sample,
    ids: Sequence[int],
    tools: ToolContext,
    *,
    observed: Sequence[bool],
    limit: int | None = None,
) -> TurnRow:
    """A row of the turn loop that goes on from ``ids``, a prefix of a tool rollout's response whose
    result tokens the rollout marked in ``observed`` (kept as they are): the calls so far are its runs
    of result tokens, and a call that ends the prefix's last turn (a turn's end: the last token of a
    call, before its result) is ``pending``, so :func:`run_turns` runs it and appends its result before
    the next turn. Only the policy's own last turn is parsed, never a result's text. The new row marks
    the prefix's results as the rollout did (``obs``); the prefix is scored, never trained on."""
    parser: ToolParser = PARSERS.get(tools.config.parser)
    observed = list(observed)
    if len(observed) != len(ids):
        raise ValueError(f"observed marks {len(observed)} tokens of a prefix of {len(ids)}")
    runs = observation_runs(observed)
    start = runs[-1][1] if runs else 0
    last = tok.decode(list(ids[start:]), skip_special_tokens=True)  # the prefix's last turn
    found = parser.find(last, {n: TOOLS.get(n) for n in tools.config.names})
    # a call followed by more of the policy's text was not cut at (a trace, not a rollout), and a call
    # the prefix ends inside is still being written (the continuation samples the rest): no call runs
    complete = found is not None and found.complete and not last[found.end :].strip()
    pending = found.call if found is not None and complete else None
    return TurnRow(
        list(prompt),
        sample,
        tools.max_new_tokens if limit is None else limit,
        list(ids),
        observed,
        len(runs),
        pending,
    )


def branch_row(tok: Any, row: TurnRow, point: int, tools: ToolContext) -> TurnRow:
    """A new row that goes on from ``row``'s first ``point`` tokens (a branch of a tool tree): the
    results, their marks and the outcomes of the calls in that prefix are kept, and a call that ends
    there is pending (the branch runs it again, as a continuation does)."""
    child = resume_row(
        tok, row.prompt, row.sample, row.ids[:point], tools, observed=row.obs[:point], limit=row.limit
    )
    child.outcomes = row.outcomes[: child.calls]
    return child


def turn_counters(rows: Sequence[TurnRow]) -> dict[str, float]:
    """Sums over the responses: calls, turns (calls + the final turn), failed calls and each failure
    kind, responses and response tokens (results included)."""
    out = {
        "tools/calls": float(sum(r.calls for r in rows)),
        "tools/turns": float(sum(r.calls + 1 for r in rows)),
        "tools/failed_calls": float(sum(1 for r in rows for kind in r.outcomes if kind)),
    }
    for r in rows:
        for kind in filter(None, r.outcomes):
            out[f"tools/failed_{kind}"] = out.get(f"tools/failed_{kind}", 0.0) + 1.0
    out["rollout/responses"] = float(len(rows))
    out["rollout/response_tokens"] = float(sum(len(r.ids) for r in rows))
    return out


def rows_batch(
    model: Any, tok: Any, samples: list[Sample], rows: Sequence[TurnRow], request: RolloutRequest
) -> Batch:
    """The batch of finished rows (``request.cfg.n`` per sample, each sample's contiguous): results'
    tokens marked in ``observation_BT`` (the rows' recorded marks), out of ``response_mask_BT``, with
    behaviour log-prob 0. ``request``: the :class:`~stepcredit.rollout.modes.RolloutRequest`."""
    dev = next(model.parameters()).device
    T = max(1, max(len(r.ids) for r in rows))
    resp = torch.full((len(rows), T), tok.pad_token_id, dtype=torch.long)
    obs_BT = torch.zeros((len(rows), T), dtype=torch.bool)
    for b, r in enumerate(rows):
        resp[b, : len(r.ids)] = torch.tensor(r.ids, dtype=torch.long)
        obs_BT[b, : len(r.obs)] = torch.tensor(r.obs, dtype=torch.bool)
    p_ids, p_mask = left_pad([r.prompt for r in rows], tok.pad_token_id)
    batch = finish_batch(
        model,
        tok,
        samples,
        replace(request.generation(), temperature=request.sampling_temperature),
        p_ids=p_ids.to(dev),
        p_mask=p_mask.to(dev),
        resp=resp.to(dev),
    )
    Tb = batch.response_ids_BT.shape[1]
    obs_BT = obs_BT[:, :Tb] & batch.response_mask_BT  # finish_batch cut at eos: nothing after it counts
    logp = batch.behaviour_logp_BT
    return replace(
        batch,
        response_mask_BT=batch.response_mask_BT & ~obs_BT,
        observation_BT=obs_BT,
        behaviour_logp_BT=None if logp is None else torch.where(obs_BT, 0.0, logp),
    )
