"""An experiment's results: each run's curve and compute read from its ``metrics.jsonl``, the summary
(``replication.json``, shaped as issue 44 asks) with its paired comparisons, the details, a markdown
table and a plot."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stepcredit.config import Config
from stepcredit.errors import UserError
from stepcredit.recipes.plan import Plan
from stepcredit.recipes.runs import metrics_rows
from stepcredit.recipes.spec import Arm, Spec
from stepcredit.recipes.stats import holm, paired_t, trapezoid_mean


@dataclass(frozen=True)
class RunResult:
    curve: list[float]
    steps: list[int]
    generated_tokens: float
    rollout_tokens: float
    process_tokens: float
    verifier_calls: float
    values: float
    seconds: float
    final_greedy: float | None
    device: str
    """Where it ran (``final_greedy.json``'s ``device``, else ``trainer.device`` of its ``config.yaml``): a
    file may be run in parts on different machines."""
    code: str = "unknown"
    """The code it ran (``final_greedy.json``'s ``code``: a git commit, ``+dirty`` when the checkout was
    changed; runs before the runner recorded it: ``unknown``)."""


def read_run(run: Path) -> RunResult:
    """A finished run's validation curve (step 0 first) and compute: ``generated_tokens`` (the trainer's
    running total: rollouts plus process continuations) and the RL steps' seconds less validation's."""
    rows = metrics_rows(run)
    vals = [r for r in rows if "val/accuracy" in r]
    rl = [r for r in rows if r.get("step", 0) > 0 and "time/step_s" in r]
    if not vals or not rl:
        raise UserError(f"{run}: no finished run here (metrics.jsonl without validations or RL steps)")
    done = run / "final_greedy.json"
    final = json.loads(done.read_text()) if done.is_file() else {}
    fg = final.get("accuracy")
    process = float(sum(r.get("process/generated_tokens", 0.0) for r in rl))
    # the device the runner resolved (runs before it recorded one: trainer.device as configured)
    saved = run / "config.yaml"
    trainer = (yaml.safe_load(saved.read_text()) or {}).get("trainer", {}) if saved.is_file() else {}
    device = final.get("device") or str(trainer.get("device", "unknown"))
    return RunResult(
        curve=[float(r["val/accuracy"]) for r in vals],
        steps=[int(r["step"]) for r in vals],
        generated_tokens=float(rl[-1].get("generated_tokens", float("nan"))),
        rollout_tokens=float(sum(r.get("generated/step_tokens", float("nan")) for r in rl)) - process,
        process_tokens=process,
        verifier_calls=float(sum(r.get("process/verifier_calls", 0.0) for r in rl)),
        values=float(sum(r.get("process/values", 0.0) for r in rl)),
        seconds=float(sum(r["time/step_s"] - r.get("time/val_s", 0.0) for r in rl)),
        final_greedy=None if fg is None else float(fg),
        device=device,
        code=str(final.get("code") or "unknown"),
    )


def _strict(x: Any) -> Any:
    """JSON without NaN: an undefined statistic is null."""
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_strict(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


SFT = "sft (step 0)"
"""The ``against`` of an arm's comparison with its own step-0 validation (the shared SFT model)."""


def comparisons(
    spec: Spec, primary: dict[str, list[float]], kind: str, step0: dict[str, list[float]] | None = None
) -> list[dict[str, Any]]:
    """Every arm against GRPO, against its equal-compute GRPO and against its placebo, paired by seed,
    on one endpoint; with ``step0`` (each arm's step-0 validations, seed by seed) every arm against the
    SFT model it started from (kind ``sft``: "RL beats SFT"); Holm's correction over the list (the family
    of that endpoint)."""
    pairs: list[tuple[str, str, str]] = []
    for a in spec.arms:
        if a.name != spec.baseline:
            pairs.append((a.name, spec.baseline, "grpo"))
        pairs += [(a.name, b.name, "equal_compute") for b in spec.arms if b.equal_compute_of == a.name]
        pairs += [(a.name, b.name, "placebo") for b in spec.arms if b.placebo_of == a.name]
    out = [
        {"arm": x, "against": y, "kind": k, "endpoint": kind, **paired_t(primary[x], primary[y])}
        for x, y, k in pairs
        if all(v is not None for v in primary[x] + primary[y])
    ]
    # each arm's own step 0: every arm of a seed validates the same SFT model there, with the same
    # per-row random streams, so the pair differs only by the RL the arm ran
    out += [
        {
            "arm": a.name,
            "against": SFT,
            "kind": "sft",
            "endpoint": kind,
            **paired_t(primary[a.name], step0[a.name]),
        }
        for a in spec.arms
        if step0 is not None
    ]
    for c, p in zip(out, holm([c["p"] for c in out]), strict=True):
        c["p_holm"] = p
        c["significant_holm_05"] = bool(p <= 0.05) if p == p else False
    return out


_NOTES = {
    "compute": "generated_tokens = tokens sampled from the policy: rollouts (a tree's shared prefixes once, "
    "dynamic sampling's refills included) + process continuations (monte_carlo, greedy_continuation, greedy_bisect), "
    "up to and including eos; forced-answer values generate nothing (one scoring pass per value: "
    "process_values) and verifier calls are counted apart (process_verifier_calls). seconds = the RL "
    "steps' wall time less validation's (time/step_s - time/val_s), on the machine and load of the run",
    "secondary": "final_greedy: greedy accuracy of the final model on the held-out prompts "
    "(comparisons with endpoint final_greedy; with endpoint.primary final_greedy it is the primary "
    "endpoint instead, and the validation mean the secondary one: endpoint last_validations, seed by seed "
    "in details' arms[].last_validations); auc: the validation curve's trapezoid mean over the "
    "arm's own budget (step 0 to the last step; comparisons with endpoint auc)",
    "holm": "Holm's correction within each endpoint's comparisons; the primary family is the claim",
    "sft": "with endpoint.against_sft, every arm's primary endpoint against its own step-0 validation "
    "(the shared SFT model, the same prompts and random streams), kind sft, in the primary family",
}
"""What the details' figures mean, written into ``details.json`` beside them."""


def summarize(plan: Plan, cfgs: dict[str, Config]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the summary shaped as issue 44 asks, the details: compute breakdown, endpoints' own figures)."""
    spec = plan.spec
    res = {a.name: [read_run(plan.run_dir(a.name, s)) for s in plan.run_seeds] for a in spec.arms}
    base = cfgs[spec.baseline]
    kind = f"sampled at T={base.rollout.val_temperature:g}" if base.rollout.val_temperature > 0 else "greedy"
    validations = (
        f"mean of the last {spec.last} validations (val/accuracy, {kind}, {base.data.val_size} prompts every "
        f"trainer.val_every steps, per-row common random numbers keyed by (seed, step, prompt))"
    )
    held_out = (
        f"greedy accuracy of each run's final model on {spec.final_greedy_prompts} held-out prompts of the "
        f"validation distribution, evaluated once at the end"
    )
    by_greedy = spec.primary == "final_greedy"
    endpoint = held_out if by_greedy else validations
    arms: dict[str, Any] = {}
    details: dict[str, Any] = {"arms": {}}
    for a in spec.arms:
        arms[a.name], details["arms"][a.name] = _arm_figures(plan, cfgs[a.name], a, res[a.name])
    _compute_ratios(spec, arms, details["arms"])
    greedy: dict[str, list[float | None]] = {k: v["final_greedy"] for k, v in arms.items()}
    val_means = {k: v["primary"] for k, v in arms.items()}
    if by_greedy:
        # the claim is the final greedy accuracy: it is "primary", the validation mean a secondary endpoint
        for k, v in arms.items():
            details["arms"][k]["last_validations"] = v["primary"]
            v["primary"] = v["final_greedy"]
        comps = comparisons(spec, {k: v["primary"] for k, v in arms.items()}, "primary")
        comps += comparisons(spec, val_means, "last_validations")
    else:
        step0 = {k: [c[0] for c in v["curves"]] for k, v in arms.items()} if spec.against_sft else None
        comps = comparisons(spec, val_means, "primary", step0)
        if all(all(x is not None for x in v) for v in greedy.values()):
            comps += comparisons(
                spec, {k: [float(x) for x in v if x is not None] for k, v in greedy.items()}, "final_greedy"
            )
    comps += comparisons(spec, {k: v["auc"] for k, v in details["arms"].items()}, "auc")
    summary = {"endpoint": endpoint, "seeds": list(plan.run_seeds), "arms": arms, "comparisons": comps}
    details.update(
        {
            "file": str(spec.path),
            "purpose": spec.purpose,
            "file_seeds": list(spec.seeds),
            "complete": list(plan.run_seeds) == list(spec.seeds) and not plan.extra and not plan.left_out,
            "arms_left_out": list(plan.left_out),
            "baseline": spec.baseline,
            "primary_endpoint": spec.primary,
            "secondary_endpoints": ["last_validations" if by_greedy else "final_greedy", "auc"],
            "against_sft": spec.against_sft,
            "sft_model": str(plan.sft_model),
            "final_greedy_prompts": spec.final_greedy_prompts,
            "command_line_overrides": list(plan.extra),
            **_NOTES,
        }
    )
    return _strict(summary), _strict(details)


def _arm_figures(
    plan: Plan, cfg: Config, a: Arm, rs: list[RunResult]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One arm's entry of the summary (its role, compute, curves, endpoints seed by seed) and of the
    details (its command, the compute breakdown, the curves' area)."""
    summary = {
        "oracle": a.oracle,
        "placebo_of": a.placebo_of,
        "equal_compute_of": a.equal_compute_of,
        "compute": {
            "generated_tokens": [r.generated_tokens for r in rs],
            "seconds": [r.seconds for r in rs],
        },
        "curves": [r.curve for r in rs],
        # a smoke run shortened on the command line may have fewer validations after step 0 than
        # endpoint.last (the file as written may not: plan.check): it averages those it has
        "primary": [statistics.fmean(r.curve[-min(plan.spec.last, len(r.curve) - 1) :]) for r in rs],
        "final_greedy": [r.final_greedy for r in rs],
    }
    details = {
        "preset": a.preset,
        "overrides": [*plan.spec.common, *a.overrides, *plan.extra],
        "steps": cfg.trainer.steps,
        "val_every": cfg.trainer.val_every,
        "validation_steps": rs[0].steps,
        "auc": [trapezoid_mean(r.curve) for r in rs],
        "rollout_tokens": [r.rollout_tokens for r in rs],
        "process_continuation_tokens": [r.process_tokens for r in rs],
        "process_verifier_calls": [r.verifier_calls for r in rs],
        "process_values": [r.values for r in rs],
        # seconds are comparable only between runs on the same device
        "devices": [r.device for r in rs],
        "codes": [r.code for r in rs],
    }
    return summary, details


def _compute_ratios(spec: Spec, arms: dict[str, Any], details: dict[str, Any]) -> None:
    """Compute matching: an equal-compute arm's generated tokens (and seconds) over its costly arm's,
    seed by seed, into that arm's details; a seconds ratio between runs on different devices is
    undefined (NaN)."""
    for a in spec.arms:
        if a.equal_compute_of is not None:
            mine, theirs = arms[a.name]["compute"], arms[a.equal_compute_of]["compute"]
            details[a.name]["token_ratio_to_costly_arm"] = [
                x / y if y else float("nan")
                for x, y in zip(mine["generated_tokens"], theirs["generated_tokens"], strict=True)
            ]
            same = [
                d == e
                for d, e in zip(
                    details[a.name]["devices"], details[a.equal_compute_of]["devices"], strict=True
                )
            ]
            details[a.name]["seconds_ratio_to_costly_arm"] = [
                x / y if y and ok else float("nan")
                for x, y, ok in zip(mine["seconds"], theirs["seconds"], same, strict=True)
            ]


def _parts(
    details: dict[str, Any], seeds: list[int], key: str, at: str, what: str, note: str, differ: str
) -> list[str]:
    """Lines naming the runs of each ``key`` value (``devices``, ``codes``) and the seeds whose arms ran
    on more than one, when the runs had more than one; none otherwise."""
    runs = [
        (str(v), s) for a in details["arms"].values() for v, s in zip(a.get(key, []), seeds, strict=False)
    ]
    values = sorted({v for v, _ in runs})
    if len(values) < 2:
        return []
    lines = [""] + [
        f"Runs {at} {v}: {sum(x == v for x, _ in runs)} (seeds "
        f"{', '.join(map(str, sorted({s for x, s in runs if x == v})))})" + (f"; {note}." if note else ".")
        for v in values
    ]
    mixed = sorted({s for _, s in runs if len({v for v, t in runs if t == s}) > 1})
    if mixed:
        lines.append(
            f"Seeds whose arms ran on more than one {what}: {', '.join(map(str, mixed))} (their paired "
            f"differences include {differ})."
        )
    return lines


def markdown(summary: dict[str, Any], details: dict[str, Any]) -> str:
    def pm(xs: Sequence[float | None]) -> str:
        v = [x for x in xs if x is not None]
        if not v:
            return "-"
        se = statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else float("nan")
        return f"{100 * statistics.fmean(v):.2f} +- {100 * se:.2f}"

    lines = [
        f"Endpoint: {summary['endpoint']}; seeds {', '.join(map(str, summary['seeds']))}.",
        "",
        "| arm | role | primary (%) | final greedy (%) | AUC (%) | generated tokens / run | s / run |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, a in summary["arms"].items():
        role = "oracle" if a["oracle"] else ""
        role = f"placebo of {a['placebo_of']}" if a["placebo_of"] else role
        role = f"equal compute of {a['equal_compute_of']}" if a["equal_compute_of"] else role
        toks = [x for x in a["compute"]["generated_tokens"] if x is not None]
        secs = [x for x in a["compute"]["seconds"] if x is not None]
        lines.append(
            f"| {name} | {role or ('baseline' if name == details['baseline'] else '')} | {pm(a['primary'])} | "
            f"{pm(a['final_greedy'])} | {pm(details['arms'][name]['auc'])} | "
            f"{statistics.fmean(toks):,.0f} | {statistics.fmean(secs):.1f} |"
        )
    # a file run in parts (machines, sessions): say which ran where and on which code
    lines += _parts(details, summary["seeds"], "devices", "on", "device", "seconds compare only within a device",
                    "the devices' numerics")  # fmt: skip
    lines += _parts(details, summary["seeds"], "codes", "at code", "code version", "", "the code's changes")
    lines += [
        "",
        "| arm | against | kind | endpoint | diff (points) | 95 % CI | t | df | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(x: float | None, scale: float = 1.0, fmt: str = ".2f") -> str:
        return "-" if x is None else format(scale * x, fmt)

    for c in summary["comparisons"]:
        lo, hi = c["ci95"]
        lines.append(
            f"| {c['arm']} | {c['against']} | {c['kind']} | {c['endpoint']} | {f(c['mean_diff'], 100, '+.2f')} | "
            f"[{f(lo, 100, '+.2f')}, {f(hi, 100, '+.2f')}] | {f(c['t'])} | {c['df']} | {f(c['p'], fmt='.3g')} | "
            f"{f(c['p_holm'], fmt='.3g')} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], details: dict[str, Any], png: Path) -> None:
    """Per-seed (thin) and mean (thick) validation curves of every arm, against steps and against the
    fraction of the arm's own budget."""
    from stepcredit.plotting import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, (name, a) in enumerate(summary["arms"].items()):
        steps = details["arms"][name]["validation_steps"]
        frac = [s / max(1, steps[-1]) for s in steps]
        for c in a["curves"]:
            axes[0].plot(steps, c, color=f"C{i}", alpha=0.2, lw=0.8)
        mean = [statistics.fmean(col) for col in zip(*a["curves"], strict=True)]
        axes[0].plot(steps, mean, color=f"C{i}", lw=2.2, marker="o", ms=3, label=name)
        axes[1].plot(frac, mean, color=f"C{i}", lw=2.2, marker="o", ms=3, label=name)
    axes[0].set_xlabel("RL step")
    axes[1].set_xlabel("fraction of the arm's budget (equal-compute arms run more steps)")
    for ax in axes:
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{len(summary['seeds'])} seeds: per seed (thin) and mean (thick)")
    fig.tight_layout()
    save(fig, png)


def write_outputs(plan: Plan, cfgs: dict[str, Config]) -> tuple[dict[str, Any], Path]:
    """The summary (``OUT/replication.json``), details, markdown table and plot; returns the summary."""
    summary, details = summarize(plan, cfgs)
    out = plan.out
    (out / "replication.json").write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    (out / "details.json").write_text(json.dumps(details, indent=1, allow_nan=False) + "\n")
    (out / "replication.md").write_text(markdown(summary, details))
    plot(summary, details, out / "curves.png")
    return summary, out / "replication.json"
