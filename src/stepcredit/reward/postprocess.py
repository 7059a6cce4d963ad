"""Reward post-processing between scoring and the estimator.

1. The failure policy: what results that are not real verdicts become (:func:`apply_failure_policy`,
   applied once per scored sub-batch as it arrives: :func:`with_failure_policy` gives the
   :class:`Scored` mini-batch every later step reads), and the reward metrics.
2. Per-domain processing of outcome scores before the estimator, and dynamic sampling's group filter.

Order per domain (each step optional, :class:`~stepcredit.config.OutcomeProcessConfig`): mask
truncated responses, normalise ``(s - mean) / (std + eps)`` with mean and std each from the batch, the
group, running statistics or none, clip to ``[-clip, clip]``, scale. Statistics are over valid
scores only (a masked response never moves a baseline); stds are population stds. Running
statistics are exact cumulative moments per domain (Welford), updated with the batch's valid scores
before they are used (as ROLL's ``RunningMoments``), and saved in checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from stepcredit.config import OutcomeProcessConfig, PostprocessConfig, RewardConfig
from stepcredit.config.reward import FAILURE_POLICIES
from stepcredit.types import Batch, RewardResult, Status


class Verdicts(NamedTuple):
    """The failure policy's reading of a batch of reward results (unpacks as a 3-tuple)."""

    score_B: torch.Tensor
    """float32 scores: a real verdict's own, a failed one's by policy."""
    valid_B: torch.Tensor
    """bool: counts in the loss and in group baselines."""
    keep_B: torch.Tensor
    """bool: False for every response of a group dropped by ``drop_group``."""


def apply_failure_policy(results: Sequence[RewardResult], group_B: Any, cfg: RewardConfig) -> Verdicts:
    """Scores and masks for a batch of results under ``cfg.failure_policy`` (per source:
    ``cfg.failure_policy_by_source``).

    Returns ``score_B`` (float32), ``valid_B`` (bool: counts in the loss and in group baselines) and
    ``keep_B`` (bool: False for every response of a group dropped by ``drop_group``). A real verdict
    (``ok`` or ``unparseable``) keeps its score. A failed one (timeout, error, sandbox error) is, by
    policy: ``mask`` score 0 and not valid; ``score`` ``cfg.failure_score`` and valid; ``drop_group``
    not valid and its whole group not kept.
    """
    group = torch.as_tensor(group_B, dtype=torch.long).reshape(-1)
    B = len(results)
    if group.numel() != B:
        raise ValueError(f"group_B has {group.numel()} entries for {B} results")
    score_B = torch.zeros(B, dtype=torch.float32)
    valid_B = torch.ones(B, dtype=torch.bool)
    dropped: set[int] = set()
    for i, r in enumerate(results):
        if r.ok:
            score_B[i] = r.score
            continue
        policy = FAILURE_POLICIES[cfg.failure_policy_by_source.get(r.source, cfg.failure_policy)]
        if policy.scored:
            score_B[i] = cfg.failure_score
        else:
            valid_B[i] = False
        if policy.drops_group:
            dropped.add(int(group[i]))
    keep_B = torch.ones(B, dtype=torch.bool)
    if dropped:
        keep_B = ~torch.isin(group, torch.tensor(sorted(dropped), dtype=torch.long))
    return Verdicts(score_B, valid_B & keep_B, keep_B)


@dataclass(frozen=True)
class Scored:
    """A sub-batch of whole scored groups with the failure policy's verdicts, which are computed once,
    when its rewards arrive (:func:`with_failure_policy`), and read by every later step (dynamic
    sampling's filter, the reward channels)."""

    batch: Batch
    verdicts: Verdicts
    """Per response of ``batch``."""

    def __len__(self) -> int:
        return len(self.batch)

    def select(self, idx: list[int]) -> Scored:
        """The responses ``idx`` (in that order) with their verdicts."""
        index = torch.as_tensor(idx, dtype=torch.long)
        return Scored(self.batch.select(idx), Verdicts(*(x.index_select(0, index) for x in self.verdicts)))

    @staticmethod
    def concat(parts: list[Scored]) -> Scored:
        """Several scored sub-batches as one (see :meth:`Batch.concat`)."""
        if len(parts) == 1:
            return parts[0]
        cols = zip(*(p.verdicts for p in parts), strict=True)
        return Scored(Batch.concat([p.batch for p in parts]), Verdicts(*(torch.cat(list(c)) for c in cols)))


def with_failure_policy(batch: Batch, cfg: RewardConfig) -> Scored:
    """``batch`` (its ``rewards`` filled) with the verdicts of :func:`apply_failure_policy`."""
    if batch.rewards is None:
        raise ValueError("with_failure_policy: the batch has no reward results")
    return Scored(batch, apply_failure_policy(batch.rewards, batch.group_B, cfg))


def _percentile(sorted_xs: list[float], q: float) -> float:
    # Nearest-rank percentile (the smallest value with at least q% of the data at or below it).
    k = max(0, math.ceil(q / 100.0 * len(sorted_xs)) - 1)
    return sorted_xs[k]


def reward_metrics(results: Sequence[RewardResult]) -> dict[str, float]:
    """Per reward source: ``reward/<source>/status/<status>`` counts (every status, zeros included),
    ``count``, ``score_mean`` over real verdicts, and ``latency_p50_ms`` / ``latency_p95_ms`` /
    ``latency_max_ms``."""
    by_source: dict[str, list[RewardResult]] = {}
    for r in results:
        by_source.setdefault(r.source or "unknown", []).append(r)
    out: dict[str, float] = {}
    for src, rs in sorted(by_source.items()):
        p = f"reward/{src}/"
        out[p + "count"] = float(len(rs))
        for st in Status:
            out[f"{p}status/{st.value}"] = float(sum(r.status == st for r in rs))
        scores = [r.score for r in rs if r.ok]
        if scores:
            out[p + "score_mean"] = sum(scores) / len(scores)
        lat = sorted(r.latency_s * 1000.0 for r in rs)
        out[p + "latency_p50_ms"] = _percentile(lat, 50)
        out[p + "latency_p95_ms"] = _percentile(lat, 95)
        out[p + "latency_max_ms"] = lat[-1]
    return out


class RunningStats:
    """Cumulative count, mean and M2 of every valid outcome score seen, per domain (Welford 1962)."""

    def __init__(self) -> None:
        self.stats: dict[str, tuple[int, float, float]] = {}

    def update(self, domain: str, x: torch.Tensor) -> None:
        n, mean, m2 = self.stats.get(domain, (0, 0.0, 0.0))
        for v in x.double().tolist():
            n += 1
            d = v - mean
            mean += d / n
            m2 += d * (v - mean)
        self.stats[domain] = (n, mean, m2)

    def mean_std(self, domain: str) -> tuple[float, float]:
        """(mean, population std) of ``domain``; (0, 1) before any score was seen."""
        n, mean, m2 = self.stats.get(domain, (0, 0.0, 0.0))
        if n == 0:
            return 0.0, 1.0
        return mean, math.sqrt(m2 / n)

    def state_dict(self) -> dict[str, Any]:
        return {d: list(v) for d, v in self.stats.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats = {d: (int(v[0]), float(v[1]), float(v[2])) for d, v in state.items()}


def _group_mean_std(
    score_B: torch.Tensor, valid_B: torch.Tensor, group_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per response, the (mean, population std) of its group's valid scores (0, 0 for no valid member)."""
    _, gid = torch.unique(group_B, return_inverse=True)
    k = int(gid.max()) + 1 if gid.numel() else 0
    w = valid_B.double()
    x = torch.where(valid_B, score_B.double(), torch.zeros((), dtype=torch.float64))
    cnt = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, w).clamp(min=1)
    mean = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, x) / cnt
    dev = (x - mean[gid]) * w
    var = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, dev * dev) / cnt
    return mean[gid], var.sqrt()[gid]


def normalize_outcomes(
    score_B: torch.Tensor,
    valid_B: torch.Tensor,
    group_B: torch.Tensor,
    *,
    mean: str,
    std: str,
    eps: float,
    running: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """``(s - mu) / (sigma + eps)`` with mu and sigma each from ``batch`` (valid scores of these
    responses), ``group`` (valid scores of the response's group), ``running`` (the given moments) or
    ``none`` (mu = 0, sigma = 1 with no eps). Invalid responses get 0."""
    x = score_B.double()
    if not bool(valid_B.any()):
        return torch.zeros_like(score_B)
    v = x[valid_B]
    g_mean, g_std = _group_mean_std(score_B, valid_B, group_B) if "group" in (mean, std) else (x, x)
    mu = {
        "batch": v.mean().expand_as(x),
        "group": g_mean,
        "running": torch.full_like(x, running[0]),
        "none": torch.zeros_like(x),
    }
    sigma = {  # the divisor, eps included; ``none`` divides by exactly 1
        "batch": v.std(unbiased=False).expand_as(x) + eps,
        "group": g_std + eps,
        "running": torch.full_like(x, running[1]) + eps,
        "none": torch.ones_like(x),
    }
    out = (x - mu[mean]) / sigma[std]
    return torch.where(valid_B, out, torch.zeros_like(out)).to(score_B.dtype)


def is_noop(c: OutcomeProcessConfig) -> bool:
    """True when ``c`` leaves scores and masks as they are."""
    return not c.mask_truncated and c.mean == c.std == "none" and c.clip == 0 and c.scale == 1.0


def process_outcomes(
    score_B: torch.Tensor,
    valid_B: torch.Tensor,
    *,
    group_B: torch.Tensor,
    domain_B: list[str],
    truncated_B: torch.Tensor,
    cfg: PostprocessConfig,
    eps: float,
    running: RunningStats,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(score_B, valid_B) after each domain's masking, normalisation, clipping and scaling."""
    score_B, valid_B = score_B.clone(), valid_B.clone()
    for d in dict.fromkeys(domain_B):
        c = cfg.for_domain(d)
        if is_noop(c):
            continue
        rows = torch.tensor([x == d for x in domain_B], dtype=torch.bool)
        if c.mask_truncated:
            valid_B &= ~(rows & truncated_B.bool())
        s, v = score_B[rows], valid_B[rows]
        if "running" in (c.mean, c.std):
            running.update(d, s[v])
        s = normalize_outcomes(
            s, v, group_B[rows], mean=c.mean, std=c.std, eps=eps, running=running.mean_std(d)
        )
        if c.clip > 0:
            s = s.clamp(-c.clip, c.clip)
        score_B[rows] = s * c.scale
    return score_B, valid_B


def zero_signal_groups(
    score_B: torch.Tensor,
    valid_B: torch.Tensor,
    group_B: torch.Tensor,
    *,
    criterion: str,
    mean_low: float = 0.0,
    mean_high: float = 1.0,
) -> set[int]:
    """Group ids to drop: ``std`` -> every valid score of the group is equal (or none is valid);
    ``mean_bounds`` -> the group's mean valid score is not strictly inside (mean_low, mean_high)."""
    by_group: dict[int, list[float]] = {}
    for g, s, ok in zip(group_B.tolist(), score_B.tolist(), valid_B.tolist(), strict=True):
        by_group.setdefault(int(g), [])
        if ok:
            by_group[int(g)].append(float(s))
    no_signal = _NO_SIGNAL[criterion]
    return {g for g, xs in by_group.items() if not xs or no_signal(xs, mean_low, mean_high)}


_NO_SIGNAL: dict[str, Callable[[list[float], float, float], bool]] = {
    "std": lambda xs, low, high: max(xs) - min(xs) <= 1e-9,
    "mean_bounds": lambda xs, low, high: not low < sum(xs) / len(xs) < high,
}
"""``postprocess.dynamic_sampling.criterion`` -> whether a group's valid scores (xs, not empty) carry
no signal, given (mean_low, mean_high)."""
