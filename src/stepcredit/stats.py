"""The statistics the reports share: Wilson's interval of a rate, Spearman's rank correlation, the area
under a ROC curve.

Pure functions over plain numbers (no tensors): the probe's verdicts, ``train``'s closing summary and
``sft``'s accuracy line read the same interval.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import NamedTuple


class Interval(NamedTuple):
    """A two-sided confidence interval (a pair: ``lo, hi = interval`` reads it too)."""

    low: float
    """Lower bound."""
    high: float
    """Upper bound."""


def wilson_interval(rate: float, n: int, *, z: float = 1.96) -> Interval:
    """Wilson's score interval for a binomial rate ``rate`` observed on ``n`` trials (Wilson 1927;
    Brown, Cai and DasGupta 2001 recommend it over the normal interval for small n):

        (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)

    95 % at z = 1.96. Unlike p -/+ z sqrt(p(1-p)/n) it stays inside [0, 1] and does not collapse to a
    point at 0 or 1. ``rate`` may be any value in [0, 1] (the probe counts a tie shared by m steps as
    1/m of a hit); for k successes pass ``k / n``. No trials: (nan, nan)."""
    if n <= 0:
        return Interval(float("nan"), float("nan"))
    denom = 1.0 + z * z / n
    centre = (rate + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(rate * (1.0 - rate), 0.0) / n + z * z / (4 * n * n)) / denom
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan for fewer than 2 points or no spread."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(x) < 2:
        return float("nan")
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


def auroc(positive: Sequence[float], negative: Sequence[float]) -> tuple[float, Interval]:
    """The area under the ROC curve of a score that should be higher on ``positive`` than on
    ``negative``: P(score of a positive > score of a negative), a tie counting 1/2 (the Mann-Whitney U
    statistic over n_pos * n_neg), with DeLong's 95 % interval (DeLong, DeLong and Clarke-Pearson 1988),
    which holds with ties (values from K Monte Carlo samples tie often):

        V10_i = mean_j psi(x_i, y_j),  V01_j = mean_i psi(x_i, y_j),  psi = 1 (x > y), 1/2 (x = y), 0
        var(A) = s^2(V10) / n_pos + s^2(V01) / n_neg   (s^2: sample variances)

    clipped to [0, 1]. 0.5 is chance. Either side empty: (nan, (nan, nan)); one of a side: the area
    with a (nan, nan) interval (no variance to estimate)."""
    n_p, n_n = len(positive), len(negative)
    nan = float("nan")
    if n_p == 0 or n_n == 0:
        return nan, Interval(nan, nan)
    neg, pos = sorted(negative), sorted(positive)

    def below(xs: list[float], v: float) -> float:  # how many of the sorted xs are below v, ties 1/2
        lo, hi = bisect.bisect_left(xs, v), bisect.bisect_right(xs, v)
        return lo + 0.5 * (hi - lo)

    v10 = [below(neg, x) / n_n for x in positive]
    v01 = [(n_p - below(pos, y)) / n_p for y in negative]  # positives above y, ties 1/2
    a = sum(v10) / n_p
    if n_p < 2 or n_n < 2:
        return a, Interval(nan, nan)
    s10 = sum((v - a) ** 2 for v in v10) / (n_p - 1)
    s01 = sum((v - a) ** 2 for v in v01) / (n_n - 1)
    half = 1.96 * math.sqrt(s10 / n_p + s01 / n_n)
    return a, Interval(max(0.0, a - half), min(1.0, a + half))
