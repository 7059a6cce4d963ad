"""The runner protocol's message ops, as the host reads them (:mod:`.runner`, which runs alone in the sandbox, writes the same strings)."""

from __future__ import annotations

from enum import Enum


class Op(str, Enum):
    """The ``op`` of a message from the runner (equal to its string, so a decoded message compares as is)."""

    HELLO = "hello"
    """The runner started and set its limits."""
    READY = "ready"
    """A live case's program ran and waits for the test's requests."""
    REPLY = "reply"
    """The answer to one request of a live case."""
    DONE = "done"
    """A case ended: exit code or signal, timeout, overflow, output and answers."""
