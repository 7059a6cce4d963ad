"""Build verl-style parquet files from the raw GSM8K and MATH-500 jsonl files.

A row follows verl's ``examples/data_preprocess/gsm8k.py`` and ``math_dataset.py``: ``data_source``,
``prompt`` (a chat list), ``ability``, ``reward_model{style, ground_truth}`` and ``extra_info``.
GSM8K's ground truth is the text after ``#### `` without thousands separators; MATH-500's is its
``answer`` field.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepcredit.data.io import read_jsonl
from stepcredit.errors import DataError

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

MATH_ANSWER_END = (
    r"####[ \t]*\$?[ \t]*-?[\d,]*\.?\d+(?:[^\d.,]|[.,][^\d])"
    r"|\\(?:boxed|fbox)\{(?:[^{}]|\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\})*\}"
)
"""Where a GSM8K or MATH response's final answer is complete (``stepcredit.data.ANSWER_ENDS``): the number
after ``####`` once a character that cannot continue it follows ("#### 72\n", "#### 1,000. "; "#### 7.5"
waits for what comes after the 5; an answer that eos ends needs no rule), or a ``\boxed{...}`` (``\fbox``)
with its braces balanced, nested up to four deep. The math verifier reads either marker on either
source (the last strong one), so both end both; the first complete one ends a continuation. A response
that writes a second, different answer after its first is a hedge the verifier flags; a continuation
that stops at the first answer takes that one as final, the contract of the two instructions above."""

MATH_SOURCES = (
    "openai/gsm8k",
    "gsm8k",
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math500",
    "MATH",
)
"""The data sources whose responses end at :data:`MATH_ANSWER_END` (verl's names and ours); the math verifier
scores them (with more: ``stepcredit.reward.verifiers.math.score``)."""


def shared_data_dir() -> Path:
    """``$STEPCREDIT_SHARED_DATA``, else ``<repo>/../shared/data`` (CI clones the repo beside ``shared/``)."""
    env = os.environ.get("STEPCREDIT_SHARED_DATA")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    for cand in (repo.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"):
        if cand.is_dir():
            return cand
    return repo.parent / "shared" / "data"


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise DataError(f"{path}: no such file (set STEPCREDIT_SHARED_DATA to the shared data directory)")
    for i, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise DataError(f"{path}:{i}: expected a JSON object")
        yield i, row


def gsm8k_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after ``#### `` without thousands separators."""
    if "####" not in solution:
        raise ValueError("no '####' in the solution")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def gsm8k_rows(path: Path, split: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, r in _jsonl(path):
        try:
            q, a = r["question"], r["answer"]
            gt = gsm8k_answer(a)
        except (KeyError, ValueError) as e:
            raise DataError(
                f"{path}:{i}: expected 'question' and an 'answer' ending in '#### N' ({e})"
            ) from None
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{q} {GSM8K_INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": gt},
                "extra_info": {"split": split, "index": len(rows), "answer": a, "question": q},
            }
        )
    return rows


def math500_rows(path: Path, split: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, r in _jsonl(path):
        try:
            problem, answer = r["problem"], r["answer"]
        except KeyError as e:
            raise DataError(f"{path}:{i}: missing field {e}") from None
        rows.append(
            {
                "data_source": "HuggingFaceH4/MATH-500",
                "prompt": [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {
                    "split": split,
                    "index": len(rows),
                    "question": problem,
                    "solution": r.get("solution", ""),
                    "subject": r.get("subject", ""),
                    "level": int(r.get("level", 0) or 0),
                    "unique_id": r.get("unique_id", ""),
                },
            }
        )
    return rows


@dataclass(frozen=True)
class Dataset:
    """A raw dataset under the shared data directory and how its rows are built."""

    directory: str
    """Its directory under :func:`shared_data_dir` (holding ``<split>.jsonl``)."""
    rows: Callable[[Path, str], list[dict[str, Any]]]
    """The row builder: ``rows(path, split)`` -> verl-style rows."""
    splits: tuple[str, ...]
    """The splits ``stepcredit data prepare`` writes."""
    eval_split: str = "test"
    """The split ``stepcredit eval`` and ``stepcredit probe`` read."""


DATASETS: dict[str, Dataset] = {
    "gsm8k": Dataset("gsm8k", gsm8k_rows, ("train", "test")),
    "math500": Dataset("math500", math500_rows, ("test",)),
}
"""The one dataset registry: ``data prepare``, ``eval --data`` and ``probe --data`` accept these names."""

ARITH = "arith"
"""The generated arithmetic task (``data.arith``): ``--data arith`` of eval and probe."""


def data_names() -> list[str]:
    """The names ``--data`` of eval and probe accepts besides a file: ``arith`` and :data:`DATASETS`."""
    return [ARITH, *DATASETS]


def dataset_rows(
    name: str, *, split: str | None = None, src: str | Path | None = None
) -> tuple[list[dict[str, Any]], Path]:
    """The rows of split ``split`` (default: its ``eval_split``) of dataset ``name``, and their file."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r} (valid: {', '.join(DATASETS)})")
    ds = DATASETS[name]
    split = split or ds.eval_split
    path = (Path(src) if src is not None else shared_data_dir()) / ds.directory / f"{split}.jsonl"
    return ds.rows(path, split), path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows with pyarrow, atomically (a temp file renamed into place)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)


def prepare(name: str, out: str | Path, *, src: str | Path | None = None) -> dict[str, Path]:
    """Write ``<out>/<split>.parquet`` for each split of dataset ``name``; returns split -> path."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r} (valid: {', '.join(DATASETS)})")
    written = {}
    for split in DATASETS[name].splits:
        rows, path = dataset_rows(name, split=split, src=src)
        if not rows:
            raise DataError(f"{path}: no rows")
        target = Path(out) / f"{split}.parquet"
        write_parquet(target, rows)
        written[split] = target
    return written
