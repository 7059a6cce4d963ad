"""Advantage estimators: stepcredit vs verl 0.9.1 (``verl.trainer.ppo.core_algos``) in one process.

    python benchmarks/advantages.py [--json] [--threads N] [--shapes 256x1024,1024x4096]

Each estimator runs on the same float32 batch (groups of 8, right padding, lengths in [T/4, T]);
times are the median of several runs after a warm-up, ours and verl's timed in alternation, with the
same number of torch threads (default: one per core, as a training run uses; verl's loop over time
gains little from more); ``max_abs_diff`` compares advantages on the counted tokens. verl has no ``grpo_process`` or ``prime_rloo``: those rows carry our time only.
Like ``stepcredit train``, the process first lets glibc keep freed batch-sized tensors
(:func:`stepcredit.runtime.keep_freed_memory`; ``--system-malloc`` skips it): without it, page faults
on fresh 16 MiB tensors take about half of our time at 1024 x 4096 (and less of verl's).
The machine's load is recorded around each shape (``benchmarks/_harness.py``; ``"valid": false`` says
the figures cannot be trusted, and why); each row has the min and max of both sides' runs beside the
medians. With ``--json`` the last stdout line is ``{"results": [...], "settings", "valid", "load", ...}``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from _harness import Monitor, emit
from stepcredit.advantages import ESTIMATORS, AdvantageInputs, AdvantageOutputs, hparams
from stepcredit.config import AlgorithmConfig
from stepcredit.runtime import keep_freed_memory

GAMMA, LAM = 0.99, 0.95


def make_batch(B: int, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    len_B = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < len_B[:, None]
    last = len_B - 1
    score = torch.randint(0, 2, (B,), generator=g).float()
    outcome = torch.zeros(B, T).scatter_(1, last[:, None], score[:, None])
    # process rewards: one step reward every ~64 tokens (episode ends), small, as V(prefix) deltas
    steps = mask & (torch.rand(B, T, generator=g) < 1 / 64)
    process = torch.where(steps, 0.05 * torch.randn(B, T, generator=g), torch.zeros(()))
    return {
        "outcome": outcome,
        "process": process,
        "steps": steps,
        "token": outcome + process,  # one channel holding both, for the token-level verl comparisons
        "mask": mask,
        "group": torch.arange(B) // 8,
        "values": 0.5 * torch.randn(B, T, generator=g),
    }


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def paired_ms(
    ours: Callable[[], Any], theirs: Callable[[], Any], runs: int, their_runs: int
) -> tuple[list[float], list[float]]:
    """Times of both, timed in alternation (ours, theirs, ours, ...) after one warm-up call each, so
    that a slow spell of the machine falls on both rather than on whichever ran during it."""
    ours()
    theirs()
    a: list[float] = []
    b: list[float] = []
    per = max(1, runs // their_runs)  # our runs between two of theirs
    while len(a) < runs or len(b) < their_runs:
        for _ in range(per if len(a) < runs else 0):
            t0 = time.perf_counter()
            ours()
            a.append((time.perf_counter() - t0) * 1e3)
        if len(b) < their_runs:
            t0 = time.perf_counter()
            theirs()
            b.append((time.perf_counter() - t0) * 1e3)
    return a, b


def cases(d: dict[str, torch.Tensor]) -> list[tuple[str, AdvantageInputs, Callable[[], torch.Tensor] | None]]:
    """(estimator, our inputs, a thunk returning verl's advantages or None)."""
    from verl.trainer.ppo import core_algos as ca

    m, mf, gid_np = d["mask"], d["mask"].float(), d["group"].numpy()
    outcome_only = AdvantageInputs(outcome_BT=d["outcome"], mask_BT=m, group_B=d["group"])
    token = AdvantageInputs(outcome_BT=d["token"], mask_BT=m, group_B=d["group"], values_BT=d["values"])
    both = AdvantageInputs(
        outcome_BT=d["outcome"],
        mask_BT=m,
        group_B=d["group"],
        process_BT=d["process"],
        process_mask_BT=d["steps"],
    )
    return [
        (
            "grpo",
            outcome_only,
            lambda: ca.compute_grpo_outcome_advantage(d["outcome"].clone(), mf, gid_np)[0],
        ),
        (
            "rloo",
            outcome_only,
            lambda: ca.compute_rloo_outcome_advantage(d["outcome"].clone(), mf, gid_np)[0],
        ),
        (
            "reinforce_pp_baseline",
            outcome_only,
            lambda: ca.compute_reinforce_plus_plus_baseline_outcome_advantage(
                d["outcome"].clone(), mf, gid_np
            )[0],
        ),
        (
            "reinforce_pp",
            token,
            lambda: ca.compute_reinforce_plus_plus_outcome_advantage(
                d["token"], mf, config=SimpleNamespace(gamma=GAMMA)
            )[0],
        ),
        ("gae", token, lambda: ca.compute_gae_advantage_return(d["token"], d["values"], mf, GAMMA, LAM)[0]),
        ("grpo_process", both, None),
        ("prime_rloo", both, None),
    ]


def run(shapes: list[tuple[int, int]], runs: int, mon: Monitor) -> list[dict[str, Any]]:
    cfg = AlgorithmConfig(gamma=GAMMA, lam=LAM, process_weight=0.5)
    hp = hparams(cfg)
    results = []
    for B, T in shapes:
        d = make_batch(B, T)
        for name, inp, verl_fn in cases(d):
            with mon.side(f"{name} {B}x{T} (ours and verl interleaved)"):
                results.append(one_case(name, inp, verl_fn, d, B, T, runs, hp))
    return results


def one_case(
    name: str,
    inp: AdvantageInputs,
    verl_fn: Callable[[], torch.Tensor] | None,
    d: dict[str, torch.Tensor],
    B: int,
    T: int,
    runs: int,
    hp: dict[str, Any],
) -> dict[str, Any]:
    fn = ESTIMATORS.get(name).fn

    def ours(fn: Callable[..., AdvantageOutputs] = fn, inp: AdvantageInputs = inp) -> AdvantageOutputs:
        with torch.no_grad():
            return fn(inp, **hp)

    row: dict[str, Any] = {"estimator": name, "shape": f"{B}x{T}"}
    if verl_fn is None:
        row.update(ours_ms=round(median_ms(ours, runs), 3), verl_ms=None, speedup=None, max_abs_diff=None)
    else:
        # verl's Python loop over time takes seconds at 1024 x 4096: fewer runs of it there
        slow = B * T > 1_000_000 and name in ("reinforce_pp", "gae")
        a, b = paired_ms(ours, verl_fn, runs, 3 if slow else runs)
        ours_ms, verl_ms = statistics.median(a), statistics.median(b)
        row["ours_ms"] = round(ours_ms, 3)
        row["ours_ms_min_max"] = [round(min(a), 3), round(max(a), 3)]
        row["verl_ms_min_max"] = [round(min(b), 3), round(max(b), 3)]
        diff = (ours().adv_BT - verl_fn()).abs()[d["mask"]].max().item()
        row.update(verl_ms=round(verl_ms, 3), speedup=round(verl_ms / ours_ms, 2), max_abs_diff=diff)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch intra-op threads for both sides (default: torch's default, one per core)",
    )
    ap.add_argument("--shapes", default="256x1024,1024x4096", help="comma-separated BxT")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per measurement (median)")
    ap.add_argument(
        "--system-malloc",
        action="store_true",
        help="leave glibc's malloc as it is instead of the settings stepcredit's runtime applies",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    # The process settings a stepcredit run uses (the CLI applies them); verl's functions run in the
    # same process and get the same allocator.
    kept = False if args.system_malloc else keep_freed_memory()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    mon = Monitor()
    results = run([(b, t) for b, t in shapes], args.runs, mon)

    def fmt(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    print(
        f"torch {torch.__version__}, {args.threads} thread(s), float32, median of {args.runs} runs, "
        f"malloc keeps freed memory: {kept}"
    )
    print(f"{'estimator':<22} {'shape':>10} {'ours ms':>10} {'verl ms':>10} {'speedup':>9} {'max|diff|':>10}")
    for r in results:
        print(
            f"{r['estimator']:<22} {r['shape']:>10} {r['ours_ms']:>10.2f} {fmt(r['verl_ms'], '10.2f'):>10} "
            f"{fmt(r['speedup'], '8.1f') + 'x' if r['speedup'] else '-':>9} {fmt(r['max_abs_diff'], '10.2e'):>10}"
        )
    import verl

    side = {"threads": args.threads, "dtype": "float32", "malloc_keeps_freed_memory": kept, "runs": args.runs}
    settings = {
        "ours": {**side, "stepcredit": "this tree", "no_grad": True},
        "verl": {**side, "verl": getattr(verl, "__version__", "?"), "slow_loops_runs": 3},
    }
    res = {"benchmark": "advantages", "results": results, "threads": args.threads}
    emit(mon.finish({**res, "malloc_keeps_freed_memory": kept}, settings), args.json)


if __name__ == "__main__":
    main()
