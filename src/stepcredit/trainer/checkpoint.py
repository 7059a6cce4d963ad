"""Atomic checkpoints: model, optimiser, RNG states, data position and any extra trainer state.

A checkpoint is a directory written under a temporary name and renamed into place, so a run killed
mid-write never leaves a half checkpoint that ``--resume`` would pick up.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, Any], *, keep: int = 2) -> Path:
    """Write ``state`` (a dict of state_dicts and plain values) as ``ckpt_dir/step_{step:06d}``."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:06d}"
    tmp = ckpt_dir / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    torch.save({**state, "rng": rng_state(), "step": step}, tmp / "state.pt")
    with open(tmp / "state.pt", "rb") as f:
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    old = sorted(p for p in ckpt_dir.glob("step_*") if p.is_dir())
    for p in old[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if (p / "state.pt").exists())
    return ckpts[-1] if ckpts else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The saved state dict (RNG states are restored by the caller via ``set_rng_state``)."""
    return torch.load(path / "state.pt", map_location="cpu", weights_only=False)
