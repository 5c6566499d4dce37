"""Per-run intervals (bayesurl.stats.intervals) against independent references.

Coverage by simulation (synthetic scores with a known AUROC and a known R@1 rate, 1,000 draws
at n = 200 and n = 5,000), DeLong's variance against a brute-force bootstrap of scikit-learn's
AUROC, the Wilson interval against scipy's, each weighted statistic at integer weights against
the functional metric on the duplicated queries, and hypothesis properties (the interval holds
its estimate, narrows with n, and the AUROCs' do not move under a monotone transform of u).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom, binomtest, norm, rankdata
from sklearn.metrics import roc_auc_score

from bayesurl.evaluation import evaluate
from bayesurl.evaluation import functional as Fm
from bayesurl.evaluation.table import Metric, register_metric, unregister_metric
from bayesurl.stats.intervals import (
    Interval,
    IntervalMethod,
    Resample,
    auroc_interval,
    delong,
    fisher_z_interval,
    flat_intervals,
    intervals_of,
    paired_bootstrap,
    poisson_weights,
    read_interval,
    weighted_auroc,
    weighted_average_precision,
    weighted_ece,
    weighted_mean,
    weighted_sparsification,
    wilson_interval,
)

DRAWS = 1000


def _coverage(n: int, kind: str, seed: int) -> float:
    """Share of DRAWS data sets whose 95 % interval holds the truth. Each draw has its own
    truth: an R@1 rate ``p ~ U[0.7, 0.9]`` and an AUROC ``a ~ U[0.5, 0.85]``; u of the
    positives ~ N(delta, 1), of the negatives ~ N(0, 1), ``a = Phi(delta / sqrt 2)``.
    R@1: n queries right with probability p (Wilson); R-AUROC: the same queries, positives
    the wrong ones (DeLong); OOD AUROC: n in-distribution inputs against n / 2 OOD ones."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(DRAWS):
        p, auc = rng.uniform(0.7, 0.9), rng.uniform(0.5, 0.85)
        delta = math.sqrt(2.0) * norm.ppf(auc)
        right = rng.random(n) < p
        if kind == "r@1":
            lo, hi = wilson_interval(int(right.sum()), n)
            hits += lo <= p <= hi
            continue
        if kind == "ood_auroc":
            pos, neg = rng.normal(delta, 1, n // 2), rng.normal(0, 1, n)
        else:
            u = rng.normal(0, 1, n) + delta * ~right
            pos, neg = u[~right], u[right]
        _, lo, hi = auroc_interval(pos, neg)
        hits += lo <= auc <= hi
    return hits / DRAWS


@pytest.mark.parametrize("n", [200, 5000])
def test_coverage_of_the_95_intervals(n):
    """R@1, R-AUROC (20-60 wrong retrievals of 200) and OOD AUROC: the 95 % intervals cover
    the truth in 93-97 % of 1,000 draws."""
    for kind in ("r@1", "r_auroc", "ood_auroc"):
        cov = _coverage(n, kind, seed=n)
        assert 0.93 <= cov <= 0.97, (kind, n, cov)


@pytest.mark.parametrize("n", [200, 5000])
def test_exact_coverage_of_wilson(n):
    """Wilson's coverage summed over the binomial (scipy), no simulation noise: within 93-97 %
    at every R@1 rate from 0.5 to 0.97 in steps of 0.01."""
    ks = np.arange(n + 1)
    iv = np.array([wilson_interval(int(k), n) for k in ks])
    for p in np.arange(0.5, 0.971, 0.01):
        cov = binom.pmf(ks, n, p)[(iv[:, 0] <= p) & (p <= iv[:, 1])].sum()
        assert 0.93 <= cov <= 0.97, (n, p, cov)


def test_delong_variance_matches_a_bootstrap_of_sklearn():
    rng = np.random.default_rng(0)
    n = 1000
    right = rng.random(n) < 0.8
    u = rng.normal(0, 1, n) + 0.4 * ~right
    _, var = delong(u[~right], u[right])
    idx = rng.integers(0, n, (4000, n))  # resampled queries, AUROC from scipy's midranks
    pos = ~right[idx]
    m = pos.sum(axis=1)
    ranks = rankdata(u[idx], axis=1)
    boot = ((ranks * pos).sum(axis=1) - m * (m + 1) / 2) / (m * (n - m))
    assert roc_auc_score(~right[idx[0]], u[idx[0]]) == pytest.approx(boot[0], abs=1e-12)
    assert np.var(boot, ddof=1) == pytest.approx(var, rel=0.10)


def test_delong_auroc_is_sklearns_with_ties():
    rng = np.random.default_rng(1)
    pos, neg = np.round(rng.normal(0.5, 1, 70), 1), np.round(rng.normal(0, 1, 90), 1)
    a, _ = delong(pos, neg)
    want = roc_auc_score(np.r_[np.ones(70), np.zeros(90)], np.r_[pos, neg])
    assert a == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (170, 200), (200, 200), (1, 1)])
def test_wilson_is_scipys(k, n):
    want = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson_interval(k, n)
    assert (lo, hi) == pytest.approx((want.low, want.high), abs=1e-12)


def test_fisher_z_interval():
    rho, n = 0.4, 100
    se = math.sqrt((1 + rho**2 / 2) / (n - 3))
    z = norm.ppf(0.975)
    want = (math.tanh(math.atanh(rho) - z * se), math.tanh(math.atanh(rho) + z * se))
    assert fisher_z_interval(rho, n) == pytest.approx(want, abs=1e-12)
    assert fisher_z_interval(0.3, 3) == (-1.0, 1.0)


def test_poisson_weights_are_poisson_and_seeded():
    w = np.concatenate(list(poisson_weights(5000, 40, seed=3)))
    assert w.shape == (40, 5000) and w.dtype == np.float32
    counts = np.bincount(w.astype(int).ravel(), minlength=6)[:6] / w.size
    want = [math.exp(-1) / math.factorial(k) for k in range(6)]
    assert counts == pytest.approx(want, abs=2e-3)
    again = np.concatenate(list(poisson_weights(5000, 40, seed=3)))
    assert np.array_equal(w, again)
    other = np.concatenate(list(poisson_weights(5000, 40, seed=4)))
    assert not np.array_equal(w, other)


# --------------------------------------------------------------------------- weighted statistics
@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 300), seed=st.integers(0, 10_000), ties=st.booleans())
def test_weighted_statistics_are_the_metrics_of_the_duplicated_queries(n, seed, ties):
    """Integer weights w: each statistic equals the functional metric on the data with query i
    repeated w_i times (the resample the weights stand for); all-ones weights: the metric."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=n)
    if ties:
        u = np.round(u)
    c = rng.random(n) < 0.6
    conf = rng.integers(0, 11, n) / 10
    for w in (np.ones(n), rng.poisson(1.0, n).astype(float)):
        rep = np.repeat(np.arange(n), w.astype(int))
        if rep.size < 2 or c[rep].all() or not c[rep].any():
            continue
        tu, tc = torch.tensor(u[rep]), torch.tensor(c[rep])
        got = weighted_sparsification(u, c)(w[None].astype(np.float32))
        assert got["ausc"][0] == pytest.approx(float(Fm.ausc(tu, tc)), abs=1e-12)
        assert got["ause"][0] == pytest.approx(float(Fm.ause(tu, tc)), abs=1e-12)
        assert weighted_auroc(u, ~c)(w[None])[0] == pytest.approx(
            roc_auc_score(~c[rep], u[rep]), abs=1e-12
        )
        assert weighted_average_precision(u, ~c)(w[None])[0] == pytest.approx(
            float(Fm.average_precision(tu, ~tc)), abs=1e-12
        )
        ece = Fm.calibration_bins(torch.tensor(conf[rep]), tc, 10).ece
        assert weighted_ece(conf, c, 10)(w[None])[0] == pytest.approx(float(ece), abs=1e-12)
        assert weighted_mean(conf)(w[None])[0] == pytest.approx(conf[rep].mean(), abs=1e-12)


# --------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None)
@given(
    n_pos=st.integers(2, 60),
    n_neg=st.integers(2, 60),
    shift=st.floats(-2, 2),
    seed=st.integers(0, 10_000),
)
def test_auroc_interval_holds_estimate_narrows_and_ignores_monotone_maps(n_pos, n_neg, shift, seed):
    rng = np.random.default_rng(seed)
    pos, neg = rng.normal(shift, 1, n_pos), rng.normal(0, 1, n_neg)
    a, lo, hi = auroc_interval(pos, neg)
    assert 0 <= lo <= a <= hi <= 1
    # a monotone map of u leaves every rank, hence the interval, where it was
    for f in (np.exp, lambda x: 3 * x + 1, np.arctan):
        assert auroc_interval(f(pos), f(neg)) == pytest.approx((a, lo, hi), abs=1e-12)
    if 0 < a < 1:  # four times the data, the same AUROC: a narrower interval
        _, lo4, hi4 = auroc_interval(np.tile(pos, 4), np.tile(neg, 4))
        assert hi4 - lo4 < hi - lo


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 500), frac=st.floats(0, 1))
def test_wilson_holds_estimate_and_narrows(n, frac):
    k = round(frac * n)
    lo, hi = wilson_interval(k, n)
    assert 0 <= lo <= k / n <= hi <= 1
    lo4, hi4 = wilson_interval(4 * k, 4 * n)
    assert hi4 - lo4 < hi - lo


@settings(max_examples=15, deadline=None)
@given(n=st.integers(20, 300), seed=st.integers(0, 10_000))
def test_evaluate_intervals_hold_their_estimates_and_ignore_monotone_maps_of_u(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4
    x = torch.randn(n, 6, generator=g, dtype=torch.float64) + torch.nn.functional.one_hot(y, 6)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    ood = torch.rand(n // 2, generator=g, dtype=torch.float64) + 0.2
    kw = dict(ood_uncertainties=ood, replicates=200)
    res = evaluate(x, y, uncertainties=u, **kw)
    for key, iv in res["intervals"].items():
        assert iv.low <= res[key] <= iv.high, (key, iv, res[key])
    moved = evaluate(x, y, uncertainties=torch.exp(3 * u), ood_uncertainties=torch.exp(3 * ood),
                     replicates=200)  # fmt: skip
    for key in ("r_auroc", "ood_auroc", "ausc", "ause"):
        if key in res["intervals"]:
            assert moved["intervals"][key] == pytest.approx(res["intervals"][key]), key


def test_bootstrap_interval_narrows_with_n():
    rng = np.random.default_rng(0)
    v = rng.random(200)
    est = float(v.mean())
    small = intervals_of({"m": _mean_resample(v)}, {"m": est})["m"]
    big = intervals_of({"m": _mean_resample(np.tile(v, 16))}, {"m": est})["m"]
    assert big.high - big.low < 0.5 * (small.high - small.low)
    # and matches the normal interval of a mean within the bootstrap's own noise
    se = v.std(ddof=1) / math.sqrt(v.size)
    assert small.high - small.low == pytest.approx(2 * 1.96 * se, rel=0.1)


def test_threads_give_the_same_intervals():
    rng = np.random.default_rng(0)
    n = 30_000  # several blocks of replicates
    u, c = rng.normal(size=n), rng.random(n) < 0.7
    ev = {"ausc": Resample(n, weighted_sparsification(u, c)), "m": _mean_resample(u)}
    est = {"ausc": 0.7, "m": float(u.mean())}
    one = intervals_of(ev, est, replicates=300)
    assert intervals_of(ev, est, replicates=300, workers=3) == one
    # (and at this size the sparsification's blocks are of 64 units: still the exact metric)
    ones = np.ones((1, n), np.float32)
    got = ev["ausc"].statistic(ones)["ausc"][0]
    assert got == pytest.approx(float(Fm.ausc(torch.tensor(u), torch.tensor(c))), abs=1e-12)


def _mean_resample(v):
    return Resample(v.size, weighted_mean(v))


# --------------------------------------------------------------------------- the evaluator
def _case(n=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 5
    x = torch.randn(n, 8, generator=g) + 1.2 * torch.nn.functional.one_hot(y, 8)
    u = torch.rand(n, generator=g)
    s = x[None] + 0.4 * torch.randn(6, n, 8, generator=g)
    return x, y, u, s


def test_every_declared_metric_gets_its_interval_and_the_seed_fixes_them():
    x, y, u, s = _case()
    ood = torch.rand(150) + 0.1
    res = evaluate(x, y, uncertainties=u, samples=s, ood_uncertainties=ood,
                   reference_uncertainties=u + torch.rand(400))  # fmt: skip
    methods = {k: iv.method for k, iv in res["intervals"].items()}
    assert methods == {
        "r@1": "wilson", "recall@1": "wilson", "recall@5": "wilson", "recall@10": "wilson",
        "r_auroc": "delong", "ausc": "bootstrap", "ause": "bootstrap", "aurc": "bootstrap",
        "augrc": "bootstrap", "rank_correlation": "fisher_z", "ece": "bootstrap",
        "ood_auroc": "delong", "ood_auprc": "logit", "map@1": "bootstrap", "map@5": "bootstrap",
        "map@10": "bootstrap",
    }  # fmt: skip
    assert res["intervals"]["ood_auroc"].n == 550
    assert res["intervals"]["ood_auroc"].over == "queries and OOD inputs"
    assert all(iv.level == 0.95 and iv.n >= 400 for iv in res["intervals"].values())
    again = evaluate(x, y, uncertainties=u, samples=s, ood_uncertainties=ood,
                     reference_uncertainties=u + torch.rand(400))  # fmt: skip
    assert again["intervals"]["ece"] == res["intervals"]["ece"]
    other = evaluate(x, y, uncertainties=u, samples=s, interval_seed=1)
    assert other["intervals"]["ece"] != res["intervals"]["ece"]
    assert other["intervals"]["r_auroc"] == res["intervals"]["r_auroc"]  # closed form
    wider = evaluate(x, y, uncertainties=u, level=0.99)["intervals"]["r@1"]
    iv = res["intervals"]["r@1"]
    assert wider.low < iv.low and wider.high > iv.high and wider.level == 0.99
    off = evaluate(x, y, uncertainties=u, intervals=False)
    assert off["intervals"] == {} and off["r@1"] == res["r@1"]


@pytest.mark.parametrize(
    "kw, arg",
    [
        ({"level": 1.5}, "`level`"),
        ({"level": True}, "`level`"),
        ({"replicates": 5}, "`replicates`"),
        ({"replicates": 100.0}, "`replicates`"),
        ({"interval_seed": -1}, "`interval_seed`"),
        ({"intervals": "yes"}, "`intervals`"),
    ],
)
def test_interval_options_are_checked_when_built(kw, arg):
    from bayesurl.evaluation import Evaluator

    with pytest.raises(ValueError, match=arg):
        Evaluator(**kw)


def test_a_metric_that_declares_an_interval_must_keep_its_evidence():
    def compute(ctx):
        return {"lonely": 0.5}

    register_metric(
        Metric("lonely", lambda o: ("lonely",), (), compute, interval=IntervalMethod.WILSON)
    )
    try:
        x, y, u, _ = _case(60)
        with pytest.raises(TypeError, match="declares a wilson interval for 'lonely'"):
            evaluate(x, y, include=["lonely"])
    finally:
        unregister_metric("lonely")


def test_result_is_a_dict_with_caveats_and_flat_records():
    x, y, u, _ = _case()
    res = evaluate(x, y, uncertainties=u)
    assert isinstance(res, dict) and dict(res) == res
    assert [n.kind for n in res.caveats] == ["chance_r_auroc"]  # random u
    assert res.intervals is res["intervals"]
    flat = flat_intervals(res["intervals"])
    assert flat["r_auroc_interval"] == "delong" and flat["r_auroc_n"] == 400
    assert flat["interval_level"] == 0.95
    back = read_interval(flat, "r_auroc")
    assert back == res["intervals"]["r_auroc"]
    assert (
        read_interval({"intervals": {"r@1": res["intervals"]["r@1"]._asdict()}}, "r@1")
        == (res["intervals"]["r@1"])
    )
    assert read_interval({}, "r@1") is None
    iv = res["intervals"]["r@1"]
    assert isinstance(iv, Interval) and iv.describe() == "95 % Wilson interval over 400 queries"


def test_paired_bootstrap_separates_only_real_differences():
    rng = np.random.default_rng(0)
    n = 1000
    c = rng.random(n) < 0.8
    good = rng.normal(0, 1, n) + 1.0 * ~c  # R-AUROC about 0.76
    worse = rng.normal(0, 1, n) + 0.2 * ~c  # about 0.56
    twin = good + 1e-3 * rng.normal(0, 1, n)  # nearly the same ranking
    a, b, t = (weighted_auroc(v, ~c) for v in (good, worse, twin))
    sep = paired_bootstrap(lambda w: a(w[0]), lambda w: b(w[0]), [n], replicates=500)
    assert sep["low"] > 0 and sep["p"] < 0.01
    same = paired_bootstrap(lambda w: a(w[0]), lambda w: t(w[0]), [n], replicates=500)
    assert same["low"] <= 0 <= same["high"] and same["p"] > 0.05


def test_the_docs_example_metric_declares_its_interval_once():
    """The registration of docs/concepts/metrics.rst: a bootstrap interval of a per-query mean,
    declared on the entry, shown by every display with no further change."""
    from bayesurl.evaluation.table import Column, Need

    def precision_at_2(ctx):
        per_query = ctx.shards.gather(ctx.hits[:, :2].double().mean(dim=1))
        ctx.keep("precision@2", Resample(ctx.n, weighted_mean(per_query.cpu().numpy())))
        return {"precision@2": float(per_query.mean())}

    register_metric(Metric("precision@2", lambda options: ("precision@2",), (Need.NEIGHBOURS,),
                           precision_at_2, neighbours=lambda ctx: 2,
                           columns=(Column("precision@2", "P@2", digits=3),),
                           interval=IntervalMethod.BOOTSTRAP))  # fmt: skip
    try:
        x, y, u, _ = _case()
        res = evaluate(x, y, uncertainties=u)
        iv = res["intervals"]["precision@2"]
        assert iv.method == "bootstrap" and iv.low <= res["precision@2"] <= iv.high
        assert "P@2 " in res.describe()
    finally:
        unregister_metric("precision@2")
