"""The registry of code executors (``reward.sandbox.backend``): the name a config gives -> the class that runs programs."""

from __future__ import annotations

import functools
from collections.abc import Callable

from stepcredit.config import SandboxConfig
from stepcredit.registry import Registry
from stepcredit.sandbox.bwrap import Sandbox
from stepcredit.sandbox.fusion import FusionSandbox
from stepcredit.sandbox.judging import Executor

EXECUTORS: Registry[Callable[[SandboxConfig], Executor]] = Registry("sandbox backend")
"""``reward.sandbox.backend`` -> the executor class, built with the sandbox config."""
EXECUTORS.add("local", Sandbox)  # bubblewrap on this machine
EXECUTORS.add("sandbox_fusion", FusionSandbox)  # a SandboxFusion-compatible service at cfg.url


def make_executor(cfg: SandboxConfig) -> Executor:
    """The executor ``cfg.backend`` names: ``local`` (bubblewrap here) or ``sandbox_fusion`` (``cfg.url``)."""
    return EXECUTORS.get(cfg.backend)(cfg)


@functools.lru_cache(maxsize=8)
def get_sandbox(cfg: SandboxConfig) -> Executor:
    """A new executor for ``cfg`` on every call (none is cached; its concurrency bound holds per executor)."""
    return make_executor(cfg)
