"""The statistics of an experiment's summary: paired t-tests with their interval, Holm's correction.

Pure functions over lists of floats (no scipy in the core install): Student's t distribution through
the regularised incomplete beta function, evaluated by its continued fraction (Numerical Recipes,
3rd ed., section 6.4, modified Lentz's method), so every figure is recomputable from the lists.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (NR 6.4.5), by the modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for coef in (even, odd):
            d = 1.0 + coef * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + coef / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (NR 6.4.6; the symmetry
    I_x(a, b) = 1 - I_(1-x)(b, a) keeps the continued fraction where it converges fast)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: I_(df / (df + t^2))(df / 2, 1 / 2)
    (NR 6.14.9)."""
    if math.isnan(t):
        return float("nan")
    if math.isinf(t):
        return 0.0
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t: bisection on :func:`t_two_sided_p`, which
    falls monotonically in t (to ~1e-12)."""
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_p(mid, df) > 2 * (1 - q):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def paired_t(arm: Sequence[float], against: Sequence[float]) -> dict[str, Any]:
    """Paired t-test of ``arm - against`` seed by seed (the lists in the same seed order):

        d_i = arm_i - against_i,  mean d,  se = sd(d) / sqrt(n),  t = mean / se,  df = n - 1,
        p = two-sided P(|T_df| >= |t|),  95 % interval mean +- t_(0.975, df) se

    (the numbers of ``scipy.stats.ttest_rel``). A zero spread gives t = +-inf and p = 0 when the mean
    is not 0; fewer than 2 pairs give NaN (written as null)."""
    if len(arm) != len(against):
        raise ValueError(f"paired_t: {len(arm)} values against {len(against)}")
    d = [float(a) - float(b) for a, b in zip(arm, against, strict=True)]
    n = len(d)
    if n < 2:
        nan = float("nan")
        return {"n": n, "mean_diff": d[0] if d else nan, "se": nan, "t": nan, "df": max(0, n - 1),
                "p": nan, "ci95": [nan, nan]}  # fmt: skip
    mean = statistics.fmean(d)
    se = statistics.stdev(d) / math.sqrt(n)
    df = n - 1
    if se == 0:
        t = math.copysign(math.inf, mean) if mean else float("nan")
    else:
        t = mean / se
    half = t_quantile(0.975, df) * se
    return {"n": n, "mean_diff": mean, "se": se, "t": t, "df": df, "p": t_two_sided_p(t, df),
            "ci95": [mean - half, mean + half]}  # fmt: skip


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test
    procedure"): with p_(1) <= ... <= p_(m), p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)); a test is
    rejected at family-wise level alpha when p~ <= alpha. NaN p-values stay NaN and do not count in m."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    m = len(idx)
    out = [float("nan")] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def trapezoid_mean(curve: Sequence[float]) -> float:
    """The area under equally spaced points divided by the x range (the trapezoid rule): the curve's
    mean height over the run, with the two ends weighted half."""
    if len(curve) < 2:
        return float(curve[0]) if curve else float("nan")
    inner = sum(curve[1:-1])
    return (inner + (curve[0] + curve[-1]) / 2) / (len(curve) - 1)
