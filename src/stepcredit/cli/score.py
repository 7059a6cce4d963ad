"""``stepcredit score --in FILE --out FILE.jsonl [--preset P | --config F] [key=value ...]``.

Scores a file of model outputs with the rewards of the same config tree as ``train`` (``reward.*``: the
judge, the reward model, the sandbox, custom functions, per-domain routing and their overrides), so
what a run would reward can be checked before (or after) a run. The input is JSON lines or a Parquet
file (by its extension, or ``--format``): verl's parquet (``data_source``, ``prompt``,
``reward_model.ground_truth``, plus a response column) and TRL's rows (``prompt``, ``completion``,
``answer``) are read as they are written. Each row has a data source (``data_source``, or ``--source``
for rows without one), the response (``--response-key``, else ``response``, verl's ``solution_str`` or
TRL's ``completion``: a string or a list of chat messages, whose assistant contents are joined) and the
ground truth (``--answer-key``, else ``ground_truth``, verl's ``reward_model.ground_truth`` or TRL's
``answer``), optionally ``prompt`` (``--prompt-key``; a chat list or a string: the judge and the reward
model see it), ``ability``, ``domain``, ``tag``, ``extra_info`` and ``reward_model.style``. A TRL-style
custom function (``reward.custom.style=trl``) needs no ground truth and sees every other column.

Each row is written back (JSON lines) with ``score``, ``status``, ``extracted``, ``source`` and ``info``
added; a summary per data source (statuses, mean score, accuracy) and the most frequent failure
messages are printed. A malformed row is reported as ``file:line: what is wrong`` and written back
with status ``error``; unless ``--skip-bad-rows`` is given the command then exits 2. It also exits 2,
with one line saying why, when the input has no row, or when more rows failed (no verdict) than
training's breaker allows (``reward.breaker.max_failure_share``). The output appears only once
complete (a temp file renamed into place), so it is never half-written.
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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from stepcredit.config import RewardConfig
from stepcredit.errors import DataError
from stepcredit.reward.run.failures import format_top, top_failures
from stepcredit.reward.run.health import format_counts
from stepcredit.types import RewardResult, Sample, Status

if TYPE_CHECKING:
    from stepcredit.reward import Rewarder

CHUNK = 512
"""Rows scored per call of the rewarder (bounds memory on big files)."""

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
"""Input format by file extension (``--format`` overrides it)."""


def configure(parser: argparse.ArgumentParser) -> None:
    from stepcredit.cli.common import add_config_args

    parser.add_argument("--in", dest="inp", required=True, help="input: .jsonl or .parquet")
    parser.add_argument("--out", required=True, help="output jsonl (may equal --in)")
    parser.add_argument(
        "--format",
        choices=("auto", "jsonl", "parquet"),
        default="auto",
        help="input format (auto: by the extension of --in)",
    )
    parser.add_argument("--response-key", default=None, help="column of the response (default: response, "
                        "solution_str or completion)")  # fmt: skip
    parser.add_argument("--answer-key", default=None, help="column of the ground truth, dotted for a nested "
                        "one (default: ground_truth, reward_model.ground_truth or answer)")  # fmt: skip
    parser.add_argument("--prompt-key", default=None, help="column of the prompt (default: prompt)")
    parser.add_argument(
        "--source", default=None, help="data source of rows without data_source (e.g. gsm8k, math)"
    )
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


@dataclasses.dataclass(frozen=True)
class Columns:
    """Where a row's fields are (``--response-key``, ``--answer-key``, ``--prompt-key``, ``--source``)."""

    response: str | None = None
    """The response column; None = the first of :data:`RESPONSE_KEYS` present."""
    answer: str | None = None
    """The ground truth's column, dotted for a nested one; None = the first of :data:`ANSWER_KEYS`."""
    prompt: str | None = None
    """The prompt's column; None = ``prompt``."""
    source: str | None = None
    """The data source of a row without ``data_source``."""
    trl: bool = False
    """A TRL-style custom function scores the rows: no ground truth needed, every column passed on."""


RESPONSE_KEYS = ("response", "solution_str", "completion")
"""Where a row's response is: ours, verl's ``compute_score(solution_str=...)``, TRL's ``completion``
column (the first present wins)."""

ANSWER_KEYS = ("ground_truth", "reward_model.ground_truth", "answer")
"""Where a row's ground truth is: ours, verl's parquet layout, TRL datasets' ``answer`` column (GSM8K's
full solution ending in ``#### N`` is read by the math verifier as its final answer)."""

_KNOWN = frozenset({"data_source", "prompt", "reward_model", "extra_info", "ability", "domain", "tag"})


def _get(row: dict[str, Any], key: str) -> Any:
    """``row[key]``, a dotted key read through nested objects (``reward_model.ground_truth``)."""
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def parse_row(line: str, where: str, cols: Columns | None = None) -> tuple[dict[str, Any], Sample, str]:
    """The JSON line's row, its Sample and its response; DataError naming ``where`` when malformed."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg})") from None
    return parse_record(row, where, cols or Columns())


def parse_record(row: Any, where: str, cols: Columns) -> tuple[dict[str, Any], Sample, str]:
    """A row (a JSON object or a Parquet record), its Sample and its response; DataError naming
    ``where`` and the missing or malformed field (and the flag that maps it) when it cannot be read."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    rm_raw = row.get("reward_model")
    rm: dict[str, Any] = rm_raw if isinstance(rm_raw, dict) else {}
    gt_key = cols.answer or next((k for k in ANSWER_KEYS if _get(row, k) is not None), None)
    gt = _get(row, gt_key) if gt_key else None
    key = cols.response or next((k for k in RESPONSE_KEYS if row.get(k) is not None), None)
    source = row.get("data_source")
    if source is None:
        source = cols.source if cols.source is not None else ("custom" if cols.trl else None)
    missing = [
        label
        for label, v in (
            ("data_source (or pass --source NAME)", source),
            (f"{cols.response} (--response-key)" if cols.response else "response (or solution_str, "
             "completion; or pass --response-key COLUMN)", row.get(key) if key else None),
            (f"{cols.answer} (--answer-key)" if cols.answer else "ground_truth (or reward_model.ground_truth, "
             "answer; or pass --answer-key COLUMN)", gt if not cols.trl else 0),
        )
        if v is None
    ]  # fmt: skip
    if missing:
        raise DataError(f"{where}: missing {', '.join(missing)}")
    assert key is not None
    if not isinstance(source, str):
        raise DataError(f"{where}: data_source must be a string, got {type(source).__name__}")
    response = _response(row[key], key, where)
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: extra_info must be an object")
    if cols.trl:  # TRL passes every dataset column to its reward functions by name
        used = {key, cols.prompt or "prompt"}
        extra = {**{k: v for k, v in row.items() if k not in _KNOWN and k not in used}, **extra}
    routing = {k: row[k] for k in ("ability", "domain", "tag") if row.get(k) is not None}
    if any(not isinstance(v, str) for v in routing.values()):
        raise DataError(f"{where}: ability, domain and tag must be strings")
    sample = Sample(
        prompt=_prompt(row.get(cols.prompt or "prompt"), where),
        ground_truth=gt,
        data_source=source,
        style=str(rm.get("style", "rule") or "rule"),
        extra_info=extra,
        uid=where,
        **routing,
    )
    return row, sample, response


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
    """What the summary reports: statuses overall, per data source and per reward source, scores per
    data source, the failed results (for their most frequent messages) and how many rows were malformed."""

    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    by_source: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    by_data: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    scores: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    failed: list[RewardResult] = dataclasses.field(default_factory=list)
    n_bad: int = 0

    def add(self, res: RewardResult, data_source: str | None) -> None:
        """Count ``res``; ``data_source`` None for a malformed row (counted in statuses, not per source)."""
        self.counts[res.status.value] += 1
        if data_source is None:
            return
        self.by_source.setdefault(res.source or "?", Counter())[res.status.value] += 1
        self.by_data.setdefault(data_source, Counter())[res.status.value] += 1
        if res.ok:
            self.scores.setdefault(data_source, []).append(res.score)
        else:
            self.failed.append(res)

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    @property
    def all_scores(self) -> list[float]:
        return [x for xs in self.scores.values() for x in xs]


_Row = tuple[int, dict[str, Any], Sample | None, str]
"""A row of the input: its number, the row as read, the parsed sample (None if malformed), the response."""


def _flush(rewarder: Rewarder, batch: list[_Row], out: TextIO, tally: _Tally) -> None:
    """Score the parsed rows of ``batch`` in one call (a malformed row gets its parse error as an
    ``error`` result) and write every row back in input order."""
    good = [(s, r) for _, _, s, r in batch if s is not None]
    results = iter(rewarder.score_batch([s for s, _ in good], [r for _, r in good]))
    for _, row, s, _ in batch:
        res = next(results) if s is not None else RewardResult.failure(Status.ERROR, row.pop("_error"))
        tally.add(res, s.data_source if s is not None else None)
        out.write(json.dumps(_annotate(row, res), ensure_ascii=False, default=str) + "\n")
    batch.clear()


def input_format(inp: Path, fmt: str) -> str:
    """``jsonl`` or ``parquet``: ``fmt`` unless ``auto``, else by the extension (unknown: JSON lines)."""
    return fmt if fmt != "auto" else FORMATS.get(inp.suffix.lower(), "jsonl")


def read_records(inp: Path, fmt: str) -> Iterator[tuple[int, str, Any]]:
    """(row number from 1, where, the row or the JSON line's text) for every row of ``inp``; a file
    that cannot be read as ``fmt`` is a DataError of one line naming the file and the way out."""
    if fmt == "parquet":
        yield from _parquet_records(inp)
        return
    try:
        with inp.open(encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    yield i, f"{inp}:{i}", line
    except UnicodeDecodeError:
        hint = " (a Parquet file? pass --format parquet)" if inp.suffix.lower() not in FORMATS else ""
        raise DataError(f"{inp}: not UTF-8 text, so not JSON lines{hint}") from None


def _parquet_records(inp: Path) -> Iterator[tuple[int, str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(inp)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{inp}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    i = 0
    for batch in pf.iter_batches(batch_size=CHUNK):
        for rec in batch.to_pylist():  # nested columns (reward_model, extra_info, prompt) as dicts/lists
            i += 1
            yield i, f"{inp}:row {i}", rec


def _score_rows(inp: Path, fmt: str, cols: Columns, rewarder: Rewarder, out: TextIO, tally: _Tally) -> None:
    """Score ``inp`` in chunks of ``CHUNK`` rows; a malformed row is reported on stderr and written
    back as an ``error`` row."""
    batch: list[_Row] = []
    for i, where, rec in read_records(inp, fmt):
        try:
            if isinstance(rec, str):
                row, sample, resp = parse_row(rec, where, cols)
            else:
                row, sample, resp = parse_record(rec, where, cols)
            batch.append((i, row, sample, resp))
        except DataError as e:
            tally.n_bad += 1
            print(f"stepcredit score: {e}", file=sys.stderr)
            raw = rec.rstrip("\n") if isinstance(rec, str) else rec
            batch.append((i, {"line": i, "raw": raw, "_error": str(e)}, None, ""))
        if len(batch) >= CHUNK:
            _flush(rewarder, batch, out, tally)
    _flush(rewarder, batch, out, tally)


def _score_file(inp: Path, fmt: str, cols: Columns, out_path: Path, rewarder: Rewarder) -> _Tally:
    """Score ``inp`` into ``out_path`` through a temp file renamed into place, so the output is never
    half-written (nor written at all for an input without rows); the rewarder is closed in any case."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    tally = _Tally()
    try:
        with os.fdopen(fd, "w") as out:
            _score_rows(inp, fmt, cols, rewarder, out, tally)
        if tally.n == 0:
            raise DataError(f"{inp}: no rows to score (an empty {fmt} file)")
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        rewarder.close()
    return tally


def _print_summary(tally: _Tally, out_path: Path) -> None:
    print(f"scored {tally.n} rows -> {out_path}" + (f" ({tally.n_bad} malformed)" if tally.n_bad else ""))
    for st in Status:
        if tally.counts[st.value]:
            print(f"  {st.value:<14}{tally.counts[st.value]:>8}")
    print("per data source:")
    for data, c in sorted(tally.by_data.items()):
        scores = tally.scores.get(data, [])
        line = f"  {data}: {sum(c.values())} rows, {format_counts(dict(c))}"
        if scores:
            line += f", mean score {sum(scores) / len(scores):.4f}"
            if all(x in (0.0, 1.0) for x in scores):
                line += f", accuracy {sum(x == 1.0 for x in scores) / len(scores):.4f}"
        print(line)
    for source, c in sorted(tally.by_source.items()):
        print(f"  reward {source}: {format_counts(dict(c))}")
    if tally.failed:
        print(
            f"failed rows ({len(tally.failed)}), most frequent causes: {format_top(top_failures(tally.failed))}"
        )
    print(*score_summary(tally.all_scores), sep="\n")


def run(args: argparse.Namespace) -> int:
    from stepcredit.reward import build_rewarder

    inp = Path(args.inp)
    if not inp.is_file():
        raise DataError(f"{inp}: no such file")
    out_path = Path(args.out)
    if out_path.suffix.lower() in (".parquet", ".pq"):
        raise DataError(f"--out {out_path}: score writes JSON lines; name the output .jsonl")
    fmt = input_format(inp, args.format)
    cfg = reward_config(args)
    cols = Columns(
        response=args.response_key,
        answer=args.answer_key,
        prompt=args.prompt_key,
        source=args.source,
        trl=bool(cfg.custom.path) and cfg.custom.style == "trl",
    )
    rewarder = build_rewarder(cfg)  # a missing custom function fails here, before any output
    tally = _score_file(inp, fmt, cols, out_path, rewarder)
    _print_summary(tally, out_path)
    return _verdict(tally, cfg, args.skip_bad_rows)


def _verdict(tally: _Tally, cfg: RewardConfig, skip_bad_rows: bool) -> int:
    """The exit code, and on stderr the one line that says why it is not 0."""
    if tally.n_bad and not skip_bad_rows:
        print(
            f"stepcredit score: error: {tally.n_bad} malformed row(s), listed above (written back with status "
            f"error); fix them or pass --skip-bad-rows",
            file=sys.stderr,
        )
        return 2
    # rows that were read but got no verdict (an unknown data source, a reward that raised, a missing
    # package): past the share training's breaker allows, the file is not scored, and the exit says so
    read = tally.n - tally.n_bad
    limit = cfg.breaker.max_failure_share
    if read and len(tally.failed) / read > limit:
        print(
            f"stepcredit score: error: {len(tally.failed)}/{read} rows got no verdict, more than "
            f"reward.breaker.max_failure_share={limit:g} allows: {format_top(top_failures(tally.failed))}",
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
