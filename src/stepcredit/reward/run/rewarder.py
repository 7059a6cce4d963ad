"""The rewarder: routes each response to its reward function and scores batches synchronously.

It is the synchronous face of the reward agent: :meth:`Rewarder.score_batch` submits the batch to
the run's one :class:`~stepcredit.reward.run.agent.RewardAgent` (the rewarder's own, started on first
use and shared with the trainer: one pool per run) and waits for every group. So validation, the
``score`` command, the start-up probes, the VeRL reward manager and value estimators that need the
verifier get the agent's guarantees (kill-safe deadlines, concurrency limits, chunks, no lost or
mis-assigned sample) and share its workers. Routing itself (which function scores a sample, the
inline fast path, domain weights) is :class:`~stepcredit.reward.run.routing.Router`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from stepcredit.config import RewardConfig
from stepcredit.reward.base import TrainingProgress
from stepcredit.reward.run.agent import RewardAgent
from stepcredit.reward.run.backends import check_config
from stepcredit.reward.run.routing import Plan, Route, Router, call_args, load_custom, run_fast
from stepcredit.types import RewardResult, Sample

__all__ = [
    "Plan",
    "Rewarder",
    "Route",
    "build_agent",
    "build_rewarder",
    "call_args",
    "load_custom",
    "run_fast",
]

BatchScoreFn = Callable[[Sequence[Sample], Sequence[str]], list[float]]
"""A batched verifier: (samples, texts) -> one score per text, NaN where the reward failed."""


class Rewarder(Router):
    """Scores batches of responses through the run's reward agent; build with :func:`build_rewarder`,
    release with :meth:`close` (which stops the agent and its workers)."""

    def __init__(self, cfg: RewardConfig | None = None) -> None:
        super().__init__(cfg)
        check_config(self.cfg)  # a bad reward.agent setting fails at start-up, not at the first score
        self._agent: RewardAgent | None = None

    @property
    def agent(self) -> RewardAgent:
        """The run's reward agent over this rewarder, started on first use (the rewarder closes it; one
        closed by its user is replaced on the next use)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("rewarder is closed")
            if self._agent is None or self._agent.closed:
                self._agent = RewardAgent(self.cfg, self)
            return self._agent

    def warmup(self) -> None:
        """Start the agent's backend now (pool workers import sympy and math-verify on their first start)."""
        self.agent.warmup()

    def close(self) -> None:
        """Stop the agent (its workers killed) and close the scorers; the rewarder cannot be used afterwards."""
        with self._lock:
            agent, self._agent = self._agent, None
        if agent is not None:
            agent.close()
        super().close()

    def __enter__(self) -> Rewarder:
        return self

    # ------------------------------------------------------------------------------ scoring
    def score_batch(
        self,
        samples: Sequence[Sample],
        responses: Sequence[str],
        group_B: Any = None,
        progress: TrainingProgress | None = None,
    ) -> list[RewardResult]:
        """One result per response, in order: the batch goes through the agent's chunk protocol and
        this call waits for all of it. ``group_B`` (ids of prompts) groups samples for custom scorers'
        ``post_process_scores``; without it, samples with the same ``uid`` form a group. ``progress``:
        where training stands (a TRL function's ``trainer_state``; None outside training)."""
        return self.agent.score_batch(samples, responses, group_B, progress)

    async def ascore_batch(
        self, samples: Sequence[Sample], responses: Sequence[str], group_B: Any = None
    ) -> list[RewardResult]:
        """:meth:`score_batch` for asyncio: waits without blocking the event loop."""
        agent = self.agent
        return await agent.aget(agent.submit_samples(samples, responses, group_B))

    def score(self, sample: Sample, response: str) -> RewardResult:
        """Score one response."""
        return self.score_batch([sample], [response])[0]

    def verifier_fn(self) -> BatchScoreFn:
        """``(samples, texts) -> scores`` for value estimators that need the verifier (Monte Carlo
        continuations): the same routing as the outcome reward, all texts in one submission, NaN where
        the reward could not be computed, so a caller can leave that row without process credit
        instead of reading a 0."""

        def score(samples: Sequence[Sample], texts: Sequence[str]) -> list[float]:
            return [float(r.score) if r.ok else math.nan for r in self.score_batch(samples, texts)]

        return score


def build_rewarder(cfg: RewardConfig | None = None) -> Rewarder:
    """A :class:`Rewarder` for ``cfg``; custom functions and domain routes are loaded now, so a missing
    file or name is a ConfigError (one line naming the key) at start-up rather than mid-run."""
    import stepcredit.reward.builtin  # noqa: F401  (registers the built-in reward functions)

    return Rewarder(cfg)


def build_agent(cfg: RewardConfig | None = None, rewarder: Rewarder | None = None) -> RewardAgent:
    """The reward agent for ``cfg`` (``cfg.agent`` picks the backend from the registry; an unknown one
    is a ConfigError naming ``reward.agent.backend``). With ``rewarder`` (and ``cfg`` None or its own
    config): that rewarder's agent, so the trainer's asynchronous scoring and the rewarder's synchronous
    one share one pool; otherwise a new agent that owns its own routing and closes it."""
    if rewarder is not None and (cfg is None or cfg == rewarder.cfg):
        return rewarder.agent
    return RewardAgent(cfg, rewarder)
