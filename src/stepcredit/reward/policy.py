"""What the trainer does with results that are not real verdicts, and the reward metrics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepcredit.config import RewardConfig
from stepcredit.types import RewardResult, Status

if TYPE_CHECKING:
    import torch


def apply_failure_policy(
    results: Sequence[RewardResult], group_B: Any, cfg: RewardConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores and masks for a batch of results under ``cfg.failure_policy`` (per source:
    ``cfg.failure_policy_by_source``).

    Returns ``score_B`` (float32), ``valid_B`` (bool: counts in the loss and in group baselines) and
    ``keep_B`` (bool: False for every response of a group dropped by ``drop_group``). A real verdict
    (``ok`` or ``unparseable``) keeps its score. A failed one (timeout, error, sandbox error) is, by
    policy: ``mask`` score 0 and not valid; ``score`` ``cfg.failure_score`` and valid; ``drop_group``
    not valid and its whole group not kept.
    """
    import torch

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
        policy = cfg.failure_policy_by_source.get(r.source, cfg.failure_policy)
        if policy == "score":
            score_B[i] = cfg.failure_score
        else:
            valid_B[i] = False
            if policy == "drop_group":
                dropped.add(int(group[i]))
    keep_B = torch.ones(B, dtype=torch.bool)
    if dropped:
        keep_B = ~torch.isin(group, torch.tensor(sorted(dropped), dtype=torch.long))
    return score_B, valid_B & keep_B, keep_B


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
