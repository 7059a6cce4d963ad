"""``stepcredit config``: the merged configuration (preset or file, then overrides) as YAML, every
field preceded by its documentation as a comment. ``--config`` reads the output back unchanged."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import shlex
import sys
import typing
from functools import cache
from typing import Any

import yaml

import stepcredit.config as C
from stepcredit.cli.common import add_config_args, build_config


def configure(p: argparse.ArgumentParser) -> None:
    add_config_args(p)


@cache
def field_docs() -> dict[str, dict[str, str]]:
    """{config class name: {field: the docstring under it}}, read from the config tree's modules."""
    out: dict[str, dict[str, str]] = {}
    for node in ast.parse(C.tree_source()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs = out.setdefault(node.name, {})
        for stmt, nxt in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return out


def _scalar(value: Any) -> str:
    """One value in YAML flow style, on one line (lists and mappings included)."""
    text = yaml.safe_dump([value], default_flow_style=True, width=1 << 30, allow_unicode=True).strip()
    return text[1:-1]


def to_commented_yaml(cfg: Any, indent: int = 0) -> list[str]:
    """The lines of ``cfg`` (a config dataclass) as block YAML, each field under its doc comment."""
    lines: list[str] = []
    pad = " " * indent
    docs = field_docs().get(type(cfg).__name__, {})
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        for line in docs.get(f.name, "").splitlines():
            lines.append(f"{pad}# {line}".rstrip())
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            lines.append(f"{pad}{f.name}:")
            lines.extend(to_commented_yaml(value, indent + 2))
        else:
            lines.append(
                f"{pad}{f.name}: {_scalar(C.to_dict(value) if dataclasses.is_dataclass(value) else _plain(value))}"
            )
    return lines


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    source = f"--config {args.config}" if args.config else f"--preset {args.preset or 'default'}"
    head = f"# stepcredit config {source} {shlex.join(args.overrides or [])}".rstrip()
    sys.stdout.write("\n".join([head, *to_commented_yaml(cfg)]) + "\n")
    return 0
