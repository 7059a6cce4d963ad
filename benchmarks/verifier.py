"""Throughput and verdicts of stepcredit's math verifier vs ``math_verify.parse`` + ``verify``, same run.

Pairs: every GSM8K test solution against its own answer (label 1) and against another row's
different answer (label 0); the same for MATH-500 solutions and answers. Each set is scored twice,
as ``boxed`` and ``unboxed`` responses: GSM8K solutions end in ``#### N`` (unboxed), which the boxed
variant replaces by ``The answer is $\\boxed{N}$.``; MATH-500 solutions carry ``\\boxed{X}`` (boxed),
which the unboxed variant replaces by ``X`` (inside ``$...$``, so the answer is the last math
expression, as a model writes it without a box). Both verifiers run in this
process, on the main thread, after one untimed warm-up pass, with their caches cleared before each
timed pass. math-verify runs with its default configuration (``verify(parse(gold), parse(response))``,
as in the differential test). ``agree`` is the share of pairs on which the two verdicts are equal;
``worse`` counts pairs where math-verify is right and we are wrong (the target is 0), apart from the
documented deliberate difference (a bare gold the default reads only in part), counted in
``deliberate``; ``better`` the reverse; ``slow_share`` the share of pairs our fast path handed to
math-verify. Also reported: our throughput through the full :class:`~stepcredit.reward.Rewarder`
(routing + kill-safe pool for what the fast path leaves). The three timed passes alternate
(``--repeats`` rounds; medians with min/max) and the machine's load is recorded around each
(``benchmarks/_harness.py``; ``"valid": false`` says the figures cannot be trusted, and why).
Beside each wall-time ``speedup``, ``speedup_cpu`` is the same ratio of the main thread's CPU time
(``time.thread_time``): both verifiers are single-threaded Python on the main thread, so on a quiet
machine the two agree, and on a busy one the CPU ratio is the work ratio while a GSM8K pass of ours
(tens of milliseconds) can lose a whole time slice to another process and the wall ratio with it.

    python benchmarks/verifier.py [--json] [--limit N] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _harness import Monitor, emit, spread

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("STEPCREDIT_SHARED_DATA", REPO.parent / "shared" / "data"))


Pair = tuple[str, str, str, bool]


def _unbox(solution: str) -> str:
    """A MATH solution with its last ``\\boxed{X}`` replaced by ``X`` (``$X$`` when it stood outside math)."""
    from stepcredit.reward.verifiers.math import last_boxed

    hit = last_boxed(solution)
    if hit is None:
        return solution
    start, content = hit
    end = solution.index(content, start) + len(content) + 1
    before = solution[:start]
    in_math = before.count("$") % 2 == 1 or before.rfind("\\[") > before.rfind("\\]")
    return before + (content if in_math else f"${content}$") + solution[end:]


def _box(solution: str) -> str:
    """A GSM8K solution with its final ``#### N`` replaced by a boxed answer sentence."""
    body, answer = solution.rsplit("####", 1)
    return f"{body}The answer is $\\boxed{{{answer.strip()}}}$."


def load_pairs(name: str, limit: int, variant: str) -> list[Pair]:
    """(data_source, response, ground truth, label) for one dataset, ``boxed`` or ``unboxed``."""
    if name == "gsm8k":
        rows = [json.loads(line) for line in (DATA / "gsm8k" / "test.jsonl").open()]
        sols = [r["answer"] for r in rows]
        golds = [s.rsplit("####", 1)[1].strip().replace(",", "") for s in sols]
        source = "openai/gsm8k"
        if variant == "boxed":
            sols = [_box(s) for s in sols]
    else:
        rows = [json.loads(line) for line in (DATA / "math500" / "test.jsonl").open()]
        sols = [r["solution"] for r in rows]
        golds = [r["answer"] for r in rows]
        source = "HuggingFaceH4/MATH-500"
    if limit:
        sols, golds = sols[:limit], golds[:limit]
    pairs = []
    n = len(sols)
    # MATH solutions lose their box after the answer is replaced (a policy writes its own answer where
    # the solution's stood, boxed or not).
    unbox = _unbox if name == "math500" and variant == "unboxed" else (lambda s: s)
    for i in range(n):
        pairs.append((source, unbox(sols[i]), golds[i], True))
        # A wrong response as a policy writes it: the same solution ending in another answer (the next
        # row's answer, different from this one), against this row's gold.
        j = next((k % n for k in range(i + 1, i + n) if _differ(golds[k % n], golds[i])), None)
        if j is not None:
            wrong = unbox(_replace_answer(sols[i], golds[j], name, variant))
            pairs.append((source, wrong, golds[i], False))
    return pairs


def _differ(a: str, b: str) -> bool:
    """Whether two golds are different answers ("x=5" is no other answer than "5")."""
    from stepcredit.reward.verifiers.math import fast_verdict

    return a.strip() != b.strip() and fast_verdict(a, b) is not True and fast_verdict(b, a) is not True


def _replace_answer(solution: str, answer: str, name: str, variant: str) -> str:
    """``solution`` with its final answer (``#### N``, the last box, or the unboxed ``$X$``) replaced."""
    from stepcredit.reward.verifiers.math import last_boxed

    if "####" in solution:
        return solution.rsplit("####", 1)[0] + f"#### {answer}"
    hit = last_boxed(solution)
    if hit is not None:
        start, content = hit
        end = solution.index(content, start) + len(content)
        return solution[:start] + f"\\boxed{{{answer}}}" + solution[end + 1 :]
    return solution + f" So the answer is ${answer}$."


def clear_caches() -> None:
    import math_verify.parser as mvp

    from stepcredit.reward.verifiers import latex, math

    caches: list[Any] = [
        latex.normalize,
        latex.to_number,
        latex.to_complex,
        latex.const_value,
        latex.parse_answer,
    ]
    caches += [math._mv_parse_cached, math._fitted_readings, math._mv_group_matches]
    caches += [mvp.parse_latex_cached, mvp.parse_expr_cached]
    for f in caches:
        f.cache_clear()


def run_ours(pairs: list[tuple[str, str, str, bool]]) -> tuple[float, list[bool], float, float]:
    """Time, verdicts, the share of pairs that reached the slow path (math-verify), main-thread CPU time."""
    from stepcredit.reward.verifiers.math import math_compute_score

    clear_caches()
    c0, t0 = time.thread_time(), time.perf_counter()
    results = [math_compute_score(ds, resp, gt) for ds, resp, gt, _ in pairs]
    dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
    slow = sum(r.info.get("path") != "fast" for r in results) / max(1, len(results))
    return dt, [r.score == 1.0 for r in results], slow, cpu


def run_math_verify(pairs: list[tuple[str, str, str, bool]]) -> tuple[float, list[bool], float]:
    """math-verify with its default configuration, as a user who swaps it for us runs it and as the
    differential test (tests/reward/test_math_differential.py) uses it: ``verify(parse(gold),
    parse(response))``."""
    from math_verify import parse, verify

    clear_caches()
    c0, t0 = time.thread_time(), time.perf_counter()
    verdicts = []
    for _, resp, gt, _ in pairs:
        verdicts.append(bool(verify(parse(gt), parse(resp))))
    return time.perf_counter() - t0, verdicts, time.thread_time() - c0


def partial_gold_reading(gold: str) -> bool:
    """The documented deliberate difference (docs/verifiers.md): math-verify's default configuration
    reads only part of this bare gold (``2\\sqrt{3}`` as 2); we read it whole."""
    from math_verify import parse

    from stepcredit.reward.verifiers.math import _reads_whole

    return "$" not in gold and "####" not in gold and not _reads_whole(tuple(parse(gold)), gold)


def run_rewarder(pairs: list[tuple[str, str, str, bool]]) -> float:
    from stepcredit.config import RewardConfig
    from stepcredit.reward import build_rewarder
    from stepcredit.types import Sample

    samples = [Sample(prompt=(), ground_truth=gt, data_source=ds) for ds, _, gt, _ in pairs]
    responses = [resp for _, resp, _, _ in pairs]
    with build_rewarder(RewardConfig(workers=1)) as rw:
        rw.warmup()
        clear_caches()
        t0 = time.perf_counter()
        rw.score_batch(samples, responses)
        return time.perf_counter() - t0


def bench(dataset: str, limit: int, variant: str, mon: Monitor, repeats: int) -> dict[str, Any]:
    pairs = load_pairs(dataset, limit, variant)
    labels = [p[3] for p in pairs]
    # An untimed pass first: the LaTeX parser both verifiers share (antlr) builds its lookahead
    # tables lazily, and whichever runs first would otherwise pay for it.
    run_math_verify(pairs)
    where = f"{dataset} {variant}"
    runs = mon.alternate(
        {
            f"ours {where}": lambda: run_ours(pairs),
            f"math_verify {where}": lambda: run_math_verify(pairs),
            f"rewarder {where}": lambda: run_rewarder(pairs),
        },
        repeats=repeats,
    )
    ours_t = [r[0] for r in runs[f"ours {where}"]]
    mv_t = [r[0] for r in runs[f"math_verify {where}"]]
    c_ours = statistics.median(r[3] for r in runs[f"ours {where}"])
    c_mv = statistics.median(r[2] for r in runs[f"math_verify {where}"])
    t_ours, ours, slow = statistics.median(ours_t), runs[f"ours {where}"][0][1], runs[f"ours {where}"][0][2]
    t_mv, mv = statistics.median(mv_t), runs[f"math_verify {where}"][0][1]
    t_rw = statistics.median(runs[f"rewarder {where}"])
    worse = [i for i, (a, b, y) in enumerate(zip(ours, mv, labels, strict=True)) if b == y != a]
    deliberate = [i for i in worse if partial_gold_reading(pairs[i][2])]
    n = len(pairs)
    return {
        "pairs": n,
        "ours_per_s": round(n / t_ours, 1),
        "math_verify_per_s": round(n / t_mv, 1),
        "speedup": round(t_mv / t_ours, 2),
        "speedup_cpu": round(c_mv / c_ours, 2),
        "slow_share": round(slow, 3),
        "t_ours": t_ours,
        "t_mv": t_mv,
        "c_ours": c_ours,
        "c_mv": c_mv,
        "agree": round(sum(a == b for a, b in zip(ours, mv, strict=True)) / n, 4),
        "ours_correct": round(sum(a == y for a, y in zip(ours, labels, strict=True)) / n, 4),
        "math_verify_correct": round(sum(b == y for b, y in zip(mv, labels, strict=True)) / n, 4),
        "worse": len(worse) - len(deliberate),
        "deliberate": len(deliberate),
        "better": sum(a == y != b for a, b, y in zip(ours, mv, labels, strict=True)),
        "rewarder_per_s": round(n / t_rw, 1),
        "ours_s": spread(ours_t),
        "math_verify_s": spread(mv_t),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument("--limit", type=int, default=0, help="rows per dataset (0 = all)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds of the timed passes")
    ap.add_argument("--datasets", default="gsm8k,math500", help="comma-separated: gsm8k, math500")
    args = ap.parse_args(argv)
    if not DATA.is_dir():
        print(f"benchmarks/verifier.py: {DATA} not found (set STEPCREDIT_SHARED_DATA)", file=sys.stderr)
        return 2
    mon = Monitor()
    out = {
        name: {
            variant: bench(name, args.limit, variant, mon, args.repeats) for variant in ("boxed", "unboxed")
        }
        for name in args.datasets.split(",")
    }
    cols = [
        "pairs",
        "ours_per_s",
        "math_verify_per_s",
        "speedup",
        "speedup_cpu",
        "slow_share",
        "agree",
        "ours_correct",
    ]
    cols += ["math_verify_correct", "worse", "deliberate", "better", "rewarder_per_s"]
    print(f"{'dataset':<17}" + "".join(f"{c:>20}" for c in cols))
    for name, variants in out.items():
        for variant, r in variants.items():
            print(f"{name + ' ' + variant:<17}" + "".join(f"{r[c]!s:>20}" for c in cols))
    for name, style in (("gsm8k", "GSM8K-style"), ("math500", "MATH-style")):
        if name not in out:
            continue
        rows = list(out[name].values())
        t_ours = sum(r.pop("t_ours") for r in rows)
        t_mv = sum(r.pop("t_mv") for r in rows)
        c_ours = sum(r.pop("c_ours") for r in rows)
        c_mv = sum(r.pop("c_mv") for r in rows)
        n = sum(r["pairs"] for r in rows)
        slow = sum(r["slow_share"] * r["pairs"] for r in rows) / n
        out[name]["all"] = {
            "speedup": round(t_mv / t_ours, 2),
            "speedup_cpu": round(c_mv / c_ours, 2),
            "slow_share": round(slow, 3),
            "pairs": n,
        }
        print(
            f"{style}: {t_mv / t_ours:.1f}x math-verify (boxed + unboxed; CPU time {c_mv / c_ours:.1f}x), "
            f"slow-path share {slow:.1%}"
        )
    import math_verify

    side = {"thread": "main", "caches": "cleared before each timed pass", "limit": args.limit}
    settings = {
        "ours": {**side, "fn": "math_compute_score"},
        "math_verify": {
            **side,
            "fn": "parse + verify (default configuration)",
            "version": getattr(math_verify, "__version__", "?"),
        },
        "rewarder": {**side, "workers": 1},
    }
    emit(mon.finish({"benchmark": "verifier", **out}, settings), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
