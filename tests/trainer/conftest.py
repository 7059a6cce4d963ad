"""Shared by the composition tests: a tool-call convention a random model follows, and the thread
count a run must set."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stepcredit.tools import PARSERS, ParsedCall, ToolCall, ToolParser

# A tiny model that trained 2 SFT steps never writes a fenced calculator call, so the tools runs use a
# convention under which a random model calls a tool in about half its turns: a turn of at least 3
# characters whose first character has an even code is a call of the (real) calculator, ending there;
# its result is appended as "\n~42~\n" (a marker no other test's text holds: the segmenter reads every
# registered convention's result starts).
TOY_PARSER = "composition_every_other_turn"


def _find_call(text: str, tools: Any) -> ParsedCall | None:
    if len(text) < 3 or ord(text[0]) % 2:
        return None
    return ParsedCall(ToolCall("calculator", {"expression": "6*7"}), 3)


PARSERS.add(
    TOY_PARSER,
    ToolParser(
        find=_find_call,
        observation=lambda result: f"\n~{result}~\n",
        observation_starts=lambda text: [i for i in range(len(text)) if text.startswith("\n~", i)],
    ),
    override=True,
)


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any], int]]:
    """``threads(level)``: set the environment for a ``threads`` level (``env``: STEPCREDIT_THREADS=1
    over trainer.threads=2), and the count of torch's threads the run must set. The test's own count
    is restored afterwards (a run sets it for the process)."""
    import torch

    from stepcredit.runtime import THREADS_ENV, usable_cpus

    before = torch.get_num_threads()

    def level(value: Any) -> int:
        if value == "env":
            monkeypatch.setenv(THREADS_ENV, "1")
        else:
            monkeypatch.delenv(THREADS_ENV, raising=False)
        return 1 if value in (1, "env") else min(2, usable_cpus())

    yield level
    torch.set_num_threads(before)
