"""Labelled traces: solutions split into steps, each with the index of its first wrong step (or none).

This is ProcessBench's row (Zheng et al. 2024, "ProcessBench: Identifying Process Errors in
Mathematical Reasoning"): ``problem``, ``steps`` (a list of strings), ``label`` (the 0-based index of
the earliest wrong step, -1 when every step is right). ProcessBench does not carry the gold answer,
which every value estimator that continues a prefix needs; a row gives it as ``answer`` or
``ground_truth`` (join it from the source dataset), or is a verl-schema row (``prompt``,
``data_source``, ``reward_model.ground_truth``) with ``steps`` and ``label`` added. A ProcessBench row's
prompt is the problem with the MATH instruction (answer in ``\\boxed{}``), scored by the ``math``
verifier unless the row names its ``data_source``. ``stepcredit probe --traces FILE`` values them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepcredit.data.io import numbered_rows, row_to_sample
from stepcredit.data.prepare import MATH_INSTRUCTION
from stepcredit.errors import DataError
from stepcredit.types import Sample

__all__ = ["LabelledTrace", "load_labelled_traces"]


@dataclass(frozen=True)
class LabelledTrace:
    """One solution, its steps and where it first goes wrong."""

    sample: Sample
    """The problem as a prompt row, with its gold answer."""
    steps: tuple[str, ...]
    """The solution's steps, in order (the response is them joined by the probe's separator)."""
    label: int
    """0-based index of the earliest wrong step; -1 when every step is right."""

    @property
    def erroneous(self) -> bool:
        return self.label >= 0


def _sample(row: dict[str, Any], where: str) -> Sample:
    if "prompt" in row:  # a verl-schema row with steps added
        return row_to_sample(row, where)
    problem = row.get("problem", row.get("question"))
    if not isinstance(problem, str) or not problem.strip():
        raise DataError(f"{where}: needs 'problem' (a ProcessBench row) or 'prompt' (a verl-schema row)")
    gold = row.get("answer", row.get("ground_truth"))
    if gold is None or (isinstance(gold, str) and not gold.strip()):
        raise DataError(
            f"{where}: no gold answer: add 'answer' (ProcessBench rows carry none; join it from the "
            "source dataset): the values continue each prefix and score it against the gold answer"
        )
    source = row.get("data_source") or "math"
    if not isinstance(source, str):
        raise DataError(f"{where}: 'data_source' must be a string")
    verl = {
        "prompt": [{"role": "user", "content": f"{problem.strip()} {MATH_INSTRUCTION}"}],
        "data_source": source,
        "reward_model": {"ground_truth": str(gold)},
        "extra_info": {k: row[k] for k in ("id", "generator") if k in row},
    }
    return row_to_sample(verl, where)


def _steps_and_label(row: dict[str, Any], where: str) -> tuple[tuple[str, ...], int]:
    steps = row.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise DataError(f"{where}: 'steps' must be a non-empty list of strings")
    if any(not s.strip() for s in steps):
        k = next(i for i, s in enumerate(steps) if not s.strip())
        raise DataError(f"{where}: step {k} is empty (a step with no text has no prefix of its own)")
    label = row.get("label")
    if isinstance(label, bool) or not isinstance(label, int) or not -1 <= label < len(steps):
        raise DataError(
            f"{where}: 'label' must be an integer from -1 (no wrong step) to {len(steps) - 1} "
            f"(the index of the first wrong step of {len(steps)}), got {label!r}"
        )
    return tuple(steps), label


def load_labelled_traces(path: str | Path, *, n: int | None = None) -> tuple[list[LabelledTrace], int]:
    """The first ``n`` (all when None) labelled traces of a jsonl, json (an array or lines) or parquet
    file, and how many rows the file has; DataError naming the file, row and key on a bad row."""
    p = Path(path)
    rows = numbered_rows(p)
    if not rows:
        raise DataError(f"{p}: the file has no rows")
    out = []
    for where, row in rows[: n if n is not None else len(rows)]:
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        steps, label = _steps_and_label(row, where)
        out.append(LabelledTrace(_sample(row, where), steps, label))
    return out, len(rows)
