"""Aggregation of run records against scipy and hand-written loops (float64)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from _holm import holm_reference
from scipy import stats

from bayesurl.stats.comparison import RANDOM_HALVINGS
from bayesurl.sweeps.aggregate import (
    paired_comparison,
    split_half_reproducibility,
    summarize,
)


def _records(n_est=5, n_split=4, n_seed=3, seed=0, with_ece=True):
    rng = np.random.default_rng(seed)
    recs = []
    for e in range(n_est):
        for k in range(n_split):
            for s in range(n_seed):
                recs.append(
                    {
                        "method": "ce" if e == 0 else f"m{e}",
                        "split": k,
                        "seed": s,
                        "r_auroc": 0.5 + 0.03 * e + 0.02 * rng.standard_normal(),
                        "r@1": 0.6 + 0.01 * k + 0.05 * rng.standard_normal(),
                        "ece": float(rng.uniform(0, 0.2)) if with_ece and e % 2 else None,
                        "error": None,
                    }
                )
    return recs


@pytest.mark.parametrize("unit", ["split", "run"])
def test_summarize_against_loops(unit):
    recs = _records()
    recs.append({"method": "m1", "split": 9, "seed": 0, "error": "RuntimeError: x"})
    out = summarize(recs, ["r_auroc", "ece"], level=0.95, unit=unit)
    for name in ["ce", "m1", "m2"]:
        obs = []
        for k in range(4):
            vals = [
                r["r_auroc"]
                for r in recs
                if r["method"] == name and r["split"] == k and r.get("error") is None
            ]
            obs.extend([sum(vals) / len(vals)] if unit == "split" else vals)
        n = len(obs)
        mean = sum(obs) / n
        sd = math.sqrt(sum((o - mean) ** 2 for o in obs) / (n - 1))
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        row = out[name]["r_auroc"]
        assert row["n"] == (4 if unit == "split" else 12) and row["n_runs"] == 12
        assert row["mean"] == pytest.approx(mean, abs=1e-12)
        assert (row["low"], row["high"]) == pytest.approx((mean - half, mean + half), abs=1e-12)
    assert out["ce"]["ece"]["mean"] is None and out["ce"]["ece"]["n"] == 0
    assert out["m1"]["ece"]["n_runs"] == 12
    assert out["m1"]["_runs"] == {"ok": 12, "failed": 1}


def test_summarize_rejects_bad_records():
    recs = _records(2, 2, 1)
    with pytest.raises(ValueError, match="twice"):
        summarize(recs + [recs[0]], ["r_auroc"])
    bad = dict(recs[0], r_auroc=float("nan"))
    with pytest.raises(ValueError, match="r_auroc"):
        summarize([bad] + recs[1:], ["r_auroc"])
    with pytest.raises(ValueError, match="split"):
        summarize([{"method": "a", "seed": 0}], ["r_auroc"])
    with pytest.raises(ValueError, match="method"):
        summarize([{"split": 0, "seed": 0}], ["r_auroc"])
    with pytest.raises(ValueError, match="unit"):
        summarize(recs, ["r_auroc"], unit="seed")


def test_paired_comparison_against_scipy_and_loops():
    recs = _records(n_est=4, n_split=4, n_seed=3, seed=3)
    # drop one pair so the pairing matters
    recs = [r for r in recs if not (r["method"] == "m2" and r["split"] == 1 and r["seed"] == 2)]
    out = paired_comparison(recs, "r_auroc", reference="ce")
    assert set(out) == {"m1", "m2", "m3"}
    ref = {(r["split"], r["seed"]): r["r_auroc"] for r in recs if r["method"] == "ce"}
    ps = []
    for name in ["m1", "m2", "m3"]:
        mine = {(r["split"], r["seed"]): r["r_auroc"] for r in recs if r["method"] == name}
        keys = sorted(set(mine) & set(ref))
        d = np.array([mine[k] - ref[k] for k in keys])
        row = out[name]
        assert row["n"] == len(keys) == (11 if name == "m2" else 12)
        assert row["mean_diff"] == pytest.approx(d.mean(), abs=1e-12)
        t1 = stats.ttest_1samp(d, 0.0)
        assert row["t"] == pytest.approx(t1.statistic, rel=1e-10)
        assert row["p_t"] == pytest.approx(t1.pvalue, rel=1e-10)
        assert row["p_wilcoxon"] == pytest.approx(stats.wilcoxon(d).pvalue, rel=1e-10)
        ps.append(t1.pvalue)
    for name, a in zip(["m1", "m2", "m3"], holm_reference(ps)):
        assert out[name]["p_t_holm"] == pytest.approx(a, rel=1e-10)
        expect = (
            "no difference" if a >= 0.05 else ("better" if out[name]["mean_diff"] > 0 else "worse")
        )
        assert out[name]["verdict"] == expect
    assert out["m3"]["verdict"] == "better"  # +0.09 R-AUROC with sd 0.03: clearly detected


def test_paired_comparison_lower_is_better_and_errors():
    recs = []
    for s in range(5):
        recs.append({"method": "ce", "split": 0, "seed": s, "ece": 0.2 + 0.01 * s})
        recs.append({"method": "x", "split": 0, "seed": s, "ece": 0.1 + 0.013 * s})
    out = paired_comparison(recs, "ece")
    assert out["x"]["mean_diff"] == pytest.approx(np.mean([0.1 - 0.003 * s for s in range(5)]))
    assert out["x"]["verdict"] == "better"  # lower ECE is better: sign flipped
    with pytest.raises(ValueError, match="reference"):
        paired_comparison(recs, "ece", reference="sngp")
    with pytest.raises(ValueError, match="alpha"):
        paired_comparison(recs, "ece", alpha=0)


def _spearman_reference(a, b):
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for pos, i in enumerate(order):
            r[i] = pos + 1.0
        return r  # no ties in these data

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


@pytest.mark.parametrize("n_split", [4, 5])
def test_split_half_reproducibility_against_loops(n_split):
    recs = _records(n_est=6, n_split=n_split, n_seed=2, seed=7)
    out = split_half_reproducibility(recs, "r_auroc")
    names = ["ce"] + [f"m{e}" for e in range(1, 6)]
    assert sorted(out["estimators"]) == sorted(names)
    expect_parts = []
    for a in itertools.combinations(range(n_split), n_split // 2):
        if n_split % 2 == 0 and 0 not in a:
            continue
        expect_parts.append(a)
    assert [tuple(p["a"]) for p in out["partitions"]] == expect_parts
    rhos = []
    for part in out["partitions"]:
        a, b = part["a"], part["b"]
        assert sorted(a + b) == list(range(n_split)) and not set(a) & set(b)

        def mean(name, half):
            v = [r["r_auroc"] for r in recs if r["method"] == name and r["split"] in half]
            return sum(v) / len(v)

        ref = _spearman_reference([mean(n, a) for n in names], [mean(n, b) for n in names])
        assert part["spearman"] == pytest.approx(ref, abs=1e-12)
        rhos.append(ref)
    assert out["mean"] == pytest.approx(np.mean(rhos), abs=1e-12)
    assert out["first"] == out["partitions"][0]["spearman"]
    assert len(out["partitions"]) == (3 if n_split == 4 else 10)


def test_split_half_with_many_splits_draws_distinct_random_halvings():
    """40 splits have 6.9e10 balanced partitions: a seeded sample of distinct ones is used and
    its distribution reported; each sampled partition's Spearman against the loop reference."""
    recs = _records(n_est=6, n_split=40, n_seed=1, seed=3)
    out = split_half_reproducibility(recs, "r_auroc")
    parts = [(tuple(p["a"]), tuple(p["b"])) for p in out["partitions"]]
    assert len(set(parts)) == len(parts) >= RANDOM_HALVINGS and not out["exhaustive"]
    for a, b in parts:
        assert len(a) == len(b) == 20 and sorted(a + b) == list(range(40)) and 0 in a
    names = sorted(out["estimators"])
    for part in out["partitions"][:20]:

        def mean(name, half):
            v = [r["r_auroc"] for r in recs if r["method"] == name and r["split"] in half]
            return sum(v) / len(v)

        ref = _spearman_reference(
            [mean(n, part["a"]) for n in names], [mean(n, part["b"]) for n in names]
        )
        assert part["spearman"] == pytest.approx(ref, abs=1e-12)
    rhos = [p["spearman"] for p in out["partitions"]]
    assert out["median"] == pytest.approx(float(np.median(rhos)), abs=1e-12)
    assert out["first"] is not None and out["q05"] <= out["median"] <= out["q95"]


def test_split_half_needs_splits_and_estimators():
    with pytest.raises(ValueError, match="2 splits"):
        split_half_reproducibility(_records(4, 1, 2), "r_auroc")
    with pytest.raises(ValueError, match="3 estimators"):
        split_half_reproducibility(_records(2, 4, 2), "r_auroc")
    with pytest.raises(ValueError, match="3 estimators"):  # ECE only on odd estimators
        split_half_reproducibility(_records(4, 4, 2), "ece")
