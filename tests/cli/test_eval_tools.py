"""``stepcredit eval`` with ``rollout.mode=tools``: answers call tools through the same tool rollout as
the trainer's validation, and the tool counters are printed beside pass@k and kept in the JSON line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import stepcredit.rollout.turns as rt
from stepcredit.cli import main as cli
from stepcredit.rollout.engines import Completion

TOOLS = [
    "--preset",
    "tools",
    "--data",
    "val",
    "--limit",
    "3",
    "--n",
    "2",
    "--no-progress",
    "trainer.threads=1",
]


@pytest.fixture(autouse=True)
def _only_our_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser imports every sub-command module; keep this test independent of the others.
    monkeypatch.setattr(cli, "COMMANDS", {k: v for k, v in cli.COMMANDS.items() if k == "eval"})


def last_json(out: str) -> dict[str, Any]:
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_eval_with_tools_counts_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every response calls the calculator twice (fenced convention, the preset's): a good expression,
    # then a malformed one, then answers. Sampling is scripted; the calls run for real through the
    # reward layer's tool runner, as in validation.
    script = ["```calculator\n 6 * 7\n```", "```calculator\n 6 *\n```", "The answer is\n42"]

    class Scripted:
        def sample(
            self, model: Any, tok: Any, contexts: list[list[int]], spec: Any, *, budgets: list[int]
        ) -> list:
            out = []
            for ctx, room in zip(contexts, budgets, strict=True):
                k = tok.decode(ctx, skip_special_tokens=True).count("```output")
                got = tok(script[k], add_special_tokens=False)["input_ids"]
                out.append(Completion((got + ([tok.eos_token_id] if k == 2 else []))[:room]))
            return out

    monkeypatch.setattr(rt, "engine_for", lambda model: Scripted())
    out = tmp_path / "s.jsonl"
    assert cli.main(["eval", *TOOLS, "--max-new-tokens", "200", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # 6 responses, 2 calls each, 1 of them failed (bad_expression): 2.0 and 1.0 per response
    assert "tools: 2.000 calls per response, 1.000 failed calls per response (bad_expression 6)" in printed
    summary = last_json(printed)
    assert summary["tools"] == {
        "tools/calls_per_response": 2.0,
        "tools/failed_calls_per_response": 1.0,
        "tools/failed_bad_expression": 6.0,
    }
    assert summary["prompts"] == 3 and summary["n"] == 2 and "pass@1" in summary and "pass@2" in summary
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6
    # the results were appended to the responses, and the answer was scored (not truncated)
    assert all("```output\n42\n```" in r["response"] and "error" in r["response"] for r in rows)
    assert all(r["status"] != "truncated" for r in rows)


def test_eval_with_tools_on_a_real_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Unscripted: the preset's tiny model generates every turn; the counters are printed whatever it does
    rc = cli.main(["eval", *TOOLS, "--max-new-tokens", "24", "--out", str(tmp_path / "s.jsonl")])
    printed = capsys.readouterr().out
    assert rc == 0 and "tools calculator (fenced)" in printed.splitlines()[0]
    assert "calls per response" in printed and "tools/calls_per_response" in last_json(printed)["tools"]


def test_eval_without_tools_reports_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        ["eval", *TOOLS, "rollout.mode=flat", "--max-new-tokens", "8", "--out", str(tmp_path / "s.jsonl")]
    )
    printed = capsys.readouterr().out
    assert rc == 0 and "tools:" not in printed and "tools" not in last_json(printed)


def test_eval_refuses_a_template_that_cannot_render_tool_turns(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eval", *TOOLS, "rollout.tools.render=template"]) == 2
    err = capsys.readouterr().err.strip()
    assert "rollout.tools.render" in err and len(err.splitlines()) == 1
