"""A column's best is marked only where a paired test separates it from the runner-up
(bayesurl.sweeps.report.best_marks): crafted rows both ways, for one run (a paired bootstrap
over the same queries, from the runs' per-query records) and for several seeds (a paired
t-test); time columns are never marked; the table, results.json and the report say which test.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

from bayesurl.runs.queries import QueryRecord, paired_test
from bayesurl.stats.intervals import (
    Interval,
    auroc_interval,
    flat_intervals,
    wilson_interval,
)
from bayesurl.sweeps.report import best_marks, read_results, results_table, write_results

N = 1000


def _record(u, hit, labels, ood_u=None) -> QueryRecord:
    n = u.size
    return QueryRecord(
        u=u.astype(np.float32), label=labels, neighbour=(np.arange(n) + 1) % n, hit=hit,
        ood_u=np.zeros(0, np.float32) if ood_u is None else ood_u.astype(np.float32),
        meta={"labelled": True},
    )  # fmt: skip


def _runs(tmp_path, us, ood=None, train=None):
    """One run per estimator on the same 1000 queries (the same hits: R@1 tied), their records
    in tmp_path / queries, the run records with the metrics recomputed by scikit-learn."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, N)
    hit = rng.random(N) < 0.8
    folder = tmp_path / "queries"
    folder.mkdir(parents=True, exist_ok=True)
    recs = []
    for name, u in us.items():
        o = None if ood is None else ood[name]
        _record(u, hit, labels, o).save(folder / f"{name}_s0.npz")
        rec = {"estimator": name, "seed": 0, "split": 0, "error": None,
               "r@1": float(hit.mean()), "r_auroc": roc_auc_score(~hit, u),
               "train_time": (train or {}).get(name, 1.0)}  # fmt: skip
        _, lo, hi = auroc_interval(u[~hit], u[hit])
        ivs = {"r@1": Interval(*wilson_interval(int(hit.sum()), N), 0.95, "wilson", N),
               "r_auroc": Interval(lo, hi, 0.95, "delong", N)}  # fmt: skip
        if o is not None:
            rec["ood_auroc"] = roc_auc_score(np.r_[np.zeros(N), np.ones(o.size)], np.r_[u, o])
        recs.append({**rec, **flat_intervals(ivs)})
    return recs, hit


def test_one_run_marks_only_what_the_paired_bootstrap_separates(tmp_path):
    rng = np.random.default_rng(1)
    base = rng.normal(0, 1, N)
    _, hit = _runs(tmp_path, {"x": base})  # the shared hits
    good = base + 1.2 * ~hit  # R-AUROC about 0.8
    weak = rng.normal(0, 1, N) + 0.3 * ~hit  # about 0.58
    ood = {"good": rng.normal(0.1, 1, 300), "weak": rng.normal(0.15, 1, 300)}  # both about 0.5
    recs, _ = _runs(tmp_path, {"good": good, "weak": weak}, ood, train={"good": 0.1, "weak": 9})
    marks = best_marks(recs, queries=tmp_path / "queries")
    assert marks["r_auroc"]["best"] == "good" and marks["r_auroc"]["separated"]
    assert marks["r_auroc"]["test"] == "paired bootstrap over the same 1000 queries"
    assert marks["r_auroc"]["low"] > 0
    # R@1 tied (the same hits): tested, not separated; OOD AUROC 0.5 vs 0.5: not separated
    assert marks["r@1"]["test"] and not marks["r@1"]["separated"]
    assert not marks["ood_auroc"]["separated"] and marks["ood_auroc"]["low"] < 0
    assert "train_time" not in marks  # never a time column
    table = results_table(recs, {"seeds": [0]}, queries=tmp_path / "queries")
    lines = table.splitlines()
    rows = {ln.split()[0]: ln for ln in lines if ln.split()[:1] in (["good"], ["weak"])}
    assert rows["good"].count("*") == 1 and "*" not in rows["weak"]
    assert "by a paired bootstrap over the same 1000 queries (95 %)" in table
    assert "not separated from the runner-up: R@1, OOD AUROC" in table
    assert "95 % interval over the queries of the one run" in lines[1]


def test_one_run_near_ties_get_no_mark(tmp_path):
    rng = np.random.default_rng(2)
    _, hit = _runs(tmp_path, {"x": rng.normal(0, 1, N)})
    a = rng.normal(0, 1, N) + 0.8 * ~hit
    b = rng.normal(0, 1, N) + 0.8 * ~hit  # as good as a, its own noise
    recs, _ = _runs(tmp_path, {"a": a, "b": b})
    assert abs(recs[0]["r_auroc"] - recs[1]["r_auroc"]) > 0.001  # a best by noise alone
    marks = best_marks(recs, queries=tmp_path / "queries")
    assert marks["r_auroc"]["test"] and not marks["r_auroc"]["separated"]
    assert marks["r_auroc"]["low"] <= 0 <= marks["r_auroc"]["high"]
    table = results_table(recs, {"seeds": [0]}, queries=tmp_path / "queries")
    assert "*" not in "\n".join(ln for ln in table.splitlines() if ln.startswith(("a ", "b ")))
    # without the records there is no test, and the table says so instead of marking
    bare = best_marks(recs)
    assert bare["r_auroc"]["test"] is None and not bare["r_auroc"]["separated"]


def test_paired_test_is_a_joint_resample_of_both_rankings():
    """Its interval of the difference against a brute-force bootstrap (indices drawn with
    replacement, both AUROCs by scikit-learn on the same draw)."""
    rng = np.random.default_rng(3)
    n = 400
    labels = rng.integers(0, 5, n)
    hit = rng.random(n) < 0.75
    a = rng.normal(0, 1, n) + 0.9 * ~hit
    b = a + rng.normal(0, 1, n)  # correlated with a, weaker
    ra, rb = _record(a, hit, labels), _record(b, hit, labels)
    res = paired_test(ra, rb, "r_auroc", replicates=2000)
    want = roc_auc_score(~hit, a) - roc_auc_score(~hit, b)
    assert res["diff"] == pytest.approx(want, abs=1e-6)
    idx = rng.integers(0, n, (2000, n))
    wrong = ~hit[idx]
    m = wrong.sum(axis=1)

    def auroc(u):  # scipy's midranks on each drawn set of queries
        r = rankdata(u[idx].astype(np.float32), axis=1)
        return ((r * wrong).sum(axis=1) - m * (m + 1) / 2) / (m * (n - m))

    boot = auroc(a) - auroc(b)
    assert boot[0] == pytest.approx(
        roc_auc_score(wrong[0], a[idx[0]].astype(np.float32))
        - roc_auc_score(wrong[0], b[idx[0]].astype(np.float32)),
        abs=1e-9,
    )
    lo, hi = np.quantile(boot, [0.025, 0.975])
    assert res["low"] == pytest.approx(lo, abs=0.02) and res["high"] == pytest.approx(hi, abs=0.02)
    # different queries: no test
    other = _record(a[:-1], hit[:-1], labels[:-1])
    assert paired_test(ra, other, "r_auroc") is None


@pytest.mark.parametrize("gap, separated", [(0.03, True), (0.0, False)])
def test_several_seeds_use_the_paired_t_test(gap, separated):
    rng = np.random.default_rng(4)
    recs = []
    for seed in range(5):
        common = rng.normal(0.6, 0.02)  # the seed moves both estimators together
        for name, shift in (("a", gap), ("b", 0.0)):
            recs.append({"estimator": name, "seed": seed, "split": 0, "error": None,
                         "r_auroc": common + shift + rng.normal(0, 0.004),
                         "train_time": 1.0 + (name == "a")})  # fmt: skip
    marks = best_marks(recs)
    m = marks["r_auroc"]
    assert m["test"] == "paired t-test over 5 runs" and m["separated"] == separated
    assert "train_time" not in marks
    table = results_table(recs, {"seeds": list(range(5))})
    assert ("*" in table.splitlines()[4]) == separated
    assert "Student-t interval over the runs (n = 5)" in table


def test_results_json_and_the_report_carry_the_marks(tmp_path):
    from bayesurl.report import report_model
    from bayesurl.report.sources import load_source

    rng = np.random.default_rng(5)
    _, hit = _runs(tmp_path / "bench", {"x": rng.normal(0, 1, N)})
    good = rng.normal(0, 1, N) + 1.2 * ~hit
    weak = rng.normal(0, 1, N)
    recs, _ = _runs(tmp_path / "bench", {"good": good, "weak": weak})
    write_results(recs, tmp_path / "bench", {"preset": "t", "dataset": "d", "seeds": [0]})
    doc = read_results(tmp_path / "bench")
    assert doc["best"]["r_auroc"]["best"] == "good" and doc["best"]["r_auroc"]["separated"]
    assert not doc["best"]["r@1"]["separated"]
    head = (tmp_path / "bench" / "results.csv").read_text().splitlines()[0]
    assert "r_auroc,r_auroc_low,r_auroc_high,r_auroc_interval,r_auroc_n,r_auroc_over" in head
    row = doc["runs"][0]
    assert row["r_auroc_low"] <= row["r_auroc"] <= row["r_auroc_high"] and row["r_auroc_n"] == N
    model = report_model(load_source(tmp_path / "bench"))
    assert model["marks"] == {"r_auroc": "good"}
    assert any("paired bootstrap over the same 1000 queries" in line for line in model["legend"])
    assert any("not separated from the runner-up: R@1" in line for line in model["legend"])
