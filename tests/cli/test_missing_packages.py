"""A configured reward, tool or backend whose optional package is missing stops at start-up: one line
naming the package and the pip command, exit 2, before SFT (``train``) or before a row is written
(``score``). The missing module is simulated: ``importlib.util.find_spec`` answers None for it, which
is what it answers on a venv without the package (the check never imports it)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from stepcredit.cli.main import main
from stepcredit.errors import MissingPackageError
from stepcredit.runtime import missing_modules, require


def _hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``find_spec`` say ``names`` (and their submodules) are not installed."""
    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any, **k: Any) -> Any:
        if name.split(".")[0] in names:
            return None
        return real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err  # one line, no traceback
    return lines[0]


def test_require_names_the_first_missing_package_and_its_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "latex2sympy2_extended", "antlr4")
    assert missing_modules(["math_verify", "antlr4", "latex2sympy2_extended", "antlr4"]) == [
        "antlr4",
        "latex2sympy2_extended",
    ]
    require(["json", "math_verify"], what="nothing missing")  # no error
    with pytest.raises(MissingPackageError) as e:
        require(["json", "antlr4"], what="reward 'math'")
    msg = str(e.value)
    # the ANTLR runtime is installed through math-verify's extra, with this interpreter's pip
    assert msg.startswith("reward 'math' needs the Python package 'antlr4'"), msg
    assert f"{sys.executable} -m pip install 'math-verify[antlr4_9_3]>=0.7'" in msg
    with pytest.raises(MissingPackageError, match="pip install 'no_such_pkg_xyz'"):
        require(["no_such_pkg_xyz"], what="a tool")  # not in the table: its own name


def test_train_without_math_verify_stops_before_sft(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_train: list[str]
) -> None:
    import stepcredit.trainer.loop as loop

    sft_calls: list[int] = []
    monkeypatch.setattr(loop, "run_sft", lambda *a, **k: sft_calls.append(1))
    _hide(monkeypatch, "math_verify")
    out = tmp_path / "run"
    code = main(["train", "--out", str(out), *tiny_train, "sft.steps=2", "trainer.steps=1"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2
    assert sft_calls == []  # stopped before the warm-up
    assert not out.exists()  # nothing started: the run directory it created is removed
    # default preset: the arith task, scored by the math reward
    assert line.startswith("stepcredit train: error: reward 'math' (data_source 'arith'"), line
    assert "'math_verify'" in line and "-m pip install 'math-verify[antlr4_9_3]>=0.7'" in line


def test_score_without_math_verify_stops_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"data_source": "gsm8k", "response": "The answer is 4.", "ground_truth": "4"},
        {"data_source": "mc", "response": "The answer is (B).", "ground_truth": "B"},
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    _hide(monkeypatch, "math_verify")
    code = main(["score", "--in", str(inp), "--out", str(out), "--workers", "1"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2
    assert not out.exists()  # not a file of error rows: nothing is written
    assert list(tmp_path.iterdir()) == [inp]  # and no temp file is left behind
    assert "reward 'math' (data_source 'gsm8k', row " in line and "'math_verify'" in line, line
    assert "pip install 'math-verify[antlr4_9_3]>=0.7'" in line


def test_score_without_the_package_of_an_unused_reward_still_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The check is per route the data uses: multiple-choice rows need no math-verify.
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        json.dumps({"data_source": "mc", "response": "The answer is (B).", "ground_truth": "B"}) + "\n"
    )
    out = tmp_path / "out.jsonl"
    _hide(monkeypatch, "math_verify")
    assert main(["score", "--in", str(inp), "--out", str(out), "--workers", "1"]) == 0
    (row,) = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert (row["status"], row["score"]) == ("ok", 1.0)


def test_train_with_a_tool_whose_package_is_missing_stops_at_the_config_check(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tools_smoke: list[str],
) -> None:
    from stepcredit.tools import TOOLS, register_tool

    monkeypatch.setattr(TOOLS, "_items", dict(TOOLS._items))  # the tool is forgotten after the test

    @register_tool(
        "needs_pkg_tool",
        description="a tool that imports a package this venv lacks",
        parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        requires=("no_such_pkg_xyz",),
    )
    def needs_pkg_tool(x: str) -> str:  # pragma: no cover - never called
        return x

    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "tools",
            "--out",
            str(out),
            *tools_smoke,
            "rollout.tools.names=[calculator, needs_pkg_tool]",
            "trainer.steps=1",
        ]
    )
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and not out.exists()
    assert (
        "tool 'needs_pkg_tool' (config key rollout.tools.names) needs the Python package 'no_such_pkg_xyz'"
        in line
    )


def test_ray_backend_without_ray_stops_at_the_config_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_train: list[str]
) -> None:
    _hide(monkeypatch, "ray")
    out = tmp_path / "run"
    code = main(["train", "--out", str(out), *tiny_train, "reward.agent.backend=ray", "trainer.steps=1"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and not out.exists()
    assert "config key reward.agent.backend: 'ray' needs the Python package 'ray'" in line
    assert "pip install 'stepcredit[ray]'" in line


def test_sft_and_eval_without_math_verify_stop_before_their_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_train: list[str]
) -> None:
    import stepcredit.models as models
    import stepcredit.trainer.sft as sft

    sft_calls: list[int] = []
    monkeypatch.setattr(sft, "run_sft", lambda *a, **k: sft_calls.append(1))
    loads: list[int] = []
    real_load = models.load_policy
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    _hide(monkeypatch, "math_verify")
    out = tmp_path / "sft"
    assert main(["sft", "--out", str(out), *tiny_train, "sft.steps=2"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("stepcredit sft: error: reward 'math'") and "'math_verify'" in line
    assert sft_calls == [] and loads == [] and not (out / "model").exists()
    code = main(
        ["eval", "--model", "tiny", "--data", "arith", "--limit", "2", "--out", str(tmp_path / "e.jsonl")]
    )
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("stepcredit eval: error: reward 'math'"), line
    assert loads == [] and not (tmp_path / "e.jsonl").exists()  # no model loaded, nothing generated
