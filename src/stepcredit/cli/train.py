"""``stepcredit train``: SFT warm-up then RL, into a run directory."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepcredit.cli.common import add_config_args, build_config, setup_runtime
from stepcredit.cli.paths import absolute_paths
from stepcredit.config import Config
from stepcredit.errors import ConfigError
from stepcredit.models.resolve import PACKAGED


def configure(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--out", type=Path, help="run directory (default: runs/<time>)")
    p.add_argument("--resume", type=Path, help="continue the run in this directory from its last checkpoint")


def run(args: argparse.Namespace) -> int:
    cfg = absolute_paths(build_config(args, resume=args.resume), Path.cwd())
    check_model_path(cfg, Path.cwd())
    # absolute: the lines printed at the end name the run's files from any directory, as the banner does
    out = (args.resume or args.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
    setup_runtime()
    from stepcredit.trainer import check_config, train

    check_config(cfg)
    with third_party_warnings(out) as collected:
        train(cfg, out, resume=args.resume)
    from stepcredit.trainer.metrics import summary_lines

    summary = json.loads((out / "summary.json").read_text())
    for line in summary_lines(summary):
        print(line)
    for line in model_lines(out):
        print(line)
    if collected:
        print(f"{len(collected)} deprecation warning(s) of other packages: {out / WARNINGS_FILE}")
    print(f"run directory: {out}")
    return 0


WARNINGS_FILE = "warnings.log"
"""Where a run keeps the deprecation warnings of other packages (transformers, torch, peft)."""

_OWN = str(Path(__file__).resolve().parents[1])
_COLLECTED = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)


@contextlib.contextmanager
def third_party_warnings(run_dir: Path) -> Iterator[list[str]]:
    """Collect other packages' deprecation warnings (transformers' ``past_key_values is deprecated``
    on every run) instead of printing them: each distinct one once, written to ``run_dir/warnings.log``
    at the end (if the run directory is there). stepcredit's own warnings and every other category
    are shown as usual. Yields the list of collected lines."""
    collected: list[str] = []
    seen: set[tuple[str, type]] = set()
    show = warnings.showwarning

    def collect(message: Any, category: type[Warning], filename: str, lineno: int, *a: Any, **k: Any) -> None:
        if issubclass(category, _COLLECTED) and not str(Path(filename).resolve()).startswith(_OWN):
            if (str(message), category) not in seen:
                seen.add((str(message), category))
                collected.append(f"{category.__name__}: {message} ({filename}:{lineno})")
            return
        show(message, category, filename, lineno, *a, **k)

    warnings.showwarning = collect
    try:
        yield collected
    finally:
        warnings.showwarning = show
        if collected and run_dir.is_dir():
            (run_dir / WARNINGS_FILE).write_text("\n".join(collected) + "\n")


def model_lines(run_dir: Path) -> list[str]:
    """What the run wrote that a model loader reads, each only if it is there: the SFT model, and the
    final policy (a model directory, or with LoRA its adapters and their base, and the merged model
    when ``model.lora.merge_on_export`` asked for it)."""
    ckpt = run_dir / "checkpoints"
    found = [
        (ckpt / "sft" / "model", "after SFT"),
        (
            ckpt / "final" / "model",
            "final policy" + (", adapters merged" if (ckpt / "final" / "adapter").is_dir() else ""),
        ),
        (ckpt / "final" / "adapter", "final LoRA adapters, peft format"),
        (ckpt / "final" / "base", "the base the adapters apply to"),
    ]
    lines = [
        f"model: {path} ({what})"
        for path, what in found
        if (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
    ]
    adapter = ckpt / "final" / "adapter" / "adapter_config.json"
    if adapter.is_file() and not (ckpt / "final" / "base").is_dir():  # the base was the unchanged model.path
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        lines.append(f"model: {base} (the base the adapters apply to)")
    return lines


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""``owner/name``: how a Hugging Face hub id looks (a relative path with one separator looks the same,
so it is one only when nothing exists there)."""


def check_model_path(cfg: Config, cwd: Path) -> None:
    """A hub id as ``model.path`` (nothing here by that name) is one line: this tool loads local
    directories only (no network), so say so rather than "does not exist"."""
    path = cfg.model.path
    if _HUB_ID.fullmatch(path) and not (cwd / path).exists():
        raise ConfigError(
            f"config key model.path: {path!r} looks like a Hugging Face hub id; hub downloads are not "
            f"supported here; pass a local directory (e.g. one saved with save_pretrained or "
            f"huggingface-cli download), tiny, or {', '.join(sorted(PACKAGED))}"
        )
