"""``stepcredit probe``: do process rewards carry signal for this model? Inject a wrong step, measure.

    stepcredit probe --model M --data arith|gsm8k|FILE [--estimators a,b] [--n 60] [--png F] [--json]

``--model`` is what every command takes (models/resolve.py): a model directory, a run directory (its
``checkpoints/final/model`` and ``config.yaml``: the task and process settings the run used), ``tiny``
or a packaged model (``smollm2``, with its preset). ``--data arith`` takes validation problems of the
config's ``data.arith`` setting, a registered dataset (``gsm8k``, ``math500``) its test split, a FILE
verl-schema rows (jsonl/parquet) whose solution is ``response``, ``extra_info.solution`` or
``extra_info.answer``. The command parses, calls :func:`stepcredit.trainer.probe.probe` and prints. Each solution gets one wrong step (a result changed
and carried forward, format kept); every estimator values the clean and the corrupted trace (one model
load) and the table says, per estimator, how often U at the wrong step is lower than in the clean
trace, how often the most negative U falls on it (against chance), how often the final V drops, and
the cost per trace, then per estimator the hit rate's Wilson 95 % interval, its ratio to chance and
a one-line verdict (signal / no signal / too few traces); a second table repeats the locating figures for each credit form (``--credits``:
the step credit c_i that form writes into the process channel, e.g. PURE's min-form or MIG's
watermark), so the form a run uses can be chosen from it. Trailing ``key=value`` arguments override
the config (e.g. ``process.mc_samples=8``). With ``--json`` the last line is the summary as JSON. With
``--grow-trees`` the ``tree`` estimator values each trace by a tree grown over it (the trace is one of
its leaves) with the config's tree rollout settings, e.g. ``rollout.tree.branch_at=entropy rollout.n=8``.
With a config whose rollouts call tools (``rollout.mode=tools``, e.g. ``--preset tools``) the prompts
are the tool rollout's and every estimator that takes tools values a prefix as training does:
continuations (``monte_carlo``, ``greedy_continuation``) are tool rollouts whose calls run in the
reward agent, a forced answer at a call is forced after its result (``--grow-trees`` is refused there).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stepcredit.data.prepare import data_names
from stepcredit.errors import UserError
from stepcredit.process.probe import EstimatorFigures, Locating, ProbeReport, position_lines

DEFAULT_ESTIMATORS = "forced_answer_logprob,monte_carlo,greedy_continuation"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="a model directory, a run directory, 'tiny', or a packaged model (smollm2)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--data",
        help=f"{', '.join(data_names())} or a jsonl/parquet file of verl-schema rows (a wrong step is put in)",
    )
    src.add_argument(
        "--traces",
        type=Path,
        metavar="FILE",
        help="a jsonl/parquet/json file of labelled traces (ProcessBench rows: problem, steps, label; the gold "
        "answer from the row's 'answer', the GSM8K/MATH-500 problem it matches, or its own final answer "
        "when final_answer_correct): find the labelled first wrong step instead of one put in",
    )
    p.add_argument(
        "--estimators",
        default=DEFAULT_ESTIMATORS,
        help=f"comma-separated value estimators ({DEFAULT_ESTIMATORS})",
    )
    p.add_argument(
        "--credits",
        default="",
        help="comma-separated credit forms to score beside each estimator (default: every registered one)",
    )
    p.add_argument(
        "--n", type=int, default=60, help="solutions to probe (default 60; with --traces: the first N)"
    )
    p.add_argument(
        "--step-sep",
        help="with --traces: what joins the steps into a response (escapes read; default \\n\\n)",
    )
    p.add_argument(
        "--skip-no-gold",
        action="store_true",
        default=None,
        help="with --traces: leave out (and count) a row whose gold answer neither the row, a dataset nor "
        "its own final answer marked correct gives, instead of stopping at it",
    )
    p.add_argument(
        "--threshold",
        metavar="TAU|NAME=TAU,...",
        help="with --traces: also ProcessBench's F1, a trace predicted wrong at its first step with U < -TAU; "
        "TAU is in each estimator's units (nats for forced_answer_logprob, a chance for monte_carlo): one "
        "for all, or per estimator as name=tau,...",
    )
    p.add_argument(
        "--seed", type=int, help="with --data: which wrong steps are drawn (and arith problems; default 0)"
    )
    p.add_argument(
        "--deltas", help="with --data: the changes a wrong result is drawn from (default -2,-1,1,2)"
    )
    p.add_argument("--gguf-file", default="", help="a GGUF file inside the model directory")
    p.add_argument(
        "--data-dir",
        type=Path,
        help="the raw GSM8K/MATH-500 directory (default: ../shared/data): --data's datasets, and where "
        "--traces looks up the gold answer of a row that has none",
    )
    p.add_argument("--png", type=Path, metavar="FILE", help="write a bar chart of the figures")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    p.add_argument(
        "--grow-trees",
        action="store_true",
        help="tree values from a tree grown over each trace with the config's rollout.n, rollout.tree.* "
        "(branch_at=entropy too), temperature and max_new_tokens, as a tree run gives them (default: "
        "Monte Carlo continuations at every episode end)",
    )
    p.add_argument(
        "--preset",
        help="config preset for data and process settings (default: the run's, a packaged model's, or default)",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. process.mc_samples=8"
    )


def _figures(m: Locating) -> str:
    return (
        f"hit rate {m.argmin:.3f} [95% {m.argmin_ci.low:.3f}, {m.argmin_ci.high:.3f}] against chance "
        f"{m.chance:.3f}: {m.argmin_vs_chance:.2f}x [{m.vs_chance_ci.low:.2f}, {m.vs_chance_ci.high:.2f}] "
        f"on {m.n} traces -> {m.verdict}"
    )


def _main_table(r: ProbeReport) -> list[str]:
    head = (
        f"{'estimator':<24} {'U lower':>8} {'argmin U':>9} {'x chance':>9} {'argmin k|k+1':>13} "
        f"{'x chance':>9} {'final V drops':>14} {'V before':>9} {'V after':>8} {'s/trace':>9}"
    )
    lines = [
        f"{r.n} traces with one wrong step carried forward ({r.skipped} without an equation and "
        f"{r.not_correct} whose solution the verifier does not score correct skipped); chance of the argmin: "
        f"{r.chance:.3f} (on the step or the next: {r.chance_next:.3f}); chance of U lower: 0.5",
        head,
        "-" * len(head),
    ]
    for name, e in r.estimators.items():
        m = e.all
        lines.append(
            f"{name:<24} {m.lower:>8.3f} {m.argmin:>9.3f} {m.argmin_vs_chance:>9.2f} "
            f"{e.argmin_next:>13.3f} {e.argmin_next_vs_chance:>9.2f} {e.final_drop:>14.3f} "
            f"{m.v_before or 0.0:>9.3f} {m.v_after or 0.0:>8.3f} {e.s_per_trace:>9.4f}"
        )
    return lines


def _credit_table(estimators: dict[str, EstimatorFigures]) -> list[str]:
    forms = [(n, f, c) for n, e in estimators.items() for f, c in e.credits.items()]
    if not forms:
        return []
    sub = f"  {'estimator':<22} {'credit form':<12} {'c lower':>8} {'argmin c':>9} {'x chance':>9} {'95% x chance':>14} {'solvable x chance':>18}"
    lines = [
        "step credit c_i by credit form (with process.clip; difference without a clip is the U above):",
        sub,
        "  " + "-" * (len(sub) - 2),
    ]
    for name, form, c in forms:
        m, sv = c.all, c.solvable
        ci = f"{m.vs_chance_ci.low:.2f}-{m.vs_chance_ci.high:.2f}"
        solv = f"{sv.argmin_vs_chance:>18.2f}" if sv else f"{'-':>18}"
        lines.append(
            f"  {name:<22} {form:<12} {m.lower:>8.3f} {m.argmin:>9.3f} {m.argmin_vs_chance:>9.2f} {ci:>14} {solv}"
        )
    return lines


def _table(r: ProbeReport) -> str:
    lines = _main_table(r)
    if r.solvable_by is not None:
        lines.append(
            f"on the {r.n_solvable} traces the policy can solve ({r.solvable_by} V_0 of the clean trace > 0):"
        )
        for name, e in r.estimators.items():
            if e.solvable is not None:
                sv = e.solvable
                lines.append(
                    f"  {name:<22} U lower {sv.lower:.3f}, V {sv.v_before or 0.0:.3f} -> {sv.v_after or 0.0:.3f}, {_figures(sv)}"
                )
    lines += position_lines(
        {n: e.same_length for n, e in r.estimators.items()},
        "the wrong step of every other trace with as many episodes",
    )
    lines += _credit_table(r.estimators)
    if r.rank_correlation is not None:
        rc = r.rank_correlation
        lines.append(f"rank correlation of {rc.x} V with {rc.y} V: {rc.spearman:.3f}")
    lines.append("verdict (does the most negative U fall on the wrong step more often than chance?):")
    lines += [f"  {name:<22} {_figures(e.all)}" for name, e in r.estimators.items()]
    lines.append(r.recommendation.describe())
    return "\n".join(lines)


def _png(report: ProbeReport, path: Path, title: str) -> None:
    from stepcredit.plotting import pyplot, save

    plt = pyplot()

    est = report.estimators
    names = list(est)
    keys = [
        ("lower", "U at wrong step < clean"),
        ("argmin", "most negative U on it"),
        ("final_drop", "final V drops"),
    ]
    forms = sorted({f for n in names for f in est[n].credits})
    if forms:
        fig, (ax, bx) = plt.subplots(
            1, 2, figsize=(max(9.0, 3.0 + 3.2 * len(names)), 3.8), gridspec_kw={"width_ratios": [1, 1]}
        )
        w = 0.8 / len(forms)
        for j, form in enumerate(forms):
            xs = [i + (j - (len(forms) - 1) / 2) * w for i in range(len(names))]
            ys = [est[n].credits[form].all.argmin_vs_chance if form in est[n].credits else 0.0 for n in names]
            bx.bar(xs, ys, w, label=form)
        bx.axhline(1.0, color="k", ls="--", lw=1, label="chance")
        bx.axhline(2.0, color="grey", ls=":", lw=1, label="2x chance")
        bx.set_xticks(range(len(names)), names)
        bx.set_ylabel("most negative c_i on the wrong step, x chance")
        bx.set_title("by credit form", fontsize=9)
        bx.legend(fontsize=7)
    else:
        fig, ax = plt.subplots(figsize=(1.8 + 2.2 * len(names), 3.6))
    width = 0.8 / len(keys)
    for j, (k, label) in enumerate(keys):
        xs = [i + (j - 1) * width for i in range(len(names))]
        ax.bar(xs, [_bar_value(est[n], k) for n in names], width, label=label)
    ax.axhline(report.chance, color="k", ls="--", lw=1, label="chance of the argmin")
    ax.axhline(0.5, color="grey", ls=":", lw=1, label="chance of U lower")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1.35)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("share of traces")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", ncol=3 if len(names) > 1 else 2)
    fig.tight_layout()
    save(fig, path)


def _bar_value(e: EstimatorFigures, key: str) -> float:
    return e.final_drop if key == "final_drop" else float(getattr(e.all, key))


def _parse(args: argparse.Namespace) -> tuple[list[str], list[str], list[int]]:
    """Estimators, credit forms and deltas from their comma-separated flags (UserError when bad)."""
    from stepcredit.process import CREDIT_FORMS, VALUE_ESTIMATORS

    if args.n < 1:
        raise UserError(f"--n {args.n}: must be >= 1")
    # each mode's own flags: one given to the other mode would be ignored, so it is refused
    own = {"--data": ("--seed", "--deltas"), "--traces": ("--step-sep", "--threshold", "--skip-no-gold")}
    mode = "--traces" if args.traces is not None else "--data"
    for other, flags in own.items():
        for flag in flags if other != mode else ():
            if getattr(args, flag[2:].replace("-", "_")) is not None:
                raise UserError(f"{flag} is a flag of {other}, and this probe reads {mode}: drop it")
    if args.traces is not None and args.grow_trees:
        raise UserError(
            "--grow-trees branches a tree at the config's episode ends, not at the labelled steps: drop it "
            "with --traces (Monte Carlo and greedy continuations value every labelled step)"
        )
    raw = args.deltas if args.deltas is not None else "-2,-1,1,2"
    try:
        deltas = [int(d) for d in raw.split(",") if d.strip()]
    except ValueError:
        deltas = []
    if not deltas or 0 in deltas:
        raise UserError(f"--deltas {raw}: expected comma-separated non-zero integers")
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    for e in estimators:
        if e not in VALUE_ESTIMATORS:
            raise UserError(f"--estimators: unknown {e!r} (valid: {', '.join(VALUE_ESTIMATORS.names())})")
    args.thresholds = _thresholds(args.threshold, estimators)
    forms = [c.strip() for c in args.credits.split(",") if c.strip()] or CREDIT_FORMS.names()
    for c in forms:
        if c not in CREDIT_FORMS:
            raise UserError(f"--credits: unknown {c!r} (valid: {', '.join(CREDIT_FORMS.names())})")
    return estimators, forms, deltas


def _thresholds(raw: str | None, estimators: list[str]) -> dict[str, float] | None:
    """``--threshold``: one tau for every estimator, or ``name=tau,...`` (each >= 0; a name probed)."""
    if raw is None:
        return None
    out: dict[str, float] = {}
    try:
        if "=" not in raw:
            out = dict.fromkeys(estimators, float(raw))
        else:
            for part in (p for p in raw.split(",") if p.strip()):
                name, _, value = part.partition("=")
                out[name.strip()] = float(value)
    except ValueError:
        raise UserError(f"--threshold {raw}: expected TAU or name=TAU,... with numbers") from None
    for name, tau in out.items():
        if name not in estimators:
            raise UserError(
                f"--threshold {raw}: {name!r} is not one of --estimators ({', '.join(estimators)})"
            )
        if not tau >= 0:
            raise UserError(f"--threshold {raw}: {tau} must be >= 0 (a trace goes wrong where U < -TAU)")
    return out


def run(args: argparse.Namespace) -> int:
    from stepcredit.cli.common import config_for_model, setup_runtime
    from stepcredit.process import check_config

    estimators, forms, deltas = _parse(args)
    cfg, model_ref, _ = config_for_model(args, args.model)
    check_config(cfg)
    setup_runtime()

    from stepcredit.data.wrong_step import load_solutions
    from stepcredit.reward import build_rewarder
    from stepcredit.rollout import ROLLOUT_MODES
    from stepcredit.runtime import set_threads
    from stepcredit.trainer.probe import probe
    from stepcredit.trainer.rollout import tool_context
    from stepcredit.trainer.setup import policy

    # rollout.mode=tools: continuations run the calls as in training (the mode's own start-up check
    # imports rollout.tools.modules and checks the names and the parser)
    with_tools = ROLLOUT_MODES.get(cfg.rollout.mode).uses_tools
    if args.traces is not None:
        if with_tools:
            raise UserError(
                f"--traces: labelled traces have no tool turns, and rollout.mode={cfg.rollout.mode} calls tools "
                "(probe them with a config without tools)"
            )
        from stepcredit.cli.probe_traces import run_traces

        return run_traces(args, cfg, model_ref, estimators, forms)
    check = ROLLOUT_MODES.get(cfg.rollout.mode).check
    if with_tools and check is not None:
        check(cfg)
    if with_tools and args.grow_trees:
        raise UserError(
            f"--grow-trees grows trees without tools, and rollout.mode={cfg.rollout.mode} calls tools "
            "(drop --grow-trees: continuations at every episode end run the tools)"
        )
    solutions = load_solutions(args.data, cfg.data.arith, n=args.n, seed=args.seed or 0, src=args.data_dir)
    set_threads(cfg.trainer.threads)  # at most the usable CPUs; STEPCREDIT_THREADS overrides
    if with_tools:
        tc = cfg.rollout.tools
        print(
            f"continuations call tools: {','.join(tc.names)} ({tc.parser}), as rollout.mode={cfg.rollout.mode}"
        )
    with policy(cfg) as (model, tok), build_rewarder(cfg.reward) as rewarder:
        report = probe(
            model, tok, solutions, cfg.process, estimators, score_fn=rewarder.verifier_fn(),
            deltas=deltas, seed=args.seed or 0, credit_forms=forms,
            tree_rollout=cfg.rollout if args.grow_trees else None,
            # the calls run in the reward agent, as the trainer's continuations do
            tools=tool_context(cfg, rewarder),
        )  # fmt: skip
    print(_table(report))
    if args.png is not None:
        _png(report, args.png, f"stepcredit probe: {args.model} on {args.data} ({report.n} traces)")
        print(f"wrote {args.png}")
    if args.json:
        print(json.dumps({**report.to_dict(), "model": model_ref.spec, "data": str(args.data)}))
    return 0
