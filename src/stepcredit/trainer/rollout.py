"""``rollout_and_submit``: draw prompts, generate with the current weights, hand the batch to the reward
agent (which scores it in the background) and meanwhile store what needs the policy loaded (critic
values, V(prefix) for process rewards)."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field, replace

from stepcredit import process
from stepcredit.config import Config
from stepcredit.process.values import spending
from stepcredit.reward import RewardAgent, Rewarder, Ticket, TrainingProgress
from stepcredit.reward.tools import AgentCallRunner
from stepcredit.rollout import ROLLOUT_MODES, RolloutRequest, ToolContext
from stepcredit.trainer.critic import critic_values
from stepcredit.trainer.state import TrainState
from stepcredit.trainer.update import needs_behaviour_logp, reads_rollout_cache
from stepcredit.types import Batch


@dataclass(frozen=True)
class Rollout:
    """A generated batch, the agent's ticket for its rewards, and what generating it cost."""

    batch: Batch
    ticket: Ticket
    times: dict[str, float] = field(default_factory=dict)
    """``time/generation_s``, ``time/process_s``; ``process/unscored_rows`` when a value could not be computed."""


def progress_of(batch: Batch, cfg: Config) -> TrainingProgress:
    """Where training stood for ``batch``: the RL steps done by the weights that generated it, of the
    run's steps (what a TRL reward function gets as ``trainer_state``)."""
    return TrainingProgress(global_step=batch.policy_version, max_steps=cfg.trainer.steps)


def tool_context(cfg: Config, rewarder: Rewarder) -> ToolContext | None:
    """The run's tools as one object, or None when ``rollout.mode`` calls none: ``rollout.tools``, the
    length budget and the runner that runs calls through ``rewarder``'s agent (kill-safe, with
    deadlines). Rollouts, validation and the process stage's continuations all take this one object."""
    if not ROLLOUT_MODES.get(cfg.rollout.mode).uses_tools:
        return None
    tc = cfg.rollout.tools
    runner = AgentCallRunner(rewarder, offered=tc.names, max_chars=tc.max_result_chars)
    return ToolContext(tc, runner, cfg.rollout.max_new_tokens)


def with_values(
    state: TrainState, batch: Batch, rewarder: Rewarder, domains: frozenset[str]
) -> tuple[Batch, int]:
    """V(prefix) at episode ends for the responses of ``domains`` (the rest get no episodes, hence an
    all-zero process channel). Returns the batch and the number of rows left without values because
    a value could not be computed (NaN)."""
    cfg = state.cfg.process
    rows = [i for i, s in enumerate(batch.samples) if s.domain in domains]
    if process.VALUE_ESTIMATORS.get(cfg.value_estimator).from_outcomes:
        # a tree's node values need the leaves' outcomes: the segments now, the values once scored
        # (trainer.update.reward_channels)
        assert batch.tree_ends is not None, "from_outcomes values need a rollout that shares prefixes"
        keep = set(rows)
        segments = [list(e) if i in keep else [] for i, e in enumerate(batch.tree_ends)]
        return replace(batch, episode_ends=segments, prefix_values=None, kv_cache=None), 0
    ends: list[list[int]] = [[] for _ in range(len(batch))]
    values: list[list[float]] = [[] for _ in range(len(batch))]
    if process.VALUE_ESTIMATORS.get(cfg.value_estimator).from_group:
        # the group's values need its outcomes: the episodes now, the values once scored
        # (trainer.update.reward_channels); the cache is not read
        if rows:
            prompts, responses = process.batch_token_ids(batch)
            observed = process.batch_observed(batch)
            segmented, _ = process.build_requests(
                [batch.samples[i] for i in rows],
                [prompts[i] for i in rows],
                [responses[i] for i in rows],
                state.tok,
                cfg,
                None if observed is None else [observed[i] for i in rows],
                None,
            )
            for j, i in enumerate(rows):
                ends[i] = segmented[j]
        return replace(batch, episode_ends=ends, prefix_values=None, kv_cache=None), 0
    unscored = 0
    if rows:
        prompts, responses = process.batch_token_ids(batch)
        observed = process.batch_observed(batch)
        logps = process.batch_logps(batch)
        got = process.prefix_values(
            state.model,
            state.tok,
            [batch.samples[i] for i in rows],
            [prompts[i] for i in rows],
            [responses[i] for i in rows],
            cfg,
            score_fn=rewarder.verifier_fn(),  # used by estimators that need a verifier, ignored by the rest
            # the rollout's cache covers every row: a subset recomputes its prefixes
            body=batch.kv_cache if len(rows) == len(batch) else None,
            # continuations of a tool rollout's prefixes call the same tools through the same runner
            tools=tool_context(state.cfg, rewarder),
            observed=None if observed is None else [observed[i] for i in rows],  # the recorded turns
            logps=None if logps is None else [logps[i] for i in rows],  # where sampling was greedy's choice
        )
        for j, i in enumerate(rows):
            if any(math.isnan(v) for v in got.values[j]):
                unscored += 1
                continue
            ends[i], values[i] = got.episode_ends[j], got.values[j]
    return replace(batch, episode_ends=ends, prefix_values=values, kv_cache=None), unscored


def rollout_and_submit(
    state: TrainState,
    agent: RewardAgent,
    rewarder: Rewarder,
    step: int,
    extra: int = 0,
    *,
    process_domains: frozenset[str] = frozenset(),
) -> Rollout:
    """Generate ``rollout.n`` responses to each of ``rollout.prompts_per_step`` prompts for RL step
    ``step`` with the current weights (labelled with the policy's clocks) and critic values; the
    outcome rewards start scoring at once, in the run's one reward agent, while V(prefix) is computed
    with the policy loaded (the continuations' verifier calls queue in the same agent). ``extra``
    numbers dynamic sampling's refill rollouts (their group ids stay distinct from every other batch's)."""
    cfg = state.cfg
    P = cfg.rollout.prompts_per_step
    t0 = time.perf_counter()
    request = RolloutRequest(
        samples=state.stream.take(P),
        cfg=cfg.rollout,
        group_offset=(extra * (cfg.trainer.steps + 1) + step) * P,
        policy_version=state.step,
        with_logprobs=needs_behaviour_logp(cfg),
        # the process stage continues from the behaviour log-prob pass instead of re-running responses
        keep_cache=reads_rollout_cache(cfg),
        boundaries=functools.partial(process.segment_episodes, tokenizer=state.tok, cfg=cfg.process),
        tools=tool_context(cfg, rewarder),  # tool calls run in the run's reward agent: kill-safe
    )
    batch, counts = ROLLOUT_MODES.get(cfg.rollout.mode).fn(state.model, state.tok, request)
    batch = replace(batch, policy_updates=state.updates)
    if state.critic is not None:
        batch = replace(batch, values_BT=critic_values(state.critic, batch))
    t1 = time.perf_counter()
    times = {"time/generation_s": t1 - t0, **counts}
    # Outcome rewards need no values: they run while the process stage evaluates (the copy handed to
    # the agent leaves the rollout cache behind, so the cache is freed once the values are computed).
    ticket = agent.submit(batch.without_rewards(), progress_of(batch, cfg))
    if cfg.process.enabled:
        with spending() as spent:  # what valuing cost beyond the rollout (an experiment's accounting)
            batch, unscored = with_values(state, batch, rewarder, process_domains)
        times["time/process_s"] = time.perf_counter() - t1
        times["process/unscored_rows"] = float(unscored)
        times["process/generated_tokens"] = float(spent.generated_tokens)  # continuations sampled
        times["process/verifier_calls"] = float(spent.verifier_calls)  # texts the estimator had scored
        # V(prefix) computed (a forced answer's is one scoring pass over its suffix: no generation)
        times["process/values"] = float(sum(len(v) for v in batch.prefix_values or []))
    return Rollout(batch, ticket, times)
