"""Data: built-in tasks and verl-style files, turned into validated ``Sample`` lists, and the
deterministic prompt stream the trainer draws from (its position is saved in checkpoints).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from stepcredit.config import DataConfig
from stepcredit.data import arith, codegen, ifgen, prepare
from stepcredit.data.io import read_rows, read_samples, row_to_sample, write_rows
from stepcredit.errors import ConfigError
from stepcredit.registry import Registry
from stepcredit.types import Sample

__all__ = [
    "ANSWER_ENDS",
    "STEP_VALUES",
    "TASKS",
    "WASTED_EPISODES",
    "PromptStream",
    "load_task",
    "read_rows",
    "read_samples",
    "row_to_sample",
    "write_rows",
]

TaskFn = Callable[[DataConfig], tuple[list[Sample], list[Sample]]]
TASKS: Registry[TaskFn] = Registry("data task")


def _generated(
    name: str, make_rows: Callable[..., list[dict[str, Any]]], *, arith_cfg: bool = False
) -> TaskFn:
    """A task whose train and val rows a seeded generator makes: ``make_rows([cfg.arith,] n, seed=, split=)``
    (``arith_cfg``: the generator takes the arithmetic settings first)."""

    def task(cfg: DataConfig) -> tuple[list[Sample], list[Sample]]:
        def split(size: int, part: str) -> list[Sample]:
            head = (cfg.arith, size) if arith_cfg else (size,)
            rows = make_rows(*head, seed=cfg.seed, split=part)
            return [row_to_sample(r, f"{name}:{part}:{i}") for i, r in enumerate(rows)]

        return split(cfg.train_size, "train"), split(cfg.val_size, "val")

    return task


TASKS.add("arith", _generated("arith", arith.make_rows, arith_cfg=True))


StepValueFn = Callable[[Sample, str], float]
STEP_VALUES: Registry[StepValueFn] = Registry("exact step value (data source)")
"""Per data source: the exact value of a reasoning prefix, ``fn(sample, prefix_text) -> float`` in [0, 1],
where the task can check every step itself (the oracle that ``process.value_estimator=step_oracle``
reads; an upper bound for any V(prefix) estimator on that task)."""


@STEP_VALUES.register(arith.DATA_SOURCE)
def _arith_step_value(sample: Sample, prefix: str) -> float:
    question = next(m["content"] for m in reversed(sample.prompt) if m["role"] == "user")
    return arith.step_value(question, prefix)


# arithmetic with a 2-digit by 3-digit multiplication: traces call the ``calculator`` tool
_arith_tools = TASKS.add("arith_tools", _generated("arith_tools", arith.make_tool_rows, arith_cfg=True))


@TASKS.register("arith_tools_direct")
def _arith_tools_direct(cfg: DataConfig) -> tuple[list[Sample], list[Sample]]:
    """``arith_tools``'s problems and answers with traces that answer at once, without a tool call: the
    "without tools" side of the tools experiment (run with a plain ``rollout.mode``)."""
    train, val = _arith_tools(cfg)

    def direct(samples: list[Sample]) -> list[Sample]:
        return [
            s.with_(
                uid=s.uid.replace("arith_tools:", "arith_tools_direct:"),
                extra_info={
                    **{k: v for k, v in s.extra_info.items() if k != "solution_observations"},
                    "solution": arith.direct_trace(str(s.ground_truth)),
                },
            )
            for s in samples
        ]

    return direct(train), direct(val)


@STEP_VALUES.register(arith.TOOLS_DATA_SOURCE)
def _arith_tools_step_value(sample: Sample, prefix: str) -> float:
    question = next(m["content"] for m in reversed(sample.prompt) if m["role"] == "user")
    return arith.tool_step_value(question, prefix)


WasteFn = Callable[[str], int]
WASTED_EPISODES: Registry[WasteFn] = Registry("wasted-episode counter (data source)")
"""Per data source that can tell: ``fn(response_text) -> int`` wasted episodes (steps that change
nothing), for the verbosity figures ``response/wasted_episodes_per_response`` and its ``val/`` twin."""
WASTED_EPISODES.add(arith.DATA_SOURCE, arith.count_wasted)

ANSWER_ENDS: Registry[str] = Registry("answer marker (data source)")
"""Per data source whose responses end at a marked final answer: a regular expression whose first match
in a response's text completes that answer ("The answer is 7."). The task's contract is that a response
is finished there (its traces end there, and the verdict is read from it), so a continuation that
values a prefix stops at the token that completes the match instead of running on to eos, and a
prefix that already holds a match is worth its response's own reward
(:func:`stepcredit.process.continuation.continuation_values`). A source without an entry: continuations
run to eos or their length limit."""
ANSWER_ENDS.add(arith.DATA_SOURCE, arith.ANSWER_END)
for _source in prepare.MATH_SOURCES:
    ANSWER_ENDS.add(_source, prepare.MATH_ANSWER_END)


TASKS.add("code", _generated("code", codegen.make_rows))
TASKS.add("ifeval", _generated("ifeval", ifgen.make_rows))
TASKS.add("arith_mc", _generated("arith_mc", ifgen.make_mc_rows))


@TASKS.register("files")
def _files(cfg: DataConfig) -> tuple[list[Sample], list[Sample]]:
    if not cfg.train_files:
        raise ConfigError("config key data.train_files: task=files needs at least one file")
    train = [s for f in cfg.train_files for s in read_samples(f)]
    val = [s for f in cfg.val_files for s in read_samples(f)][: cfg.val_size or None]
    return train, val


def load_task(cfg: DataConfig) -> tuple[list[Sample], list[Sample]]:
    """(train, validation) samples of the configured task."""
    return TASKS.get(cfg.task)(cfg)


class PromptStream:
    """Endless, seeded, epoch-shuffled stream of training samples; ``state_dict`` records the position."""

    def __init__(self, samples: list[Sample], seed: int) -> None:
        if not samples:
            raise ConfigError("config key data: the training set is empty")
        self.samples = samples
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._perm(0)

    def _perm(self, epoch: int) -> list[int]:
        order = list(range(len(self.samples)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[Sample]:
        out = []
        for _ in range(k):
            if self.pos >= len(self._order):
                self.epoch += 1
                self.pos = 0
                self._order = self._perm(self.epoch)
            out.append(self.samples[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.pos = int(state["pos"])
        self._order = self._perm(self.epoch)
