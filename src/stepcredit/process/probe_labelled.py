"""The probe's figures on labelled traces: does a model's step credit find a wrong step someone marked?

:mod:`stepcredit.process.probe` corrupts correct solutions itself and compares each with its clean twin.
Here the traces come with a label instead (:mod:`stepcredit.data.labelled_traces`, ProcessBench's rows):
the index of the first wrong step, or -1 when every step is right. Each trace is one episode per step,
valued V_0..V_S by an estimator; U_i = V_(i+1) - V_i is the credit of step i. Per estimator:

- on the traces with a wrong step, how often the most negative U falls on it (1/m for an m-way tie)
  against picking a step at random (1/S), with Wilson's interval and the same verdict as the
  corruption probe; on it or the next step; how often U drops (< 0) at it;
- a baseline that keeps where errors usually sit, which 1/S does not (:class:`~stepcredit.process.probe.
  PositionBaseline`): the same argmin scored against the label of every other erroneous trace with as
  many steps;
- between the traces with and without a wrong step, the area under the ROC curve of the lowest U and of
  the final V (a trace that goes wrong should have the lower of each): threshold-free;
- with a threshold tau (``--threshold``), ProcessBench's own metric: a trace is predicted to go wrong at
  its first step with U < -tau (else nowhere); the share of erroneous traces whose prediction is their
  label, of correct ones predicted correct, and their harmonic mean (ProcessBench's F1).

The locating figures reuse :class:`~stepcredit.process.probe.Locating` (``lower`` is None: a labelled
trace has no clean twin to be lower than).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from stepcredit.errors import DataError
from stepcredit.process.probe import (
    Locating,
    PositionBaseline,
    Recommendation,
    _json_ready,
    _ties_at_min,
    locating,
    position_baseline,
    solvable_figures,
)
from stepcredit.process.utility import CREDIT_FORMS, marginal_utilities
from stepcredit.stats import Interval, auroc

__all__ = [
    "LabelledFigures",
    "LabelledReport",
    "first_drop",
    "labelled_figures",
    "labelled_indicators",
    "recommend_labelled",
]


def first_drop(u: Sequence[float], tau: float) -> int:
    """The step a threshold rule says a trace first goes wrong at: the first i with U_i < -tau; -1 if none."""
    return next((i for i, x in enumerate(u) if x < -tau), -1)


def labelled_indicators(values: Sequence[float], label: int, tau: float | None = None) -> dict[str, float]:
    """One trace's figures from its values V_0..V_S and its label (the first wrong step, -1: none).

    Every trace: ``min_u`` (its lowest U), ``final_v`` (V_S) and, with ``tau``, ``predicted_right`` (1
    when :func:`first_drop` gives its label). A trace with a wrong step also: ``argmin`` (the most
    negative U is on it; 1/m for an m-way tie), ``chance`` (1/S), ``argmin_next`` (on it or the next
    step) and ``chance_next``, ``drop`` (U at it < 0), ``v_before`` / ``v_after`` (V just before and
    just after it)."""
    u = marginal_utilities(values)
    if len(u) == 0:
        raise ValueError("a labelled trace has at least one step (two values)")
    out = {"min_u": min(u), "final_v": float(values[-1])}
    if tau is not None:
        out["predicted_right"] = float(first_drop(u, tau) == label)
    if label < 0:
        return out
    ties = _ties_at_min(u)
    near = {label, min(label + 1, len(u) - 1)}
    out.update(
        argmin=(1.0 / len(ties)) if label in ties else 0.0,
        chance=1.0 / len(u),
        argmin_next=len(near.intersection(ties)) / len(ties),
        chance_next=len(near) / len(u),
        drop=float(u[label] < 0.0),
        v_before=float(values[label]),
        v_after=float(values[label + 1]),
    )
    return out


@dataclass(frozen=True)
class Separation:
    """How well a per-trace score tells the traces that go wrong from those that do not."""

    auroc: float
    """P(the score ranks a trace with a wrong step below one without); 0.5 is chance."""
    ci: Interval
    """Hanley and McNeil's 95 % interval of it."""


@dataclass(frozen=True)
class ProcessBenchFigures:
    """ProcessBench's metric at a threshold: a trace goes wrong at its first step with U < -tau."""

    tau: float
    error_accuracy: float
    """Share of the traces with a wrong step whose predicted first wrong step is their label."""
    correct_accuracy: float
    """Share of the traces without one predicted to have none."""
    f1: float
    """The harmonic mean of the two (0 when either is 0)."""


@dataclass(frozen=True)
class LabelledFigures:
    """What the probe measured for one value estimator on labelled traces."""

    name: str
    n_error: int
    """Scored traces with a wrong step."""
    n_correct: int
    """Scored traces without one."""
    error: Locating | None
    """Over the traces with a wrong step: the most negative U on it (None without such traces)."""
    solvable: Locating | None
    """The same over those the policy can solve (its reference estimator's V_0 > 0)."""
    argmin_next: float
    """Share where the most negative U is on the wrong step or the next."""
    chance_next: float
    drop: float
    """Share where U at the wrong step is negative."""
    same_length: PositionBaseline | None
    """The hit rate against labels swapped among traces of equal length (None: no two such traces)."""
    min_u: Separation | None
    """The lowest U of a trace, as a score of its going wrong (None without both kinds of traces)."""
    final_v: Separation | None
    """The final V, likewise."""
    processbench: ProcessBenchFigures | None
    """ProcessBench's metric at ``--threshold`` (None without one)."""
    s_per_trace: float
    unscored: int
    """Traces left out because the verifier could not score them (NaN values)."""
    credits: dict[str, Locating]
    """Per credit form, its step credits' locating figures on the traces with a wrong step."""


def _separation(rows: dict[int, dict[str, float]], labels: Sequence[int], key: str) -> Separation | None:
    # the score of going wrong is minus the figure: the lower U (or V), the likelier a wrong step
    bad = [-r[key] for i, r in rows.items() if labels[i] >= 0]
    good = [-r[key] for i, r in rows.items() if labels[i] < 0]
    if not bad or not good:
        return None
    a, ci = auroc(bad, good)
    return Separation(a, ci)


def labelled_figures(
    name: str,
    values: Sequence[Sequence[float]],
    labels: Sequence[int],
    *,
    tau: float | None,
    solvable: set[int] | None,
    s_per_trace: float,
    credit_forms: Sequence[str] = (),
    clip: float = 0.0,
) -> LabelledFigures | None:
    """One estimator's :class:`LabelledFigures` from every trace's values (in the order of ``labels``);
    traces whose values hold a NaN (the verifier failed) are left out and counted. None when no trace
    could be scored. ``credit_forms``: also the locating figures of each form's step credits
    (:data:`~stepcredit.process.utility.CREDIT_FORMS`, with ``clip``), as the corruption probe gives."""
    ok = [i for i in range(len(labels)) if not any(math.isnan(v) for v in values[i])]
    if not ok:
        return None
    rows = {i: labelled_indicators(values[i], labels[i], tau) for i in ok}
    err = {i: r for i, r in rows.items() if labels[i] >= 0}
    n_err, n_ok = len(err), len(rows) - len(err)

    def share(key: str, keep: dict[int, dict[str, float]]) -> float:
        return sum(r[key] for r in keep.values()) / len(keep) if keep else float("nan")

    bench = None
    if tau is not None:
        good = {i: r for i, r in rows.items() if labels[i] < 0}
        a, b = share("predicted_right", err), share("predicted_right", good)
        if math.isnan(a) or math.isnan(b):  # no trace of one kind: ProcessBench's F1 is undefined
            f1 = float("nan")
        else:
            f1 = 2 * a * b / (a + b) if a + b > 0 else 0.0
        bench = ProcessBenchFigures(tau, a, b, f1)
    loc_rows = [{k: r[k] for k in ("argmin", "chance", "v_before", "v_after")} for r in err.values()]
    return LabelledFigures(
        name=name,
        n_error=n_err,
        n_correct=n_ok,
        error=locating(loc_rows) if loc_rows else None,
        solvable=solvable_figures(
            {i: {k: r[k] for k in ("argmin", "chance", "v_before", "v_after")} for i, r in err.items()},
            solvable,
        ),
        argmin_next=share("argmin_next", err),
        chance_next=share("chance_next", err),
        drop=share("drop", err),
        same_length=position_baseline(
            [(len(values[i]) - 1, _ties_at_min(marginal_utilities(values[i])), labels[i]) for i in err]
        ),
        min_u=_separation(rows, labels, "min_u"),
        final_v=_separation(rows, labels, "final_v"),
        processbench=bench,
        s_per_trace=s_per_trace,
        unscored=len(labels) - len(ok),
        credits={
            form: locating([_credit_row(values[i], labels[i], form, clip) for i in err])
            for form in credit_forms
            if err
        },
    )


def _credit_row(values: Sequence[float], label: int, form: str, clip: float) -> dict[str, float]:
    c = CREDIT_FORMS.get(form)(values, clip=clip, scale=1.0, zero_last=False)
    if len(c) != len(values) - 1:
        raise DataError(
            f"credit form {form!r}: {len(values)} values gave {len(c)} credits, expected {len(values) - 1}"
        )
    ties = _ties_at_min(c)
    return {"argmin": (1.0 / len(ties)) if label in ties else 0.0, "chance": 1.0 / len(c)}


@dataclass(frozen=True)
class LabelledReport:
    """The probe's result on labelled traces."""

    n: int
    """Traces probed."""
    n_error: int
    """Of them, with a wrong step."""
    estimators: dict[str, LabelledFigures]
    """Per value estimator, in the order given (an estimator that scored no trace is left out)."""
    solvable_by: str | None
    """The reference estimator that says which traces the policy can solve (its V_0 > 0)."""
    n_solvable: int

    @property
    def recommendation(self) -> Recommendation:
        return recommend_labelled(self.estimators)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (intervals as ``{"low", "high"}``)."""
        out = _json_ready(asdict(self))
        out["recommendation"] = asdict(self.recommendation)
        return _no_nan(out)


def _no_nan(x: Any) -> Any:
    """NaN (an F1 or a share with no trace of its kind) as null: strict JSON has no NaN."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return x


def recommend_labelled(estimators: dict[str, LabelledFigures]) -> Recommendation:
    """As :func:`~stepcredit.process.probe.recommend`, on the traces with a wrong step: among the
    estimators whose hit-rate interval lies wholly above chance and that find the labelled step more often
    than where errors usually sit (:class:`PositionBaseline`, when some traces have a peer of as many
    steps), the highest lower bound of the ratio to chance (the cheaper on a tie); none when none does."""
    scored = {n: e for n, e in estimators.items() if e.error is not None}
    if not scored:
        return Recommendation(None, "no trace with a wrong step was scored: nothing to locate")
    signal = [e for e in scored.values() if e.error is not None and e.error.signal]
    if not signal:
        best = max(scored.values(), key=lambda e: e.error.vs_chance_ci.low if e.error else 0.0)
        m = best.error
        assert m is not None
        why = "too few traces to rule a signal out: probe more" if m.too_few else "train on outcome rewards"
        return Recommendation(
            None,
            f"none: no estimator puts its most negative U on the labelled wrong step more often than chance "
            f"(the best, {best.name}, {m.argmin_vs_chance:.2f}x [{m.vs_chance_ci.low:.2f}, "
            f"{m.vs_chance_ci.high:.2f}] on {m.n} traces); {why}",
        )
    located = [e for e in signal if e.same_length is None or e.same_length.beaten]
    if not located:
        e = max(signal, key=lambda e: e.error.vs_chance_ci.low if e.error else 0.0)
        b, m = e.same_length, e.error
        assert b is not None and m is not None
        return Recommendation(
            None,
            f"none: {e.name} puts its most negative U on the labelled step {m.argmin_vs_chance:.2f}x as often as "
            f"chance, but no more often than where the errors of traces as long usually sit (on {b.n} traces: "
            f"{b.hit:.3f} of their own labels, {b.swapped:.3f} of other traces' labels, difference "
            f"{b.hit - b.swapped:+.3f} [{b.diff_ci.low:+.3f}, {b.diff_ci.high:+.3f}]): it points at a position, "
            "not at this trace's error",
        )
    best = max(located, key=lambda e: (e.error.vs_chance_ci.low if e.error else 0.0, -e.s_per_trace))
    m = best.error
    assert m is not None
    reason = (
        f"its most negative U falls on the labelled wrong step {m.argmin_vs_chance:.2f}x as often as chance "
        f"(95 % interval {m.vs_chance_ci.low:.2f}-{m.vs_chance_ci.high:.2f}x, wholly above 1) on {m.n} traces"
    )
    b = best.same_length
    if b is not None:
        reason += (
            f", and more often than where errors usually sit ({b.hit:.3f} of the own labels against "
            f"{b.swapped:.3f} of other traces' labels of as many steps, on {b.n})"
        )
    else:
        reason += "; no two erroneous traces have as many steps, so position was not ruled out"
    return Recommendation(best.name, reason)
