"""Config assembly for the commands: preset or YAML file, then dotted ``key=value`` overrides.

This is the only place where YAML and overrides are merged; the result is validated by
:func:`stepcredit.config.from_dict` (unknown keys are errors naming close valid keys).
"""

from __future__ import annotations

import argparse
import difflib
import re
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from stepcredit.config import Config, all_keys, from_dict
from stepcredit.errors import ConfigError, UserError
from stepcredit.models.resolve import ResolvedModel, resolve_model


def add_config_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset", help=f"a preset from configs/ ({', '.join(preset_names())})")
    g.add_argument("--config", type=Path, help="a YAML config file")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. trainer.steps=50"
    )


def preset_names() -> list[str]:
    d = resources.files("stepcredit") / "configs"
    return sorted(f.name[: -len(".yaml")] for f in d.iterdir() if f.name.endswith(".yaml"))


class _ConfigLoader(yaml.SafeLoader):
    """YAML with 1.2's booleans, ``true`` and ``false`` only. Under 1.1's (PyYAML's default) ``off``,
    ``on``, ``yes`` and ``no`` are booleans too, so ``rollout.decode_compile=off`` reached the config
    tree as false ("expected a string")."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)  # a SafeLoader: no Python objects


def _read_yaml(text: str, where: str) -> dict[str, Any]:
    try:
        data = _yaml(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: invalid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    return data


def load_preset(name: str) -> dict[str, Any]:
    f = resources.files("stepcredit") / "configs" / f"{name}.yaml"
    if not f.is_file():
        close = difflib.get_close_matches(name, preset_names(), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"valid: {', '.join(preset_names())}"
        raise ConfigError(f"--preset {name}: no such preset; {hint}")
    return _read_yaml(f.read_text(), f"preset {name}")


def _check_key(key: str) -> None:
    valid = all_keys()
    if key in valid or any(key.startswith(v + ".") for v in valid):
        return
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    if not close:
        top = key.split(".")[0]
        close = [v for v in valid if v.split(".")[0] == top][:6] or sorted({v.split(".")[0] for v in valid})
    raise ConfigError(f"unknown config key {key}; close valid keys: {', '.join(close)}")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Merge ``a.b.c=value`` strings into the nested mapping (values parsed as YAML scalars/lists)."""
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected key=value")
        key, raw = ov.split("=", 1)
        key = key.strip()
        _check_key(key)
        try:
            value = _yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = value
    return data


def build_config(args: argparse.Namespace, *, resume: Path | None = None) -> Config:
    """Preset (default: ``default``) or file or the resumed run's config.yaml, then overrides."""
    if resume is not None:
        f = resume / "config.yaml"
        if not f.exists():
            raise UserError(f"--resume {resume}: no config.yaml in that directory")
        data = _read_yaml(f.read_text(), str(f))
    elif getattr(args, "config", None):
        if not args.config.exists():
            raise ConfigError(f"--config {args.config}: no such file")
        data = _read_yaml(args.config.read_text(), str(args.config))
    else:
        data = load_preset(args.preset or "default")
    return from_dict(apply_overrides(data, list(args.overrides or [])))


def config_for_model(args: argparse.Namespace, spec: str | None) -> tuple[Config, ResolvedModel, str]:
    """The config of a command that runs the model ``spec`` (``--model``; None: the config's
    ``model.path``), the resolved model, and where the settings came from.

    ``--preset``/``--config`` win when given; else the model's own settings: its run's ``config.yaml``
    (the generation length and prompt format it was trained with) or a packaged model's preset (so
    ``--model smollm2`` does not generate with the default preset's 40 tokens); else the default
    preset. Then the ``key=value`` overrides; ``model.path`` is set to the resolved model."""
    if spec is None or getattr(args, "preset", None) or getattr(args, "config", None):
        cfg = build_config(args)
        source = (
            f"--preset {args.preset}"
            if getattr(args, "preset", None)
            else (f"--config {args.config}" if getattr(args, "config", None) else "preset default")
        )
        model = resolve_model(spec or cfg.model.path, flag="--model" if spec else "config key model.path")
    else:
        model = resolve_model(spec)
        if model.run_config is not None:
            data, source = (
                _read_yaml(model.run_config.read_text(), str(model.run_config)),
                f"the run's {model.run_config.resolve()}",
            )
        elif model.preset:
            data, source = (
                load_preset(model.preset),
                f"preset {model.preset} (the model's own; --preset to change)",
            )
        else:
            data, source = load_preset("default"), "preset default"
        cfg = from_dict(apply_overrides(data, list(args.overrides or [])))
    gguf = getattr(args, "gguf_file", None) or ""
    # a run's config names the model it started from (tiny, a packaged name): here it is the saved one
    path_cfg = replace(
        cfg.model,
        path=model.path,
        gguf_file=gguf or (cfg.model.gguf_file if model.kind == "directory" else ""),
    )
    return replace(cfg, model=path_cfg), model, source


def setup_runtime() -> None:
    """Quiet third-party progress bars and warnings that would drown the run's own output, and let
    malloc keep freed batch-sized tensors (:func:`stepcredit.runtime.keep_freed_memory`)."""
    import os
    import warnings

    from stepcredit.runtime import keep_freed_memory

    keep_freed_memory()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=UserWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
