"""The docs against the code: every python example of docs/extending runs as written, and every
`stepcredit ...` command the README and the docs show names a real subcommand with real flags."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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


GUIDE = ROOT / "docs" / "guide.md"
"""The guide: every command and flag, presets, rewards (what the README was before it became a front page)."""


def synopsis(guide: str) -> str:
    """The guide's command synopsis: the first code block under '## Command line'."""
    section = guide.split("## Command line", 1)[1]
    return code_blocks(section)[0]


def test_guide_synopsis_lists_every_subcommand() -> None:
    listed = {cmd for cmd, _ in commands_of(synopsis(GUIDE.read_text()))}
    assert listed == set(COMMANDS), (
        f"missing from the guide's synopsis: {sorted(set(COMMANDS) - listed)}; "
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


def test_guide_synopsis_shows_every_flag() -> None:
    # each subcommand's synopsis line(s) name every option its parser accepts (help and version aside)
    # whole lines: alternatives (``--preset NAME | --config FILE``) and the comment ("# or --from-run DIR")
    lines = [ln.split() for ln in synopsis(GUIDE.read_text()).splitlines()]
    missing = {}
    for cmd, parser in SUBCOMMANDS.items():
        shown = " ".join(" ".join(w) for w in lines if w[:2] == ["stepcredit", cmd])
        flags = {f for f in _flags(parser) if f.startswith("--") and f != "--help"}
        absent = sorted(f for f in flags if not re.search(rf"{re.escape(f)}(?![\w-])", shown))
        if absent:
            missing[cmd] = absent
    assert not missing, f"flags missing from the guide's synopsis: {missing}"


# ------------------------------------------------------------------------------ config keys, names
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# verl's own config keys, which the README's VeRL section names beside ours: not keys of our tree
VERL_KEYS = {
    "algorithm.adv_estimator",
    "algorithm.stepcredit",
    "reward.reward_manager.name",
    "reward.custom_reward_function",
    "trainer.v1.trainer_mode",
}
FILE_SUFFIXES = {"py", "md", "yaml", "json", "jsonl", "parquet", "png", "sh", "txt", "html"}


def _config_keys() -> set[str]:
    from stepcredit.config import all_keys

    return set(all_keys())


def _is_config_key(key: str, keys: set[str]) -> bool:
    """A leaf, a section (``reward.sandbox``), or a key under a mapping-valued field
    (``postprocess.domains.ifeval.clip``, ``reward.kwargs.ifeval.credit``)."""
    return key in keys or any(k.startswith(key + ".") or key.startswith(k + ".") for k in keys)


def _module_file(dotted: str) -> Path | None:
    """The source file of a ``stepcredit...`` module or package, if there is one."""
    base = ROOT / "src" / Path(*dotted.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


def _top_level_names(source: Path) -> set[str]:
    """Names a module defines or imports at its top level (read, not imported)."""
    import ast

    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for tgt in targets for n in ast.walk(tgt) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _importable(dotted: str) -> bool:
    """``stepcredit.a.b.C``: a module, or an attribute reached from the longest module prefix. A module
    whose optional dependency is missing here (the verl plugin in a venv without verl) is read instead
    of imported."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        source = _module_file(".".join(parts[:i]))
        if source is None:
            continue
        rest = parts[i:]
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            return not rest or rest[0] in _top_level_names(source)
        # longer prefixes with a file of their own were tried first: what is left are attributes
        for attr in rest:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _doc_text(page: Path) -> str:
    """Code blocks and inline code of a page: where keys and names are written."""
    text = page.read_text()
    inline = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", FENCE.sub("", text))]
    return "\n".join(code_blocks(text) + inline)


def wrong_names(text: str) -> list[str]:
    """Dotted config keys (``rollout.mode=tree``, ``process.credit``) and ``stepcredit.x.y`` names in a
    text that are neither a key of the config tree nor something importable from the package."""
    keys = _config_keys()
    sections = sorted({k.split(".")[0] for k in keys})
    bad = []
    alternatives = "|".join(sections)
    dotted = re.compile(rf"(?<![\w./-])((?:stepcredit\.)?(?:{alternatives})(?:\.[A-Za-z_]\w*)+)(=?)")
    for m in dotted.finditer(text):
        name, assigned = m.group(1), m.group(2)
        if name.rsplit(".", 1)[-1] in FILE_SUFFIXES or name in VERL_KEYS:
            continue
        bare = name.removeprefix("stepcredit.")
        if _is_config_key(bare, keys):  # verl's ``stepcredit.process.enabled`` is our ``process.enabled``
            continue
        if not assigned and _importable("stepcredit." + bare):
            continue
        bad.append(name + assigned)
    for m in re.finditer(r"(?<![\w./-])(stepcredit(?:\.[A-Za-z_]\w*)+)", text):
        tail = m.group(1).removeprefix("stepcredit.")
        if tail.split(".")[0] not in sections and not _importable(m.group(1)):
            bad.append(m.group(1))
    return sorted(set(bad))


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_keys_and_names_exist(page: Path) -> None:
    """Every dotted config key a page shows is a key of the tree, and every ``stepcredit.x.y`` (or
    ``process.CREDIT_FORMS``-style) name it cites can be imported."""
    bad = wrong_names(_doc_text(page))
    assert not bad, f"{page.name}: {bad}"


def test_the_name_checker_sees_a_wrong_key() -> None:
    text = "`rollout.mode=tree` `reward.custom.style=trl` `process.CREDIT_FORMS` `stepcredit.process.enabled=true`"
    assert wrong_names(text) == []
    text = "`rollout.modes=tree` `reward.custom_style=trl` `process.CREDIT_FORM` `stepcredit.reward.no_such`"
    assert wrong_names(text) == [
        "process.CREDIT_FORM",
        "reward.custom_style=",
        "rollout.modes=",
        "stepcredit.reward.no_such",
    ]


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_presets_exist(page: Path) -> None:
    from stepcredit.cli.common import preset_names

    named = set(re.findall(r"--preset[ =]([a-z][\w]*)", _doc_text(page)))
    assert named - {"NAME"} <= set(preset_names()), (
        f"{page.name}: no preset {sorted(named - set(preset_names()))}"
    )


def test_guide_lists_every_preset() -> None:
    from stepcredit.cli.common import preset_names

    section = GUIDE.read_text().split("Presets:", 1)[1].split("\n\n", 1)[0]
    missing = [p for p in preset_names() if f"`{p}`" not in section]
    assert not missing, f"presets the guide's list omits: {missing}"


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_files_exist(page: Path) -> None:
    # a path in backticks (`reward/verifiers/code/cases.py`, `tests/models/test_lora.py`) names a file of
    # the repository, relative to its root or to the package
    paths = re.findall(
        r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|yaml|md|sh|json|jsonl))(?:::\w+|:\w+)?`", page.read_text()
    )
    bases = [ROOT, ROOT / "src" / "stepcredit", ROOT / "src"]
    missing = sorted({p for p in paths if not any((b / p).exists() for b in bases)})
    assert not missing, f"{page.name}: no such file {missing}"


# ------------------------------------------------------------------------------ `stepcredit config`
def _field_docs(out: str) -> dict[str, str]:
    """``dotted key -> its doc`` from the output of ``stepcredit config`` (comment lines above a key)."""
    docs: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in out.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("# "))
            continue
        m = re.match(r"^( *)([\w-]+):", line)
        if not m:
            comment = []
            continue
        depth = len(m.group(1))
        path = [(d, k) for d, k in path if d < depth] + [(depth, m.group(2))]
        docs[".".join(k for _, k in path)] = " ".join(comment)
        comment = []
    return docs


def _package_registry(module: str, name: str) -> list[str]:
    """The names the package itself registers, read in a fresh interpreter: test modules register
    entries of their own (tools, parsers) into the same registries of this process."""
    code = f"import json, stepcredit.trainer.loop, {module} as m; print(json.dumps(list(m.{name})))"
    return list(json.loads(subprocess.check_output([sys.executable, "-c", code], text=True).splitlines()[-1]))


def test_config_docs_list_every_registered_name(capsys: pytest.CaptureFixture[str]) -> None:
    """A field whose doc cites a registry (``stepcredit.process.VALUE_ESTIMATORS``) and lists its
    entries lists all of them: the lists are written by hand, the registries grow."""
    import stepcredit.trainer.loop  # noqa: F401  (every registry filled: rollout modes, tools, estimators)
    from stepcredit.cli.main import main

    assert main(["config"]) == 0
    docs = _field_docs(capsys.readouterr().out)
    cited = {}
    for key, doc in docs.items():
        for ref in re.findall(r"``(stepcredit\.[\w.]+\.[A-Z][A-Z_]+)``", doc):
            module, _, name = ref.rpartition(".")
            registry = _package_registry(module, name)
            listed = set(re.findall(r"``([\w-]+)``", doc))
            if listed & set(registry):  # the doc lists entries: all of them
                cited[key] = sorted(set(registry) - listed)
    assert "process.value_estimator" in cited and "rollout.mode" in cited  # the check reads the docs
    assert not any(cited.values()), (
        f"docs that miss registered names: { {k: v for k, v in cited.items() if v} }"
    )


def test_bpe_ratio_as_the_guide_says() -> None:
    # docs/guide.md, "What the default job does": the BPE tokenizer writes the default arith rows in 3.1x fewer
    # tokens than characters (reference solutions) and 4.5x (questions); a count, not a timing
    from stepcredit.config import ArithConfig
    from stepcredit.data.arith import make_rows
    from stepcredit.models.tiny import build_tokenizer

    rows = make_rows(ArithConfig(), 1000, seed=0, split="train")
    char, bpe = build_tokenizer("char"), build_tokenizer("bpe")
    readme = GUIDE.read_text()
    for texts, stated in (
        ([r["extra_info"]["solution"] for r in rows], "3.1x"),
        ([r["prompt"][0]["content"] for r in rows], "4.5x"),
    ):
        n_char = sum(len(char(t)["input_ids"]) for t in texts)
        n_bpe = sum(len(bpe(t)["input_ids"]) for t in texts)
        assert f"{n_char / n_bpe:.1f}x" == stated and stated in readme


# ------------------------------------------------------------------------------ data and config blocks
def test_guide_score_rows_score_as_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the guide's example rows for `stepcredit score` (verl's and TRL's layouts) are read and scored
    from stepcredit.cli.main import main

    section = GUIDE.read_text().split("### Scoring a file", 1)[1]
    rows = code_blocks(section, "json")[0]
    inp, out = tmp_path / "rows.jsonl", tmp_path / "scored.jsonl"
    inp.write_text(rows)
    assert main(["score", "--in", str(inp), "--out", str(out), "--workers", "1"]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(g["status"], g["score"], g["extracted"]) for g in got] == [("ok", 1.0, "18")] * 2
    capsys.readouterr()


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_blocks_are_valid_config(page: Path) -> None:
    # a YAML block in the docs is a piece of config: merged onto the default preset, the tree accepts it
    from stepcredit.cli.common import load_preset
    from stepcredit.config import from_dict

    def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in extra.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    for block in code_blocks(page.read_text(), "yaml"):
        from_dict(merge(load_preset("default"), yaml.safe_load(block)))


# ------------------------------------------------------------------------------ the README as a front page
README = ROOT / "README.md"
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
FIGURE = re.compile(r"[-+]?\d+\.\d+|\d+(?:,\d{3})+|\b\d+ ?%|\b\d+(?:\.\d+)?x\b|p = ")
"""What counts as a measured figure: a decimal, a thousands-separated count, a percentage, a ratio, a p-value."""


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs and table rows of a page, code blocks left out."""
    out: list[str] = []
    for para in FENCE.sub("", text).split("\n\n"):
        lines = para.strip().splitlines()
        rows = [ln for ln in lines if ln.startswith("|")]
        out += rows
        prose = " ".join(ln for ln in lines if not ln.startswith("|"))
        if prose:
            out.append(prose)
    return out


def test_readme_is_a_front_page() -> None:
    text = README.read_text()
    assert len(text) <= 12_000, f"README.md is {len(text)} characters (at most 12,000)"
    for heading in ("## The two commands", "## Quick start", "## Features", "## Results"):
        assert heading in text
    # every figure names its commit: a paragraph or table row with a measured number carries a commit id
    # (inline code is a setting or a version, not a measurement)
    bare = [p for p in _paragraphs(text) if FIGURE.search(re.sub(r"`[^`]*`", "", p)) and not COMMIT.search(p)]
    assert not bare, f"README figures without a commit: {bare}"
    # the greedy-continuation claim is marked as not replicated, with the rerun's figures
    row = next(p for p in _paragraphs(text) if "Greedy-continuation" in p)
    assert "NOT replicated" in row and "-1.0 +- 1.3" in row and "p = 0.46" in row and "0c439ee" in row
    # every link into docs/ points at a file that is there
    for target in re.findall(r"\]\(((?:docs|examples)/[^)#]*)", text):
        assert (ROOT / target).exists(), target


def test_the_checker_sees_a_figure_without_a_commit() -> None:
    assert [
        p for p in _paragraphs("| a | +3.25 points | x |\n| b | +2.3 (4600a9a) | y |") if not COMMIT.search(p)
    ] == ["| a | +3.25 points | x |"]
    assert FIGURE.search("3.85x") and FIGURE.search("p = 0.006") and not FIGURE.search("rank 8 on 2 layers")


def quick_start() -> list[list[str]]:
    """The README's quick-start commands, each as argv after ``stepcredit``."""
    import shlex

    block = code_blocks(README.read_text().split("## Quick start", 1)[1], "bash")[0]
    return [
        shlex.split(line.split(" #", 1)[0])[1:]
        for line in block.splitlines()
        if line.startswith("stepcredit ")
    ]


SMOKE_SIZE = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "data.train_size=16",
    "data.val_size=2",
    "sft.steps=20",  # enough for the tiny model to write something (explain refuses an empty response)
    "sft.batch_size=8",
    "trainer.steps=1",
    "trainer.save_every=0",
    "trainer.threads=1",
    "trainer.progress=false",
    "trainer.tensorboard=false",
    "rollout.prompts_per_step=2",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "process.mc_max_new_tokens=16",
]
"""What the quick-start test appends to a `train` line: the same job at the size of a test."""


def _quick_start_inputs(cwd: Path) -> None:
    # what the score lines read: verl's parquet layout (plus a response column) and TRL's rows
    import pyarrow as pa
    import pyarrow.parquet as pq

    verl = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "9 + 9?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "18"}, "extra_info": {"index": 0}, "responses": "#### 18"}]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(verl), cwd / "test.parquet")
    (cwd / "trl.jsonl").write_text(
        json.dumps({"prompt": "9 + 9?", "completion": "#### 18", "answer": "#### 18"}) + "\n"
    )


def test_quick_start_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command of the README's quick start runs as written, `train` at smoke size (appended
    overrides), `probe` on fewer traces; the vLLM line runs in the vLLM venv (the next test)."""
    from stepcredit.cli.main import main

    monkeypatch.chdir(tmp_path)
    _quick_start_inputs(tmp_path)
    ran = []
    for argv in quick_start():
        extra: list[str] = []
        if argv[0] == "train":
            if "rollout.engine=vllm" in argv:
                continue
            extra = SMOKE_SIZE
        elif argv[0] == "probe":
            extra = ["--n", "4"]
        code = main([*argv, *extra])
        out = capsys.readouterr()
        assert code == 0, f"stepcredit {' '.join(argv)}: exit {code}\n{out.err[-2000:]}"
        ran.append(argv[0])
    assert sorted(set(ran)) == ["explain", "probe", "score", "train"] and ran.count("train") == 4
    assert json.loads((tmp_path / "runs" / "lora" / "summary.json").read_text())["params"]["trainable"] > 0


@pytest.mark.vllm
def test_quick_start_vllm_line_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    from stepcredit.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    (argv,) = [a for a in quick_start() if "rollout.engine=vllm" in a]
    # vLLM's CPU kernels want head size 32: the smoke model's own width (64, 2 heads), smaller otherwise
    size = [o for o in SMOKE_SIZE if not o.startswith("model.tiny.")]
    assert main([*argv, *size]) == 0


def test_midchain_greedy_is_the_measured_arm() -> None:
    """The `midchain_greedy` preset is the `mid_greedy` arm of the experiment that measured it
    (benchmarks/longchain_experiment.py: a preset plus overrides), field for field."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from longchain_experiment import VARIANTS
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict, to_dict

    base, overrides = VARIANTS["mid_greedy"]
    measured = from_dict(apply_overrides(load_preset(base), list(overrides)))
    assert to_dict(from_dict(load_preset("midchain_greedy"))) == to_dict(measured)
    # and the README's recipe line runs that preset, not a hand-written variant of it
    assert next(a for a in quick_start() if "midchain_greedy" in a)[:3] == [
        "train",
        "--preset",
        "midchain_greedy",
    ]
