"""Where the reward agent's chunks run: the backend registry, filled with the three built-in backends.

The contract and the registry live in :mod:`.backend_api`; each backend in its own module
(:mod:`.thread_backend`, :mod:`.process_backend`, :mod:`.ray_backend`), imported here so that they register.

A backend receives :class:`Job` objects (one attempt of one chunk: several samples of one reward
function, or one batched call) through ``submit`` and answers each exactly once through the agent's
callback ``on_done(job, outcome)``, an :class:`~stepcredit.reward.run.chunks.Outcome` holding one
result per item, or None for an item that did not run to the end (the agent queues it again). A
backend never raises into the agent for a job: a failure is a typed result.

Each item of a chunk has its own deadline, counted from when that item started: a sample that hangs
is answered ``timeout``, the items before it keep their results and the items after it run again in a
new chunk, so one hanging sample never fails its neighbours.

Backends are registry entries (:data:`BACKENDS`, :func:`register_backend`) whose capabilities are
metadata the agent and :func:`check_config` read; nobody compares backend names:

* ``thread`` (:class:`ThreadBackend`): in-process worker threads (sync functions) and the agent's
  event loop (async functions). A thread cannot be stopped: at an item's deadline the chunk is
  answered, the thread is *abandoned* (its late result is discarded) and a replacement takes its
  place, up to ``concurrency`` abandoned threads at once; past that cap no replacement starts, so a
  function that hangs for ever ends in the agent's step deadline rather than in unbounded threads.
* ``process`` (:class:`ProcessBackend`): the :class:`~stepcredit.reward.run.pool.KillSafePool`; a
  deadline kills the worker's process group; a worker that died under an item reports it so the
  agent re-submits it.
* ``ray`` (:class:`RayBackend`): pools of Ray actors with declared resources, chunks handed to idle
  actors; a deadline kills the actor, a lost actor (killed, its node gone) is replaced and its chunk
  re-submitted. Scorers listed in ``reward.agent.ray_scorers`` (the code sandbox, reward models) run
  as actors of their own, placed by custom resources such as ``sandbox``.
"""

from __future__ import annotations

from stepcredit.config import RewardConfig
from stepcredit.errors import ConfigError
from stepcredit.reward.base import REWARDS
from stepcredit.reward.run.backend_api import (
    BACKENDS,
    AsyncLoop,
    Backend,
    BackendArgs,
    BackendSpec,
    Job,
    OnDone,
    Timer,
    register_backend,
)
from stepcredit.reward.run.process_backend import ProcessBackend
from stepcredit.reward.run.ray_backend import RayBackend, RewardActor, ScorerActor
from stepcredit.reward.run.thread_backend import ThreadBackend
from stepcredit.runtime import require

__all__ = [
    "BACKENDS",
    "AsyncLoop",
    "Backend",
    "BackendArgs",
    "BackendSpec",
    "Job",
    "OnDone",
    "ProcessBackend",
    "RayBackend",
    "RewardActor",
    "ScorerActor",
    "ThreadBackend",
    "Timer",
    "check_config",
    "register_backend",
]


def check_config(cfg: RewardConfig) -> BackendSpec:
    """Start-up check of ``reward.agent`` against the backend registry; returns the backend's spec.

    - the backend must be registered (the message lists the valid ones) and its packages installed;
    - ``ray_scorers`` needs a backend that hosts scorers, and each key must name a registered scorer;
    - ``ray_resources`` / ``ray_scorers`` need a backend that reads the Ray settings.
    """
    a = cfg.agent
    try:
        spec = BACKENDS.get(a.backend)
    except ConfigError as e:
        raise ConfigError(f"config key reward.agent.backend: {e}") from None
    require(spec.requires, what=f"config key reward.agent.backend: {a.backend!r}")
    if a.ray_scorers and not spec.hosts_scorers:
        ok = ", ".join(n for n in BACKENDS if BACKENDS.get(n).hosts_scorers)
        raise ConfigError(
            f"config key reward.agent.ray_scorers: backend {a.backend!r} cannot host scorers; use one of: {ok}"
        )
    if a.ray_resources and not spec.uses_ray:
        raise ConfigError(f"config key reward.agent.ray_resources: backend {a.backend!r} does not use Ray")
    if a.ray_scorers:
        import stepcredit.reward.builtin  # noqa: F401  (registers the built-in scorers)

        for name in a.ray_scorers:
            try:
                entry = REWARDS.get(name)
            except ConfigError as e:
                raise ConfigError(f"config key reward.agent.ray_scorers.{name}: {e}") from None
            if entry.factory is None:
                raise ConfigError(
                    f"config key reward.agent.ray_scorers.{name}: {name!r} is a reward function, not a "
                    "scorer (only scorers such as code or model run as their own actors)"
                )
    return spec
