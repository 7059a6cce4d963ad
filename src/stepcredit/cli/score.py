"""``stepcredit score --in FILE.jsonl --out FILE.jsonl [--preset P | --config F] [key=value ...]``.

Scores a file of model outputs with the rewards of the same config tree as ``train`` (``reward.*``: the
judge, the reward model, the sandbox, custom functions, per-domain routing and their overrides), so
what a run would reward can be checked before (or after) a run. Each input line has ``data_source``,
the response (``response``, verl's ``solution_str`` or TRL's ``completion``: a string or a list of
chat messages, whose assistant contents are joined) and ``ground_truth`` (or verl's
``reward_model.ground_truth``), optionally ``prompt`` (a chat list or a string: the judge and the
reward model see it), ``ability``, ``domain``, ``tag``, ``extra_info`` and ``reward_model.style``.
Each is written back with ``score``, ``status``, ``extracted``, ``source`` and ``info`` (what decided
the verdict: the extracted answer's form, test cases, IFEval's per-instruction results) added; a
summary of statuses (overall and per source) and of the scores is printed. A malformed line is
reported as ``file:line: what is wrong`` and written back with status ``error``; unless
``--skip-bad-rows`` is given the command then exits 2. The output appears only once complete (a
temp file renamed into place), so it is never half-written.
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
from typing import TYPE_CHECKING, Any, TextIO

from stepcredit.config import RewardConfig
from stepcredit.errors import DataError
from stepcredit.reward.run.health import format_counts
from stepcredit.types import RewardResult, Sample, Status

if TYPE_CHECKING:
    from stepcredit.reward import Rewarder

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
    parser.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="exit 0 when some rows are malformed (they are still reported and written back as error)",
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
    key = next((k for k in RESPONSE_KEYS if row.get(k) is not None), None)
    missing = [
        k
        for k, v in (
            ("data_source", row.get("data_source")),
            ("response (or solution_str, completion)", key),
            ("ground_truth", gt),
        )
        if v is None
    ]
    if missing:
        raise DataError(f"{where}: missing {', '.join(missing)}")
    assert key is not None
    if not isinstance(row["data_source"], str):
        raise DataError(f"{where}: data_source must be a string, got {type(row['data_source']).__name__}")
    response = _response(row[key], key, where)
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
    return row, sample, response


RESPONSE_KEYS = ("response", "solution_str", "completion")
"""Where a row's response is: ours, verl's ``compute_score(solution_str=...)``, TRL's ``completion``
column (the first present wins)."""


def _response(raw: Any, key: str, where: str) -> str:
    if isinstance(raw, str):
        return raw
    # TRL's conversational format: [{"role": "assistant", "content": ...}, ...]
    if (
        isinstance(raw, list)
        and raw
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in raw)
    ):
        said = [m["content"] for m in raw if m.get("role", "assistant") == "assistant"]
        if said:
            return "".join(said)
    raise DataError(
        f"{where}: {key} must be a string or a list of {{role, content}} messages with an assistant turn"
    )


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
    out["info"] = res.info
    if not res.ok and "message" in res.info:
        out["error"] = res.info["message"]
    return out


@dataclasses.dataclass
class _Tally:
    """What the summary reports: statuses overall and per source, the scores of the scored rows, and
    how many lines were malformed."""

    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    by_source: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    scores: list[float] = dataclasses.field(default_factory=list)
    n_bad: int = 0

    def add(self, res: RewardResult) -> None:
        self.counts[res.status.value] += 1
        self.by_source.setdefault(res.source or "?", Counter())[res.status.value] += 1
        if res.ok:
            self.scores.append(res.score)


_Row = tuple[int, dict[str, Any], Sample | None, str]
"""A line of the input: its number, the row as read, the parsed sample (None if malformed), the response."""


def _flush(rewarder: Rewarder, batch: list[_Row], out: TextIO, tally: _Tally) -> None:
    """Score the parsed rows of ``batch`` in one call (a malformed row gets its parse error as an
    ``error`` result) and write every row back in input order."""
    good = [(s, r) for _, _, s, r in batch if s is not None]
    results = iter(rewarder.score_batch([s for s, _ in good], [r for _, r in good]))
    for _, row, s, _ in batch:
        res = next(results) if s is not None else RewardResult.failure(Status.ERROR, row.pop("_error"))
        tally.add(res)
        out.write(json.dumps(_annotate(row, res), ensure_ascii=False, default=str) + "\n")
    batch.clear()


def _score_lines(inp: Path, rewarder: Rewarder, out: TextIO, tally: _Tally) -> None:
    """Score ``inp`` line by line in chunks of ``CHUNK`` rows; a malformed line is reported on stderr
    and written back as an ``error`` row."""
    batch: list[_Row] = []
    with inp.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row, sample, resp = parse_row(line, f"{inp}:{i}")
                batch.append((i, row, sample, resp))
            except DataError as e:
                tally.n_bad += 1
                print(f"stepcredit score: {e}", file=sys.stderr)
                batch.append((i, {"line": i, "raw": line.rstrip("\n"), "_error": str(e)}, None, ""))
            if len(batch) >= CHUNK:
                _flush(rewarder, batch, out, tally)
    _flush(rewarder, batch, out, tally)


def _score_file(inp: Path, out_path: Path, rewarder: Rewarder) -> _Tally:
    """Score ``inp`` into ``out_path`` through a temp file renamed into place, so the output is never
    half-written; the rewarder is closed in any case."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    tally = _Tally()
    try:
        with os.fdopen(fd, "w") as out:
            _score_lines(inp, rewarder, out, tally)
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        rewarder.close()
    return tally


def _print_summary(tally: _Tally, out_path: Path) -> None:
    total = sum(tally.counts.values())
    print(f"scored {total} rows -> {out_path}" + (f" ({tally.n_bad} malformed)" if tally.n_bad else ""))
    for st in Status:
        if tally.counts[st.value]:
            print(f"  {st.value:<14}{tally.counts[st.value]:>8}")
    for source, c in sorted(tally.by_source.items()):
        print(f"  source {source}: {format_counts(dict(c))}")
    print(*score_summary(tally.scores), sep="\n")


def run(args: argparse.Namespace) -> int:
    from stepcredit.reward import build_rewarder

    inp = Path(args.inp)
    if not inp.is_file():
        raise DataError(f"{inp}: no such file")
    cfg = reward_config(args)
    rewarder = build_rewarder(cfg)  # a missing custom function fails here, before any output
    out_path = Path(args.out)
    tally = _score_file(inp, out_path, rewarder)
    _print_summary(tally, out_path)
    if tally.n_bad and not args.skip_bad_rows:
        print(
            f"stepcredit score: error: {tally.n_bad} malformed row(s), listed above (written back with status "
            f"error); fix them or pass --skip-bad-rows",
            file=sys.stderr,
        )
        return 2
    return 0


def score_summary(scores: list[float]) -> list[str]:
    """The summary's score lines: the mean score of the scored rows, and the accuracy (share with full
    marks) only when every score is 0 or 1 (a weighted custom score or a fraction of tests passed is
    not an accuracy)."""
    if not scores:
        return ["  no row was scored"]
    n = len(scores)
    lines = [f"  mean score (rows with a real score): {sum(scores) / n:.4f} over {n}"]
    if all(x in (0.0, 1.0) for x in scores):
        lines.append(f"  accuracy (share with score 1): {sum(x == 1.0 for x in scores) / n:.4f} over {n}")
    return lines
