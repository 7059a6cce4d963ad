"""The architecture, checked: imports point left to right along the data's way through the code, and
only ``integrations/verl`` imports verl.

    data -> rollout -> reward -> process -> advantages -> losses -> trainer      (then cli, integrations)

``models`` (the policy and its log-probs; the tiny model's tokenizer is trained on ``data``'s task) is
shared by every stage after ``data`` that runs a model; the top-level
modules (types, config, registry, ops, errors, runtime) are the base everything may import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stepcredit

ROOT = Path(stepcredit.__file__).parent
ORDER = [
    "data",
    "models",
    "rollout",
    "reward",
    "process",
    "advantages",
    "losses",
    "trainer",
    "cli",
    "integrations",
]


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
    return out


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
