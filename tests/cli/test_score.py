"""``stepcredit score`` end to end: verdicts, malformed rows, atomic output, start-up errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepcredit.cli import main as cli


@pytest.fixture(autouse=True)
def _only_our_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser imports every sub-command module; keep this test independent of the others.
    monkeypatch.setattr(cli, "COMMANDS", {k: v for k, v in cli.COMMANDS.items() if k in ("score", "data")})


ROWS = [
    {"data_source": "openai/gsm8k", "response": "She makes 9 * 2 = 18.\n#### 18", "ground_truth": "18"},
    {"data_source": "openai/gsm8k", "response": "A: 26", "ground_truth": "25"},
    {
        "data_source": "math",
        "response": "so \\boxed{\\frac{\\sqrt{2}}{2}}",
        "ground_truth": "\\frac{1}{\\sqrt{2}}",
    },
    {"data_source": "lighteval/MATH", "response": "I give up.", "reward_model": {"ground_truth": "3"}},
]


def test_score_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    lines = [json.dumps(r) for r in ROWS]
    lines.insert(2, "{not json")
    lines.append(json.dumps({"response": "x"}))
    inp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert cli.main(["score", "--in", str(inp), "--out", str(out), "--workers", "1"]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(g["status"], g["score"]) for g in got] == [
        ("ok", 1.0),
        ("ok", 0.0),
        ("error", None),
        ("ok", 1.0),
        ("unparseable", 0.0),
        ("error", None),
    ]
    assert got[1]["extracted"] == "26" and got[2]["line"] == 3
    err = capsys.readouterr()
    assert f"{inp}:3: invalid JSON" in err.err and f"{inp}:6: missing data_source, ground_truth" in err.err
    assert "accuracy" in err.out and "scored 6 rows" in err.out
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_missing_custom_function_fails_at_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps(ROWS[0]) + "\n")
    out = tmp_path / "out.jsonl"
    fn = tmp_path / "fn.py"
    fn.write_text("def other(*a, **k):\n    return 1.0\n")
    for spec, msg in [
        (f"{tmp_path / 'nope.py'}:f", "does not exist"),
        (f"{fn}:compute_score", "has no 'compute_score'"),
    ]:
        assert cli.main(["score", "--in", str(inp), "--out", str(out), "--custom", spec]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1
            and err[0].startswith("stepcredit score: error: reward.custom.path=")
            and msg in err[0]
        )
    assert not out.exists()  # nothing written


def test_missing_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["score", "--in", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_score_takes_the_train_config_tree_and_the_row_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], loopback_judge: Any
) -> None:
    def reply(body: dict[str, Any]) -> tuple[int, str]:  # Score: 10 when the request contains 2+2
        text = " ".join(m["content"] for m in body["messages"])
        return 200, "Score: 10" if "2+2" in text else "Score: 0"

    judge = loopback_judge(reply)
    rows = [
        {"data_source": "judge", "prompt": "What is 2+2?", "response": "4", "ground_truth": "4"},
        {"data_source": "judge", "prompt": [{"role": "user", "content": "What is 3+3?"}], "response": "6",
         "ground_truth": "6"},
        {"data_source": "openai/gsm8k", "response": "#### 18", "ground_truth": "18"},
    ]  # fmt: skip
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [
        f"reward.judge.base_url={judge.url}",
        "reward.judge.max_retries=1",
        "reward.judge.deadline_s=20",
    ]
    try:
        assert (
            cli.main(["score", "--in", str(inp), "--out", str(out), "--preset", "default", *overrides]) == 0
        )
    finally:
        judge.close()
    got = [json.loads(line) for line in out.read_text().splitlines()]
    # The judge saw each row's own prompt: only the first asks about 2+2.
    assert [(g["source"], g["status"], g["score"]) for g in got] == [
        ("judge", "ok", 1.0),
        ("judge", "ok", 0.0),
        ("math", "ok", 1.0),
    ]
    printed = capsys.readouterr().out
    assert "source judge: ok=2" in printed and "scored 3 rows" in printed


def test_score_rejects_an_unknown_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps(ROWS[0]) + "\n")
    out = tmp_path / "out.jsonl"
    assert cli.main(["score", "--in", str(inp), "--out", str(out), "reward.judge.base_ur=x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown config key reward.judge.base_ur" in err[0] and not out.exists()
