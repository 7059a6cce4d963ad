"""A step's mini-batches as their rewards arrive, and dynamic sampling (DAPO, Yu et al. 2025, arXiv
2503.14476 sec. 3.2: drop groups whose outcomes carry no signal and draw more prompts to refill).

The filter works on whole groups as they stream in, so it composes with the mini-batch pipeline
(kept groups are buffered into mini-batches of at least ``pipeline.mini_batch`` responses) and with
one-step off-policy (a refill is generated with the current weights while earlier groups train).
Every generated response is accounted for: trained, or dropped with the reason in the metrics. The
failure policy is applied here, once per arriving sub-batch (:func:`with_failure_policy`); the filter
and the update read its verdicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from stepcredit.config import Config
from stepcredit.reward import RewardAgent, Scored, with_failure_policy, zero_signal_groups
from stepcredit.trainer.metrics import StepMetrics
from stepcredit.trainer.rollout import Rollout
from stepcredit.types import Batch


class GroupFilter:
    """Keeps groups with outcome signal until ``target`` groups are kept; the rest are dropped."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.target = cfg.rollout.prompts_per_step
        self.kept = 0

    def __call__(self, scored: Scored, counts: StepMetrics) -> Scored | None:
        ds = self.cfg.postprocess.dynamic_sampling
        mb, (score_B, valid_B, _) = scored.batch, scored.verdicts
        drop = zero_signal_groups(
            score_B, valid_B, mb.group_B, criterion=ds.criterion, mean_low=ds.mean_low, mean_high=ds.mean_high
        )
        group_B = mb.group_B.tolist()
        keep: set[int] = set()
        for g in dict.fromkeys(group_B):
            rows = [i for i, x in enumerate(group_B) if x == g]
            domain = mb.samples[rows[0]].domain
            if g in drop:
                counts.count("samples/dropped_no_signal", len(rows))
                counts.count("sampling/dropped_groups", 1)
                counts.count(f"{domain}/sampling/dropped_groups", 1)
            elif self.kept >= self.target:
                counts.count("samples/dropped_surplus", len(rows))
            else:
                keep.add(g)
                self.kept += 1
        if not keep:
            return None
        return scored.select([i for i, g in enumerate(group_B) if g in keep])

    @property
    def full(self) -> bool:
        return self.kept >= self.target


def step_stream(
    agent: RewardAgent,
    first: Rollout,
    cfg: Config,
    counts: StepMetrics,
    refill: Callable[[int], Rollout],
    arrived: list[Batch],
) -> Iterator[Scored]:
    """Whole scored groups of this step, ``pipeline.mini_batch`` responses at a time in the order their
    rewards complete (all at once in index order when 0), with the failure policy's verdicts. With
    dynamic sampling, groups without signal are dropped and up to ``max_extra_batches`` refill rollouts are drawn until
    ``prompts_per_step`` groups are kept. Every scored sub-batch is appended to ``arrived`` (for the
    step's reward metrics)."""
    ds = cfg.postprocess.dynamic_sampling
    keep = GroupFilter(cfg) if ds.enabled else None
    k = cfg.pipeline.mini_batch
    rollout: Rollout | None = first
    extra = 0
    buffered: list[Scored] = []
    if keep is not None:
        for key in ("sampling/extra_batches", "sampling/dropped_groups", "sampling/drawn_prompts"):
            counts.count(key, 0)
    while rollout is not None:
        counts.count("samples/generated", len(rollout.batch))
        if keep is not None:
            counts.count("sampling/drawn_prompts", len(set(rollout.batch.group_B.tolist())))
        # k = 0: the whole batch in index order, so a step's rows (and the float sums over them: running
        # statistics, the loss) do not depend on which reward finished first
        pulls = agent.stream(rollout.ticket, k)
        while True:
            t0 = time.perf_counter()
            got = next(pulls, None)  # whole groups, as soon as k samples' worth are scored
            counts.count("time/reward_wait_s", time.perf_counter() - t0)
            if got is None:
                break
            mb = rollout.batch.select(got[0]).with_rewards(got[1])
            arrived.append(mb)
            scored = with_failure_policy(mb, cfg.reward)  # the one place the failure policy is applied
            kept = keep(scored, counts) if keep is not None else scored
            if kept is None:
                continue
            buffered.append(kept)
            if sum(len(b) for b in buffered) >= (k or 1) and (k or keep is None):
                yield Scored.concat(buffered)
                buffered = []
        rollout = None
        if keep is not None and not keep.full and extra < ds.max_extra_batches:
            extra += 1
            counts.count("sampling/extra_batches", 1)
            rollout = refill(extra)
            counts.add_times(rollout.times)
    if keep is not None:
        counts.count("sampling/kept_groups", keep.kept)
    if buffered:
        yield Scored.concat(buffered)
