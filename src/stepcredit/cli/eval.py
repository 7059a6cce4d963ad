"""``stepcredit eval``: pass@1, pass@k and maj@k of a model on a prompt set, per tag.

The command parses, calls :func:`stepcredit.trainer.evaluate.evaluate` (validation's generation, the
reward layer's scoring) and prints. ``--model`` takes what every command takes (a model or run
directory, ``tiny``, a packaged model); without ``--preset``/``--config`` the model's own settings are
used (its run's ``config.yaml``, a packaged model's preset). Responses that hit the token limit are
counted, warned about and, unless ``--score-truncated``, not scored (status ``truncated``).

With ``rollout.mode=tools`` (a preset, a config or an override) the responses call tools as in the
trainer's validation (the same tool rollout, calls through the reward layer), and the tool counters
(calls and failed calls per response, failures by kind) are printed under the table and kept in the
JSON line's ``tools``.

Writes every sample to a JSONL file, prints a summary table and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepcredit.cli.common import add_config_args, config_for_model, setup_runtime
from stepcredit.cli.paths import absolute_paths, local_path
from stepcredit.config import Config
from stepcredit.data.prepare import data_names
from stepcredit.errors import UserError
from stepcredit.types import Sample


def configure(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument(
        "--model",
        help="a model directory, a run directory, 'tiny' or a packaged model ('smollm2'); default: "
        "model.path. Without --preset/--config the model's own settings are used (its run's "
        "config.yaml, a packaged model's preset)",
    )
    p.add_argument("--gguf-file", help="a GGUF file inside the --model directory")
    p.add_argument(
        "--data",
        default=VAL,
        help=f"{VAL}, {', '.join(data_names())} ({VAL}, the default: the validation split of the config's own "
        "data.task, what the trainer validates on, e.g. arith_tools for --preset tools; arith: the arith task's "
        "validation split; the others: their test split) or a verl-style .jsonl/.parquet file",
    )
    p.add_argument("--n", type=int, default=1, help="samples per prompt (k of pass@k and maj@k)")
    p.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: rollout.val_temperature)"
    )
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N prompts (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="default: rollout.max_new_tokens")
    p.add_argument(
        "--score-truncated",
        action="store_true",
        help="score responses that hit the token limit (default: status truncated, counted wrong)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="responses generated per call")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: trainer.seed)")
    p.add_argument("--out", type=Path, help="JSONL of every sample (default: eval/<data>-<time>.jsonl)")
    p.add_argument("--data-dir", type=Path, help="the raw GSM8K/MATH-500 directory (default: ../shared/data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


VAL = "val"
"""``--data val``: the validation split of the config's own ``data.task`` (the trainer's validation set)."""


def load_eval_samples(cfg: Config, data: str, data_dir: Path | None) -> list[Sample]:
    """The prompts of ``--data``: the config's own task's validation split (``val``, what the trainer
    validates on), the ``arith`` validation split, a registered dataset's eval split
    (``data.prepare.DATASETS``), or a verl-style file."""
    from stepcredit.data import load_task, read_samples, row_to_sample
    from stepcredit.data.prepare import ARITH, DATASETS, dataset_rows

    if data == VAL:
        return load_task(cfg.data)[1]
    if data == ARITH:
        return load_task(replace(cfg.data, task=ARITH))[1]
    if data in DATASETS:
        rows, path = dataset_rows(data, src=data_dir)
        return [row_to_sample(r, f"{path}:{i + 1}", tag=data) for i, r in enumerate(rows)]
    if not Path(data).exists():
        raise UserError(f"--data {data}: not one of {VAL}, {', '.join(data_names())} and no such file")
    return read_samples(data)


def run(args: argparse.Namespace) -> int:
    cfg, model_ref, source = config_for_model(args, args.model)
    # paths absolute, as ``train`` makes them: the model, data and reward files it reads and the samples
    # file it prints and names in its JSON line mean the same from any directory
    cfg = absolute_paths(cfg, Path.cwd())
    temperature = cfg.rollout.val_temperature if args.temperature is None else args.temperature
    max_new = args.max_new_tokens or cfg.rollout.max_new_tokens
    if args.n < 1 or args.limit < 0 or args.batch_size < 1 or max_new < 1:
        raise UserError("--n, --batch-size and --max-new-tokens must be >= 1 and --limit >= 0")
    if temperature < 0:
        raise UserError(f"--temperature {temperature}: must be >= 0")
    setup_runtime()

    from stepcredit.reward.run.routing import check_packages
    from stepcredit.rollout import ROLLOUT_MODES
    from stepcredit.runtime import set_threads
    from stepcredit.trainer.setup import policy

    set_threads(cfg.trainer.threads)  # at most the usable CPUs; STEPCREDIT_THREADS overrides
    # rollout.mode=tools: answers call tools as in the trainer's validation (the mode's own start-up
    # check imports rollout.tools.modules and checks the names and the parser)
    tools = cfg.rollout.tools if ROLLOUT_MODES.get(cfg.rollout.mode).uses_tools else None
    check = ROLLOUT_MODES.get(cfg.rollout.mode).check
    if tools is not None and check is not None:
        check(cfg)
    samples = load_eval_samples(cfg, args.data, args.data_dir)[: args.limit or None]
    if not samples:
        raise UserError(f"--data {args.data}: no prompts to evaluate")
    check_packages(cfg.reward, samples)  # before generating: a reward's missing package, one line
    with_tools = "" if tools is None else f"; tools {','.join(tools.names)} ({tools.parser})"
    model_name = local_path(model_ref.spec, Path.cwd())
    print(
        f"model {model_name} ({model_ref.kind}); settings from {source}; max_new_tokens {max_new}{with_tools}"
    )
    stem = args.data if args.data in (VAL, *data_names()) else Path(args.data).stem
    out = (args.out or Path("eval") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl").resolve()
    t_load = time.perf_counter()
    with policy(cfg) as (model, tok):  # rollout.engine generates, as in training
        load_s = time.perf_counter() - t_load
        report = _evaluate_into(out, args, cfg, model, tok, samples, temperature=temperature, max_new=max_new)
    data = args.data if args.data in (VAL, *data_names()) else local_path(args.data, Path.cwd())
    report = replace(report, extra={"model": model_name, "data": data, "settings": source})
    _print_table(report.table, report.status, out)
    if report.tools:
        _print_tools(report.tools)
    if report.truncated:
        _warn_truncated(report.truncated, report.prompts * report.n, max_new, report.score_truncated)
    print(json.dumps({**report.to_dict(), "load_s": load_s, "out": str(out)}))
    return 0


def _evaluate_into(
    out: Path,
    args: argparse.Namespace,
    cfg: Config,
    model: Any,
    tok: Any,
    samples: list[Sample],
    *,
    temperature: float,
    max_new: int,
) -> Any:
    """Evaluate, writing every sample to ``out`` as it is scored (through a temporary file: ``out`` is
    whole or absent), with a progress bar on stderr; the :class:`~stepcredit.trainer.evaluate.EvalReport`."""
    from stepcredit.reward import build_rewarder
    from stepcredit.trainer.evaluate import evaluate
    from stepcredit.trainer.rollout import tool_context

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    bar = _bar(len(samples) * args.n, enabled=not args.no_progress)
    try:
        with tmp.open("w") as f, build_rewarder(cfg.reward) as rewarder:

            def write(rows: list[dict[str, Any]]) -> None:
                f.writelines(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
                bar(rows)

            report = evaluate(
                model, tok, samples, rewarder, n=args.n, temperature=temperature, max_new_tokens=max_new,
                batch_size=args.batch_size, seed=cfg.trainer.seed if args.seed is None else args.seed,
                score_truncated=args.score_truncated, on_rows=write, tools=tool_context(cfg, rewarder),
            )  # fmt: skip
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        bar(None)
    return report


def _print_tools(counters: dict[str, float]) -> None:
    kinds = {k.removeprefix("tools/failed_"): v for k, v in counters.items() if k.startswith("tools/failed_")}
    kinds.pop("calls_per_response", None)
    why = ", ".join(f"{k} {int(v)}" for k, v in kinds.items())
    print(
        f"tools: {counters['tools/calls_per_response']:.3f} calls per response, "
        f"{counters['tools/failed_calls_per_response']:.3f} failed calls per response"
        + (f" ({why})" if why else "")
    )
    sys.stdout.flush()


def _warn_truncated(k: int, total: int, max_new: int, scored: bool) -> None:
    what = "scored anyway (--score-truncated)" if scored else "not scored: status truncated, counted wrong"
    print(
        f"warning: {k} of {total} responses hit the token limit ({max_new} new tokens) and were {what}; "
        "raise --max-new-tokens or use the model's preset",
        file=sys.stderr,
    )


def _bar(total: int, *, enabled: bool) -> Any:
    """A progress bar on stderr (stdout keeps the table and the JSON line): ``bar(rows)`` advances by
    a chunk's rows, ``bar(None)`` closes it."""
    if not enabled:
        return lambda rows: None
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
    seen = {"rows": 0, "correct": 0}
    p.start()

    def step(rows: Sequence[dict[str, Any]] | None) -> None:
        if rows is None:
            p.stop()
            return
        seen["rows"] += len(rows)
        seen["correct"] += sum(bool(r["correct"]) for r in rows)
        p.update(task, advance=len(rows), info=f"correct {seen['correct'] / max(1, seen['rows']):.3f}")

    return step


def _print_table(table: dict[str, dict[str, float]], status: dict[str, int], out: Path) -> None:
    cols = [c for c in next(iter(table.values())) if c != "prompts"]
    w = max(8, *(len(t) for t in table))
    print(f"{'tag':<{w}} {'prompts':>8} " + " ".join(f"{c:>9}" for c in cols))
    for tag, row in table.items():
        print(f"{tag:<{w}} {int(row['prompts']):>8} " + " ".join(f"{row[c]:>9.3f}" for c in cols))
    print("status: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
    print(f"samples: {out}")
    sys.stdout.flush()
