"""What a run shows while it trains: rich progress bars on a terminal, one plain line per logged step
when stdout is a file or a pipe (verl and TRL print the same), nothing when disabled.

Plain lines are never wrapped or cut (rich would wrap or ellipsise them to an 80-column file); the
bars are only drawn where a person watches them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

SHOWN = (
    ("train/reward_sampled", "reward_sampled", ".3f"),
    ("val/accuracy_greedy", "val_acc_greedy", ".3f"),
    ("val/accuracy_sampled", "val_acc_sampled", ".3f"),
    ("response_length/mean", "len", ".0f"),
    ("kl", "kl", ".4f"),
    ("time/step_s", "s/step", ".2f"),
)
"""(metric, label, format) of the figures shown per step, in this order (absent ones are left out)."""


def step_line(step: int, total: int, m: dict[str, Any]) -> str:
    """``step 3/100  reward_sampled 0.455  val_acc_greedy 0.700  kl 0.0012  s/step 0.61``."""
    parts = [f"step {step}/{total}"]
    for key, label, fmt in SHOWN:
        v = m.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            parts.append(f"{label} {v:{fmt}}")
    return "  ".join(parts)


class Progress:
    """``enabled=False``: silent. Else bars when ``stream`` (default stdout) is a terminal, plain lines
    when it is not: one per RL step, and during SFT one every ``sft_lines``-th of its steps."""

    def __init__(
        self, total: int, enabled: bool, *, stream: TextIO | None = None, sft_lines: int = 10
    ) -> None:
        self._p: Any = None
        self._rl: Any = None
        self._sft: Any = None
        self.total = total
        self.stream = stream if stream is not None else sys.stdout
        self.enabled = enabled
        self.sft_lines = sft_lines
        self.plain = enabled and not _is_tty(self.stream)
        if not enabled or self.plain:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self._p = RichProgress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            transient=False,
            console=Console(file=self.stream),
        )
        self._p.start()

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def sft_step(self, steps: int) -> Callable[[int, dict[str, float]], None] | None:
        if not self.enabled or steps <= 0:
            return None
        if self.plain:
            every = max(1, steps // self.sft_lines)

            def line(step: int, m: dict[str, float]) -> None:
                if (step + 1) % every == 0 or step + 1 == steps:
                    self._print(f"sft step {step + 1}/{steps}  loss {m['sft/loss']:.3f}")

            return line
        self._sft = self._p.add_task("sft", total=steps, info="")

        def cb(step: int, m: dict[str, float]) -> None:
            self._p.update(self._sft, completed=step + 1, info=f"loss {m['sft/loss']:.3f}")

        return cb

    def update(self, step: int, m: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.plain:
            self._print(step_line(step, self.total, m))
            return
        if self._rl is None:
            self._rl = self._p.add_task("rl", total=self.total, info="")
        self._p.update(self._rl, completed=step, info=step_line(step, self.total, m).split("  ", 1)[-1])

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
