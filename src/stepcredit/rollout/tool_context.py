"""Where a run's tool calls run: the per-run :class:`ToolContext` (the tools settings, the runner and
the length budget, handed around as one object or None), the runner type and the two runners the
library provides without a reward agent (in this process; counting, for ``stepcredit eval``).

The trainer's runner runs calls on the reward agent's kill-safe workers
(:class:`stepcredit.reward.tools.AgentCallRunner`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepcredit.config import ToolsConfig
from stepcredit.tools import PARSERS, TOOLS, Observation, ToolCall, execute_call

CallRunner = Callable[[Sequence[ToolCall], Sequence[Mapping[str, Any] | None]], list[Observation]]
"""(calls, each call's row ``tools_kwargs``) -> one observation per call, in order."""


def in_process_runner(offered: Sequence[str], max_chars: int) -> CallRunner:
    """A runner that executes calls in this process (library use without a reward agent: no hard
    deadline for a tool that hangs; the trainer always runs tools through its agent)."""

    def run(calls: Sequence[ToolCall], kwargs: Sequence[Mapping[str, Any] | None]) -> list[Observation]:
        return [
            execute_call(c, offered=offered, tools_kwargs=kw, max_chars=max_chars)
            for c, kw in zip(calls, kwargs, strict=True)
        ]

    return run


@dataclass
class CountingRunner:
    """A runner that counts the calls it ran and the failed ones by kind (``stepcredit eval``'s tool
    counters; every executed call goes through the runner, so nothing is missed)."""

    run: CallRunner
    calls: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    def __call__(
        self, calls: Sequence[ToolCall], kwargs: Sequence[Mapping[str, Any] | None]
    ) -> list[Observation]:
        got = self.run(calls, kwargs)
        self.calls += len(got)
        for o in got:
            if o.error:
                self.failed[o.error] = self.failed.get(o.error, 0) + 1
        return got

    def counters(self, responses: int) -> dict[str, float]:
        """``tools/calls_per_response``, ``tools/failed_calls_per_response`` and ``tools/failed_<kind>``
        (sums), as the trainer logs them."""
        n = max(1, responses)
        return {
            "tools/calls_per_response": self.calls / n,
            "tools/failed_calls_per_response": sum(self.failed.values()) / n,
            **{f"tools/failed_{k}": float(v) for k, v in sorted(self.failed.items())},
        }


@dataclass(frozen=True)
class ToolContext:
    """A run's tools, as one object: what is offered and how calls are written (``config``), where
    calls run (``runner``) and a whole response's length budget. ``None`` in its place means the run
    calls no tools."""

    config: ToolsConfig
    """``rollout.tools``: the offered tools, the call convention, the turn limit, the render."""
    runner: CallRunner
    """Runs a batch of calls (the trainer's reward agent, or this process)."""
    max_new_tokens: int
    """The length budget of a whole response, results included (``rollout.max_new_tokens``)."""

    @classmethod
    def in_process(cls, config: ToolsConfig, max_new_tokens: int) -> ToolContext:
        """Calls run in this process (every name and the parser must be registered: one line listing
        the registered ones otherwise)."""
        for name in config.names:
            TOOLS.get(name)
        PARSERS.get(config.parser)
        return cls(config, in_process_runner(config.names, config.max_result_chars), max_new_tokens)

    def with_runner(self, runner: CallRunner) -> ToolContext:
        return ToolContext(self.config, runner, self.max_new_tokens)
