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


def test_a_bad_row_after_blank_lines_is_named_by_its_line_in_the_file(tmp_path: Path) -> None:
    good = json.dumps({"data_source": "x", "prompt": "q", "reward_model": {"ground_truth": "1"}})
    bad = json.dumps({"data_source": "x", "prompt": "q"})
    f = tmp_path / "d.jsonl"
    f.write_text(f"\n{good}\n\n   \n{bad}\n")
    # the editor's line 5, not the second row
    with pytest.raises(DataError, match=r"d\.jsonl:5: missing 'reward_model\.ground_truth'"):
        read_samples(f)
    # a JSON array numbers its elements from 1, a parquet file its rows from 0
    arr = tmp_path / "d.json"
    arr.write_text(f"[{good}, {bad}]")
    with pytest.raises(DataError, match=r"d\.json:2: missing"):
        read_samples(arr)
    pq = tmp_path / "d.parquet"
    write_rows(pq, [json.loads(good), json.loads(good) | {"reward_model": {"style": "rule"}}])
    with pytest.raises(DataError, match=r"d\.parquet:1: missing"):
        read_samples(pq)


def test_the_probes_solution_files_name_a_row_by_its_line(tmp_path: Path) -> None:
    from stepcredit.data.wrong_step import load_solutions

    good = {"data_source": "x", "prompt": "q", "reward_model": {"ground_truth": "1"}, "response": "1"}
    f = tmp_path / "d.jsonl"
    f.write_text(f"{json.dumps(good)}\n\n{json.dumps(good | {'response': ''})}\n")
    with pytest.raises(DataError, match=r"d\.jsonl:3: no solution text"):
        load_solutions(str(f), ArithConfig(), n=5, seed=0)
    f.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"d\.jsonl:1: expected a JSON object, got list"):
        load_solutions(str(f), ArithConfig(), n=5, seed=0)
