"""``stepcredit data prepare``: verl-schema parquet from the shared raw files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stepcredit.cli import main as cli
from stepcredit.data.prepare import MATH_ANSWER_END, MATH_SOURCES, gsm8k_answer, prepare, shared_data_dir
from stepcredit.errors import DataError


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    src = tmp_path / "raw"
    (src / "gsm8k").mkdir(parents=True)
    (src / "math500").mkdir()
    g = [
        {"question": "Q1?", "answer": "1+1=<<1+1=2>>2\n#### 1,200"},
        {"question": "Q2?", "answer": "#### -3"},
    ]
    for split in ("train", "test"):
        (src / "gsm8k" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in g))
    m = {
        "problem": "P?",
        "solution": "so \\boxed{\\frac12}",
        "answer": "\\frac12",
        "subject": "Algebra",
        "level": 2,
        "unique_id": "test/x.json",
    }
    (src / "math500" / "test.jsonl").write_text(json.dumps(m) + "\n")
    return src


def test_gsm8k_schema(raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMANDS", {"data": cli.COMMANDS["data"]})
    out = tmp_path / "out"
    assert cli.main(["data", "prepare", "gsm8k", "--out", str(out), "--src", str(raw)]) == 0
    rows = pq.read_table(out / "test.parquet").to_pylist()
    assert (out / "train.parquet").exists() and len(rows) == 2
    r = rows[0]
    assert r["data_source"] == "openai/gsm8k" and r["ability"] == "math"
    assert r["prompt"][0]["role"] == "user" and r["prompt"][0]["content"].startswith("Q1? Let's think")
    assert r["reward_model"] == {"style": "rule", "ground_truth": "1200"}
    assert r["extra_info"]["split"] == "test" and r["extra_info"]["index"] == 0
    assert rows[1]["reward_model"]["ground_truth"] == "-3"


def test_math500_schema(raw: Path, tmp_path: Path) -> None:
    written = prepare("math500", tmp_path / "m", src=raw)
    rows = pq.read_table(written["test"]).to_pylist()
    assert rows[0]["data_source"] == "HuggingFaceH4/MATH-500"
    assert rows[0]["reward_model"]["ground_truth"] == "\\frac12"
    assert rows[0]["extra_info"]["level"] == 2


def test_errors_name_the_file_and_line(raw: Path, tmp_path: Path) -> None:
    (raw / "gsm8k" / "test.jsonl").write_text('{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(DataError, match=r"test.jsonl:1: .*####"):
        prepare("gsm8k", tmp_path / "o", src=raw)
    with pytest.raises(DataError, match="unknown dataset"):
        prepare("mmlu", tmp_path / "o", src=raw)
    with pytest.raises(ValueError):
        gsm8k_answer("nothing")


def test_real_shared_data_if_present(tmp_path: Path) -> None:
    base = shared_data_dir()
    if not (base / "math500" / "test.jsonl").exists():
        pytest.skip(f"{base} not found")
    written = prepare("math500", tmp_path / "m")
    assert pq.read_metadata(written["test"]).num_rows == 500


@pytest.mark.parametrize(
    ("text", "done"),
    [
        # (a response, the shortest prefix in which its answer is complete; None: never, eos ends it)
        ("3 + 4 = 7.\n#### 7\nDone.", "3 + 4 = 7.\n#### 7\n"),
        ("#### 1,000. That is it.", "#### 1,000. "),
        ("#### $72 dollars", "#### $72 "),
        ("#### -3\n", "#### -3\n"),
        ("#### 7.5\n", "#### 7.5\n"),  # the full stop of 7.5 does not end it
        ("#### 72", None),  # eos ends it
        ("So 3 + 4 = 7. The answer is 7.", None),  # no marker: runs to eos, as before
        ("so \\boxed{\\frac{\\sqrt{3}}{2}} is it", "so \\boxed{\\frac{\\sqrt{3}}{2}}"),
        ("\\fbox{12} and then \\boxed{13}", "\\fbox{12}"),  # the first complete answer
        ("\\boxed{{{{5}}}}.", "\\boxed{{{{5}}}}"),  # four deep
    ],
)
def test_gsm8k_and_math_answers_end_where_the_answer_is_complete(text: str, done: str | None) -> None:
    # the continuation stop rule (stepcredit.rollout.stops) ends a row at the first token whose text
    # completes a match: every shorter prefix must not match, and the first matching one must be `done`
    from stepcredit.data import ANSWER_ENDS

    assert {ANSWER_ENDS.get(s) for s in MATH_SOURCES} == {MATH_ANSWER_END}
    first = next((text[:i] for i in range(len(text) + 1) if re.search(MATH_ANSWER_END, text[:i])), None)
    assert first == done
