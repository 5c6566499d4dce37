"""The statistics of repeated runs (bayesurl.stats.comparison) against scipy and
hand-written definitions (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _holm import holm_reference
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from bayesurl.stats.comparison import (
    balanced_partitions,
    bootstrap_interval,
    holm,
    holm_verdicts,
    location_test,
    n_balanced_partitions,
    t_interval,
)


def test_t_interval_matches_scipy():
    x = np.random.default_rng(1).normal(size=7)
    m, lo, hi = t_interval(x, 0.9)
    ref = stats.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert m == pytest.approx(x.mean(), abs=1e-12)
    assert (lo, hi) == pytest.approx(ref, abs=1e-12)
    assert t_interval([0.3], 0.95)[1:] == (-math.inf, math.inf)
    assert t_interval([0.3, 0.3], 0.95) == pytest.approx((0.3, 0.3, 0.3))
    with pytest.raises(ValueError, match="values"):
        t_interval([], 0.95)
    with pytest.raises(ValueError, match="level"):
        t_interval([1.0, 2.0], 1.5)
    with pytest.raises(ValueError, match="NaN"):
        t_interval([1.0, float("nan")])


@given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_holm_matches_definition(p):
    adj = holm(p)
    assert adj == pytest.approx(holm_reference(p), abs=1e-12)
    assert all(a >= x - 1e-15 for a, x in zip(adj, p))


def test_bootstrap_interval_agrees_with_the_t_interval_on_a_large_sample():
    """Reference: scipy's t quantile; for 400 normal values both intervals nearly coincide."""
    x = np.random.default_rng(0).normal(0.3, 1.0, 400)
    lo, hi = bootstrap_interval(x, 0.95)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    assert lo < x.mean() < hi
    assert (hi - lo) == pytest.approx(2 * half, rel=0.1)
    assert bootstrap_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2))
    with pytest.raises(ValueError, match="`values`"):
        bootstrap_interval([])


def test_location_test_is_the_paired_and_the_one_sample_test():
    """Paired differences against 0 give scipy's paired t-test bit for bit; values against a
    value give the one-sample test, its Wilcoxon on the differences."""
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.6, 0.05, 9), rng.normal(0.58, 0.05, 9)
    got = location_test(a - b)
    ref = stats.ttest_rel(a - b, np.zeros(9))
    assert (got["t"], got["p_t"]) == (float(ref.statistic), float(ref.pvalue))
    assert got["p_wilcoxon"] == float(stats.wilcoxon(a - b).pvalue)
    assert (got["mean"], got["low"], got["high"]) == t_interval(a - b)
    got = location_test(a, 0.5, 0.9)
    ref = stats.ttest_1samp(a, 0.5)
    assert got["t"] == pytest.approx(float(ref.statistic), rel=1e-12)
    assert got["p_wilcoxon"] == pytest.approx(float(stats.wilcoxon(a - 0.5).pvalue), rel=1e-12)
    assert (got["low"], got["high"]) == t_interval(a, 0.9)[1:]
    # no spread: the t statistic is undefined, the verdict is not
    assert location_test([0.7, 0.7], 0.5)["t"] == math.inf
    assert location_test([0.5, 0.5], 0.5) == {**location_test([0.5, 0.5], 0.5), "t": 0.0,
                                              "p_t": 1.0, "p_wilcoxon": None}  # fmt: skip
    with pytest.raises(ValueError, match="two or more"):
        location_test([0.1])


def test_holm_verdicts_adjust_over_the_rows_with_a_test():
    rows = {
        "a": {"d": 0.2, "p_t": 0.01, "p_wilcoxon": 0.02},
        "b": {"d": -0.1, "p_t": 0.02, "p_wilcoxon": None},
        "c": {"d": 0.0, "p_t": 0.5, "p_wilcoxon": 0.6},
        "d": {"d": 0.3, "p_t": None, "p_wilcoxon": None},
    }
    holm_verdicts(rows, 0.05, effect="d", words=("up", "down", "same"))
    assert [rows[n]["p_t_holm"] for n in "abcd"] == [*holm_reference([0.01, 0.02, 0.5]), None]
    assert [rows[n]["p_wilcoxon_holm"] for n in "abcd"] == [0.04, None, 0.6, None]
    assert [rows[n]["verdict"] for n in "abcd"] == ["up", "down", "same", None]


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6, 7])
def test_balanced_partitions_are_every_halving_once(k):
    """Reference: every subset of size floor(k/2) with its complement, unordered."""
    import itertools

    units = list(range(10, 10 + k))
    got = balanced_partitions(units)
    ref = set()
    for a in itertools.combinations(units, k // 2):
        b = tuple(u for u in units if u not in a)
        ref.add(frozenset((a, b)) if k % 2 == 0 else (a, b))
    key = (lambda p: frozenset(p)) if k % 2 == 0 else (lambda p: p)
    assert {key(p) for p in got} == ref and len(got) == len(ref) == n_balanced_partitions(k)
