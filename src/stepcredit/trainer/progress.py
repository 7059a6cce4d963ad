"""What a run shows while it trains: rich progress bars on a terminal, one plain line per logged step
when stdout is a file or a pipe (verl and TRL print the same), nothing when disabled.

Plain lines are never wrapped or cut (rich would wrap or ellipsise them to an 80-column file); the
bars are only drawn where a person watches them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from stepcredit.config import Config

SHOWN = (
    ("train/reward_sampled", "reward_sampled", ".3f"),
    ("val/accuracy_greedy", "val_acc_greedy", ".3f"),
    ("val/accuracy_sampled", "val_acc_sampled", ".3f"),
    ("response_length/mean", "len", ".0f"),
    ("kl", "kl", ".4f"),
    ("process/u_abs_mean", "process_|U|", ".3f"),
    ("process/episodes_per_response", "episodes", ".1f"),
    ("tools/calls_per_response", "tool_calls", ".2f"),
    ("tools/failed_calls_per_response", "tool_failed", ".2f"),
    ("reward/failed", "reward_failed", ".0f"),
    ("time/step_s", "s/step", ".2f"),
)
"""(metric, label, format) of the figures shown per step, in this order (absent ones are left out: the
process and tool figures appear only when those stages are on)."""

HIDDEN_WHEN_ZERO = frozenset({"reward/failed"})
"""Figures shown only when they are not 0 (a line per step that says ``reward_failed 0`` is noise)."""


def step_line(step: int, total: int, m: dict[str, Any]) -> str:
    """``step 3/100  reward_sampled 0.455  val_acc_greedy 0.700  kl 0.0012  s/step 0.61``."""
    parts = [f"step {step}/{total}"]
    for key, label, fmt in SHOWN:
        v = m.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if key in HIDDEN_WHEN_ZERO and v == 0:
                continue
            parts.append(f"{label} {v:{fmt}}")
    return "  ".join(parts)


def param_counts(model: Any) -> dict[str, int]:
    """``{"trainable": ..., "total": ...}``: parameters the optimiser moves, and the model's own
    (adapters not counted in ``total``, so LoRA's share reads as adapters against the model they adapt)."""
    trainable = total = 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            trainable += p.numel()
        if "lora_" not in name:
            total += p.numel()
    return {"trainable": trainable, "total": total}


def lora_weights(model: Any, *, rank: int, targets: Sequence[str]) -> int:
    """Adapter weights that LoRA of ``rank`` on the linear layers named ``targets`` adds: r (in + out)
    per layer (A is r x in, B is out x r; Hu et al. 2021, section 4), no bias."""
    import torch

    return sum(
        rank * (m.in_features + m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in targets
    )


def banner_lines(
    cfg: Config,
    run_dir: Path,
    model: Any,
    *,
    sources: Sequence[str],
    n_train: int,
    n_val: int,
    tools: bool,
) -> list[str]:
    """What the run is, before it starts: run directory, model and its size, device and dtype, the
    parameters each phase trains, reward sources, the credit setting and tools."""
    m = cfg.model
    counts = param_counts(model)
    total = counts["total"]
    device = next((p.device for p in model.parameters()), "cpu")
    name = (
        f"tiny (built in: {m.tiny.hidden_size} wide, {m.tiny.num_layers} layer{'s' if m.tiny.num_layers != 1 else ''})"
        if m.path == "tiny"
        else m.path
    )
    if m.lora.rank > 0:
        n = lora_weights(model, rank=m.lora.rank, targets=m.lora.target_modules)
        rl = (
            f"RL trains {n:,} LoRA weights ({100 * n / max(1, total):.1f} %: rank {m.lora.rank} on "
            f"{', '.join(m.lora.target_modules)})"
        )
    else:
        rl = f"RL trains all {total:,}"
    sft = f"SFT {cfg.sft.steps} steps trains all" if cfg.sft.steps > 0 else "no SFT"
    p = cfg.process
    credit = f"advantage {cfg.algorithm.advantage}"
    if p.enabled:
        credit += f", process credit on: {p.value_estimator} values, {p.credit} credit, weight {cfg.algorithm.process_weight:g}"
    else:
        credit += ", process credit off (outcome only)"
    where = f"on {device} in {m.dtype}"
    if str(device) == "cpu":
        import torch

        from stepcredit.runtime import openmp_wait

        where += f" ({torch.get_num_threads()} threads, {openmp_wait()})"
    t = cfg.rollout.tools
    offered = f"{', '.join(t.names)} (parser {t.parser}, up to {t.max_turns} turns)" if tools else "none"
    return [
        f"stepcredit train: run directory {run_dir.resolve()}",
        f"  model      {name}, {total:,} parameters, {where}",
        f"  trains     {sft}; {rl}",
        f"  data       {cfg.data.task}: {n_train} training, {n_val} validation prompts; "
        f"{cfg.trainer.steps} RL steps of {cfg.rollout.prompts_per_step} x {cfg.rollout.n} responses",
        f"  rewards    {', '.join(sources) or 'none'} (breaker {'on' if cfg.reward.breaker.enabled else 'OFF'})",
        f"  credit     {credit}; rollout {cfg.rollout.mode}",
        f"  tools      {offered}",
    ]


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
