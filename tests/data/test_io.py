"""verl-style readers: parquet and jsonl round trip, and errors that name the file and row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepcredit.config import ArithConfig
from stepcredit.data import read_samples, write_rows
from stepcredit.data.arith import make_rows
from stepcredit.errors import DataError


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    rows = make_rows(ArithConfig(), 10, seed=0, split="train")
    f = tmp_path / f"d{suffix}"
    write_rows(f, rows)
    samples = read_samples(f)
    assert [s.ground_truth for s in samples] == [r["reward_model"]["ground_truth"] for r in rows]
    assert samples[3].prompt[0]["content"] == rows[3]["prompt"][0]["content"]
    assert samples[3].extra_info["solution"] == rows[3]["extra_info"]["solution"]


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"data_source": "x", "prompt": [{"role": "user", "content": "q"}]}, "ground_truth"),
        ({"data_source": "x", "prompt": 5, "reward_model": {"ground_truth": "1"}}, "prompt"),
        (
            {"data_source": "x", "prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}},
            "content",
        ),
        ({"prompt": "q", "reward_model": {"ground_truth": "1"}}, "data_source"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path: Path, row: dict, needle: str) -> None:
    good = {"data_source": "x", "prompt": "q", "reward_model": {"ground_truth": "1"}}
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"d\.jsonl:2: .*{needle}"):
        read_samples(f)


def test_invalid_json_line(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: invalid JSON"):
        read_samples(f)
