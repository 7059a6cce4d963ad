"""Total training time with a slow reward: synchronous baseline vs mini-batch pipeline vs one-step
off-policy vs both, same run (issue 7).

The reward is the arith math verifier behind a sleep drawn uniformly from ``[--min-s, --max-s]`` per
training response (``benchmarks/_sleepy_reward.py``, routed as a user's function and run by the reward
agent's thread backend with ``--concurrency`` requests at once; 0 = every request in flight at once, a
remote service with room for every request: two steps' batches when one is generated ahead. With one
batch's worth of room, the batch generated ahead queues behind the one being scored and the bound below,
which lets two steps' rewards run together, is out of reach of any schedule). One SFT warm-up is trained first and saved; each of the four
runs starts from it and trains ``--steps`` RL steps with the same seed, through
``stepcredit.trainer.train``:

* ``baseline``: ``pipeline.mini_batch=0``, ``pipeline.one_step_off_policy=false``;
* ``pipeline``: ``pipeline.mini_batch=--mini-batch`` (update on whole groups as their rewards arrive);
* ``off_policy``: ``pipeline.one_step_off_policy=true`` (generate step t+1 during step t's reward wait);
* ``both``.

All four use ``--loss`` (default ``decoupled_ppo``: the off-policy runs need a loss that corrects for
stale data, and on fresh data it is PPO's clipped objective), so only the schedule differs.

Reported: wall time of each ``train`` call (validation is left out of the runs: the final models are
validated afterwards with the plain math verifier, greedy, on ``data.val_size`` prompts), the
reduction of ``both`` against the baseline, the ideal reduction of wall time: ``both``'s own time
outside its steps plus the least time any schedule with one step of staleness needs for the steps' work,
the larger of sum(G+T) and the critical path in which step t's generation waits for step t-1's
generation and step t-2's rewards (a lower bound on any schedule's wall time, see
:func:`least_steps_time` and :func:`ideal_wall`), from the baseline's per-step generation (G), training
(T) and reward wait (R) times; the share of that bound reached (the same reduction on the steps' own time alone is
``ideal_reduction_steps_pct``); whether the
decoupled loss was applied (the share of updates whose proximal policy differs from the behaviour
policy, and the behaviour weights' distance from 1), the seconds per step each run spent in log-prob
passes the baseline does not run (``time/behaviour_logp_s``: the rollout's behaviour pass, 0 when the
sampling loop's log-probs are used; ``time/proximal_s``: the proximal pass, 0 when the training
pass's are the proximal ones), validation accuracy
of each run, and the audit of every reward the trainer pulled from the agent: ``lost`` (indices of a
submitted batch never handed to the trainer) and ``misassigned`` (a result handed out twice, or to a
response other than the one it scored, by the fingerprint the reward function returns).

The runs alternate (baseline, pipeline, off_policy, both, baseline, ...; ``--repeats`` rounds): wall
times are medians (min/max beside them), the bound comes from every baseline run's steps, and the
machine's load is recorded around each run (``benchmarks/_harness.py``; ``"valid": false`` says the
figures cannot be trusted, and why).

    python benchmarks/async_reward.py [--json] [--steps 8] [--min-s 0.1] [--max-s 4] [--repeats 3] [key=value ...]

Extra ``key=value`` arguments are config overrides applied to all four runs (e.g. ``loss.name=...``).
With --json the last line is ``{"baseline_s", "pipeline_s", "off_policy_s", "both_s", "reduction_pct",
"ideal_reduction_pct", "share_of_ideal", "accuracy": {...}, "lost", "misassigned", "proximal_frac": {...},
"behav_weight_dev": {...}, "extra_pass_s_per_step": {...}, ...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Monitor, emit, spread  # noqa: E402
from _sleepy_reward import fingerprint  # noqa: E402
from stepcredit.cli.common import apply_overrides, load_preset, setup_runtime  # noqa: E402
from stepcredit.config import Config, RewardConfig, from_dict, to_dict  # noqa: E402
from stepcredit.reward.run.agent import RewardAgent, Ticket  # noqa: E402
from stepcredit.types import RewardResult  # noqa: E402

RUNS: dict[str, dict[str, Any]] = {
    "baseline": {"pipeline.mini_batch": 0, "pipeline.one_step_off_policy": False},
    "pipeline": {"pipeline.mini_batch": None, "pipeline.one_step_off_policy": False},
    "off_policy": {"pipeline.mini_batch": 0, "pipeline.one_step_off_policy": True},
    "both": {"pipeline.mini_batch": None, "pipeline.one_step_off_policy": True},
}


PASSES = ("behaviour_logp", "proximal")
"""Log-prob passes only the pipelined runs may need (``time/{name}_s`` in the step metrics)."""


class Audit:
    """Watches every pull from every reward agent in this process: lost and misassigned results."""

    def __init__(self) -> None:
        self.tickets: list[tuple[Ticket, set[int]]] = []
        self.misassigned = 0
        self.failed = 0
        self._orig: tuple[Any, Any] | None = None

    def install(self) -> None:
        orig_submit, orig_get = RewardAgent.submit_samples, RewardAgent.get
        self._orig = (orig_submit, orig_get)
        audit = self

        def submit_samples(agent: RewardAgent, samples: Any, texts: Any, group_B: Any = None) -> Ticket:
            t = orig_submit(agent, samples, texts, group_B)
            audit.tickets.append((t, set()))
            return t

        def get(agent: RewardAgent, ticket: Ticket, k: int = 0) -> tuple[list[int], list[RewardResult]]:
            idx, results = orig_get(agent, ticket, k)
            seen = next(s for t, s in audit.tickets if t is ticket)
            for i, r in zip(idx, results, strict=True):
                fp = r.info.get("fp")
                want = fingerprint(
                    ticket.texts[i], ticket.samples[i].ground_truth, ticket.samples[i].extra_info
                )
                if i in seen or (fp is not None and fp != want):
                    audit.misassigned += 1
                audit.failed += not r.ok
                seen.add(i)
            return idx, results

        RewardAgent.submit_samples = submit_samples  # type: ignore[method-assign,assignment]
        RewardAgent.get = get  # type: ignore[method-assign,assignment]

    def uninstall(self) -> None:
        if self._orig is not None:
            RewardAgent.submit_samples, RewardAgent.get = self._orig  # type: ignore[method-assign,assignment]

    def counts(self) -> dict[str, int]:
        lost = sum(t.n - len(seen) for t, seen in self.tickets)
        return {
            "batches": len(self.tickets),
            "lost": lost,
            "misassigned": self.misassigned,
            "failed": self.failed,
        }


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    data = load_preset(args.preset)
    b = args.prompts * args.n
    return apply_overrides(
        data,
        [
            f"trainer.steps={args.steps}",
            f"trainer.seed={args.seed}",
            "trainer.val_every=0",
            "trainer.save_every=0",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            f"rollout.prompts_per_step={args.prompts}",
            f"rollout.n={args.n}",
            f"data.val_size={args.val_size}",
            f"reward.custom.path={HERE / '_sleepy_reward.py'}:compute_score",
            f"reward.custom.kwargs={{min_s: {args.min_s}, max_s: {args.max_s}}}",
            "reward.custom.isolate=false",
            "reward.agent.backend=thread",
            # 0: room for every request in flight, two steps' batches when one is generated ahead
            f"reward.agent.max_concurrency={args.concurrency or 2 * b}",
            f"reward.agent.max_in_flight={max(args.concurrency, 2 * b)}",
            f"reward.timeout_s={args.max_s + 30}",
            f"loss.name={args.loss}",
            *args.overrides,
        ],
    )


def warm_start(args: argparse.Namespace, work: Path) -> Path:
    """SFT once (no RL steps), shared by the four runs."""
    from stepcredit.trainer import train

    data = base_config(args)
    data = apply_overrides(
        data, ["trainer.steps=0", *([f"sft.steps={args.sft_steps}"] if args.sft_steps >= 0 else [])]
    )
    train(from_dict(data), work / "sft")
    return work / "sft" / "checkpoints" / "final" / "model"


def run_config(name: str, args: argparse.Namespace, model_dir: Path) -> Config:
    over = [f"model.path={model_dir}", "sft.steps=0"]
    for k, v in RUNS[name].items():
        v = args.mini_batch if v is None else v
        over.append(f"{k}={str(v).lower() if isinstance(v, bool) else v}")
    return from_dict(apply_overrides(base_config(args), over))


def run(name: str, args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Any]:
    from stepcredit.trainer import train

    cfg = run_config(name, args, model_dir)
    audit = Audit()
    audit.install()
    t0 = time.perf_counter()
    try:
        train(cfg, work / name)
    finally:
        audit.uninstall()
    wall = time.perf_counter() - t0
    rows = [
        json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    steps = [r for r in rows if r.get("phase", "rl") != "sft" and "time/update_s" in r]
    return {
        "wall_s": wall,
        "steps": steps,
        # the decoupled objective is applied where the policy moved since generation (proximal !=
        # behaviour), whether the proximal log-probs came from a pass of their own or the training pass
        "proximal_frac": sum(r.get("proximal", 0.0) for r in steps) / max(1, len(steps)),
        "extra_pass_s": {
            k: sum(r.get(f"time/{k}_s", 0.0) for r in steps) / max(1, len(steps)) for k in PASSES
        },
        "behav_weight_dev": max((abs(r.get("behav_weight", 1.0) - 1.0) for r in steps), default=0.0),
        "accuracy": validate_final(cfg, work / name / "checkpoints" / "final" / "model"),
        **audit.counts(),
    }


def validate_final(cfg: Config, model_dir: Path) -> float:
    """Greedy validation accuracy of a saved model, scored by the plain math verifier (no sleep)."""
    import dataclasses

    from stepcredit.data import load_task
    from stepcredit.models import load_policy
    from stepcredit.reward import build_rewarder
    from stepcredit.trainer.validate import validate

    _, val = load_task(cfg.data)
    model, tok = load_policy(dataclasses.replace(cfg.model, path=str(model_dir)))
    rw = build_rewarder(RewardConfig())
    try:
        m, _ = validate(model, tok, val, rw, max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0)
    finally:
        rw.close()
    return float(m.get("val/accuracy", float("nan")))


def _step_times(steps: list[dict[str, Any]]) -> tuple[list[float], list[float], list[float]]:
    """(G, T, R) per step: generation (with process values), update, reward wait."""
    g = [r.get("time/generation_s", 0.0) + r.get("time/process_s", 0.0) for r in steps]
    t = [r["time/update_s"] for r in steps]
    rw = [r.get("time/reward_wait_s", r.get("time/reward_s", 0.0)) for r in steps]
    return g, t, rw


def least_steps_time(steps: list[dict[str, Any]]) -> float:
    """A lower bound on the time any schedule with one step of staleness needs for these steps' work.

    Two constraints, both from the baseline's per-step generation G_t, update T_t and reward wait R_t:

    * the main thread's work is serial (generation and updates share the cores): >= sum(G+T);
    * the critical path of the dependencies: generation is one stream (step t's generation starts after
      step t-1's), and step t's generation waits for the rewards of step t-2 (they train the weights it
      samples from; one step of staleness). With end_G(t) = max(end_G(t-1), end_R(t-2)) + G_t and
      end_R(t) = end_G(t) + R_t, the last reward cannot arrive before end_R(n).

    The update between the rewards of t-2 and the generation of t is left out of the path (a
    mini-batch pipeline may have run most of it before the last reward came), and so is the last step's
    update, so this stays a lower bound for every schedule; R_t is the wait the baseline saw after its
    generation ended, no longer than the reward's latency. The path is never shorter than
    sum(G+R)/2, the two interleaved chains' mean that was the bound before: the longer chain counts.
    """
    g, t, rw = _step_times(steps)
    end_g: list[float] = []
    end_r: list[float] = []
    for i in range(len(steps)):
        start = max(end_g[i - 1] if i >= 1 else 0.0, end_r[i - 2] if i >= 2 else 0.0)
        end_g.append(start + g[i])
        end_r.append(end_g[i] + rw[i])
    return max(sum(g) + sum(t), end_r[-1] if end_r else 0.0)


def ideal_reduction(steps: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(ideal reduction of the steps' own time, mean G+T, mean R) from the baseline's per-step times:
    1 - :func:`least_steps_time` / sum(G+T+R)."""
    g, t, rw = _step_times(steps)
    total = sum(g) + sum(t) + sum(rw)
    n = max(1, len(steps))
    red = 1.0 - least_steps_time(steps) / total if total else 0.0
    return red, (sum(g) + sum(t)) / n, sum(rw) / n


def outside_steps(run: dict[str, Any]) -> float:
    """Seconds of a run outside its RL steps (start-up, model and reward-agent set-up, the final save):
    its wall time less the sum of its steps' ``time/step_s``."""
    return float(run["wall_s"] - sum(s.get("time/step_s", 0.0) for s in run["steps"]))


def ideal_wall(baseline_runs: list[dict[str, Any]], runs: list[dict[str, Any]]) -> float:
    """The bound as a wall time for the runs ``runs`` (the pipelined side): the time those runs spent
    outside their steps (median; that work is the same in every schedule, and measuring it on the same
    runs keeps a cold start or a slow save of another run out of the comparison) plus the least time any
    schedule needs for the steps' work (:func:`least_steps_time` of each baseline run, median). It is
    what the measured wall time of the pipelined runs is compared with (like for like: the reduction of
    wall time against the largest reduction of wall time possible)."""
    return statistics.median(outside_steps(r) for r in runs) + statistics.median(
        least_steps_time(r["steps"]) for r in baseline_runs
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    p.add_argument("--steps", type=int, default=8, help="RL steps per run")
    p.add_argument("--min-s", type=float, default=0.1, help="shortest simulated reward latency (s)")
    p.add_argument("--max-s", type=float, default=4.0, help="longest simulated reward latency (s)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--mini-batch", type=int, default=32, help="responses per update in the pipelined runs")
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="reward requests at once (0 = every request in flight: two steps' batches)",
    )
    p.add_argument("--val-size", type=int, default=200, help="validation prompts scored after each run")
    p.add_argument("--sft-steps", type=int, default=-1, help="SFT warm-up steps (-1 = the preset's)")
    p.add_argument("--preset", default="default", help="config preset the runs start from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds of the runs (median wall time)")
    p.add_argument(
        "--loss",
        default="decoupled_ppo",
        help="policy loss of all four runs (off-policy needs a correcting one; on-policy it equals ppo_clip)",
    )
    p.add_argument(
        "--init", type=Path, help="start from this saved model instead of training the SFT warm-up"
    )
    p.add_argument("--only", nargs="*", choices=list(RUNS), help="run a subset (the baseline is always run)")
    p.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary directory)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every run")
    args = p.parse_args()

    import torch

    torch.set_num_threads(2)
    setup_runtime()
    # math-verify warns on every slow-path call made off the main thread (the agent's threads).
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    names = ["baseline", *[n for n in RUNS if n != "baseline" and (not args.only or n in args.only)]]
    with tempfile.TemporaryDirectory(prefix="async_reward_") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        model_dir = args.init or warm_start(args, work)
        sft_s = time.perf_counter() - t0
        mon = Monitor()
        done = dict.fromkeys(names, 0)  # runs of each so far: each gets its own directory

        def one(n: str) -> dict[str, Any]:
            done[n] += 1
            return run(n, args, model_dir, work / f"{n}{done[n]}")

        reps = mon.alternate({n: partial(one, n) for n in names}, repeats=args.repeats)
        settings = {n: to_dict(run_config(n, args, model_dir).pipeline) for n in names}
    out: dict[str, dict[str, Any]] = {}
    for n, rs in reps.items():
        walls = [r["wall_s"] for r in rs]
        out[n] = {
            **min(rs, key=lambda r: abs(r["wall_s"] - statistics.median(walls))),
            "wall_s": statistics.median(walls),
            "wall_s_spread": spread(walls),
            "steps": [s for r in rs for s in r["steps"]],
            "lost": sum(r["lost"] for r in rs),
            "misassigned": sum(r["misassigned"] for r in rs),
            "failed": sum(r["failed"] for r in rs),
            "accuracy": statistics.fmean(r["accuracy"] for r in rs),
        }

    base = out["baseline"]["wall_s"]
    ideal_steps, gt, rw = ideal_reduction(out["baseline"]["steps"])
    bound_wall = ideal_wall(reps["baseline"], reps.get("both", reps[names[-1]]))
    ideal = 1.0 - bound_wall / base
    print(
        f"arith, {args.steps} RL steps x {args.prompts} prompts x {args.n} responses; reward latency "
        f"U({args.min_s:g}, {args.max_s:g}) s, {args.concurrency or 2 * args.prompts * args.n} at once; "
        f"SFT warm-up {sft_s:.1f} s (shared)"
    )
    print(f"baseline per step: generation+training {gt:.2f} s, reward wait {rw:.2f} s")
    print(
        f"{'run':<11} {'wall_s':>8} {'vs_base':>8} {'val_acc':>8} {'lost':>5} {'misasg':>6} {'failed':>6} "
        f"{'proximal':>8} {'|w-1|max':>9} {'behav_s':>8} {'prox_s':>7}"
    )
    for n, r in out.items():
        print(
            f"{n:<11} {r['wall_s']:8.1f} {100 * (1 - r['wall_s'] / base):7.1f}% {r['accuracy']:8.3f} "
            f"{r['lost']:5d} {r['misassigned']:6d} {r['failed']:6d} {r['proximal_frac']:8.2f} "
            f"{r['behav_weight_dev']:9.2e} {r['extra_pass_s']['behaviour_logp']:8.3f} "
            f"{r['extra_pass_s']['proximal']:7.3f}"
        )
    last = out.get("both", out[names[-1]])
    reduction = 100 * (1 - last["wall_s"] / base)
    share = reduction / (100 * ideal) if ideal else float("nan")
    print(
        f"reduction (both vs baseline): {reduction:.1f}%  ideal bound: {100 * ideal:.1f}% of wall time "
        f"(bound {bound_wall:.1f} s; {100 * ideal_steps:.1f}% of the steps' own time)  share of ideal: {share:.2f}"
    )
    summary: dict[str, Any] = {
        **{f"{n}_s": round(r["wall_s"], 3) for n, r in out.items()},
        "reduction_pct": round(reduction, 2),
        "ideal_reduction_pct": round(100 * ideal, 2),
        "share_of_ideal": round(share, 3),
        "bound_wall_s": round(bound_wall, 3),
        "ideal_reduction_steps_pct": round(100 * ideal_steps, 2),
        "bound": (
            "the pipelined run's time outside its steps (median) + max(sum(G+T), critical path of 'generation "
            "of step t waits for step t-1's generation and step t-2's rewards') from the baseline's per-step "
            "G, T, R (median): the least wall time of any schedule with one step of staleness; "
            "ideal_reduction_pct = 1 - bound/baseline wall, ideal_reduction_steps_pct = 1 - that least "
            "steps' time / sum(G+T+R) on the steps alone"
        ),
        "accuracy": {n: r["accuracy"] for n, r in out.items()},
        "lost": sum(r["lost"] for r in out.values()),
        "misassigned": sum(r["misassigned"] for r in out.values()),
        "failed": sum(r["failed"] for r in out.values()),
        "proximal_frac": {n: round(r["proximal_frac"], 3) for n, r in out.items()},
        "behav_weight_dev": {n: r["behav_weight_dev"] for n, r in out.items()},
        "extra_pass_s_per_step": {
            n: {k: round(v, 4) for k, v in r["extra_pass_s"].items()} for n, r in out.items()
        },
        "generation_training_s_per_step": round(gt, 3),
        "reward_wait_s_per_step": round(rw, 3),
        "steps": args.steps,
        "reward_latency_s": [args.min_s, args.max_s],
        "wall_s_spread": {n: r["wall_s_spread"] for n, r in out.items()},
        "repeats": args.repeats,
    }
    emit(mon.finish({"benchmark": "async_reward", **summary}, settings), args.json)


if __name__ == "__main__":
    main()
