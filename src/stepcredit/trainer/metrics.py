"""Run-directory outputs: ``metrics.jsonl``, TensorBoard events and ``curves.png``."""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path
from typing import Any


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class MetricsLogger:
    """Appends one JSON object per step to ``metrics.jsonl`` and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, truncate_after: int | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        if truncate_after is not None and self.path.exists():
            # On resume drop rows of steps after the checkpoint: they will be recomputed.
            keep = [r for r in read_metrics(self.path) if r.get("step", -1) <= truncate_after]
            with self.path.open("w") as f:
                for r in keep:
                    f.write(json.dumps(r) + "\n")
        self._f = self.path.open("a")
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:  # tensorboard is an optional extra
                self._tb = None

    def log(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()
        if self._tb is not None:
            step = int(row.get("step", 0))
            for k, v in row.items():
                if (
                    isinstance(v, (int, float))
                    and not isinstance(v, bool)
                    and k != "step"
                    and math.isfinite(v)
                ):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(run_dir: Path, *, extra_keys: tuple[str, ...] = ()) -> Path | None:
    """Reward, validation accuracy and response length against step, as ``curves.png``."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = read_metrics(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("reward", [k for k in _keys(rows) if k.endswith("reward/mean")]),
        ("validation accuracy", [k for k in _keys(rows) if k.startswith("val/accuracy")]),
        ("response length", [k for k in _keys(rows) if k.endswith("response_length/mean")]),
        *[(k, [k]) for k in extra_keys],
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    for ax, (title, keys) in zip(axes, panels, strict=True):
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=k)
        ax.set_title(title)
        ax.set_xlabel("step")
        if keys:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = run_dir / "curves.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _keys(rows: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)
