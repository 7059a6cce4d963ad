"""The experiment summary's statistics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from stepcredit.recipes.stats import (
    holm,
    incomplete_beta,
    paired_t,
    t_quantile,
    t_two_sided_p,
    trapezoid_mean,
)


def test_t_distribution_by_hand() -> None:
    # df = 1 is the Cauchy distribution: P(|T| >= t) = 1 - 2 atan(t) / pi; at t = 1: 0.5
    assert t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)
    assert t_two_sided_p(3.0, 1) == pytest.approx(1 - 2 * math.atan(3.0) / math.pi, abs=1e-12)
    # df = 2 has a closed form: P(|T| >= t) = 1 - t / sqrt(2 + t^2); at t = 2: 1 - 2 / sqrt(6) = 0.18350
    assert t_two_sided_p(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6), abs=1e-12)
    # the table value t_(0.975, 15) = 2.131 (16 seeds); t_(0.975, 7) = 2.365; large df -> 1.960
    assert t_quantile(0.975, 15) == pytest.approx(2.1314, abs=1e-4)
    assert t_quantile(0.975, 7) == pytest.approx(2.3646, abs=1e-4)
    assert t_quantile(0.975, 100_000) == pytest.approx(1.95997, abs=1e-4)
    # I_x(1, 1) = x (the uniform distribution's CDF); I_x(a, b) = 1 - I_(1-x)(b, a)
    assert incomplete_beta(1.0, 1.0, 0.3) == pytest.approx(0.3, abs=1e-12)
    assert incomplete_beta(2.5, 0.5, 0.7) == pytest.approx(1 - incomplete_beta(0.5, 2.5, 0.3), abs=1e-12)
    assert t_two_sided_p(0.0, 5) == pytest.approx(1.0) and t_two_sided_p(math.inf, 5) == 0.0


def test_t_distribution_against_tabulated_values() -> None:
    # scipy.stats.t.sf(2.0, 4) * 2 = 0.11611652351681556; t.ppf(0.975, 4) = 2.7764451051977987,
    # t.ppf(0.975, 7) = 2.3646242510102993
    assert t_two_sided_p(2.0, 4) == pytest.approx(0.11611652351681556, rel=1e-9)
    assert t_two_sided_p(-2.0, 4) == pytest.approx(0.11611652351681556, rel=1e-9)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764451051977987, rel=1e-9)
    assert t_quantile(0.975, 7) == pytest.approx(2.3646242510102993, rel=1e-9)


def test_paired_t_by_hand() -> None:
    # d = (1, 2, 3, 3): mean 2.25, sd = sqrt(((-1.25)^2 + (-0.25)^2 + 0.75^2 + 0.75^2) / 3) = sqrt(2.75 / 3)
    # = 0.9574, se = 0.9574 / 2 = 0.4787, t = 4.700, df = 3; t_(0.975, 3) = 3.1824
    r = paired_t([1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 1.0])
    se = math.sqrt(2.75 / 3) / 2
    assert r["n"] == 4 and r["df"] == 3
    assert r["mean_diff"] == pytest.approx(2.25) and r["se"] == pytest.approx(se)
    assert r["t"] == pytest.approx(2.25 / se)
    assert r["ci95"][0] == pytest.approx(2.25 - 3.18245 * se, abs=1e-4)
    assert r["ci95"][1] == pytest.approx(2.25 + 3.18245 * se, abs=1e-4)
    # the same p as the t distribution's two tails (scipy.stats.ttest_rel gives 0.018220)
    assert r["p"] == pytest.approx(0.018220, abs=1e-5)
    # no spread: an infinite t and p = 0 when the mean is not 0, NaN when it is; too few pairs: NaN
    assert paired_t([1.0, 1.0], [0.0, 0.0])["p"] == 0.0
    assert math.isnan(paired_t([1.0, 1.0], [1.0, 1.0])["t"])
    assert math.isnan(paired_t([1.0], [0.0])["p"])
    with pytest.raises(ValueError, match="paired_t"):
        paired_t([1.0], [0.0, 1.0])


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04, 0.5 with m = 4: 4 x 0.01 = 0.04; 3 x 0.03 = 0.09; 2 x 0.04 = 0.08 -> kept
    # at the running maximum 0.09; 1 x 0.5 = 0.5 (in the input's order)
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    out = holm([0.02, float("nan")])  # a NaN does not count in m
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1])


def test_trapezoid_mean_by_hand() -> None:
    # points 0, 1, 1 equally spaced: area (0 + 1) / 2 + (1 + 1) / 2 = 1.5 over a range of 2: 0.75
    assert trapezoid_mean([0.0, 1.0, 1.0]) == pytest.approx(0.75)
    assert trapezoid_mean([0.4]) == 0.4
