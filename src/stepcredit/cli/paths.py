"""Paths in a config made absolute, so that what a command saves or prints names the same files from
any directory (a saved ``config.yaml`` read by ``eval`` or ``--resume`` elsewhere)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from stepcredit.config import Config
from stepcredit.models.resolve import PACKAGED, TINY


def _file_spec(spec: str, cwd: Path) -> str:
    # ``file.py:fn`` / ``dir/file.py`` -> absolute; ``pkg.module:fn`` and registered names stay
    # (the same test as stepcredit.reward.base.parse_spec: a .py file or a path separator)
    target, colon, attr = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if target.endswith(".py") or "/" in target or os.sep in target:
        return str((cwd / os.path.expanduser(target)).resolve()) + colon + attr
    return spec


def local_path(path: str, cwd: Path) -> str:
    """A path that exists under ``cwd`` (a model or run directory, a data file) made absolute; a name
    (tiny, smollm2, a registered dataset, a hub id) as written."""
    if path == TINY or path in PACKAGED:
        return path
    p = cwd / os.path.expanduser(path)
    return str(p.resolve()) if path and p.exists() else path


def _files(paths: tuple[str, ...], cwd: Path) -> tuple[str, ...]:
    return tuple(str((cwd / os.path.expanduser(f)).resolve()) for f in paths)


def absolute_paths(cfg: Config, cwd: Path) -> Config:
    """``cfg`` with every path in it absolute (from ``cwd``): custom reward files, per-domain reward
    files, data files, the model and reward-model directories, tool modules given as files. The saved
    ``config.yaml`` then means the same from any directory (``eval``, ``--resume``)."""
    r = cfg.reward
    custom = ",".join(_file_spec(x.strip(), cwd) for x in r.custom.path.split(",")) if r.custom.path else ""
    reward = replace(
        r,
        custom=replace(r.custom, path=custom),
        domains={k: replace(d, fn=_file_spec(d.fn, cwd) if d.fn else "") for k, d in r.domains.items()},
        reward_model=replace(r.reward_model, path=local_path(r.reward_model.path, cwd)),
    )
    d = cfg.data
    data = replace(
        d,
        train_files=_files(d.train_files, cwd),
        val_files=_files(d.val_files, cwd),
        domains={
            k: replace(v, train_files=_files(v.train_files, cwd), val_files=_files(v.val_files, cwd))
            for k, v in d.domains.items()
        },
    )
    t = cfg.rollout.tools
    modules = tuple(str((cwd / m).resolve()) if m.endswith(".py") or "/" in m else m for m in t.modules)
    rollout = replace(cfg.rollout, tools=replace(t, modules=modules))
    return replace(
        cfg,
        model=replace(cfg.model, path=local_path(cfg.model.path, cwd)),
        reward=reward,
        data=data,
        rollout=rollout,
    )
