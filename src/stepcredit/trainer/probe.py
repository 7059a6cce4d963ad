"""The signal probe as a recipe: corrupt solutions, value both traces with every estimator, summarise.

The pieces are components elsewhere: the trace surgery (:mod:`stepcredit.data.wrong_step`), the value
estimators (:mod:`stepcredit.process.values`), the figures and the recommendation
(:mod:`stepcredit.process.probe`); ``stepcredit probe`` (:mod:`stepcredit.cli.probe`) parses and prints.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from stepcredit.config import ProcessConfig, RolloutConfig, ToolsConfig
from stepcredit.data.labelled_traces import LabelledTrace
from stepcredit.data.wrong_step import inject_wrong_step
from stepcredit.errors import DataError
from stepcredit.process import (
    VALUE_ESTIMATORS,
    PrefixRequest,
    ScoreFn,
    ValueContext,
    estimate,
    prefix_request,
)
from stepcredit.process.diagnostics import prompt_ids
from stepcredit.process.probe import (
    CreditFigures,
    EstimatorFigures,
    ProbeCase,
    ProbeReport,
    RankCorrelation,
    _ties_at_min,
    case_indicators,
    credit_indicators,
    episode_at,
    locating,
    position_baseline,
    solvable_figures,
)
from stepcredit.process.probe_labelled import LabelledReport, labelled_figures
from stepcredit.process.segment import token_char_spans, trace_observed
from stepcredit.process.utility import CREDIT_FORMS, marginal_utilities
from stepcredit.process.values import ToolContext, evaluating
from stepcredit.rollout.tool_render import render_tool_prompts
from stepcredit.stats import spearman
from stepcredit.types import Sample


def run_probe(
    model: Any,
    tokenizer: Any,
    cases: Sequence[ProbeCase],
    cfg: ProcessConfig,
    estimators: Sequence[str],
    *,
    score_fn: ScoreFn | None,
    credit_forms: Sequence[str] = (),
    tree_rollout: RolloutConfig | None = None,
    tools: ToolContext | None = None,
) -> ProbeReport:
    """Value every case with every estimator (each over the whole set at once) and summarise.

    ``tools``: the policy's rollouts call tools (``rollout.mode=tools``): estimators that take them
    (``takes_tools``) value each prefix as training does, continuations as tool rollouts that run the
    calls (:mod:`stepcredit.process.continuation`); None: without tools.

    ``tree_rollout``: estimators whose values come from a tree rollout's outcomes (``from_outcomes``:
    ``tree``) value each trace by a tree of this shape and branch rule grown over it
    (:func:`stepcredit.process.tree.grown_tree_values`: ``rollout.tree.branch_at=entropy`` too), as a
    tree run would; None: by their function on fixed traces (continuations at every episode end).

    Per estimator: the locating figures of plain U (:func:`case_indicators`) and, for every form of
    ``credit_forms`` (with ``cfg.clip``), of its step credits (:func:`credit_indicators`), each with
    a Wilson 95 % interval and a verdict; and the same on the traces the policy can solve, by the first
    estimator given whose registry entry says ``needs_verifier`` (its V is a chance of reaching the
    gold answer). Which estimators are compared is read from the registry, never from their names.
    """
    # a clean trace and its corrupted twin share a prompt but are not samples of the policy: V_0 must
    # come from continuations, not from the other trace's reward (process.mc_v0=group)
    cfg = replace(cfg, mc_v0="sample")
    requests = [r for c in cases for r in (c.clean, c.corrupt)]
    values, seconds = _value_all(model, tokenizer, requests, cfg, estimators, score_fn, tree_rollout, tools)
    # a tree grown over the trace counts the trace's own outcome in its V_0: no judge of solvability
    reference = next(
        (
            n
            for n in estimators
            if VALUE_ESTIMATORS.get(n).needs_verifier
            and not (VALUE_ESTIMATORS.get(n).from_outcomes and tree_rollout is not None)
        ),
        None,
    )
    solvable = (
        {i for i in range(len(cases)) if values[reference][2 * i][0] > 0} if reference is not None else set()
    )
    figures = {
        name: _estimator_figures(
            name, values[name], cases, cfg, credit_forms, solvable if reference else None,
            seconds[name] / max(1, len(requests)),
        )
        for name in estimators
    }  # fmt: skip
    first = next(iter(figures.values()))
    return ProbeReport(
        n=len(cases),
        chance=first.all.chance,
        chance_next=first.chance_next,
        estimators=figures,
        solvable_by=reference,
        n_solvable=len(solvable),
        rank_correlation=_rank_correlation(values, estimators, reference),
    )


def _value_all(
    model: Any,
    tokenizer: Any,
    requests: list[PrefixRequest],
    cfg: ProcessConfig,
    estimators: Sequence[str],
    score_fn: ScoreFn | None,
    tree_rollout: RolloutConfig | None = None,
    tools: ToolContext | None = None,
) -> tuple[dict[str, list[list[float]]], dict[str, float]]:
    from stepcredit.process.tree import grown_tree_values

    values: dict[str, list[list[float]]] = {}
    seconds: dict[str, float] = {}
    ctx = ValueContext(model, tokenizer, requests, cfg, score_fn, tools=tools)
    for name in estimators:
        t0 = time.perf_counter()
        if VALUE_ESTIMATORS.get(name).from_outcomes and tree_rollout is not None:
            if score_fn is None:
                raise DataError(f"probe: {name} values grown trees' leaves with a verifier")
            with evaluating(model):
                values[name] = grown_tree_values(model, tokenizer, requests, cfg, tree_rollout, score_fn)
        else:
            values[name] = estimate(ctx, name)
        seconds[name] = time.perf_counter() - t0
    return values, seconds


def _estimator_figures(
    name: str,
    values: list[list[float]],
    cases: Sequence[ProbeCase],
    cfg: ProcessConfig,
    credit_forms: Sequence[str],
    solvable: set[int] | None,
    s_per_trace: float,
) -> EstimatorFigures:
    # A trace the verifier could not score (NaN values) says nothing either way: left out, counted.
    ok = [i for i in range(len(cases)) if not any(math.isnan(v) for v in values[2 * i] + values[2 * i + 1])]
    if not ok:
        raise DataError(f"probe: {name} values could not be computed for any trace (verifier failed)")
    rows = {i: case_indicators(values[2 * i], values[2 * i + 1], cases[i]) for i in ok}
    mean_next = sum(r["argmin_next"] for r in rows.values()) / len(ok)
    chance_next = sum(r["chance_next"] for r in rows.values()) / len(ok)
    credits = {}
    probability = VALUE_ESTIMATORS.get(name).success_probability
    for form in credit_forms:
        if CREDIT_FORMS.get(form).needs_success_probability and not probability:
            continue  # blame on log-probabilities compares them with 1: a number with no meaning
        by_case = {
            i: credit_indicators(values[2 * i], values[2 * i + 1], cases[i], form=form, clip=cfg.clip)
            for i in ok
        }
        credits[form] = CreditFigures(locating(list(by_case.values())), solvable_figures(by_case, solvable))
    return EstimatorFigures(
        name=name,
        all=locating(list(rows.values())),
        solvable=solvable_figures(rows, solvable),
        argmin_next=mean_next,
        chance_next=chance_next,
        argmin_next_vs_chance=mean_next / chance_next,
        final_drop=sum(r["final_drop"] for r in rows.values()) / len(ok),
        s_per_trace=s_per_trace,
        unscored=len(cases) - len(ok),
        credits=credits,
        same_length=position_baseline(
            [
                (
                    len(values[2 * i + 1]) - 1,
                    _ties_at_min(marginal_utilities(values[2 * i + 1])),
                    cases[i].corrupt_step,
                )
                for i in ok
            ]
        ),
    )


def _rank_correlation(
    values: dict[str, list[list[float]]], estimators: Sequence[str], reference: str | None
) -> RankCorrelation | None:
    # a likelihood V (no verifier) against the reference's chance of success, when both ran
    x = next((n for n in estimators if not VALUE_ESTIMATORS.get(n).needs_verifier), None)
    if x is None or reference is None:
        return None
    xs = [v for vs in values[x] for v in vs]
    ys = [v for vs in values[reference] for v in vs]
    pairs = [(a, b) for a, b in zip(xs, ys, strict=True) if not (math.isnan(a) or math.isnan(b))]
    return RankCorrelation(x, reference, spearman([a for a, _ in pairs], [b for _, b in pairs]))


def build_cases(
    tokenizer: Any,
    solutions: Sequence[tuple[Sample, str]],
    cfg: ProcessConfig,
    *,
    deltas: Sequence[int],
    rng: random.Random,
    tools: ToolsConfig | None = None,
) -> tuple[list[ProbeCase], list[int]]:
    """A :class:`ProbeCase` for each solution with an equation to make wrong, and the indices of those
    solutions (the others are skipped). Both traces end with the tokenizer's eos, as a finished
    response does. ``tools``: the prompts are a tool rollout's (the offered tools' schemas where the
    chat template prints them)."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    cases, used = [], []
    for i, (sample, text) in enumerate(solutions):
        inj = inject_wrong_step(text, rng, deltas=deltas)
        if inj is None:
            continue
        prompt = (
            prompt_ids(tokenizer, list(sample.prompt))
            if tools is None
            else render_tool_prompts(tokenizer, [sample], tools.names)[0]
        )
        pair = []
        for t in (text, inj.text):
            ids = list(tokenizer(t, add_special_tokens=False)["input_ids"]) + eos
            # a trace has no rollout's record of its results: its result blocks are read once, here
            ends, req = prefix_request(sample, prompt, ids, tokenizer, cfg, trace_observed(ids, tokenizer))
            pair.append((req, episode_at(ids, tokenizer, ends, inj.position)))
        cases.append(ProbeCase(pair[0][0], pair[1][0], pair[0][1], pair[1][1]))
        used.append(i)
    return cases, used


def probe(
    model: Any,
    tokenizer: Any,
    solutions: Sequence[tuple[Sample, str]],
    cfg: ProcessConfig,
    estimators: Sequence[str],
    *,
    score_fn: ScoreFn,
    deltas: Sequence[int] = (-2, -1, 1, 2),
    seed: int = 0,
    credit_forms: Sequence[str] = (),
    tree_rollout: RolloutConfig | None = None,
    tools: ToolContext | None = None,
) -> ProbeReport:
    """The signal probe on ``solutions`` (sample, correct solution text): one wrong step injected into
    each (drawn with ``seed`` from ``deltas``), the clean solutions the verifier ``score_fn`` does not
    score correct left out, then :func:`run_probe` (``tree_rollout``, ``tools``: see there; with
    ``tools`` the prompts are the tool rollout's too). DataError when nothing is left to probe."""
    if not deltas or 0 in deltas:
        raise DataError(f"probe: deltas {list(deltas)} must be non-zero integers")
    cases, used = build_cases(
        tokenizer,
        solutions,
        cfg,
        deltas=deltas,
        rng=random.Random(seed),
        tools=tools.config if tools is not None else None,
    )
    if not cases:
        raise DataError("probe: no solution has an equation 'a op b = c' to make wrong")
    # a "clean" trace the verifier does not score correct is no baseline for a wrong step
    clean = score_fn([solutions[i][0] for i in used], [solutions[i][1] for i in used])  # one submission
    keep = [k for k, score in enumerate(clean) if score >= 1.0 - 1e-6]
    if not keep:
        raise DataError("probe: the verifier scores none of the solutions correct")
    report = run_probe(
        model,
        tokenizer,
        [cases[k] for k in keep],
        cfg,
        estimators,
        score_fn=score_fn,
        credit_forms=credit_forms,
        tree_rollout=tree_rollout,
        tools=tools,
    )
    return replace(report, skipped=len(solutions) - len(cases), not_correct=len(cases) - len(keep))


def labelled_requests(
    tokenizer: Any, traces: Sequence[LabelledTrace], *, sep: str = "\n\n"
) -> list[PrefixRequest]:
    """One value request per labelled trace, one episode per step: the response is the steps joined by
    ``sep`` (ProcessBench's steps are paragraphs) and the tokenizer's eos.

    The whole response is tokenized at once, as the policy would have written it (tokenizing step by
    step gives other tokens at the boundaries: SmolLM2 writes ``"\n\n"`` before a word as two tokens,
    alone as one), and step k's episode ends with the last token that starts inside step k or the
    separator after it (a token across the boundary goes to the earlier step). When the tokens do not
    decode to the text (a tokenizer that normalises it), each step is tokenized with its separator
    instead. DataError naming the row and step when a step gets no token of its own."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = []
    for t in traces:
        pieces = [step + (sep if k + 1 < len(t.steps) else "") for k, step in enumerate(t.steps)]
        text = "".join(pieces)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        decoded, spans = token_char_spans(ids, tokenizer)
        if decoded == text:
            ends = list(itertools.accumulate(len(p) for p in pieces))  # character where each step ends
            lens = [0] + [sum(1 for a, _ in spans if a < c) for c in ends]
            lens[-1] = len(ids)
        else:
            ids, lens = [], [0]
            for piece in pieces:
                ids += list(tokenizer(piece, add_special_tokens=False)["input_ids"])
                lens.append(len(ids))
        empty = next((k for k, (a, b) in enumerate(itertools.pairwise(lens)) if b <= a), None)
        if empty is not None:
            raise DataError(
                f"{t.sample.uid}: step {empty} has no token of its own (a token of the step before "
                "covers it): join it to a neighbour"
            )
        prompt = prompt_ids(tokenizer, list(t.sample.prompt))
        out.append(
            PrefixRequest(t.sample, prompt, ids + eos, lens, str(t.sample.ground_truth), complete=bool(eos))
        )
    return out


def probe_labelled(
    model: Any,
    tokenizer: Any,
    traces: Sequence[LabelledTrace],
    cfg: ProcessConfig,
    estimators: Sequence[str],
    *,
    score_fn: ScoreFn | None,
    sep: str = "\n\n",
    thresholds: Mapping[str, float] | None = None,
    credit_forms: Sequence[str] = (),
) -> LabelledReport:
    """The probe on traces whose first wrong step is labelled (:mod:`stepcredit.process.probe_labelled`):
    every estimator values every prefix of every trace, one episode per step (:func:`labelled_requests`);
    ``thresholds``: per estimator, the tau of ProcessBench's metric, in its own V's units (nats for a
    log-probability, a chance for a success probability). Values come from each estimator's function on
    the fixed traces (a tree grown over a trace would branch at the config's episode ends, not at the
    labelled steps). DataError when no trace was given, or an estimator could score none."""
    if not traces:
        raise DataError("probe: no labelled traces")
    # the traces are not samples of the policy: V_0 comes from continuations, not a group's rewards;
    # every step is valued (a preset's cap on valued prefixes would give a skipped step U = 0)
    cfg = replace(cfg, mc_v0="sample", mc_prefixes=0)
    requests = labelled_requests(tokenizer, traces, sep=sep)
    values, seconds = _value_all(model, tokenizer, requests, cfg, estimators, score_fn)
    reference = next((n for n in estimators if VALUE_ESTIMATORS.get(n).needs_verifier), None)
    # a trace whose first step is already wrong has V_0 of the problem, which is what solvable asks
    solvable = (
        {i for i in range(len(traces)) if values[reference][i][0] > 0} if reference is not None else None
    )
    labels = [t.label for t in traces]
    figures = {}
    for name in estimators:
        probability = VALUE_ESTIMATORS.get(name).success_probability
        forms = [f for f in credit_forms if probability or not CREDIT_FORMS.get(f).needs_success_probability]
        fig = labelled_figures(
            name, values[name], labels, tau=(thresholds or {}).get(name), solvable=solvable,
            s_per_trace=seconds[name] / len(traces), credit_forms=forms, clip=cfg.clip,
        )  # fmt: skip
        if fig is None:
            raise DataError(f"probe: {name} values could not be computed for any trace (verifier failed)")
        figures[name] = fig
    return LabelledReport(
        n=len(traces),
        n_error=sum(t.label >= 0 for t in traces),
        estimators=figures,
        solvable_by=reference,
        n_solvable=len(solvable or ()),
    )
