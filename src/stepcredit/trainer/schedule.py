"""The RL phase's learning-rate schedules (``optim.schedule``): a multiplier of ``optim.lr`` per step.

Each schedule is ``f(step, total_steps, min_ratio) -> factor``; the linear warm-up
(``optim.warmup_steps``) multiplies whatever the schedule gives, so every schedule starts gently.
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
    """The multiplier of ``optim.lr`` at RL step ``step`` (1-based): warm-up times the schedule."""
    warm = min(1.0, step / max(1, warmup))
    return warm * LR_SCHEDULES.get(schedule)(step, total, min_ratio)
