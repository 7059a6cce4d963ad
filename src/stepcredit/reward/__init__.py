"""Rewards: verifiers, users' own functions, scorers (reward models, judges, sandboxes) and routing.

Use::

    from stepcredit.reward import build_rewarder, apply_failure_policy, reward_metrics
    rewarder = build_rewarder(cfg.reward)          # loads custom functions now: ConfigError if missing
    results = rewarder.score_batch(samples, responses)   # list[RewardResult], in order
    score_B, valid_B, keep_B = apply_failure_policy(results, group_B, cfg.reward)
    metrics = reward_metrics(results)
    rewarder.close()

``score_batch`` is the synchronous face of the reward agent, the one execution path (bounded
concurrency, kill-safe deadlines, whole groups as they finish); the trainer uses the same agent::

    with build_agent(cfg.reward, rewarder) as agent:   # the rewarder's own agent: one pool per run
        ticket = agent.submit_samples(samples, responses, group_ids)   # returns at once
        for idx, results in agent.stream(ticket, 64):   # whole groups, >= 64 samples at a time
            ...

Every result has a ``status``; "could not score" (``timeout``, ``error``, ``sandbox_error``) has a NaN
score and is never a silent 0 — the failure policy decides what it becomes.

Adding a reward (one registration, keyed by ``data_source``; shell patterns like ``aime*`` allowed):

* A per-sample function with VeRL's signature, run in the kill-safe pool with a hard deadline::

      from stepcredit.reward.base import register_reward

      @register_reward("my_source", "alias")          # fast=inline_precheck, isolate=False optional
      def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
          return RewardResult(...)  # or a float, a dict with "score", or a tuple (score, ...)

* A scorer that wants the whole batch and manages its own timeouts and concurrency (reward models,
  judges, sandboxes)::

      from stepcredit.reward.base import register_scorer

      @register_scorer("model")                       # rows with reward_model.style == "model"
      def make(cfg: RewardConfig) -> Scorer:           # built once, on first use
          return MyScorer(cfg.reward_model)            # .score_batch(samples, responses), .close()

Put the module's import in :mod:`stepcredit.reward.builtin` (pool workers import that module).
Import ``register_reward``/``register_scorer`` from ``stepcredit.reward.base`` inside reward modules
to avoid a circular import through this package.
"""

from stepcredit.reward import builtin  # noqa: F401  (fills REWARDS; must come last)
from stepcredit.reward.base import (
    REWARDS,
    FnRef,
    RewardFn,
    Scorer,
    TrainingProgress,
    register_reward,
    register_scorer,
    resolve_source,
    to_result,
)
from stepcredit.reward.postprocess import (
    RunningStats,
    Scored,
    Verdicts,
    apply_failure_policy,
    process_outcomes,
    reward_metrics,
    with_failure_policy,
    zero_signal_groups,
)
from stepcredit.reward.run.agent import RewardAgent, RewardBackendError, Ticket
from stepcredit.reward.run.rewarder import Rewarder, Route, build_agent, build_rewarder
from stepcredit.reward.shaping import LENGTH_PENALTIES, length_penalty_metrics, shape_lengths

__all__ = [
    "LENGTH_PENALTIES",
    "REWARDS",
    "FnRef",
    "RewardAgent",
    "RewardBackendError",
    "RewardFn",
    "Rewarder",
    "Route",
    "RunningStats",
    "Scored",
    "Scorer",
    "Ticket",
    "TrainingProgress",
    "Verdicts",
    "apply_failure_policy",
    "build_agent",
    "build_rewarder",
    "length_penalty_metrics",
    "process_outcomes",
    "register_reward",
    "register_scorer",
    "resolve_source",
    "reward_metrics",
    "shape_lengths",
    "to_result",
    "with_failure_policy",
    "zero_signal_groups",
]
