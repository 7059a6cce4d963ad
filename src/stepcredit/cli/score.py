"""``stepcredit score --in FILE.jsonl --out FILE.jsonl [--preset P | --config F] [key=value ...]``.

Scores a file of model outputs with the rewards of the same config tree as ``train`` (``reward.*``: the
judge, the reward model, the sandbox, custom functions, per-domain routing and their overrides), so
what a run would reward can be checked before (or after) a run. Each input line has ``data_source``,
``response`` and ``ground_truth`` (or verl's ``reward_model.ground_truth``), optionally ``prompt``
(a chat list or a string: the judge and the reward model see it), ``ability``, ``domain``, ``tag``,
``extra_info`` and ``reward_model.style``. Each is written back with ``score``, ``status``,
``extracted`` and ``source`` added; a summary of statuses (overall and per source) is printed. A malformed line is reported by
line number and written back with status ``error``; the output appears only once complete (a temp
file renamed into place), so it is never half-written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from stepcredit.config import RewardConfig
from stepcredit.errors import DataError
from stepcredit.reward.run.health import format_counts
from stepcredit.types import RewardResult, Sample, Status

CHUNK = 512
"""Rows scored per call of the rewarder (bounds memory on big files)."""


def configure(parser: argparse.ArgumentParser) -> None:
    from stepcredit.cli.common import add_config_args

    parser.add_argument("--in", dest="inp", required=True, help="input jsonl")
    parser.add_argument("--out", required=True, help="output jsonl (may equal --in)")
    # Shortcuts for reward.workers, reward.timeout_s, reward.kwargs.math.mode and reward.custom.path;
    # when given they win over the preset/config and the overrides.
    parser.add_argument("--workers", type=int, default=None, help="processes of the kill-safe pool")
    parser.add_argument("--timeout", type=float, default=None, help="per-row deadline in seconds")
    parser.add_argument("--mode", choices=("flexible", "strict"), default=None, help="math answer extraction")
    parser.add_argument(
        "--custom", default=None, help="your own reward function: file.py:fn or pkg.module:fn"
    )
    add_config_args(parser)


def parse_row(line: str, where: str) -> tuple[dict[str, Any], Sample, str]:
    """The row, its Sample and its response; DataError naming ``where`` when malformed."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    rm_raw = row.get("reward_model")
    rm: dict[str, Any] = rm_raw if isinstance(rm_raw, dict) else {}
    gt = row.get("ground_truth", rm.get("ground_truth"))
    missing = [
        k
        for k, v in (
            ("data_source", row.get("data_source")),
            ("response", row.get("response")),
            ("ground_truth", gt),
        )
        if v is None
    ]
    if missing:
        raise DataError(f"{where}: missing {', '.join(missing)}")
    if not isinstance(row["data_source"], str) or not isinstance(row["response"], str):
        raise DataError(f"{where}: data_source and response must be strings")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: extra_info must be an object")
    routing = {k: row[k] for k in ("ability", "domain", "tag") if row.get(k) is not None}
    if any(not isinstance(v, str) for v in routing.values()):
        raise DataError(f"{where}: ability, domain and tag must be strings")
    sample = Sample(
        prompt=_prompt(row.get("prompt"), where),
        ground_truth=gt,
        data_source=row["data_source"],
        style=str(rm.get("style", "rule") or "rule"),
        extra_info=extra,
        uid=where,
        **routing,
    )
    return row, sample, row["response"]


def _prompt(raw: Any, where: str) -> tuple[dict[str, str], ...]:
    # The judge and the reward model score (prompt, response): without the prompt they judge blind.
    if raw is None:
        return ()
    if isinstance(raw, str):
        return ({"role": "user", "content": raw},)
    if isinstance(raw, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in raw
    ):
        return tuple({"role": m["role"], "content": m["content"]} for m in raw)
    raise DataError(f"{where}: prompt must be a string or a list of {{role, content}} messages")


def reward_config(args: argparse.Namespace) -> RewardConfig:
    """``reward.*`` of the preset/config and overrides (as ``train`` reads them), then the shortcuts."""
    from stepcredit.cli.common import build_config

    cfg = build_config(args).reward
    if args.workers is not None or args.timeout is not None:
        if (args.workers is not None and args.workers < 1) or (
            args.timeout is not None and args.timeout <= 0
        ):
            raise DataError("--workers must be >= 1 and --timeout > 0")
        cfg = dataclasses.replace(
            cfg,
            workers=cfg.workers if args.workers is None else args.workers,
            timeout_s=cfg.timeout_s if args.timeout is None else args.timeout,
        )
    if args.mode is not None:
        kwargs = dict(cfg.kwargs)
        kwargs["math"] = {**kwargs.get("math", {}), "mode": args.mode}
        cfg = dataclasses.replace(cfg, kwargs=kwargs)
    if args.custom is not None:
        cfg = dataclasses.replace(cfg, custom=dataclasses.replace(cfg.custom, path=args.custom))
    return cfg


def _annotate(row: dict[str, Any], res: RewardResult) -> dict[str, Any]:
    out = dict(row)
    out["score"] = None if math.isnan(res.score) else res.score
    out["status"] = res.status.value
    out["extracted"] = res.extracted
    out["source"] = res.source
    if not res.ok and "message" in res.info:
        out["error"] = res.info["message"]
    return out


def run(args: argparse.Namespace) -> int:
    from stepcredit.reward import build_rewarder

    inp = Path(args.inp)
    if not inp.is_file():
        raise DataError(f"{inp}: no such file")
    cfg = reward_config(args)
    rewarder = build_rewarder(cfg)  # a missing custom function fails here, before any output
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    counts: Counter[str] = Counter()
    by_source: dict[str, Counter[str]] = {}
    scores: list[float] = []
    n_bad = 0
    try:
        with os.fdopen(fd, "w") as out, inp.open() as f:
            batch: list[tuple[int, dict[str, Any], Sample | None, str]] = []

            def flush() -> None:
                good = [(s, r) for _, _, s, r in batch if s is not None]
                results = iter(rewarder.score_batch([s for s, _ in good], [r for _, r in good]))
                for _, row, s, _ in batch:
                    res = (
                        next(results)
                        if s is not None
                        else RewardResult.failure(Status.ERROR, row.pop("_error"))
                    )
                    counts[res.status.value] += 1
                    by_source.setdefault(res.source or "?", Counter())[res.status.value] += 1
                    if res.ok:
                        scores.append(res.score)
                    out.write(json.dumps(_annotate(row, res), ensure_ascii=False) + "\n")
                batch.clear()

            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row, sample, resp = parse_row(line, f"{inp}:{i}")
                    batch.append((i, row, sample, resp))
                except DataError as e:
                    n_bad += 1
                    print(f"stepcredit score: {e}", file=sys.stderr)
                    batch.append((i, {"line": i, "raw": line.rstrip("\n"), "_error": str(e)}, None, ""))
                if len(batch) >= CHUNK:
                    flush()
            flush()
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        rewarder.close()
    total = sum(counts.values())
    print(f"scored {total} rows -> {out_path}" + (f" ({n_bad} malformed)" if n_bad else ""))
    for st in Status:
        if counts[st.value]:
            print(f"  {st.value:<14}{counts[st.value]:>8}")
    for source, c in sorted(by_source.items()):
        print(f"  source {source}: {format_counts(dict(c))}")
    if scores:
        print(f"  accuracy (mean score of scored rows): {sum(scores) / len(scores):.4f} over {len(scores)}")
    return 0
