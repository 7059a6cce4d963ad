"""``stepcredit probe --traces FILE``: the probe on labelled traces (ProcessBench's rows), its tables.

Loads the traces (:mod:`stepcredit.data.labelled_traces`), calls
:func:`stepcredit.trainer.probe.probe_labelled` and prints, per estimator: on the traces with a wrong
step, how often the most negative U falls on it against chance (with Wilson's interval and a verdict),
on it or the next, how often U drops there; the area under the ROC curve of the lowest U and of the final
V between the traces with and without a wrong step; with ``--threshold``, ProcessBench's accuracies and
F1; the credit forms' hit rates; one recommendation. Not a command of its own: ``probe`` dispatches here.
"""

from __future__ import annotations

import argparse
import codecs
import json
from typing import Any

from stepcredit.errors import UserError
from stepcredit.process.probe import Locating, position_lines
from stepcredit.process.probe_labelled import LabelledReport, Separation


def _sep(raw: str | None) -> str:
    """``--step-sep`` with its backslash escapes read (``\\n``, ``\\t``, ``\\u2192``); other text kept."""
    if raw is None:
        return "\n\n"
    try:
        # through latin-1 with the other characters as escapes: unicode_escape reads bytes as latin-1
        return str(codecs.decode(raw.encode("latin-1", "backslashreplace"), "unicode_escape"))
    except UnicodeDecodeError as e:
        raise UserError(f"--step-sep {raw!r}: not a readable escape ({e.reason})") from None


def run_traces(
    args: argparse.Namespace, cfg: Any, model_ref: Any, estimators: list[str], forms: list[str]
) -> int:
    from stepcredit.data.labelled_traces import gold_sources, load_labelled_traces
    from stepcredit.reward import build_rewarder
    from stepcredit.reward.verifiers.math.extract import marked_answer
    from stepcredit.runtime import set_threads
    from stepcredit.trainer.probe import probe_labelled
    from stepcredit.trainer.setup import policy

    sep = _sep(args.step_sep)
    traces, total, skipped = load_labelled_traces(
        args.traces,
        n=args.n,
        src=args.data_dir,
        skip_no_gold=bool(args.skip_no_gold),
        final_answer=marked_answer,
    )
    if not traces:
        raise UserError(f"--traces {args.traces}: every row read was left out for want of a gold answer")
    print(
        f"{args.traces}: the first {len(traces)} of {total} traces (--n {args.n}); gold answers: "
        f"{gold_sources(traces)}"
    )
    if skipped:
        more = ", ..." if len(skipped) > 5 else ""
        print(
            f"left out for want of a gold answer (--skip-no-gold): {len(skipped)} rows "
            f"({', '.join(skipped[:5])}{more}); rows whose final answer is right are likelier kept"
        )
    set_threads(cfg.trainer.threads)
    with policy(cfg) as (model, tok), build_rewarder(cfg.reward) as rewarder:
        report = probe_labelled(
            model, tok, traces, cfg.process, estimators, score_fn=rewarder.verifier_fn(), sep=sep,
            thresholds=args.thresholds, credit_forms=forms,
        )  # fmt: skip
    print(table(report))
    if args.png is not None:
        _png(report, args.png, f"stepcredit probe: {args.model} on {args.traces} ({report.n} traces)")
        print(f"wrote {args.png}")
    if args.json:
        print(json.dumps({**report.to_dict(), "model": model_ref.spec, "traces": str(args.traces)}))
    return 0


def _sep_figure(s: Separation | None) -> str:
    return f"{s.auroc:.3f} [{s.ci.low:.2f}, {s.ci.high:.2f}]" if s is not None else "-"


def _hit(m: Locating | None) -> str:
    if m is None:
        return "no trace with a wrong step"
    return (
        f"hit rate {m.argmin:.3f} [95% {m.argmin_ci.low:.3f}, {m.argmin_ci.high:.3f}] against chance "
        f"{m.chance:.3f}: {m.argmin_vs_chance:.2f}x [{m.vs_chance_ci.low:.2f}, {m.vs_chance_ci.high:.2f}] "
        f"on {m.n} traces -> {m.verdict}"
    )


def table(r: LabelledReport) -> str:
    """The report as the command prints it."""
    head = (
        f"{'estimator':<24} {'argmin U':>9} {'x chance':>9} {'argmin k|k+1':>13} {'x chance':>9} "
        f"{'U<0 at it':>10} {'AUC min U':>20} {'AUC final V':>20} {'s/trace':>9}"
    )
    lines = [
        f"{r.n} labelled traces, {r.n_error} with a wrong step and {r.n - r.n_error} without; one episode per step",
        head,
        "-" * len(head),
    ]
    for name, e in r.estimators.items():
        m = e.error
        argmin = f"{m.argmin:>9.3f} {m.argmin_vs_chance:>9.2f}" if m is not None else f"{'-':>9} {'-':>9}"
        nxt = e.argmin_next / e.chance_next if e.chance_next else float("nan")
        lines.append(
            f"{name:<24} {argmin} {e.argmin_next:>13.3f} {nxt:>9.2f} {e.drop:>10.3f} "
            f"{_sep_figure(e.min_u):>20} {_sep_figure(e.final_v):>20} {e.s_per_trace:>9.4f}"
        )
    lines.append(
        "AUC: how often a trace with a wrong step has the lower figure than one without (0.5: chance)"
    )
    lines += position_lines(
        {n: e.same_length for n, e in r.estimators.items()},
        "the label of every other erroneous trace with as many steps",
    )
    if any(e.processbench is not None for e in r.estimators.values()):
        lines.append(
            "ProcessBench's metric (first step with U < -tau is the predicted first wrong step; tau in V's units):"
        )
        for name, e in r.estimators.items():
            b = e.processbench
            if b is not None:
                lines.append(
                    f"  {name:<22} tau {b.tau:g}: erroneous {b.error_accuracy:.3f}, correct "
                    f"{b.correct_accuracy:.3f}, F1 {b.f1:.3f}"
                )
    if r.solvable_by is not None:
        lines.append(
            f"on the traces whose problem the policy can solve ({r.solvable_by} V_0 > 0: {r.n_solvable}):"
        )
        lines += [f"  {name:<22} {_hit(e.solvable)}" for name, e in r.estimators.items() if e.solvable]
    forms = [(n, f, c) for n, e in r.estimators.items() for f, c in e.credits.items()]
    if forms:
        lines.append("step credit c_i by credit form, most negative on the labelled step:")
        lines += [f"  {n:<22} {f:<12} {c.argmin_vs_chance:.2f}x chance" for n, f, c in forms]
    lines.append(
        "verdict (does the most negative U fall on the labelled wrong step more often than chance?):"
    )
    lines += [f"  {name:<22} {_hit(e.error)}" for name, e in r.estimators.items()]
    unscored = {n: e.unscored for n, e in r.estimators.items() if e.unscored}
    if unscored:
        lines.append(
            "left out (the verifier could not score them): "
            + ", ".join(f"{n} {k} traces" for n, k in unscored.items())
        )
    lines.append(r.recommendation.describe())
    return "\n".join(lines)


def _png(report: LabelledReport, path: Any, title: str) -> None:
    from stepcredit.plotting import pyplot, save

    plt = pyplot()

    names = list(report.estimators)
    fig, ax = plt.subplots(figsize=(1.8 + 2.4 * len(names), 3.6))
    bars = [
        ("argmin on the wrong step, x chance", lambda e: e.error.argmin_vs_chance if e.error else 0.0),
        ("AUC of min U", lambda e: e.min_u.auroc if e.min_u else 0.0),
        ("AUC of final V", lambda e: e.final_v.auroc if e.final_v else 0.0),
    ]
    w = 0.8 / len(bars)
    for j, (label, fn) in enumerate(bars):
        xs = [i + (j - 1) * w for i in range(len(names))]
        ax.bar(xs, [fn(report.estimators[n]) for n in names], w, label=label)
    ax.axhline(1.0, color="k", ls="--", lw=1, label="chance of the argmin (x chance)")
    ax.axhline(0.5, color="grey", ls=":", lw=1, label="chance of an AUC")
    ax.set_xticks(range(len(names)), names)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
