"""The docs against the code: every python example of docs/extending runs as written, and every
`stepcredit ...` command the README and the docs show names a real subcommand with real flags."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepcredit.cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
EXTENDING = sorted((ROOT / "docs" / "extending").glob("*.md"))
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)


def code_blocks(text: str, lang: str | None = None) -> list[str]:
    """The fenced blocks of a markdown text, of one language when ``lang`` is given."""
    return [body for tag, body in FENCE.findall(text) if lang is None or tag == lang]


def test_every_extending_page_is_checked() -> None:
    # a page without a python example is prose only; the pages that teach an extension point carry one
    with_code = {p.name for p in EXTENDING if code_blocks(p.read_text(), "python")}
    assert {"advantages.md", "losses.md", "process.md", "rewards.md"} <= with_code


@pytest.mark.parametrize(
    "page", [p for p in EXTENDING if code_blocks(p.read_text(), "python")], ids=lambda p: p.name
)
def test_extending_examples_run(page: Path, tmp_path: Path) -> None:
    """A page's python blocks, in order, in a fresh interpreter (what a reader pasting them gets; a
    fresh process keeps the names they register out of this test session's registries). The examples
    assert their own results."""
    script = tmp_path / f"{page.stem}.py"
    script.write_text("\n\n".join(code_blocks(page.read_text(), "python")))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{page.name}'s example failed:\n{proc.stderr[-3000:]}"


# ------------------------------------------------------------------------------ command lines
def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(p: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its nested subcommands (``data prepare``, ``serve sandbox``)."""
    out = {s for a in p._actions for s in a.option_strings}
    for sub in _subparsers(p).values():
        out |= _flags(sub)
    return out


SUBCOMMANDS = _subparsers(build_parser())
COMMAND_RE = re.compile(r"(?:^|[\s`(])stepcredit\s+([a-z][a-z-]*)((?:[^`\n&|;#])*)")


def commands_in(text: str) -> list[tuple[str, str]]:
    """``(subcommand, rest of the line)`` of every `stepcredit CMD ...` in code blocks and inline code."""
    # inline code may wrap onto the next line of the paragraph
    inline = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", FENCE.sub("", text))]
    return [c for span in code_blocks(text) + inline for c in commands_of(span)]


def commands_of(code: str) -> list[tuple[str, str]]:
    """``(subcommand, rest of the line)`` of every `stepcredit CMD ...` line of a piece of code."""
    return [c for line in code.replace("\\\n", " ").splitlines() for c in COMMAND_RE.findall(line)]


def synopsis(readme: str) -> str:
    """The README's command synopsis: the first code block under '## Command line'."""
    section = readme.split("## Command line", 1)[1]
    return code_blocks(section)[0]


def test_readme_synopsis_lists_every_subcommand() -> None:
    listed = {cmd for cmd, _ in commands_of(synopsis((ROOT / "README.md").read_text()))}
    assert listed == set(COMMANDS), (
        f"missing from the README synopsis: {sorted(set(COMMANDS) - listed)}; "
        f"not a subcommand: {sorted(listed - set(COMMANDS))}"
    )


def wrong_commands(text: str) -> list[str]:
    """The `stepcredit CMD --flag` of a text whose subcommand or flag the parsers do not accept."""
    bad = []
    for cmd, rest in commands_in(text):
        if cmd not in SUBCOMMANDS:
            # prose such as "`stepcredit train` with no arguments" is not a command line: an unknown
            # word counts only when a flag follows it
            if rest.strip().startswith("-"):
                bad.append(f"unknown subcommand {cmd!r}")
            continue
        known = _flags(SUBCOMMANDS[cmd])
        for flag in re.findall(r"(?<![\w.=/-])(--?[a-zA-Z][\w-]*)", rest):
            if flag not in known:
                bad.append(f"stepcredit {cmd}: no flag {flag}")
    return sorted(set(bad))


@pytest.mark.parametrize(
    "page",
    [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_documented_commands_exist(page: Path) -> None:
    """Every `stepcredit CMD --flag` shown names a subcommand and a flag its parser accepts."""
    bad = wrong_commands(page.read_text())
    assert not bad, f"{page.name}: {bad}"


def test_the_checker_sees_a_wrong_flag() -> None:
    # the check itself: the flags the README once documented for `score` are caught, real ones are not
    text = "`stepcredit score --custom f.py:fn --custom-style trl [--weights 1,0.5]` and `stepcredit trian --out x`"
    assert wrong_commands(text) == [
        "stepcredit score: no flag --custom-style",
        "stepcredit score: no flag --weights",
        "unknown subcommand 'trian'",
    ]
    assert wrong_commands("```\nstepcredit eval --model tiny --data arith --n 4\n```") == []


def test_config_doc_lists_every_value_estimator(capsys: pytest.CaptureFixture[str]) -> None:
    # `stepcredit config` prints each field's docstring; the estimator list there is written by hand
    from stepcredit.cli.main import main
    from stepcredit.process import VALUE_ESTIMATORS

    assert main(["config"]) == 0
    out = capsys.readouterr().out
    doc = out[: out.index("  value_estimator:")].rsplit("  enabled:", 1)[1]
    missing = [name for name in VALUE_ESTIMATORS if f"``{name}``" not in doc]
    assert not missing, f"process.value_estimator's doc misses {missing}"
