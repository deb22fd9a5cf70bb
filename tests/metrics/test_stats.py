"""metrics/stats.py against scipy: Benjamini-Hochberg, Welch's t, the single-case t, empirical p."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from spectral_hooks.metrics.stats import (
    bh_adjust,
    empirical_pvalues,
    single_case_t,
    welch_t,
    with_adjusted,
)


@pytest.mark.parametrize("seed", range(6))
def test_bh_matches_scipy_on_random_families(seed):
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=rng.integers(2, 60)) ** rng.uniform(0.5, 4)
    np.testing.assert_allclose(bh_adjust(p), stats.false_discovery_control(p, method="bh"),
                               rtol=1e-13, atol=0)


def test_bh_with_ties_zeros_and_ones():
    p = np.array([0.01, 0.01, 0.2, 0.2, 0.2, 1.0, 0.0, 0.049, 0.05])
    np.testing.assert_allclose(bh_adjust(p), stats.false_discovery_control(p), rtol=1e-13)
    adj = bh_adjust(p)
    assert adj[0] == adj[1] and adj[2] == adj[3] == adj[4]


def test_bh_one_value_and_empty():
    assert bh_adjust([0.3]).tolist() == [0.3]
    np.testing.assert_allclose(bh_adjust([0.3]), stats.false_discovery_control([0.3]))
    assert bh_adjust([]).shape == (0,)
    assert np.isnan(bh_adjust([np.nan])).all()


def test_bh_nans_are_kept_and_not_counted():
    p = np.array([0.02, np.nan, 0.03, 0.5, np.nan, 0.001])
    adj = bh_adjust(p)
    keep = ~np.isnan(p)
    assert np.isnan(adj[~keep]).all()
    np.testing.assert_allclose(adj[keep], stats.false_discovery_control(p[keep]), rtol=1e-13)


def test_bh_adjusted_never_below_raw_and_monotone():
    p = np.random.default_rng(7).uniform(size=40)
    adj = bh_adjust(p)
    assert (adj >= p - 1e-15).all() and (adj <= 1).all()
    order = np.argsort(p)
    assert (np.diff(adj[order]) >= -1e-15).all()


def test_bh_rejects_values_outside_unit_interval():
    with pytest.raises(ValueError, match="bh_adjust"):
        bh_adjust([0.1, 1.5])
    with pytest.raises(ValueError, match="bh_adjust"):
        bh_adjust([np.inf])


def test_with_adjusted_inserts_after_raw_per_group():
    df = pd.DataFrame({"metric": ["a", "a", "b", "b", "b"],
                       "pvalue": [0.01, 0.04, 0.02, np.nan, 0.9], "x": range(5)})
    out = with_adjusted(df, ["pvalue"], by=["metric"])
    assert list(out.columns) == ["metric", "pvalue", "pvalue_adj", "x"]
    np.testing.assert_allclose(out["pvalue_adj"][:2], stats.false_discovery_control([0.01, 0.04]))
    np.testing.assert_allclose(out["pvalue_adj"][[2, 4]], stats.false_discovery_control([0.02, 0.9]))
    assert np.isnan(out["pvalue_adj"][3])
    whole = with_adjusted(df, ["pvalue"])["pvalue_adj"].to_numpy()
    np.testing.assert_allclose(whole[[0, 1, 2, 4]],
                               stats.false_discovery_control([0.01, 0.04, 0.02, 0.9]))


@pytest.mark.parametrize("seed", range(4))
def test_welch_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(0.3, 1.0, size=rng.integers(2, 12))
    b = rng.normal(0.0, 2.5, size=rng.integers(2, 12))
    t, p, df = welch_t(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    np.testing.assert_allclose([t, p, df], [ref.statistic, ref.pvalue, ref.df], rtol=1e-10)


def test_welch_degenerate_cases_are_nan():
    assert np.isnan(welch_t([1.0], [1.0, 2.0])).all()
    assert np.isnan(welch_t([1.0, 1.0], [2.0, 2.0])).all()


@pytest.mark.parametrize("seed", range(4))
def test_single_case_t_is_the_two_sample_t_with_a_group_of_one(seed):
    """Crawford-Howell = Student's pooled t-test with n1 = 1 (the single value adds no variance)."""
    rng = np.random.default_rng(seed)
    y = rng.normal(size=rng.integers(3, 25))
    x = float(rng.normal(1.0))
    t, p, df = single_case_t(x, y)
    ref = stats.ttest_ind([x], y, equal_var=True)
    np.testing.assert_allclose([t, p, df], [ref.statistic, ref.pvalue, len(y) - 1], rtol=1e-10)


def test_empirical_pvalues_count_the_observation():
    null = np.arange(20, dtype=float)          # 0..19
    g, l, two = empirical_pvalues(25.0, null)  # above every draw
    assert g == 1 / 21 and l == 1.0 and two == 2 / 21
    g, l, two = empirical_pvalues(9.5, null)
    assert g == 11 / 21 and l == 11 / 21 and two == 1.0
    g, _, _ = empirical_pvalues(5.0, null)     # ties count as >= (conservative)
    assert g == (1 + 15) / 21
    assert np.isnan(empirical_pvalues(np.nan, null)).all()
    assert np.isnan(empirical_pvalues(1.0, [np.nan])).all()
