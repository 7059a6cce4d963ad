"""``stepcredit explain`` end to end through the command-line entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepcredit.cli.main import main

PROMPT = "Ann has 3 apples. Then gets 4 more. How many?"
RESPONSE = "Let me start with 3. So 3 + 4 = 8. Wait, 3 + 4 = 7.\nThe answer is 7."


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_explain_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "out" / "explain.html"
    argv = ["explain", "--model", "tiny", "--prompt", PROMPT, "--response", RESPONSE, "--answer", "7"]
    assert main([*argv, "--html", str(page), "--json"]) == 0
    report = last_json(capsys.readouterr().out)
    eps = report["episodes"]
    # "Let me" opens the response; "So " and "Wait," open two more episodes, and the new line the last one
    # (process.split_lines)
    assert [e["text"] for e in eps] == [
        "Let me start with 3. ",
        "So 3 + 4 = 8. ",
        "Wait, 3 + 4 = 7.\n",
        "The answer is 7.",
    ]
    assert "".join(e["text"] for e in eps) == RESPONSE
    assert all(RESPONSE[e["start"] : e["end"]] == e["text"] for e in eps)
    assert set(eps[0]) >= {"start", "end", "text", "value", "utility"}
    # U_i = V_i - V_(i-1), so the utilities telescope to V_S - V_0
    values = [report["v0"]] + [e["value"] for e in eps]
    for i, e in enumerate(eps, 1):
        assert e["utility"] == pytest.approx(values[i] - values[i - 1], abs=1e-6)
    doc = page.read_text()
    assert "<svg" in doc and "<polyline" in doc and doc.count('class="ep"') == 4
    assert "So 3 + 4 = 8." in doc

    # process settings can be overridden; clip/scale change U, not V
    assert main([*argv, "--json", "process.scale=2.0"]) == 0
    scaled = last_json(capsys.readouterr().out)["episodes"]
    assert [e["value"] for e in scaled] == pytest.approx([e["value"] for e in eps], abs=1e-5)
    assert [e["utility"] for e in scaled] == pytest.approx([2 * e["utility"] for e in eps], abs=1e-5)


def test_explain_with_a_verifier_estimator(capsys: pytest.CaptureFixture[str]) -> None:
    # greedy_continuation needs the verifier (registry metadata): explain scores each prefix's
    # continuation with the default rewarder, so every V is a verifier score in {0, 1}.
    argv = ["explain", "--model", "tiny", "--prompt", PROMPT, "--response", RESPONSE, "--answer", "7"]
    assert main([*argv, "--json", "process.value_estimator=greedy_continuation"]) == 0
    report = last_json(capsys.readouterr().out)
    values = [report["v0"]] + [e["value"] for e in report["episodes"]]
    assert len(values) == 5 and set(values) <= {0.0, 1.0}


def test_explain_from_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stepcredit.config import TinyModelConfig
    from stepcredit.models import build_tiny, save_pretrained

    run = tmp_path / "run"
    model, tok = build_tiny(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    save_pretrained(model, tok, run / "checkpoints" / "final" / "model")
    rows = [
        {
            "prompt": "Ben has 9 pens. Then loses 2.",
            "response": "So 9 - 2 = 7.\nThe answer is 7.",
            "ground_truth": 7,
        },
        {"prompt": PROMPT, "response": RESPONSE, "ground_truth": 7},
    ]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(
        "process:\n  enabled: true\n  min_episode_tokens: 2\n  markers: ['Wait,']\n  split_lines: false\n"
    )
    assert main(["explain", "--from-run", str(run), "--index", "1", "--json"]) == 0
    eps = last_json(capsys.readouterr().out)["episodes"]
    assert [e["text"] for e in eps] == [
        "Let me start with 3. So 3 + 4 = 8. ",
        "Wait, 3 + 4 = 7.\nThe answer is 7.",
    ]

    assert main(["explain", "--from-run", str(run), "--index", "5"]) == 2
    assert "has 2 samples" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--model", "/no/such/model", "--prompt", "a", "--response", "b", "--answer", "c"],
            "no such model",
        ),
        (["--model", "tiny", "--prompt", "a"], "missing --response, --answer"),
        (
            ["--model", "tiny", "--prompt", "a", "--response", "b", "--answer", "c", "process.nope=1"],
            "process.nope",
        ),
        (["--from-run", "/no/such/run"], "no such directory"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_explain_names_the_estimator_and_shows_outcome_credit_and_advantage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "explain.html"
    argv = ["explain", "--model", "tiny", "--prompt", PROMPT, "--response", RESPONSE, "--answer", "7"]
    assert main([*argv, "--html", str(page), "--json"]) == 0
    out = capsys.readouterr().out
    report = last_json(out)
    assert report["value_estimator"] == "forced_answer_logprob" and "log-probability" in report["value_unit"]
    # the default verifier reads "The answer is 7." as 7: full marks
    assert report["outcome"] == 1.0 and report["outcome_status"] == "ok"
    assert report["advantage_estimator"] == "grpo_process"  # the process preset's, without a run
    # grpo_process for a group of one (verl: mean 0, std 1, so the outcome term is the score 1.0) plus
    # the process term: z_j = (c_j - mean c) / (std c + 1e-6) over the response's 4 step credits
    # (unbiased std), and a token of episode k gets sum_{j >= k} z_j (the steps ending at or after it)
    c = [e["utility"] for e in report["episodes"]]
    mean = sum(c) / 4
    std = (sum((x - mean) ** 2 for x in c) / 3) ** 0.5
    z = [(x - mean) / (std + 1e-6) for x in c]
    for k, e in enumerate(report["episodes"]):
        want = 1.0 + sum(z[k:])
        assert len(e["advantage"]) == e["token_end"] - e["token_start"] + 1
        assert e["advantage"] == pytest.approx([want] * len(e["advantage"]), abs=1e-4)
    # the terminal names what it shows and explains its columns
    for needle in (
        "value estimator: forced_answer_logprob",
        "outcome: 1.000 (ok)",
        "advantage: grpo_process",
    ):
        assert needle in out
    assert "legend:" in out and "A per token" in out and "c (U)" in out
    doc = page.read_text()
    assert "forced_answer_logprob" in doc and "A per token" in doc and "grpo_process" in doc

    # an outcome-only estimator with a wrong gold answer: the verifier scores 0, and every token gets
    # the score (a group of one: baseline 0), whatever the step credit
    wrong = ["explain", "--model", "tiny", "--prompt", PROMPT, "--response", RESPONSE, "--answer", "8"]
    assert main([*wrong, "--json", "algorithm.advantage=grpo"]) == 0
    report = last_json(capsys.readouterr().out)
    assert report["outcome"] == 0.0
    assert all(a == 0.0 for e in report["episodes"] for a in e["advantage"])


TOOL_PROMPT = "Ann has 12 boxes with 345 pens each. Then sells 40 pens. How many pens now?"
CALL_1, RESULT_1 = "```calculator\n 12 * 345\n```", "\n```output\n4140\n```\n"
CALL_2, RESULT_2 = "```calculator\n4140 - 40\n```", "\n```output\n4100\n```\n"
TOOL_RESPONSE = CALL_1 + RESULT_1 + CALL_2 + RESULT_2 + "The answer is\n4100"


def test_explain_shows_turns_calls_and_untrained_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "turns.html"
    argv = ["explain", "--model", "tiny", "--prompt", TOOL_PROMPT, "--response", TOOL_RESPONSE]
    assert main([*argv, "--answer", "4100", "--html", str(page), "--json"]) == 0
    out = capsys.readouterr().out
    report = last_json(out)
    eps = report["episodes"]
    # three turns: each call ends one (the segmenter's episode end), the result opens the next
    assert report["turns"] == 3 and len(eps) == 3
    assert [e["observation"] for e in eps] == ["", RESULT_1, RESULT_2]
    assert [e["text"] for e in eps] == [CALL_1, RESULT_1 + CALL_2, RESULT_2 + "The answer is\n4100"]
    assert [e["tool_call"] for e in eps] == [
        'calculator {"expression": " 12 * 345"}',
        'calculator {"expression": "4140 - 40"}',
        "",
    ]
    # the results get no advantage: the tiny model's tokenizer has one token per character, so each
    # turn's advantages are exactly its own characters (the call or the answer), none for its result
    assert [len(e["advantage"]) for e in eps] == [len(e["text"]) - len(e["observation"]) for e in eps]
    assert [e["token_end"] - e["token_start"] + 1 for e in eps] == [len(e["text"]) for e in eps]
    values = [report["v0"]] + [e["value"] for e in eps]
    for i, e in enumerate(eps, 1):  # each turn's credit: U_i = V_i - V_(i-1)
        assert e["utility"] == pytest.approx(values[i] - values[i - 1], abs=1e-6)
    assert report["outcome"] == 1.0
    # the table: a "result ... not trained" row before the turn it opens, and each turn's call
    table = out.splitlines()
    assert sum("result" in line and "not trained" in line for line in table) == 2
    assert sum("-> calls calculator" in line for line in table) == 2
    assert any(line.startswith("turns: 3") for line in table)
    # the page: each result marked as not trained, each turn coloured by its credit with its call
    doc = page.read_text()
    assert doc.count('<span class="obs" title="tool result: attended to, never trained on') == 2
    assert doc.count('class="ep"') == 3 and doc.count("calls calculator") == 2
    assert "<th>tool result (not trained)</th>" in doc and "3 turns" in doc and "V after each turn" in doc


def test_a_plain_response_has_no_turns(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explain", "--model", "tiny", "--prompt", PROMPT, "--response", RESPONSE, "--answer", "7"]
    assert main([*argv, "--json"]) == 0
    report = last_json(capsys.readouterr().out)
    assert report["turns"] == 0
    assert all(e["observation"] == "" and e["tool_call"] == "" for e in report["episodes"])


def test_explain_states_the_scale_of_every_column(capsys: pytest.CaptureFixture[str]) -> None:
    # two episodes, the default process preset's grpo_process on a group of this one response
    response = "2 + 3 = 5. So the answer is 5."
    argv = [
        "explain",
        "--model",
        "tiny",
        "--prompt",
        "What is 2 + 3?",
        "--response",
        response,
        "--answer",
        "5",
    ]
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(
        x.startswith("value estimator: forced_answer_logprob; V = mean log-probability") for x in lines
    )
    assert any(
        x.startswith("credit form: difference; c = V's units") and "process.scale 1" in x for x in lines
    )
    assert any(x.startswith("advantage: grpo_process") and "A = per token" in x and "std" in x for x in lines)
    report = last_json(out)
    assert report["credit_unit"] and report["advantage_unit"]
    # The scale the legend states, by hand: the outcome part of a singleton group is R (mean 0, std 1);
    # two step credits standardised with their unbiased std are -/+ (c1 - c2) / 2 / (|c1 - c2| / sqrt 2)
    # = -/+ 1/sqrt 2; A at a token sums the standardised credits from its episode on:
    # A_1 = R + z_1 + z_2 = R, A_2 = R + z_2 = R +/- 0.7071 (the sign of c_2 - c_1).
    r = report["outcome"]
    e1, e2 = report["episodes"]
    sign = 1.0 if e2["utility"] > e1["utility"] else -1.0
    assert e1["advantage"] == pytest.approx([r] * len(e1["advantage"]), abs=1e-4)
    assert e2["advantage"] == pytest.approx([r + sign * 0.5**0.5] * len(e2["advantage"]), abs=1e-4)


def test_control_characters_in_shown_text_are_escaped() -> None:
    # a response's or a tool's text with ANSI escapes and a carriage return must not drive the terminal
    # the table is printed to (the tiny tokenizer maps them to <unk>; byte-level tokenizers keep them)
    from stepcredit.cli.explain import _short

    shown = _short("5.\x1b[2J\x1b[31m So\r the answer\tis\n5.\x9b", 200)
    assert shown == "5.\\x1b[2J\\x1b[31m So\\x0d the answer\\tis\\n5.\\x9b"
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in shown)


def test_an_argument_that_is_not_utf8_is_one_error_not_a_traceback(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "stepcredit.cli.main", "explain", "--model", "tiny", "--prompt", "x",
            "--response", os.fsdecode(b"2 + 3 = 5.\x9b"), "--answer", "5"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C.UTF-8"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "stepcredit: error: argument 7 (2 + 3 = 5.\\udc9b) is not valid UTF-8 text"
    )
