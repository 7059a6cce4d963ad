"""A slow remote reward, simulated: the arith math verifier behind a sleep drawn uniformly from
``[min_s, max_s]`` (training rows only; validation rows are scored at once).

Used by ``benchmarks/async_reward.py`` as a user's function::

    reward.custom.path=benchmarks/_sleepy_reward.py:compute_score
    reward.custom.kwargs={min_s: 0.1, max_s: 4.0}

The sleep is drawn from a generator seeded by the sample's fingerprint (response, ground truth, row
index), so the same response waits as long in every run. The fingerprint is returned in ``info["fp"]``:
the benchmark checks that each result came back to the response it scores.
"""

from __future__ import annotations

import hashlib
import random
import time
from typing import Any

from stepcredit.reward.verifiers.math import math_compute_score
from stepcredit.types import RewardResult


def fingerprint(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None) -> str:
    """Identifies one (row, response) pair."""
    index = (extra_info or {}).get("index", "")
    return hashlib.blake2b(f"{index}\0{ground_truth}\0{solution_str}".encode(), digest_size=8).hexdigest()


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    min_s: float = 0.1,
    max_s: float = 4.0,
    **kwargs: Any,
) -> RewardResult:
    fp = fingerprint(solution_str, ground_truth, extra_info)
    if (extra_info or {}).get("split", "train") == "train":
        time.sleep(random.Random(fp).uniform(min_s, max_s))
    res = math_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    res.info["fp"] = fp
    return res
