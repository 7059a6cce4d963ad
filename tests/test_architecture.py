"""The architecture, checked: imports point left to right along the data's way through the code, and
only ``integrations/verl`` imports verl.

    sandbox -> tools -> data -> rollout -> reward -> process -> advantages -> losses -> trainer
                                                                 (then recipes, cli, integrations)

``sandbox`` (programs run under bubblewrap) and ``tools`` (what a policy calls) sit below every stage:
the code reward and the ``python`` tool both import the sandbox, and rollouts, rewards and values all
run tools. ``models`` (the policy and its log-probs; the tiny model's tokenizer is trained on ``data``'s
task) is shared by every stage after ``data`` that runs a model; the top-level modules (types, config,
registry, ops, errors, runtime, user_code) are the base everything may import. Every import counts,
those inside functions too (only ``if TYPE_CHECKING:`` blocks, which never run, are left out).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import stepcredit

ROOT = Path(stepcredit.__file__).parent
ORDER = [
    "sandbox",
    "tools",
    "data",
    "models",
    "rollout",
    "reward",
    "process",
    "advantages",
    "losses",
    "trainer",
    "recipes",
    "cli",
    "integrations",
]


def _imports_in(source: str, name: str = "<source>") -> list[tuple[str, int]]:
    """Every import of ``source`` with its line: at module level, inside functions and classes alike
    (``ast.walk`` visits every node), except in ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(source, name)
    skip = _type_checking_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    return {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }


def _imports(path: Path) -> list[tuple[str, int]]:
    return _imports_in(path.read_text(), str(path))


def test_imports_inside_functions_count() -> None:
    # a function-level import is an import like any other (it runs when the function does)
    source = "import os\ndef f():\n    from stepcredit.trainer import loop\n    import stepcredit.process\n"
    got = _imports_in(source)
    assert ("stepcredit.trainer", 3) in got and ("stepcredit.process", 4) in got
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from stepcredit.trainer import loop\n"
    assert ("stepcredit.trainer", 3) not in _imports_in(typed)


BASE = {"config", "configs"}
"""Packages of the base (with the top-level modules): no stage, imported by any."""


def test_the_order_names_every_package() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {
        p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("_")
    }
    assert packages - BASE == set(ORDER), f"not in ORDER: {sorted(packages - BASE - set(ORDER))}"


def test_no_cycle_between_packages() -> None:
    # the package graph (every import, inside functions too) has no cycle: each import points down
    edges: set[tuple[str, str]] = set()
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        own = rel.parts[0] if len(rel.parts) > 1 else None
        if own not in ORDER:
            continue
        edges |= {(own, o) for o in (_stage(m) for m, _ in _imports(path)) if o is not None and o != own}
    cycles = sorted((a, b) for a, b in edges if (b, a) in edges)
    assert not cycles, f"packages that import each other: {cycles}"


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "stepcredit" and parts[1] in ORDER else None


def test_no_stage_imports_a_later_one() -> None:
    bad = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        own = rel.parts[0] if len(rel.parts) > 1 else None
        if own not in ORDER:
            continue
        for module, line in _imports(path):
            other = _stage(module)
            if other is not None and ORDER.index(other) > ORDER.index(own):
                bad.append(f"{rel}:{line} imports {module}")
    assert not bad, "a stage imports a later one:\n" + "\n".join(bad)


def test_base_modules_import_no_stage() -> None:
    bad = []
    for path in [*ROOT.glob("*.py"), *ROOT.glob("config/*.py")]:  # the base modules, the config package too
        for module, line in _imports(path):
            if _stage(module) is not None:
                bad.append(f"{path.name}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_only_the_verl_integration_imports_verl() -> None:
    bad = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("integrations", "verl"):
            continue
        bad += [f"{rel}:{line}" for module, line in _imports(path) if module.split(".")[0] == "verl"]
    assert not bad, "verl imported outside integrations/verl: " + ", ".join(bad)


def _module_graph() -> dict[str, set[str]]:
    """File-level imports inside the package: module -> the modules (files) it imports, a package's
    ``__init__`` counting as a file (``from pkg import x`` imports it). Imports inside functions count;
    ``if TYPE_CHECKING:`` blocks don't (they never run)."""
    files = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from pkg import x` runs pkg's __init__ and reads x from it: an import of pkg, and
                # of pkg.x when x is a module (`import pkg.x` names the module alone)
                if base in files and base != mod:
                    graph[mod].add(base)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    graph[mod] |= {sub} if sub in files else set()
    return graph


def test_no_file_imports_one_that_imports_it_back() -> None:
    graph = _module_graph()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m] - {m})
        return False

    cycles = sorted((a, b) for a in graph for b in graph[a] - {a} if reaches(b, a))
    assert not cycles, f"import cycles (a imports b, b leads back to a): {cycles[:10]}"


def test_the_architecture_page_names_every_module_and_only_modules_that_exist() -> None:
    page = (ROOT.parents[1] / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([A-Za-z_]+\.py)", page))
    modules = {p.name for p in ROOT.rglob("*.py") if p.name != "__init__.py"}
    packages = {p.parent.name + "/" for p in ROOT.rglob("__init__.py") if p.parent != ROOT}
    assert not (modules - named), f"docs/architecture.md does not name {sorted(modules - named)}"
    assert not (named - modules - {"__init__.py"}), f"names no module: {sorted(named - modules)}"
    missing = {p for p in packages if f"`{p}" not in page and f"{p}`" not in page and p not in page}
    assert not missing, f"docs/architecture.md does not name the packages {sorted(missing)}"


def test_importing_rollout_alone_registers_every_mode() -> None:
    # built-ins are registered by rollout/builtin.py, which the package imports: no other import needed
    import subprocess
    import sys

    code = "import stepcredit.rollout as r; print(','.join(sorted(r.ROLLOUT_MODES.names())))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT.parent
    )
    assert out.stdout.strip() == "flat,tools,tools_tree,tree"
