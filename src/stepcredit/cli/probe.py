"""``stepcredit probe``: do process rewards carry signal for this model? Inject a wrong step, measure.

    stepcredit probe --model M --data arith|gsm8k|FILE [--estimators a,b] [--n 60] [--png F] [--json]

``--model`` is a model directory, a run directory (its ``checkpoints/final/model`` and ``config.yaml``:
the task and process settings the run used), ``tiny`` or a packaged model (``smollm2``). ``--data
arith`` takes validation problems of the config's ``data.arith`` setting, ``gsm8k`` the shared GSM8K
test split, a FILE verl-schema rows (jsonl/parquet) whose solution is ``response``,
``extra_info.solution`` or ``extra_info.answer``. Each solution gets one wrong step (a result changed
and carried forward, format kept); every estimator values the clean and the corrupted trace (one model
load) and the table says, per estimator, how often U at the wrong step is lower than in the clean
trace, how often the most negative U falls on it (against chance), how often the final V drops, and
the cost per trace; a second table repeats the locating figures for each credit form (``--credits``:
the step credit c_i that form writes into the process channel, e.g. PURE's min-form or MIG's
watermark), so the form a run uses can be chosen from it. Trailing ``key=value`` arguments override
the config (e.g. ``process.mc_samples=8``). With ``--json`` the last line is the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepcredit.errors import DataError, UserError

DEFAULT_ESTIMATORS = "forced_answer_logprob,monte_carlo,greedy_continuation"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="a model directory, a run directory, 'tiny', or a packaged model (smollm2)",
    )
    p.add_argument("--data", required=True, help="arith, gsm8k, or a jsonl/parquet file of verl-schema rows")
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
    p.add_argument("--n", type=int, default=60, help="solutions to probe (default 60)")
    p.add_argument("--seed", type=int, default=0, help="which wrong steps are drawn (and arith problems)")
    p.add_argument(
        "--deltas", default="-2,-1,1,2", help="the changes a wrong result is drawn from (default -2,-1,1,2)"
    )
    p.add_argument("--gguf-file", default="", help="a GGUF file inside the model directory")
    p.add_argument("--png", type=Path, metavar="FILE", help="write a bar chart of the figures")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    p.add_argument(
        "--preset", help="config preset for data and process settings (default: the run's, or default)"
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. process.mc_samples=8"
    )


def _config(args: argparse.Namespace, run_dir: Path | None) -> Any:
    import yaml

    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict

    if args.preset:
        data = load_preset(args.preset)
    elif run_dir is not None and (run_dir / "config.yaml").exists():
        data = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    else:
        data = load_preset("default")
    return from_dict(apply_overrides(data, list(args.overrides)))


def _solutions(args: argparse.Namespace, cfg: Any) -> list[tuple[Any, str]]:
    """(sample, solution text) pairs from ``--data``."""
    from stepcredit.data.io import read_rows, row_to_sample

    if args.data == "arith":
        from stepcredit.data.arith import make_rows

        # the probe corrupts correct solutions: a noisy teacher's uncorrected slips are left out
        rows = make_rows(replace(cfg.data.arith, teacher_error_prob=0.0), args.n, seed=args.seed, split="val")
        return [(row_to_sample(r, f"arith:{i}"), r["extra_info"]["solution"]) for i, r in enumerate(rows)]
    if args.data == "gsm8k":
        from stepcredit.data.prepare import gsm8k_rows, shared_data_dir

        path = shared_data_dir() / "gsm8k" / "test.jsonl"
        rows = gsm8k_rows(path, "test")
        where = str(path)
    else:
        path = Path(args.data)
        if not path.is_file():
            raise UserError(f"--data {args.data}: not arith, gsm8k or an existing file")
        rows = read_rows(path)
        where = str(path)
    out = []
    for i, r in enumerate(rows[: args.n]):
        extra = r.get("extra_info") or {}
        text = r.get("response") or extra.get("solution") or extra.get("answer")
        if not isinstance(text, str) or not text.strip():
            raise DataError(
                f"{where}:{i + 1}: no solution text (response, extra_info.solution or extra_info.answer)"
            )
        out.append((row_to_sample(r, f"{where}:{i + 1}"), text))
    return out


def _table(summary: dict[str, Any]) -> str:
    head = (
        f"{'estimator':<24} {'U lower':>8} {'argmin U':>9} {'x chance':>9} {'argmin k|k+1':>13} "
        f"{'x chance':>9} {'final V drops':>14} {'V before':>9} {'V after':>8} {'s/trace':>9}"
    )
    lines = [
        f"{summary['n']} traces with one wrong step carried forward ({summary['skipped']} without an equation "
        f"and {summary.get('not_correct', 0)} whose solution the verifier does not score correct skipped); chance of the argmin: {summary['chance']:.3f} (on the step or the next: "
        f"{summary['chance_next']:.3f}); chance of U lower: 0.5",
        head,
        "-" * len(head),
    ]
    for name, m in summary["estimators"].items():
        lines.append(
            f"{name:<24} {m['lower']:>8.3f} {m['argmin']:>9.3f} {m['argmin_vs_chance']:>9.2f} "
            f"{m['argmin_next']:>13.3f} {m['argmin_next_vs_chance']:>9.2f} {m['final_drop']:>14.3f} "
            f"{m['v_before']:>9.3f} {m['v_after']:>8.3f} {m['s_per_trace']:>9.4f}"
        )
    if summary.get("n_solvable"):
        lines.append(
            f"on the {summary['n_solvable']} traces the policy can solve ({summary['solvable_by']} V_0 of the "
            "clean trace > 0):"
        )
        for name, m in summary["estimators"].items():
            if "solvable" in m:
                sv = m["solvable"]
                lines.append(
                    f"  {name:<22} U lower {sv['lower']:.3f}, argmin U {sv['argmin']:.3f} against chance "
                    f"{sv['chance']:.3f} ({sv['argmin_vs_chance']:.2f}x), V {sv['v_before']:.3f} -> {sv['v_after']:.3f}"
                )
    forms = [(n, f, c) for n, m in summary["estimators"].items() for f, c in m.get("credits", {}).items()]
    if forms:
        lines.append(
            "step credit c_i by credit form (with process.clip; difference without a clip is the U above):"
        )
        sub = f"  {'estimator':<22} {'credit form':<12} {'c lower':>8} {'argmin c':>9} {'x chance':>9} {'solvable x chance':>18}"
        lines += [sub, "  " + "-" * (len(sub) - 2)]
        for name, form, c in forms:
            sv = c.get("solvable")
            solv = f"{sv['argmin_vs_chance']:>18.2f}" if sv else f"{'-':>18}"
            lines.append(
                f"  {name:<22} {form:<12} {c['lower']:>8.3f} {c['argmin']:>9.3f} {c['argmin_vs_chance']:>9.2f} {solv}"
            )
    if "spearman_forced_vs_mc" in summary:
        lines.append(
            f"rank correlation of forced-answer V with Monte Carlo V: {summary['spearman_forced_vs_mc']:.3f}"
        )
    return "\n".join(lines)


def _png(summary: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["estimators"])
    keys = [
        ("lower", "U at wrong step < clean"),
        ("argmin", "most negative U on it"),
        ("final_drop", "final V drops"),
    ]
    forms = sorted({f for n in names for f in summary["estimators"][n].get("credits", {})})
    if forms:
        fig, (ax, bx) = plt.subplots(
            1, 2, figsize=(max(9.0, 3.0 + 3.2 * len(names)), 3.8), gridspec_kw={"width_ratios": [1, 1]}
        )
        w = 0.8 / len(forms)
        for j, form in enumerate(forms):
            xs = [i + (j - (len(forms) - 1) / 2) * w for i in range(len(names))]
            ys = [
                summary["estimators"][n].get("credits", {}).get(form, {}).get("argmin_vs_chance", 0.0)
                for n in names
            ]
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
        ax.bar(xs, [summary["estimators"][n][k] for n in names], width, label=label)
    ax.axhline(summary["chance"], color="k", ls="--", lw=1, label="chance of the argmin")
    ax.axhline(0.5, color="grey", ls=":", lw=1, label="chance of U lower")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1.35)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("share of traces")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", ncol=3 if len(names) > 1 else 2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from stepcredit.cli.common import setup_runtime
    from stepcredit.cli.explain import _prompt_ids

    model_dir = Path(args.model)
    run_dir = model_dir if (model_dir / "checkpoints" / "final" / "model").is_dir() else None
    if run_dir is not None:
        model_dir = run_dir / "checkpoints" / "final" / "model"
    from stepcredit.models import PACKAGED

    builtin = args.model == "tiny" or args.model in PACKAGED  # built in code or shipped in a package
    if run_dir is None and not builtin and not model_dir.is_dir():
        raise UserError(
            f"--model {args.model}: no such model or run directory (or 'tiny', {', '.join(sorted(PACKAGED))})"
        )
    if args.n < 1:
        raise UserError(f"--n {args.n}: must be >= 1")
    try:
        deltas = [int(d) for d in args.deltas.split(",") if d.strip()]
    except ValueError:
        raise UserError(f"--deltas {args.deltas}: expected comma-separated non-zero integers") from None
    if not deltas or 0 in deltas:
        raise UserError(f"--deltas {args.deltas}: expected comma-separated non-zero integers")
    cfg = _config(args, run_dir)
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    from stepcredit.process import CREDIT_FORMS, VALUE_ESTIMATORS, check_config

    credit_forms = [c.strip() for c in args.credits.split(",") if c.strip()] or CREDIT_FORMS.names()
    for c in credit_forms:
        if c not in CREDIT_FORMS:
            raise UserError(f"--credits: unknown {c!r} (valid: {', '.join(CREDIT_FORMS.names())})")

    check_config(cfg)
    for e in estimators:
        if e not in VALUE_ESTIMATORS:
            raise UserError(f"--estimators: unknown {e!r} (valid: {', '.join(VALUE_ESTIMATORS.names())})")
    solutions = _solutions(args, cfg)
    setup_runtime()
    import torch

    from stepcredit.models import load_policy
    from stepcredit.process import prefix_request
    from stepcredit.process.probe import ProbeCase, episode_at, inject_wrong_step, run_probe
    from stepcredit.reward import build_rewarder

    torch.set_num_threads(cfg.trainer.threads)
    model_cfg = (
        cfg.model
        if args.model == "tiny"
        else replace(cfg.model, path=args.model if builtin else str(model_dir), gguf_file=args.gguf_file)
    )
    model, tok = load_policy(model_cfg, seed=cfg.trainer.seed)
    rng = random.Random(args.seed)
    cases, texts, skipped = [], [], 0
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    for sample, text in solutions:
        inj = inject_wrong_step(text, rng, deltas=deltas)
        if inj is None:
            skipped += 1
            continue
        prompt = _prompt_ids(tok, list(sample.prompt), False)
        pair = []
        for t in (text, inj.text):
            ids = list(tok(t, add_special_tokens=False)["input_ids"]) + eos
            ends, req = prefix_request(sample, prompt, ids, tok, cfg.process)
            pair.append((ends, req, episode_at(ids, tok, ends, inj.position)))
        cases.append(ProbeCase(pair[0][1], pair[1][1], pair[0][2], pair[1][2]))
        texts.append((sample, text))
    if not cases:
        raise UserError(f"--data {args.data}: no solution has an equation 'a op b = c' to make wrong")
    with build_rewarder(cfg.reward) as rewarder:
        verify = rewarder.verifier_fn()
        # a "clean" trace the verifier does not score correct is no baseline for a wrong step
        scores = verify([sample for sample, _ in texts], [text for _, text in texts])  # one submission
        keep = [i for i, v in enumerate(scores) if v >= 1.0 - 1e-6]
        if not keep:
            raise UserError(f"--data {args.data}: the verifier scores none of the solutions correct")
        summary = run_probe(
            model,
            tok,
            [cases[i] for i in keep],
            cfg.process,
            estimators,
            score_fn=verify,
            credit_forms=credit_forms,
        )
    summary["skipped"] = skipped
    summary["not_correct"] = len(cases) - len(keep)
    summary["model"], summary["data"] = str(args.model), str(args.data)
    print(_table(summary))
    if args.png is not None:
        _png(summary, args.png, f"stepcredit probe: {args.model} on {args.data} ({summary['n']} traces)")
        print(f"wrote {args.png}")
    if args.json:
        print(json.dumps(summary))
    return 0
