"""Headless figures: every PNG the package writes (the probe's, an experiment's curves, a run's
``curves.png``) opens pyplot through :func:`pyplot` and writes through :func:`save`.

matplotlib is imported on first use, with the Agg backend, so that importing a command never needs a
display or pays for matplotlib's import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (its folder made if missing) and close it; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
