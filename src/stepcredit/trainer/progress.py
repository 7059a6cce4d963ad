"""A rich progress bar with the live figures of the run (no-op when disabled)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self._p: Any = None
        self._rl: Any = None
        self._sft: Any = None
        self.total = total
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self._p = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            transient=False,
        )
        self._p.start()

    def sft_step(self, steps: int) -> Callable[[int, dict[str, float]], None] | None:
        if self._p is None:
            return None
        self._sft = self._p.add_task("sft", total=steps, info="")

        def cb(step: int, m: dict[str, float]) -> None:
            self._p.update(self._sft, completed=step + 1, info=f"loss {m['sft/loss']:.3f}")

        return cb

    def update(self, step: int, m: dict[str, Any]) -> None:
        if self._p is None:
            return
        if self._rl is None:
            self._rl = self._p.add_task("rl", total=self.total, info="")
        parts = []
        for key, label, fmt in (
            ("reward/mean", "reward", ".3f"),
            ("val/accuracy", "val acc", ".3f"),
            ("response_length/mean", "len", ".0f"),
            ("kl", "kl", ".4f"),
            ("time/step_s", "s/step", ".1f"),
        ):
            v = m.get(key)
            if isinstance(v, (int, float)):
                parts.append(f"{label} {v:{fmt}}")
        self._p.update(self._rl, completed=step, info="  ".join(parts))

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
