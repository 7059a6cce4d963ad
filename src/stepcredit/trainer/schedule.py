"""The RL phase's learning-rate schedules (``optim.schedule``): a multiplier of ``optim.lr`` per step.

Each schedule is ``f(step, total_steps, min_ratio) -> factor`` over the steps after the warm-up: a
linear warm-up (``optim.warmup_steps``: lr/W, 2 lr/W, ..., lr at step W) reaches the configured ``lr``,
and the schedule then runs from that peak over the remaining ``trainer.steps - W`` steps (the shape of
transformers' ``get_cosine_schedule_with_warmup``; Goyal et al. 2017 for the warm-up). A run shorter
than its warm-up never reaches ``lr``: :func:`short_run_warning` says so at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from stepcredit.registry import Registry

LRSchedule = Callable[[int, int, float], float]
LR_SCHEDULES: Registry[LRSchedule] = Registry("learning-rate schedule")


@LR_SCHEDULES.register("constant")
def constant(step: int, total: int, min_ratio: float) -> float:
    """``optim.lr`` at every step (after the warm-up)."""
    return 1.0


@LR_SCHEDULES.register("cosine")
def cosine(step: int, total: int, min_ratio: float) -> float:
    """Half a cosine from 1 at step 0 to ``min_ratio`` at step ``total`` (and after it):
    m + (1 - m) (1 + cos(pi t / T)) / 2, the decay of Loshchilov & Hutter (SGDR, arXiv 1608.03983)
    without restarts, with verl's ``min_lr_ratio`` floor."""
    t = min(step, total) / max(1, total)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def lr_factor(step: int, *, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """The multiplier of ``optim.lr`` at RL step ``step`` (1-based): ``step / warmup`` up to the end
    of the warm-up (1 at step ``warmup``: the peak is the configured lr), then the schedule at
    ``step - warmup`` of ``total - warmup`` steps."""
    if step <= warmup:
        return step / warmup
    return LR_SCHEDULES.get(schedule)(step - warmup, max(1, total - warmup), min_ratio)


def short_run_warning(*, steps: int, warmup: int, lr: float) -> str | None:
    """One line when a run of ``steps`` RL steps ends inside its warm-up (its lr peaks at
    ``lr * steps / warmup``), else None."""
    if steps >= warmup or steps <= 0:
        return None
    return (
        f"warning: trainer.steps={steps} ends inside the warm-up (optim.warmup_steps={warmup}): the learning "
        f"rate peaks at {lr * steps / warmup:.3g}, not optim.lr={lr:.3g}; lower optim.warmup_steps to reach it"
    )
