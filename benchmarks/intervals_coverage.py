"""Coverage of the per-run 95 % intervals (bayesurl.stats.intervals), by simulation.

Each draw is one synthetic evaluation with a known truth: queries right with probability
``p`` (the R@1 rate), u of the wrong ones ~ N(delta, 1) and of the right ones ~ N(0, 1)
(R-AUROC ``Phi(delta / sqrt 2)``), OOD u ~ N(delta_ood, 1) against the queries' u, a mixture
of the two (OOD AUROC ``p Phi(delta_ood / sqrt 2) + (1 - p) Phi((delta_ood - delta) /
sqrt 2)``, and OOD AUPRC integrated numerically), and the sparsification curve's population
value (AUSC) from one draw of 2 million queries. Prints, per estimator and number of queries
n, the share of draws whose interval holds the truth and the mean width. The tests check the
closed forms at n = 200 and 5,000 (tests/stats/test_intervals.py); this script also
covers the bootstrap and the small-sample end.

    PYTHONPATH=. python benchmarks/intervals_coverage.py --draws 1000
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.stats import norm
from sklearn.metrics import average_precision_score

from bayesurl.stats.intervals import (
    Resample,
    auroc_interval,
    intervals_of,
    logit_interval,
    weighted_sparsification,
    wilson_interval,
)

#: The truth: R@1 rate, R-AUROC, OOD AUROC against the right queries' u alone
P_RIGHT, AUC, AUC_OOD = 0.85, 0.62, 0.8


def ausc_truth(p: float, delta: float, n: int = 2_000_000, seed: int = 99) -> float:
    """AUSC of the population, from one very large draw (its own noise about 1e-4)."""
    rng = np.random.default_rng(seed)
    right = rng.random(n) < p
    u = rng.normal(0, 1, n) + delta * ~right
    order = np.argsort(u, kind="stable")
    cs = np.concatenate([[0], np.cumsum(right[order])])
    kept = ((100 - np.arange(100)) * n + 99) // 100
    return float((cs[kept] / kept).mean())


def ap_truth(delta_ood: float, delta: float, share: float) -> float:
    """Average precision of N(delta_ood, 1) positives among the queries' u (N(0, 1) with
    probability P_RIGHT, else N(delta, 1)), ``share`` of them positive: the integral of the
    precision over the recall."""
    t = np.linspace(-12, 12, 400_001)
    tpr = norm.sf(t - delta_ood)
    fpr = P_RIGHT * norm.sf(t) + (1 - P_RIGHT) * norm.sf(t - delta)
    precision = share * tpr / (share * tpr + (1 - share) * fpr)
    return float(-np.trapezoid(precision, tpr))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--boot-draws", type=int, default=300, help="draws of the bootstrap rows")
    p.add_argument("--sizes", type=int, nargs="+", default=[200, 1000, 5000])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    delta = math.sqrt(2) * norm.ppf(AUC)
    delta_ood = math.sqrt(2) * norm.ppf(AUC_OOD)
    truth_ausc = ausc_truth(P_RIGHT, delta)
    ood_truth = P_RIGHT * AUC_OOD + (1 - P_RIGHT) * norm.cdf((delta_ood - delta) / math.sqrt(2))
    print(f"# benchmarks/intervals_coverage.py, {time.strftime('%Y-%m-%d')}, seed {a.seed}")
    print(
        f"# truth: R@1 {P_RIGHT}, R-AUROC {AUC}, OOD AUROC {ood_truth:.4f} (OOD inputs: n / 2), "
        f"AUSC {truth_ausc:.4f}; {a.draws} draws ({a.boot_draws} for the bootstrap)"
    )
    print(f"{'estimator':28s} {'n':>6s} {'coverage':>9s} {'mean width':>11s}")
    for n in a.sizes:
        rng = np.random.default_rng([a.seed, n])
        ap_true = ap_truth(delta_ood, delta, (n // 2) / (n + n // 2))
        hits = {k: 0 for k in ("r1", "rauroc", "ood", "ap", "ausc")}
        width = {k: 0.0 for k in hits}
        for d in range(a.draws):
            right = rng.random(n) < P_RIGHT
            u = rng.normal(0, 1, n) + delta * ~right
            v = rng.normal(delta_ood, 1, n // 2)
            lo, hi = wilson_interval(int(right.sum()), n)
            hits["r1"] += lo <= P_RIGHT <= hi
            width["r1"] += hi - lo
            if 0 < right.sum() < n:
                _, lo, hi = auroc_interval(u[~right], u[right])
                hits["rauroc"] += lo <= AUC <= hi
                width["rauroc"] += hi - lo
            _, lo, hi = auroc_interval(v, u)
            hits["ood"] += lo <= ood_truth <= hi
            width["ood"] += hi - lo
            ap = average_precision_score(np.r_[np.zeros(n), np.ones(v.size)], np.r_[u, v])
            lo, hi = logit_interval(ap, v.size)
            hits["ap"] += lo <= ap_true <= hi
            width["ap"] += hi - lo
            if d < a.boot_draws:
                stat = weighted_sparsification(u, right)
                est = float(stat(np.ones((1, n), np.float32))["ausc"][0])
                iv = intervals_of({"ausc": Resample(n, stat)}, {"ausc": est}, seed=d)["ausc"]
                hits["ausc"] += iv.low <= truth_ausc <= iv.high
                width["ausc"] += iv.high - iv.low
        names = {
            "r1": "R@1 (Wilson)",
            "rauroc": "R-AUROC (DeLong, logit)",
            "ood": "OOD AUROC (DeLong, logit)",
            "ap": "OOD AUPRC (Boyd logit)",
            "ausc": "AUSC (Poisson bootstrap)",
        }
        for k, name in names.items():
            m = a.boot_draws if k == "ausc" else a.draws
            if m == 0:
                continue
            print(f"{name:28s} {n:6d} {hits[k] / m:9.3f} {width[k] / m:11.4f}", flush=True)


if __name__ == "__main__":
    main()
