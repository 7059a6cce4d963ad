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
    # malformed rows: each reported, written back as error, and the exit is 2 unless asked to skip them
    assert cli.main(["score", "--in", str(inp), "--out", str(out), "--workers", "1"]) == 2
    assert "2 malformed row(s)" in capsys.readouterr().err
    assert cli.main(["score", "--in", str(inp), "--out", str(out), "--workers", "1", "--skip-bad-rows"]) == 0
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
    assert (
        f"{inp}:3: invalid JSON" in err.err
        and f"{inp}:6: missing data_source (or pass --source NAME), ground_truth (" in err.err
    )
    # 4 real scores, all 0 or 1: 1 + 0 + 1 + 0 (unparseable) -> mean 0.5 and accuracy 0.5
    assert "mean score (rows with a real score): 0.5000 over 4" in err.out
    assert "accuracy (share with score 1): 0.5000 over 4" in err.out and "scored 6 rows" in err.out
    assert got[0]["info"] is not None and got[2]["info"]["message"].startswith(f"{inp}:3: invalid JSON")
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
    assert "reward judge: ok=2" in printed and "scored 3 rows" in printed
    assert "  judge: 2 rows, ok=2, mean score 0.5000, accuracy 0.5000" in printed  # per data source


def test_score_rejects_an_unknown_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps(ROWS[0]) + "\n")
    out = tmp_path / "out.jsonl"
    assert cli.main(["score", "--in", str(inp), "--out", str(out), "reward.judge.base_ur=x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown config key reward.judge.base_ur" in err[0] and not out.exists()


def test_verl_and_trl_column_names_and_every_malformed_row_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        # verl: compute_score(data_source, solution_str, ground_truth, extra_info)
        {"data_source": "openai/gsm8k", "solution_str": "#### 18", "reward_model": {"ground_truth": "18"}},
        # TRL standard: completion is a string; conversational: a list of messages
        {"data_source": "openai/gsm8k", "completion": "#### 7", "ground_truth": "8"},
        {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2*9?"}],
         "completion": [{"role": "assistant", "content": "#### 18"}], "ground_truth": "18"},
        {"data_source": "openai/gsm8k", "completion": [{"role": "user", "content": "hi"}], "ground_truth": "1"},
        {"data_source": 3, "response": "#### 1", "ground_truth": "1"},
    ]  # fmt: skip
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["score", "--in", str(inp), "--out", str(out)]) == 2
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(g["status"], g["score"]) for g in got] == [
        ("ok", 1.0),
        ("ok", 0.0),
        ("ok", 1.0),
        ("error", None),
        ("error", None),
    ]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"stepcredit score: {inp}:4: completion must be a string or a list of {{role, content}} " \
        "messages with an assistant turn"  # fmt: skip
    assert err[1] == f"stepcredit score: {inp}:5: data_source must be a string, got int"
    assert len(err) == 3 and "--skip-bad-rows" in err[2]


def test_info_says_what_decided_and_a_weighted_score_is_no_accuracy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gt = {
        "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"],
        "kwargs": [{}, {}],
    }
    fn = tmp_path / "rew.py"
    fn.write_text("def half(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return {'score': 0.5 * len(solution_str), 'length': len(solution_str)}\n")  # fmt: skip
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(
        json.dumps({"data_source": "ifeval", "response": "Tea, please", "ground_truth": gt}) + "\n"
    )
    assert cli.main(["score", "--in", str(inp), "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    # IFEval: the comma and the capital T break both instructions; each instruction's verdict is in info
    assert row["score"] == 0.0 and [v["strict"] for v in row["info"]["instructions"]] == [False, False]
    capsys.readouterr()
    inp.write_text(
        json.dumps({"data_source": "mine", "response": "ab", "ground_truth": ""}) + "\n"
        + json.dumps({"data_source": "mine", "response": "abc", "ground_truth": ""}) + "\n"
    )  # fmt: skip
    assert cli.main(["score", "--in", str(inp), "--out", str(out), "--custom", f"{fn}:half"]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["info"]["length"] for g in got] == [2, 3]  # the verl-style function's extra keys
    printed = capsys.readouterr().out
    # scores 1.0 and 1.5: a mean score, not an accuracy
    assert "mean score (rows with a real score): 1.2500 over 2" in printed and "accuracy" not in printed


def _verl_parquet(path: Path, responses: list[str]) -> None:
    """A parquet file in verl's layout (as its examples/data_preprocess/gsm8k.py writes it) plus a
    response column, written by pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {a} + {a}? Let's think step by step."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * a)},
            "extra_info": {"split": "test", "index": i},
            "responses": r,
        }
        for i, (a, r) in enumerate(zip((9, 3, 5), responses, strict=True))
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_verl_parquet_as_verl_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp, out = tmp_path / "test.parquet", tmp_path / "scored.jsonl"
    _verl_parquet(inp, ["9 + 9 = 18\n#### 18", "#### 7", "I do not know"])
    argv = ["score", "--in", str(inp), "--out", str(out), "--response-key", "responses"]
    assert cli.main(argv) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    # 18 = 2 * 9 right; 7 != 6 wrong; no answer: unparseable (a verdict, scored 0)
    assert [(g["status"], g["score"]) for g in got] == [("ok", 1.0), ("ok", 0.0), ("unparseable", 0.0)]
    assert got[0]["reward_model"]["ground_truth"] == "18" and got[0]["extra_info"]["index"] == 0
    printed = capsys.readouterr().out
    # per data source: 3 rows, 3 verdicts, mean (1 + 0 + 0) / 3
    assert "  openai/gsm8k: 3 rows, ok=2 unparseable=1, mean score 0.3333, accuracy 0.3333" in printed
    # the same file without its extension: --format parquet reads it; read as text it is one line
    bare = tmp_path / "test.data"
    bare.write_bytes(inp.read_bytes())
    assert cli.main([*argv[:2], str(bare), *argv[3:], "--format", "parquet"]) == 0
    capsys.readouterr()
    assert cli.main(["score", "--in", str(bare), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"stepcredit score: error: {bare}: not UTF-8 text, so not JSON lines (a Parquet file? pass --format parquet)"
    ]


def test_trl_rows_as_trl_writes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        {"prompt": "What is 9 + 9?", "completion": "It is 18.\n#### 18", "answer": "Add: 9 + 9 = 18\n#### 18"},
        {"prompt": [{"role": "user", "content": "3 + 3?"}],
         "completion": [{"role": "assistant", "content": "#### 7"}], "answer": "#### 6"},
    ]  # fmt: skip
    inp, out = tmp_path / "trl.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # no data_source in TRL rows: one line per row saying which flag maps it, exit 2
    assert cli.main(["score", "--in", str(inp), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"stepcredit score: {inp}:1: missing data_source (or pass --source NAME)"
    assert cli.main(["score", "--in", str(inp), "--out", str(out), "--source", "gsm8k"]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    # GSM8K's answer column is a whole solution; its "#### N" is the answer: 18 = 18 right, 7 != 6 wrong
    assert [(g["source"], g["score"]) for g in got] == [("math", 1.0), ("math", 0.0)]
    assert "  gsm8k: 2 rows, ok=2, mean score 0.5000, accuracy 0.5000" in capsys.readouterr().out
    # named columns: --answer-key, --response-key, --prompt-key
    renamed = [{"q": "9 + 9?", "a": "18", "out": "#### 18", "data_source": "gsm8k"}]
    inp.write_text(json.dumps(renamed[0]) + "\n")
    argv = ["score", "--in", str(inp), "--out", str(out)]
    assert cli.main([*argv, "--answer-key", "a", "--response-key", "out", "--prompt-key", "q"]) == 0
    assert json.loads(out.read_text())["score"] == 1.0
    capsys.readouterr()
    assert cli.main([*argv, "--answer-key", "gold", "--response-key", "out"]) == 2
    assert f"{inp}:1: missing gold (--answer-key)" in capsys.readouterr().err


def test_trl_function_sees_the_rows_own_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fn = tmp_path / "trl_rewards.py"
    fn.write_text(
        "def exact(prompts, completions, answer, **kw):\n"
        "    return [1.0 if c.strip().endswith(a) else 0.0 for c, a in zip(completions, answer)]\n"
    )
    rows = [
        {"prompt": "p", "completion": "so 4", "answer": "4"},
        {"prompt": "p", "completion": "5", "answer": "4"},
    ]
    inp, out = tmp_path / "trl.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [
        "score",
        "--in",
        str(inp),
        "--out",
        str(out),
        "--custom",
        f"{fn}:exact",
        "reward.custom.style=trl",
    ]
    assert cli.main(argv) == 0
    assert [json.loads(x)["score"] for x in out.read_text().splitlines()] == [1.0, 0.0]


def test_failure_cases_are_one_line_and_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    argv = ["score", "--in", str(inp), "--out", str(out)]
    # an empty input: nothing to score, no output file
    inp.write_text("\n")
    assert cli.main(argv) == 2 and not out.exists()
    assert capsys.readouterr().err.splitlines() == [
        f"stepcredit score: error: {inp}: no rows to score (an empty jsonl file)"
    ]
    # every row's data source unknown: the summary names the cause, and one line says why the exit is 2
    inp.write_text(
        "".join(
            json.dumps({"data_source": "gsmk8", "response": "#### 1", "ground_truth": "1"}) + "\n"
            for _ in range(3)
        )
    )
    assert cli.main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.splitlines()
    assert len(err) == 1 and err[0].startswith("stepcredit score: error: 3/3 rows got no verdict, more than ")
    assert "3 x unknown reward function 'gsmk8'; did you mean gsm8k?" in err[0]
    assert "failed rows (3), most frequent causes: 3 x unknown reward function 'gsmk8'" in cap.out
    # a custom function that raises on 2 rows of 3: 2/3 > 0.5 fails; a looser limit lets it pass
    fn = tmp_path / "r.py"
    fn.write_text("def f(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    if solution_str != 'ok':\n        raise ImportError('No module named math_verify')\n    return 1.0\n")  # fmt: skip
    inp.write_text(
        "".join(
            json.dumps({"data_source": "x", "response": r, "ground_truth": "1"}) + "\n"
            for r in ("ok", "a", "b")
        )
    )
    assert cli.main([*argv, "--custom", f"{fn}:f"]) == 2
    assert "2 x ImportError: No module named math_verify" in capsys.readouterr().err
    assert cli.main([*argv, "--custom", f"{fn}:f", "reward.breaker.max_failure_share=0.7"]) == 0
    assert (
        "failed rows (2), most frequent causes: 2 x ImportError: No module named math_verify"
        in capsys.readouterr().out
    )
