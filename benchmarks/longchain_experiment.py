"""Issue 16's experiment: outcome GRPO vs ``grpo_process`` with forced-answer and with Monte Carlo
values on the long-chain ``arith`` regime, several seeds, the same samples per step and steps.

One SFT model (``stepcredit sft --preset longchain``) is trained once, or given with ``--sft-model``;
every RL run starts from it (``model.path=SFT sft.steps=0``), so the variants differ only in the reward
side and the seeds only in RL sampling and data order. Runs go ``--parallel`` at a time with
``--threads`` torch threads each (keep parallel x threads = the machine's cores); a run whose
``metrics.jsonl`` already reaches the last step is not run again.

    python benchmarks/longchain_experiment.py [--out runs/longchain_experiment] [--seeds 0,1,2] [--steps 40] \
        [--variants grpo,fa,mc] [--sft-model DIR] [--png docs/img/longchain_curves.png] [--json] \
        [key=value ...]          # overrides for every RL run, e.g. rollout.prompts_per_step=8

Reported per variant (means over seeds): validation accuracy after SFT and at the end, the samples at
which the mean curve first reaches outcome GRPO's final mean accuracy (and that as a fraction of
GRPO's samples), the share of all-equal-outcome groups that still got a non-zero advantage, response
length, the share of episodes whose step credit is ~0 (``process/u_near_zero_frac``), seconds per
step; and the verbosity figures (issue 24): wasted episodes and tokens per response over training
(first and last 10 steps) and at validation (after SFT and at the end), with the share of responses
the overlong penalty touched (``mid_overlong*``). The PNG has validation accuracy against samples and against wall-clock seconds. The machine's
load is recorded around the runs (``benchmarks/_harness.py``): seconds per step are only worth quoting
from a run that says ``"valid": true`` (never with ``--summarize-only``, nor with runs done earlier).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import Monitor, emit
from stepcredit.data.arith import count_wasted
from stepcredit.recipes.stats import paired_t

_ORACLE = [
    "process.enabled=true",
    "process.value_estimator=step_oracle",
    "process.min_episode_tokens=2",
    "algorithm.advantage=grpo_vineppo",
]
_OVERLONG = [
    "postprocess.outcome.length_penalty.form=overlong",
    "postprocess.outcome.length_penalty.penalty_factor=1.0",
]
VARIANTS: dict[str, tuple[str, list[str]]] = {
    # issue 24 on the mid-chain regime (--baseline mid_grpo): outcome GRPO; tree rollouts with their free
    # node values and grpo_vineppo; tree rollouts with outcome GRPO only (what the tree's correlated samples
    # do without step credit); exact step credit from the task's own arithmetic (the oracle, an upper bound
    # for any V(prefix) estimator), flat rollouts, the same credit path
    "mid_grpo": ("midchain", []),
    "mid_tree": ("midchain_tree", []),
    "mid_tree_outcome": ("midchain_tree", ["process.enabled=false", "algorithm.advantage=grpo"]),
    "mid_oracle": ("midchain", _ORACLE),
    "mid_tree_vine": ("midchain_tree", ["algorithm.advantage=vineppo"]),
    # the verbosity claim's controls. The length control users would pick instead of step credit: outcome
    # GRPO + DAPO's soft overlong penalty (verl's overlong_buffer), L_max = max_new_tokens = 96. Measured on
    # the SFT model (runs/mid_sft/model, 64 training prompts x 8 at T=1, 1 thread): 51 tokens per response
    # on average, 0.47 wasted episodes; responses without waste have median 40 tokens (max 87), with one
    # 59 (min 47), with two 82. A buffer of 48 (free up to 48 tokens) penalises 94 % of the wasteful
    # responses (mean -0.37) and 13 % of the clean ones (mean -0.03); DAPO's own proportion (L_cache =
    # L_max / 5 ~ 19, free up to 77) touches only 17 % of the wasteful ones (mean -0.10): kept as
    # mid_overlong_dapo to show what the paper's setting does here
    "mid_overlong": ("midchain", [*_OVERLONG, "postprocess.outcome.length_penalty.buffer_len=48"]),
    "mid_overlong_dapo": ("midchain", [*_OVERLONG, "postprocess.outcome.length_penalty.buffer_len=19"]),
    # pure step credit: VinePPO's step advantage alone, so a wasted episode (V unchanged) gets ~0 credit
    # and no outcome advantage is spread over it; exact step values (the oracle) and a tree's node values
    "mid_oracle_vine": ("midchain", [*_ORACLE[:-1], "algorithm.advantage=vineppo"]),
    # step credit with a step cost (process.step_cost): every step pays 0.1 of credit, so a step that
    # leaves the value unchanged (a wasted episode) gets -0.1 where a useful one is paid back by the value
    # it adds or keeps; the step-level counterpart of the length penalty above. Exact values (the oracle)
    # and a tree's free node values, both with grpo_vineppo (the outcome advantage stays)
    "mid_oracle_cost": ("midchain", [*_ORACLE, "process.step_cost=0.1"]),
    "mid_tree_cost": ("midchain_tree", ["process.step_cost=0.1"]),
    # the same with a cost of 0.25: the 0.1 runs cut waste 24 % at +2.4 points; is a larger cost still
    # free on accuracy, and does it carry over to the tree's own node values?
    "mid_oracle_cost25": ("midchain", [*_ORACLE, "process.step_cost=0.25"]),
    "mid_tree_cost25": ("midchain_tree", ["process.step_cost=0.25"]),
    # issue 38: estimators the policy computes for itself, in the oracle's credit path (grpo_vineppo):
    # one greedy continuation per episode end (process.mc_prefixes=0: every prefix) with the difference
    # credit and with the oracle's blame-only shape (V_0 := 1, credits sum to R - 1); TreeRL's tree credit
    # (1/sqrt(leaves) weighting, leave-one-out root) with VinePPO's step advantage; and the step cost
    # charged as a return (process.step_cost_as=return) with the oracle
    "mid_greedy": (
        "midchain_process",
        [
            "process.value_estimator=greedy_continuation",
            "process.mc_prefixes=0",
            "algorithm.advantage=grpo_vineppo",
        ],
    ),
    "mid_greedy_blame": (
        "midchain_process",
        [
            "process.value_estimator=greedy_continuation",
            "process.mc_prefixes=0",
            "process.credit=blame",
            "algorithm.advantage=grpo_vineppo",
        ],
    ),
    "mid_tree_treerl": ("midchain_tree", ["process.treerl=true", "algorithm.advantage=vineppo"]),
    # wider fan-out at the same 8 leaves (SPO-tree compares 4-6 children per node: 2 x 4 instead of
    # 2 x 2 x 2), branching where the next token is uncertain (TreeRL's entropy rule), with TreeRL's credit
    "mid_tree_treerl_wide": (
        "midchain_tree",
        [
            "process.treerl=true",
            "algorithm.advantage=vineppo",
            "rollout.tree.branching=[2,4]",
            "rollout.tree.branch_at=entropy",
        ],
    ),
    "mid_oracle_cost_return": (
        "midchain",
        [*_ORACLE, "process.step_cost=0.1", "process.step_cost_as=return"],
    ),
    # the same cost charged as a return with the tree's own node values (the estimator's counterpart)
    "mid_tree_cost_return": ("midchain_tree", ["process.step_cost=0.1", "process.step_cost_as=return"]),
    "grpo": ("longchain", []),
    "fa": (
        "longchain_process",
        ["process.value_estimator=forced_answer_logprob", "algorithm.advantage=grpo_process"],
    ),
    # Monte Carlo (VinePPO) at a cost a CPU can pay: K=2 continuations at 4 prefixes per response
    # (V_0, two evenly spaced episode ends and the whole response, which is scored, not sampled)
    # (V_0 of each response is the leave-one-out mean reward of its group: process.mc_v0=group)
    "mc": (
        "longchain_process",
        [
            "algorithm.advantage=grpo_process",
            "process.value_estimator=monte_carlo",
            "process.mc_samples=2",
            "process.mc_prefixes=4",
        ],
    ),
    "greedy": (
        "longchain_process",
        ["algorithm.advantage=grpo_process", "process.value_estimator=greedy_continuation"],
    ),
    # VinePPO's step advantage (every token of a step gets that step's change of value) over Monte Carlo
    # values (K=2 at 4 prefixes) and over one greedy continuation at 6 prefixes (about the same
    # generation: 2 sampled continuations of ~1/3 and ~2/3 of a response vs 4 greedy ones of 1/5..4/5)
    "vine": (
        "longchain_process",
        [
            "algorithm.advantage=vineppo",
            "process.value_estimator=monte_carlo",
            "process.mc_samples=2",
            "process.mc_prefixes=4",
        ],
    ),
    # GRPO's outcome advantage on every token plus VinePPO's step advantage from the same Monte Carlo
    # values as "vine": keeps the dense outcome signal that vineppo alone spreads thinly over a few steps
    "grpo_vine": (
        "longchain_process",
        [
            "algorithm.advantage=grpo_vineppo",
            "process.value_estimator=monte_carlo",
            "process.mc_samples=2",
            "process.mc_prefixes=4",
        ],
    ),
    "vine_greedy": (
        "longchain_process",
        [
            "algorithm.advantage=vineppo",
            "process.value_estimator=greedy_continuation",
            "process.mc_prefixes=6",
        ],
    ),
    # the forced-answer channel at a tenth of the weight: is its share of the advantage what hurts?
    # (grpo_process normalises step rewards per group, so process.scale would cancel out; the weight
    # after normalisation is algorithm.process_weight)
    "fa_w01": (
        "longchain_process",
        [
            "algorithm.advantage=grpo_process",
            "process.value_estimator=forced_answer_logprob",
            "algorithm.process_weight=0.1",
        ],
    ),
}


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("stepcredit")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "stepcredit.cli.main"]


UPTO: list[int] = []
"""When set (``--steps``), rows after that step are left out: a longer run's first steps are the run of
that many steps (constant learning rate after warm-up, the prompt stream does not depend on the length)."""


def _rows(run: Path) -> list[dict[str, Any]]:
    f = run / "metrics.jsonl"
    if not f.exists():
        return []
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return [r for r in rows if not UPTO or r.get("step", 0) <= UPTO[0]]


def _done(run: Path, steps: int) -> bool:
    return any(r.get("step") == steps and "val/accuracy" in r for r in _rows(run))


def _launch(cmd: list[str], log: Path, threads: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), RAY_AUTH_MODE="disabled")
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def run_all(args: argparse.Namespace) -> dict[str, list[Path]]:
    out: Path = args.out
    sft = args.sft_model
    if sft is None:
        sft = out / "sft" / "model"
        if not (sft / "config.json").exists():
            cmd = [*_cli(), "sft", "--preset", "longchain", "--out", str(out / "sft"), *args.sft_overrides]
            cmd.append(f"trainer.threads={args.threads * args.parallel}")
            print("+", " ".join(cmd), flush=True)
            if _launch(cmd, out / "sft.log", args.threads * args.parallel).wait() != 0:
                raise SystemExit(f"SFT failed: see {out / 'sft.log'}")
    runs: dict[str, list[Path]] = {}
    todo: list[tuple[list[str], Path]] = []
    for seed in args.seeds:
        for v in args.variants:
            preset, extra = VARIANTS[v]
            run = out / f"{v}-s{seed}"
            runs.setdefault(v, []).append(run)
            if _done(run, args.steps):
                continue
            cmd = [
                *_cli(), "train", "--preset", preset, "--out", str(run),
                f"model.path={sft}", "sft.steps=0", f"trainer.seed={seed}", f"trainer.steps={args.steps}",
                f"trainer.val_every={args.val_every}", "trainer.save_every=0", "trainer.progress=false",
                f"trainer.threads={args.threads}", *extra, *args.overrides,
            ]  # fmt: skip
            todo.append((cmd, run))
    live: list[tuple[subprocess.Popen[bytes], Path]] = []
    while todo or live:
        while todo and len(live) < args.parallel:
            cmd, run = todo.pop(0)
            print("+", " ".join(cmd), flush=True)
            live.append((_launch(cmd, run.with_suffix(".log"), args.threads), run))
        time.sleep(2)
        for p, run in list(live):
            if p.poll() is not None:
                live.remove((p, run))
                print(f"{run.name}: exit {p.returncode}", flush=True)
    return runs


def _curve(rows: list[dict[str, Any]], per_step: int) -> list[tuple[float, float, float]]:
    """(samples, seconds, val accuracy) at each validation."""
    out, secs = [], 0.0
    by_step = {r["step"]: r for r in rows if "time/step_s" in r}
    for r in rows:
        if "val/accuracy" not in r:
            continue
        step = int(r["step"])
        secs = sum(by_step[s]["time/step_s"] for s in by_step if s <= step)
        out.append((float(step * per_step), secs, float(r["val/accuracy"])))
    return out


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.mean(xs) if xs else float("nan")


def _reward_curve(
    rl: list[list[dict[str, Any]]], per_step: int, window: int = 5
) -> list[tuple[float, float]]:
    """(samples, seed-mean training reward over the last ``window`` steps) at each step."""
    k = min((len(rr) for rr in rl if rr), default=0)
    out = []
    for i in range(k):
        lo = max(0, i + 1 - window)
        out.append(
            (
                float(rl[0][i]["step"] * per_step),
                _mean([x["reward/mean"] for rr in rl if rr for x in rr[lo : i + 1]]),
            )
        )
    return out


def _se(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")


_VERBOSITY = {"wasted": "response/wasted_episodes_per_response", "tokens": "response_length/mean"}
"""Training-row keys (validation rows: ``val/`` + key) of the verbosity figures."""


def _final_samples(run: Path) -> dict[str, float]:
    """Wasted episodes and tokens (characters / 4 is not used: words) per response of the last validation."""
    f = run / "samples.jsonl"
    if not f.exists():
        return {}
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("split", "val") == "val"]  # samples.jsonl keeps every validation
    rows = [r for r in rows if r.get("step", 0) == max((x.get("step", 0) for x in rows), default=0)]
    if not rows:
        return {}
    waste = [count_wasted(r["response"]) for r in rows]
    return {
        "wasted_episodes_per_response": sum(waste) / len(rows),
        "words_per_response": sum(len(r["response"].split()) for r in rows) / len(rows),
    }


def paired_test(variant: list[float], baseline: list[float]) -> dict[str, Any]:
    """Paired t-test (seed by seed) of ``variant - baseline`` over the seeds where both are numbers: the
    mean difference, its standard error, t, degrees of freedom, two-sided p and the 95 % interval
    (scipy.stats.ttest_rel's numbers; :func:`stepcredit.recipes.stats.paired_t`)."""
    pairs = [(v, b) for v, b in zip(variant, baseline, strict=True) if v == v and b == b]
    return paired_t([v for v, _ in pairs], [b for _, b in pairs])


def estimators_json(
    runs: dict[str, list[Path]], seeds: list[int], per_step: int, steps: int, baseline: str
) -> dict[str, Any]:
    """Issue 38's summary: per variant the seeds, final accuracies and samples to reach the baseline's
    final mean accuracy (lists in seed order; a seed that never reaches it counts as the whole budget,
    ``steps x per_step``), and paired t-tests of both against the baseline."""
    finals: dict[str, list[float]] = {}
    curves: dict[str, list[list[tuple[float, float, float]]]] = {}
    for v, rs in runs.items():
        curves[v] = [_curve(_rows(r), per_step) for r in rs]
        finals[v] = [c[-1][2] if c else float("nan") for c in curves[v]]
    target = _mean(finals[baseline])
    budget = float(steps * per_step)
    out: dict[str, Any] = {
        "baseline": baseline,
        "target_accuracy": target,
        "budget_samples": budget,
        "variants": {},
    }
    for v in runs:
        reach = [next((x for x, _, a in c if x > 0 and a >= target), budget) for c in curves[v]]
        out["variants"][v] = {
            "oracle": any("step_oracle" in o for o in VARIANTS[v][1]),
            "seeds": seeds,
            "final": finals[v],
            "samples_to_target": reach,
        }
    base = out["variants"][baseline]
    for v, e in out["variants"].items():
        if v != baseline:
            e["vs_baseline"] = {
                "final": paired_test(e["final"], base["final"]),
                "samples_to_target": paired_test(e["samples_to_target"], base["samples_to_target"]),
            }
    return out


def summarize(runs: dict[str, list[Path]], per_step: int, baseline: str = "grpo") -> dict[str, Any]:
    curves = {v: [_curve(_rows(r), per_step) for r in rs] for v, rs in runs.items()}
    mean_curve: dict[str, list[tuple[float, float, float]]] = {}
    for v, cs in curves.items():
        cs = [c for c in cs if c]
        if not cs:
            continue
        k = min(len(c) for c in cs)
        mean_curve[v] = [
            (cs[0][i][0], _mean([c[i][1] for c in cs]), _mean([c[i][2] for c in cs])) for i in range(k)
        ]
    target = mean_curve[baseline][-1][2] if baseline in mean_curve else float("nan")
    grpo_samples = mean_curve[baseline][-1][0] if baseline in mean_curve else float("nan")
    start = mean_curve[baseline][0][2] if baseline in mean_curve else float("nan")
    base_final = {i: c[-1][2] for i, c in enumerate(curves.get(baseline, [])) if c}
    out: dict[str, Any] = {
        "baseline": baseline,
        "per_step_samples": per_step,
        "grpo_final": target,
        "grpo_after_sft": start,
        # "samples to reach GRPO's final accuracy" only means something when GRPO improved on SFT
        "grpo_improved": bool(target > start),
        "variants": {},
    }
    for v, rs in runs.items():
        rows = [_rows(r) for r in rs]
        rl = [[x for x in rr if x.get("step", 0) > 0 and "reward/mean" in x] for rr in rows]
        eq = sum(x.get("groups/all_equal_adv_frac", 0.0) for rr in rl for x in rr)
        moved = sum(x.get("groups/all_equal_nonzero_adv_frac", 0.0) for rr in rl for x in rr)
        mc = mean_curve.get(v, [])
        # the first validation after RL started (step 0 is the shared SFT model) at GRPO's final level
        reach = next((s for s, _, a in mc if s > 0 and a >= target), float("nan"))
        finals = {i: c[-1][2] for i, c in enumerate(curves[v]) if c}
        # paired by seed (same SFT model, same prompt order): final accuracy minus the baseline's
        diffs = [finals[i] - base_final[i] for i in finals if i in base_final]
        # per seed: the first validation after RL started at the baseline's final mean accuracy
        reach_seed = [
            next((x for x, _, a in c if x > 0 and a >= target), float("nan")) for c in curves[v] if c
        ]
        waste = [_final_samples(r) for r in rs]
        vals = [[x for x in rr if "val/accuracy" in x] for rr in rows]
        out["variants"][v] = {
            "seeds": len(rs),
            "val_final_se": _se(list(finals.values())),
            "paired_diff": _mean(diffs),
            "paired_diff_se": _se(diffs),
            "samples_to_target_per_seed": reach_seed,
            "samples_to_target_mean": _mean(reach_seed),
            "samples_to_target_se": _se(reach_seed),
            "seeds_reaching_target": sum(x == x for x in reach_seed),
            "wasted_episodes_per_response": _mean(
                [w.get("wasted_episodes_per_response", float("nan")) for w in waste]
            ),
            "words_per_response": _mean([w.get("words_per_response", float("nan")) for w in waste]),
            "val_after_sft": _mean([c[0][2] for c in curves[v] if c]),
            "val_final": _mean([c[-1][2] for c in curves[v] if c]),
            "val_final_per_seed": [c[-1][2] if c else None for c in curves[v]],
            "samples_to_grpo_final": reach,
            "samples_frac_of_grpo": reach / grpo_samples if grpo_samples == grpo_samples else float("nan"),
            "all_equal_groups_frac": _mean(
                [x.get("groups/all_equal_frac", float("nan")) for rr in rl for x in rr]
            ),
            "all_equal_groups_moved_share": moved / eq if eq > 0 else float("nan"),
            "response_length": _mean([x["response_length/mean"] for rr in rl for x in rr]),
            "u_near_zero_frac": _mean(
                [x.get("process/u_near_zero_frac", float("nan")) for rr in rl for x in rr]
            ),
            "s_per_step": _mean([x["time/step_s"] for rr in rl for x in rr if "time/step_s" in x]),
            "overlong_frac": _mean([x.get("reward/overlong_frac", float("nan")) for rr in rl for x in rr]),
            "reward_first10": _mean([x["reward/mean"] for rr in rl for x in rr[:10]]),
            "reward_last10": _mean([x["reward/mean"] for rr in rl for x in rr[-10:]]),
            "kl_last": _mean([rr[-1].get("kl", float("nan")) for rr in rl if rr]),
            # breaking out of zero pass rate (cumulative at the last step; prompts must come back)
            "zero_pass_prompts": _mean([rr[-1].get("prompts/zero_pass", float("nan")) for rr in rl if rr]),
            "zero_pass_revisited": _mean(
                [rr[-1].get("prompts/zero_pass_revisited", float("nan")) for rr in rl if rr]
            ),
            "zero_pass_solved_later": _mean(
                [rr[-1].get("prompts/zero_pass_solved_later", float("nan")) for rr in rl if rr]
            ),
            # verbosity at (the judge's) equal accuracy: wasted episodes and tokens per response in training
            # (sampled, first and last 10 steps) and at validation (after SFT and at the end)
            **{
                f"{name}_{part}": _mean([x.get(key, float("nan")) for rr in rl for x in sl(rr)])
                for name, key in _VERBOSITY.items()
                for part, sl in (("first10", lambda r: r[:10]), ("last10", lambda r: r[-10:]))
            },
            **{
                f"val_{name}_{part}": _mean([vv[i].get(f"val/{key}", float("nan")) for vv in vals if vv])
                for name, key in _VERBOSITY.items()
                for part, i in (("after_sft", 0), ("final", -1))
            },
            "reward_curve": _reward_curve(rl, per_step),
            "curve": mc,
        }
    return out


def plot(
    summary: dict[str, Any], runs: dict[str, list[Path]], per_step: int, png: Path, val_label: str, task: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for i, v in enumerate(runs):
        colour = f"C{i}"
        for r in runs[v]:
            c = _curve(_rows(r), per_step)
            if c:
                axes[0].plot([x[0] for x in c], [x[2] for x in c], color=colour, alpha=0.25, lw=1)
                axes[1].plot([x[1] for x in c], [x[2] for x in c], color=colour, alpha=0.25, lw=1)
        mc = summary["variants"][v]["curve"]
        if mc:
            axes[0].plot([x[0] for x in mc], [x[2] for x in mc], color=colour, lw=2.5, marker="o", label=v)
            axes[1].plot([x[1] for x in mc], [x[2] for x in mc], color=colour, lw=2.5, marker="o", label=v)
        rc = summary["variants"][v]["reward_curve"]
        if rc:
            axes[2].plot([x[0] for x in rc], [x[1] for x in rc], color=colour, lw=2, label=v)
    axes[0].set_xlabel("training samples")
    axes[1].set_xlabel("wall-clock seconds (sum of step times)")
    axes[2].set_xlabel("training samples")
    for ax in axes[:2]:
        ax.set_ylabel(f"validation accuracy ({val_label})")
    axes[2].set_ylabel("training reward (sampled, 5-step mean)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{task}: seed means (thick) and seeds (thin)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/longchain_experiment"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--variants", default="grpo,fa,mc")
    ap.add_argument("--baseline", default="grpo", help="the variant whose final accuracy is the target")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--val-every", type=int, default=10)
    ap.add_argument("--sft-model", type=Path)
    ap.add_argument("--sft-overrides", nargs="*", default=[])
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--per-step", type=int, default=0, help="samples per step (default: from run 1's config)")
    ap.add_argument("--summarize-only", action="store_true", help="do not run, only read the run dirs")
    ap.add_argument("--png", type=Path)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--estimators-json", type=Path, help="write issue 38's paired summary (docs/results/estimators.json)"
    )
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    UPTO[:] = [args.steps]
    args.variants = args.variants.split(",")
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad[0]!r} (valid: {', '.join(VARIANTS)})")
    mon = Monitor()
    if args.summarize_only:
        runs = {v: [args.out / f"{v}-s{s}" for s in args.seeds] for v in args.variants}
        mon.invalidate("--summarize-only: seconds per step were measured when the runs ran, not here")
    else:
        skipped = [
            f"{v}-s{s}"
            for v in args.variants
            for s in args.seeds
            if _done(args.out / f"{v}-s{s}", args.steps)
        ]
        with mon.side(f"{args.parallel} runs at a time"):
            runs = run_all(args)
        if skipped:
            mon.invalidate(f"runs done earlier and not run again: {', '.join(skipped)}")
    import yaml

    cfg = yaml.safe_load((runs[args.variants[0]][0] / "config.yaml").read_text())
    per_step = args.per_step or int(cfg["rollout"]["prompts_per_step"]) * int(cfg["rollout"]["n"])
    val_t = float(cfg["rollout"].get("val_temperature", 0.0))
    val_label = "greedy" if val_t == 0 else f"sampled at T={val_t:g}"
    ar = cfg.get("data", {}).get("arith", {})
    task = f"arith, {ar.get('min_steps')}-{ar.get('max_steps')} operations"
    summary = summarize(runs, per_step, args.baseline)
    print(f"outcome GRPO final mean val accuracy: {summary['grpo_final']:.3f} ({per_step} samples per step)")
    if not summary["grpo_improved"]:
        print(
            f"outcome GRPO did not improve on the SFT model ({summary['grpo_after_sft']:.3f} -> "
            f"{summary['grpo_final']:.3f}): 'samples to GRPO final' compares against no learning"
        )
    head = f"{'variant':<18}{'after SFT':>10}{'final':>8}{'samples to GRPO final':>23}{'x GRPO':>8}"
    head += f"{'equal groups':>13}{'moved':>7}{'length':>8}{'|U|~0':>7}{'s/step':>8}"
    head += f"{'reward first/last 10':>22}{'KL':>7}{'stuck/back/solved':>19}"
    print(head)
    for v, s in summary["variants"].items():
        print(
            f"{v:<18}{s['val_after_sft']:>10.3f}{s['val_final']:>8.3f}{s['samples_to_grpo_final']:>23.0f}"
            f"{s['samples_frac_of_grpo']:>8.2f}{s['all_equal_groups_frac']:>13.3f}"
            f"{s['all_equal_groups_moved_share']:>7.2f}{s['response_length']:>8.1f}"
            f"{s['u_near_zero_frac']:>7.2f}{s['s_per_step']:>8.1f}"
            f"{s['reward_first10']:>11.3f}/{s['reward_last10']:<10.3f}{s['kl_last']:>7.3f}"
            f"{s['zero_pass_prompts']:>7.0f}/{s['zero_pass_revisited']:.0f}/{s['zero_pass_solved_later']:.0f}"
        )
    print(f"\npaired by seed against {args.baseline} (same SFT model and prompt order per seed):")
    print(
        f"{'variant':<18}{'final':>8}{'+-SE':>7}{'diff':>8}{'+-SE':>7}{'samples to target':>19}{'+-SE':>7}"
        f"{'seeds':>6}{'wasted/resp':>12}{'words/resp':>11}"
    )
    for v, s in summary["variants"].items():
        print(
            f"{v:<18}{s['val_final']:>8.3f}{s['val_final_se']:>7.3f}{s['paired_diff']:>8.3f}"
            f"{s['paired_diff_se']:>7.3f}{s['samples_to_target_mean']:>19.0f}{s['samples_to_target_se']:>7.0f}"
            f"{s['seeds_reaching_target']:>6d}{s['wasted_episodes_per_response']:>12.3f}{s['words_per_response']:>11.1f}"
        )
    print(
        "\nverbosity (wasted episodes / tokens per response): training first -> last 10 steps, validation after SFT -> final"
    )
    print(
        f"{'variant':<18}{'val acc':>8}{'train wasted':>16}{'train tokens':>16}{'val wasted':>14}{'val tokens':>16}"
        f"{'overlong frac':>14}"
    )
    for v, s in summary["variants"].items():
        print(
            f"{v:<18}{s['val_final']:>8.3f}{s['wasted_first10']:>8.3f}->{s['wasted_last10']:<6.3f}"
            f"{s['tokens_first10']:>9.1f}->{s['tokens_last10']:<5.1f}"
            f"{s['val_wasted_after_sft']:>7.3f}->{s['val_wasted_final']:<5.3f}"
            f"{s['val_tokens_after_sft']:>9.1f}->{s['val_tokens_final']:<5.1f}{s['overlong_frac']:>14.3f}"
        )
    if args.estimators_json:
        est = estimators_json(runs, args.seeds, per_step, args.steps, args.baseline)
        est["validation"] = val_label
        args.estimators_json.parent.mkdir(parents=True, exist_ok=True)

        # strict JSON: an undefined statistic (t with a zero SE, fewer than 2 seeds) is null, not NaN
        def strict(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: strict(v) for k, v in x.items()}
            if isinstance(x, list):
                return [strict(v) for v in x]
            return None if isinstance(x, float) and not math.isfinite(x) else x

        args.estimators_json.write_text(json.dumps(strict(est), indent=1, allow_nan=False) + "\n")
        print(f"\npaired t-tests against {args.baseline} (wrote {args.estimators_json}):")
        for v, e in est["variants"].items():
            for key, tt in e.get("vs_baseline", {}).items():
                print(
                    f"{v:<24}{key:<18} diff {tt['mean_diff']:+.4f} +- {tt['se']:.4f}  t = {tt['t']:.2f}"
                    f"  df = {tt['df']}  p = {tt['p']:.3f}  95 % CI [{tt['ci95'][0]:+.4f}, {tt['ci95'][1]:+.4f}]"
                )
    if args.png:
        plot(summary, runs, per_step, args.png, val_label, task)
        print(f"wrote {args.png}")
    settings = {
        v: {"preset": VARIANTS[v][0], "overrides": [*VARIANTS[v][1], *args.overrides], "steps": args.steps}
        for v in args.variants
    }
    common = {"seeds": args.seeds, "parallel": args.parallel, "threads": args.threads}
    emit(
        mon.finish({"benchmark": "longchain_experiment", **summary, "run_settings": common}, settings),
        args.json,
    )


if __name__ == "__main__":
    main()
