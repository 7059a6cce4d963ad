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
