"""Readers and writers of verl-style prompt files (parquet, jsonl, or json: an array or lines), with
row validation.

A row has ``data_source``, ``prompt`` (a chat list of ``{"role", "content"}``), ``ability``,
``reward_model{style, ground_truth}`` and ``extra_info``. A malformed row is a :class:`DataError`
naming the file and the row: its line for JSON lines (from 1, blank lines counted), its row for parquet
(from 0), its element for a JSON array (from 1).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stepcredit.errors import DataError
from stepcredit.types import Sample


def _to_builtin(x: Any) -> Any:
    """numpy arrays and scalars (what pyarrow -> pandas gives back) to plain Python."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, dict):
        return {k: _to_builtin(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_builtin(v) for v in x]
    return x


def row_to_sample(
    row: dict[str, Any], where: str, *, domain: str = "default", tag: str | None = None
) -> Sample:
    """Validate one verl-schema row and turn it into a Sample; ``where`` is e.g. ``file.jsonl:12``."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise DataError(f"{where}: 'prompt' must be a non-empty list of chat messages")
    for m in prompt:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise DataError(f"{where}: every 'prompt' message needs string 'role' and 'content'")
    rm = row.get("reward_model")
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise DataError(f"{where}: missing 'reward_model.ground_truth'")
    style = rm.get("style", "rule") or "rule"
    if style not in ("rule", "model"):
        raise DataError(f"{where}: 'reward_model.style' must be 'rule' or 'model', got {style!r}")
    ds = row.get("data_source")
    if not isinstance(ds, str) or not ds:
        raise DataError(f"{where}: 'data_source' must be a non-empty string")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: 'extra_info' must be an object")
    ability = row.get("ability") or "math"
    if not isinstance(ability, str):
        raise DataError(f"{where}: 'ability' must be a string")
    return Sample(
        prompt=tuple({"role": m["role"], "content": m["content"]} for m in prompt),
        ground_truth=rm["ground_truth"],
        data_source=ds,
        ability=ability,
        style=style,
        extra_info=dict(extra),
        domain=domain,
        tag=tag if tag is not None else str(extra.get("tag", ds)),
        uid=where,
    )


def _read_parquet(p: Path) -> list[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        return list(enumerate(_to_builtin(r) for r in pq.read_table(p).to_pylist()))
    except Exception as e:  # pyarrow raises several unrelated types for a bad file
        raise DataError(f"{p}: not a readable parquet file ({type(e).__name__})") from None


def read_jsonl(p: Path) -> list[tuple[int, Any]]:
    """The rows of a JSON-lines file with their line numbers (blank lines skipped); a line that is not
    JSON ends in a DataError naming ``file:line``."""
    rows = []
    with p.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append((i, json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{p}:{i}: invalid JSON ({e.msg})") from None
    return rows


def _read_json(p: Path) -> list[tuple[int, Any]]:
    """A ``.json`` file: one JSON array of rows (as some datasets ship), else JSON lines."""
    with p.open() as f:
        head = f.read(4096).lstrip()
    if not head.startswith("["):
        return read_jsonl(p)
    try:
        rows = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{p}: invalid JSON array (line {e.lineno}: {e.msg})") from None
    if not isinstance(rows, list):
        raise DataError(f"{p}: expected a JSON array of rows")
    return list(enumerate(rows, 1))


def _write_parquet(rows: list[dict[str, Any]], tmp: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp)


def _write_jsonl(rows: list[dict[str, Any]], tmp: Path) -> None:
    with tmp.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


_READERS = {".parquet": _read_parquet, ".jsonl": read_jsonl, ".json": _read_json}
"""File suffix -> reader of its rows, each with the number messages give it: the line of a JSON-lines
file (from 1, blank lines counted, as an editor shows it), the row of a parquet file (from 0) or the
element of a JSON array (from 1)."""
_WRITERS = {".parquet": _write_parquet}
"""File suffix -> writer; any other suffix is written as jsonl."""


def numbered_rows(path: str | Path) -> list[tuple[str, Any]]:
    """Raw rows of a parquet, jsonl or json file, each with where it stands as messages name it:
    ``file:N``, N the line of a JSON-lines file (blank lines counted), the row of a parquet file (from
    0) or the element of a JSON array (from 1). DataError if the file is missing or unreadable."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    read = _READERS.get(p.suffix)
    if read is None:
        raise DataError(f"{p}: unsupported file type {p.suffix!r} (expected .parquet, .jsonl or .json)")
    return [(f"{p}:{i}", row) for i, row in read(p)]


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Raw rows of a parquet, jsonl or json file (DataError if unreadable)."""
    return [row for _, row in numbered_rows(path)]


def read_samples(path: str | Path, *, domain: str = "default", tag: str | None = None) -> list[Sample]:
    """Validated samples of a verl-style file; errors name the file and row."""
    rows = numbered_rows(path)
    if not rows:
        raise DataError(f"{path}: the file has no rows")
    return [row_to_sample(r, where, domain=domain, tag=tag) for where, r in rows]


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write rows as parquet or jsonl (by suffix), atomically (temp file, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    rows = list(rows)
    _WRITERS.get(p.suffix, _write_jsonl)(rows, tmp)
    tmp.replace(p)
