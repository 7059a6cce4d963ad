"""The signal probe's figures: do a model's values find a wrong step that was put into a correct solution?

Each value estimator values the prefixes of a clean solution and of its corrupted twin (one wrong step,
:mod:`stepcredit.data.wrong_step`); a useful estimator gives the wrong step a lower U than the clean
trace gets at the same step, and puts the most negative U of the corrupted trace on it more often than
picking an episode at random would. This module holds the per-trace indicators, their summaries with
Wilson intervals and verdicts, and the one recommendation a report ends with; the recipe that values
the traces is :mod:`stepcredit.trainer.probe` and ``stepcredit probe`` is its command (issue 16).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from stepcredit.errors import DataError
from stepcredit.process.segment import token_char_spans
from stepcredit.process.utility import CREDIT_FORMS, marginal_utilities
from stepcredit.process.values import PrefixRequest
from stepcredit.stats import Interval, wilson_interval

__all__ = ["Interval", "wilson_interval"]


def episode_at(response_ids: Sequence[int], tokenizer: Any, ends: Sequence[int], char: int) -> int:
    """Index of the episode (into ``ends``) holding character ``char`` of the decoded response."""
    _, spans = token_char_spans(response_ids, tokenizer)
    tok = next((i for i, (_, e) in enumerate(spans) if e > char), len(spans) - 1)
    return next((k for k, e in enumerate(ends) if tok <= e), len(ends) - 1)


@dataclass(frozen=True)
class ProbeCase:
    """One solution and its corrupted twin, ready to be valued."""

    clean: PrefixRequest
    corrupt: PrefixRequest
    clean_step: int
    """Episode of the clean trace holding the step that was changed."""
    corrupt_step: int
    """Episode of the corrupted trace holding the wrong step."""


_TIE = 1e-9
"""Credits this close to the minimum tie with it: values such as thirds (Monte Carlo with K=3) give
differences that should be equal but differ in the last bit (-0.33333333333333337 vs -0.3333333333333333)."""


def _ties_at_min(c: Sequence[float]) -> list[int]:
    lowest = min(c)
    return [i for i, x in enumerate(c) if x <= lowest + _TIE]


def case_indicators(
    clean_v: Sequence[float], corrupt_v: Sequence[float], case: ProbeCase
) -> dict[str, float]:
    """The probe's per-trace figures from the two traces' values (U = V_i - V_(i-1), no clip or scale).

    ``lower``: U at the wrong step < U at the same step of the clean trace. ``argmin``: the most
    negative U of the corrupted trace is on the wrong step (1/m when m episodes tie for it).
    ``chance``: 1/S, what picking an episode at random scores. ``argmin_next``: the most negative U is
    on the wrong step or the one after it (where the error is first built on; a policy that often
    corrects a slip loses its value there), against ``chance_next`` (2/S). ``final_drop``: V after
    the whole corrupted response < V after the clean one. ``v_before`` / ``v_after``: V of the corrupted
    trace just before and just after the wrong step (for ``monte_carlo``: how often the policy still
    reaches the gold answer once the wrong result is written; near 0 if it follows its own chain).
    """
    u_clean, u_bad = marginal_utilities(clean_v), marginal_utilities(corrupt_v)
    ties = _ties_at_min(u_bad)
    near = {case.corrupt_step, min(case.corrupt_step + 1, len(u_bad) - 1)}
    return {
        "lower": float(u_bad[case.corrupt_step] < u_clean[case.clean_step]),
        "argmin": (1.0 / len(ties)) if case.corrupt_step in ties else 0.0,
        "chance": 1.0 / len(u_bad),
        "argmin_next": len(near.intersection(ties)) / len(ties),
        "chance_next": len(near) / len(u_bad),
        "final_drop": float(corrupt_v[-1] < clean_v[-1]),
        "v_before": float(corrupt_v[case.corrupt_step]),
        "v_after": float(corrupt_v[case.corrupt_step + 1]),
    }


def credit_indicators(
    clean_v: Sequence[float], corrupt_v: Sequence[float], case: ProbeCase, *, form: str, clip: float = 0.0
) -> dict[str, float]:
    """The locating figures of one credit form of :data:`CREDIT_FORMS`, on its step credits c_i (what
    the process channel carries at episode i's end with ``process.last_episode=utility``, and what a
    step-level estimator such as ``vineppo`` gives every token of the step) instead of the plain,
    unclipped U_i of :func:`case_indicators`; ``clip`` is ``process.clip``.

    ``lower``: c at the wrong step < c at the same step of the clean trace; ``argmin``: the most negative
    c of the corrupted trace is on the wrong step (1/m for an m-way tie); ``chance``: 1/S. A form that
    pays no negative credit (``watermark``: c_i >= 0) ties every step that lost value at 0, so it can
    only score about chance here: it is built to ignore drops, not to point at them.
    """
    fn = CREDIT_FORMS.get(form)
    c_clean = fn(clean_v, clip=clip, scale=1.0, zero_last=False)
    c_bad = fn(corrupt_v, clip=clip, scale=1.0, zero_last=False)
    for c, v in ((c_clean, clean_v), (c_bad, corrupt_v)):
        if len(c) != len(v) - 1:
            raise DataError(
                f"credit form {form!r}: {len(v)} values gave {len(c)} credits, expected {len(v) - 1}"
            )
    ties = _ties_at_min(c_bad)
    return {
        "lower": float(c_bad[case.corrupt_step] < c_clean[case.clean_step]),
        "argmin": (1.0 / len(ties)) if case.corrupt_step in ties else 0.0,
        "chance": 1.0 / len(c_bad),
    }


@dataclass(frozen=True)
class PositionBaseline:
    """The argmin's hit rate on the traces that have a peer (another erroneous trace with as many steps),
    beside what it scores against the peers' wrong steps instead of its own.

    Chance (1/S) assumes the wrong step could be any step. It rarely is: the injector prefers an
    equation that is not the last, ProcessBench's labels cluster early. An estimator that always
    blames, say, the second step then beats 1/S without looking at the trace; against the wrong steps
    of other traces of the same length it does not."""

    n: int
    """Traces with at least one peer."""
    hit: float
    """The hit rate on them against their own labels."""
    swapped: float
    """The mean hit rate against each peer's label: where the errors of traces this long usually sit."""
    diff_ci: Interval
    """95 % interval of ``hit - swapped``, trace by trace (normal approximation: mean +- 1.96 se)."""

    def describe(self) -> str:
        """One line, as the probe's tables print it."""
        verdict = "beats position" if self.beaten else "no better than position"
        return (
            f"own {self.hit:.3f}, swapped {self.swapped:.3f} on {self.n} traces: difference "
            f"{self.hit - self.swapped:+.3f} [95% {self.diff_ci.low:+.3f}, {self.diff_ci.high:+.3f}] -> {verdict}"
        )

    @property
    def beaten(self) -> bool:
        """The estimator finds the labelled step more often than where errors usually sit (the whole
        interval of the difference above 0)."""
        return self.diff_ci.low > 0


def position_lines(baselines: Mapping[str, PositionBaseline | None], against: str) -> list[str]:
    """The probes' table lines on where wrong steps usually sit: a header saying what each argmin is also
    scored ``against``, then one line per estimator that has a baseline; none when no estimator has one."""
    shown = [(n, b) for n, b in baselines.items() if b is not None]
    if not shown:
        return []
    head = (
        f"where wrong steps usually sit (chance 1/S assumes any step): the hit rate against {against}, "
        "beside the own on the same traces:"
    )
    return [head] + [f"  {n:<22} {b.describe()}" for n, b in shown]


def position_baseline(traces: Sequence[tuple[int, Sequence[int], int]]) -> PositionBaseline | None:
    """:class:`PositionBaseline` of erroneous traces given as (step count, the steps that tie for the
    lowest U, label); None when no two traces have as many steps."""
    by_len: dict[int, list[tuple[Sequence[int], int]]] = {}
    for n_steps, ties, label in traces:
        by_len.setdefault(n_steps, []).append((ties, label))
    hit, swapped = [], []
    for group in by_len.values():
        for i, (ties, label) in enumerate(group):
            if len(group) < 2:
                continue
            score = 1.0 / len(ties)
            hit.append(score if label in ties else 0.0)
            others = [lab for j, (_, lab) in enumerate(group) if j != i]
            swapped.append(sum(score for lab in others if lab in ties) / len(others))
    if not hit:
        return None
    n = len(hit)
    d = [a - b for a, b in zip(hit, swapped, strict=True)]
    mean = sum(d) / n
    nan = float("nan")
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else nan
    return PositionBaseline(n, sum(hit) / n, sum(swapped) / n, Interval(mean - 1.96 * se, mean + 1.96 * se))


Verdict = Literal["signal", "no signal", "too few traces"]
"""What a probe's figures say about one estimator (see :func:`verdict`)."""

MIN_TRACES = 30
"""Below this many scored traces a hit rate whose interval reaches chance is "too few traces" rather
than "no signal": at n = 20 a ratio to chance of 0.9-1.1x is well inside the noise."""


def verdict(hit: Interval, chance: float, n: int) -> Verdict:
    """``signal`` when the whole interval of the hit rate lies above chance; else ``too few traces`` when
    fewer than :data:`MIN_TRACES` traces were scored (the interval is too wide to rule a signal out);
    else ``no signal``."""
    if hit.low > chance:
        return "signal"
    return "too few traces" if n < MIN_TRACES else "no signal"


@dataclass(frozen=True)
class Locating:
    """How often the most negative credit of a corrupted trace falls on its wrong step."""

    n: int
    """Traces these figures are over."""
    lower: float | None
    """Share where the credit at the wrong step is lower than at the same step of the clean trace (None
    on labelled traces, :mod:`stepcredit.process.probe_labelled`: no clean twin)."""
    argmin: float
    """Share where the most negative credit is on the wrong step (the hit rate; 1/m for an m-way tie)."""
    chance: float
    """What picking an episode at random scores (mean 1/S)."""
    argmin_vs_chance: float
    """``argmin / chance``."""
    argmin_ci: Interval
    """Wilson 95 % interval of ``argmin``."""
    vs_chance_ci: Interval
    """The same interval as a ratio to chance."""
    verdict: Verdict
    """What the interval says (:func:`verdict`)."""
    v_before: float | None = None
    """Mean V of the corrupted trace just before the wrong step (None for credit forms)."""
    v_after: float | None = None
    """Mean V of the corrupted trace just after it."""

    @property
    def signal(self) -> bool:
        """The whole interval of the hit rate lies above chance (verdict ``signal``)."""
        return self.argmin_ci.low > self.chance

    @property
    def too_few(self) -> bool:
        """No signal, and too few traces to rule one out (verdict ``too few traces``)."""
        return not self.signal and self.n < MIN_TRACES


def locating(rows: Sequence[dict[str, float]]) -> Locating:
    """The :class:`Locating` figures from per-trace indicators (:func:`case_indicators` or
    :func:`credit_indicators` rows)."""
    n = len(rows)
    mean = {k: sum(r[k] for r in rows) / n for k in rows[0]}
    ci = wilson_interval(mean["argmin"], n)
    chance = mean["chance"]
    return Locating(
        n=n,
        lower=mean.get("lower"),
        argmin=mean["argmin"],
        chance=chance,
        argmin_vs_chance=mean["argmin"] / chance,
        argmin_ci=ci,
        vs_chance_ci=Interval(ci.low / chance, ci.high / chance),
        verdict=verdict(ci, chance, n),
        v_before=mean.get("v_before"),
        v_after=mean.get("v_after"),
    )


@dataclass(frozen=True)
class CreditFigures:
    """The locating figures of one credit form (:data:`CREDIT_FORMS`) on one estimator's values."""

    all: Locating
    """Over every scored trace."""
    solvable: Locating | None
    """Over the traces the policy can solve (None without a reference estimator or such traces)."""


@dataclass(frozen=True)
class EstimatorFigures:
    """What the probe measured for one value estimator."""

    name: str
    """The value estimator (:data:`VALUE_ESTIMATORS`)."""
    all: Locating
    """Plain U = V_i - V_(i-1) over every scored trace."""
    solvable: Locating | None
    """The same over the traces the policy can solve (:func:`solvable_figures`)."""
    argmin_next: float
    """Share where the most negative U is on the wrong step or the next one."""
    chance_next: float
    """The chance of ``argmin_next`` (mean 2/S)."""
    argmin_next_vs_chance: float
    """``argmin_next / chance_next``."""
    final_drop: float
    """Share where V after the whole corrupted response is below the clean one's."""
    s_per_trace: float
    """Seconds of valuing per trace (clean and corrupted counted apart)."""
    unscored: int
    """Traces left out because the verifier could not score them (NaN values)."""
    credits: dict[str, CreditFigures]
    """Per credit form, its step credits' locating figures."""
    same_length: PositionBaseline | None = None
    """The hit rate against the wrong steps of other corrupted traces of as many episodes (None: no two
    such traces)."""


@dataclass(frozen=True)
class RankCorrelation:
    """Spearman's rank correlation, over every prefix of every trace, of two estimators' V."""

    x: str
    """An estimator whose V needs no verifier (a likelihood)."""
    y: str
    """The reference: an estimator whose V is a chance of reaching the gold answer."""
    spearman: float
    """The correlation (nan without spread)."""


@dataclass(frozen=True)
class ProbeReport:
    """The probe's result: per estimator its figures, with intervals and a verdict."""

    n: int
    """Traces probed (a clean solution and its corrupted twin each)."""
    chance: float
    """Chance of the argmin (mean 1/S over the traces)."""
    chance_next: float
    """Chance of the argmin on the wrong step or the next (mean 2/S)."""
    estimators: dict[str, EstimatorFigures]
    """Per value estimator, in the order given."""
    solvable_by: str | None
    """The reference estimator that says which traces the policy can solve (its V_0 > 0)."""
    n_solvable: int
    """How many traces it says the policy can solve."""
    rank_correlation: RankCorrelation | None
    """V of a likelihood estimator against the reference's, when both ran."""
    skipped: int = 0
    """Solutions with no equation to make wrong."""
    not_correct: int = 0
    """Solutions the verifier does not score correct (no baseline for a wrong step)."""

    @property
    def recommendation(self) -> Recommendation:
        """The one recommendation the figures support (:func:`recommend`)."""
        return recommend(self.estimators)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: intervals as ``{"low", "high"}``; each estimator's ``all`` figures also at its top
        level (``lower``, ``argmin``, ``argmin_vs_chance``, ...) as the table shows them."""
        out = _json_ready(asdict(self))
        out["recommendation"] = asdict(self.recommendation)
        for name, e in self.estimators.items():
            flat = {k: v for k, v in _json_ready(asdict(e.all)).items() if k not in ("n",)}
            out["estimators"][name] = {**flat, **out["estimators"][name], "n_scored": e.all.n}
        return out


def _json_ready(x: Any) -> Any:
    """``asdict``'s output with every :class:`Interval` as ``{"low", "high"}`` (a bare pair in JSON
    would lose which end is which)."""
    if isinstance(x, Interval):
        return x._asdict()
    if isinstance(x, dict):
        return {k: _json_ready(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_ready(v) for v in x]
    return x


def solvable_figures(by_case: dict[int, dict[str, float]], solvable: set[int] | None) -> Locating | None:
    """The locating figures on the traces the policy can solve (its continuation V_0 of the clean trace >
    0). On the others every continuation value is 0 at every prefix, so the argmin ties over all
    episodes and scores exactly chance whatever the estimator: they pull the overall figures to chance
    and say nothing about the estimator. None when no trace is solvable (or nothing says which are)."""
    rows = [r for i, r in by_case.items() if solvable is not None and i in solvable]
    return locating(rows) if rows else None


@dataclass(frozen=True)
class Recommendation:
    """What the probe advises: one value estimator for process rewards, or none, and why."""

    estimator: str | None
    """The value estimator to train with (``process.value_estimator``); None: none carries a signal here."""
    reason: str
    """Why, from the figures the tables show."""

    def describe(self) -> str:
        """The tables' last line: the setting to train with (or none) and why."""
        use = f"process.value_estimator={self.estimator}" if self.estimator else "no process rewards"
        return f"recommendation: {use}: {self.reason}"


def recommend(estimators: dict[str, EstimatorFigures]) -> Recommendation:
    """One recommendation from every estimator's verdict over all scored traces.

    Among the estimators whose hit-rate interval lies wholly above chance (verdict ``signal``) the one
    with the highest lower bound of its ratio to chance (the most certain signal; the cheaper per trace
    on a tie); none when no estimator has a signal. The solvable traces are a subset of the same traces:
    the unsolvable ones score exactly chance whatever the estimator, so they only pull the overall
    figures towards chance, and the subset's wider interval (fewer traces) cannot overturn a verdict on
    all of them: it is quoted as support, never voted."""
    if not estimators:
        return Recommendation(None, "no estimator was probed")
    signal = [e for e in estimators.values() if e.all.signal]
    if not signal:
        best = max(estimators.values(), key=lambda e: e.all.vs_chance_ci.low)
        m = best.all
        figures = (
            f"the best, {best.name}, {m.argmin_vs_chance:.2f}x chance with a 95 % interval of "
            f"{m.vs_chance_ci.low:.2f}-{m.vs_chance_ci.high:.2f}x that reaches 1"
        )
        if any(e.all.too_few for e in estimators.values()):
            return Recommendation(
                None,
                f"none yet: no estimator's interval lies above chance on {m.n} traces ({figures}); too few "
                "traces to rule a signal out: probe more (--n)",
            )
        return Recommendation(
            None,
            f"none: no estimator puts its most negative U on the wrong step more often than chance ({figures}); "
            "process rewards from these values would add noise: train on outcome rewards",
        )
    located = [e for e in signal if e.same_length is None or e.same_length.beaten]
    if not located:
        e = max(signal, key=lambda e: e.all.vs_chance_ci.low)
        b = e.same_length
        assert b is not None
        return Recommendation(
            None,
            f"none: {e.name} puts its most negative U on the wrong step {e.all.argmin_vs_chance:.2f}x as often as "
            f"chance, but no more often than on where the wrong steps of traces as long usually sit (on {b.n} "
            f"traces: {b.hit:.3f} of their own, {b.swapped:.3f} of other traces', difference "
            f"{b.hit - b.swapped:+.3f} [{b.diff_ci.low:+.3f}, {b.diff_ci.high:+.3f}]): it points at a position, "
            "not at the trace's error",
        )
    signal = located
    best = max(signal, key=lambda e: (e.all.vs_chance_ci.low, -e.s_per_trace))
    m = best.all
    reason = (
        f"its most negative U falls on the wrong step {m.argmin_vs_chance:.2f}x as often as chance "
        f"(95 % interval {m.vs_chance_ci.low:.2f}-{m.vs_chance_ci.high:.2f}x, wholly above 1) on {m.n} traces"
    )
    if best.same_length is not None:
        b = best.same_length
        reason += (
            f", and more often than other traces' wrong steps of as many episodes ({b.hit:.3f} against "
            f"{b.swapped:.3f} on {b.n})"
        )
    others = [e.name for e in signal if e is not best]
    if others:
        reason += f"; the highest lower bound of the estimators with a signal (also: {', '.join(others)})"
    sv = best.solvable
    if sv is not None and sv.signal:
        reason += f"; on the {sv.n} traces the policy can solve: {sv.argmin_vs_chance:.2f}x, a signal too"
    elif sv is not None and sv.too_few:
        reason += (
            f"; the {sv.n} traces the policy can solve are too few for a verdict of their own "
            f"({sv.argmin_vs_chance:.2f}x), which does not weaken the one on all traces"
        )
    elif sv is not None:
        reason += (
            f"; but on the {sv.n} traces the policy can solve alone its interval reaches chance "
            f"({sv.argmin_vs_chance:.2f}x): a weak signal, check it on more traces"
        )
    return Recommendation(best.name, reason)
