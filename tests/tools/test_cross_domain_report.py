"""tools/cross_domain_report.py: ranks and the Spearman of two domains' rankings, checked
against a brute-force Spearman (Pearson of ranks, numpy), and the split-half figures read from
both layouts of results.json."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest


def _tool():
    path = Path(__file__).resolve().parents[2] / "tools" / "cross_domain_report.py"
    spec = importlib.util.spec_from_file_location("cross_domain_report", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _halving(median):
    return {"r_auroc": {"median": median, "q05": median - 0.1, "min": median - 0.2}}


def _doc(means, nested):
    summary = {n: {"r_auroc": {"mean": m}, "r@1": {"mean": 0.8 + m / 10}} for n, m in means.items()}
    doc = {"summary": summary, "runs": [{"split": s} for s in range(4)]}
    if nested:  # every kind of halving under reproducibility_by
        doc["reproducibility_by"] = {"random": _halving(0.9), "class": _halving(0.7)}
    else:  # random halvings at the top level, the others under reproducibility_by
        doc["reproducibility"] = _halving(0.9)
        doc["reproducibility_by"] = {"pairs": _halving(0.8), "class": _halving(0.7)}
    return doc


def _spearman(x, y):
    rank = lambda v: np.argsort(np.argsort(v)).astype(np.float64)  # noqa: E731 (no ties here)
    return float(np.corrcoef(rank(np.asarray(x)), rank(np.asarray(y)))[0, 1])


@pytest.mark.parametrize("nested", [True, False])
def test_spearman_ranks_and_halvings(nested):
    tool = _tool()
    rng = np.random.default_rng(0)
    names = [f"e{i}" for i in range(9)]
    a = dict(zip(names, rng.uniform(0.4, 0.6, 9)))
    b = dict(zip(names, rng.uniform(0.4, 0.6, 9)))
    b["only_b"] = 0.5  # ran on one domain only: left out of the correlation
    res = tool.cross_domain({"A": _doc(a, nested), "B": _doc(b, not nested)})
    r = res["metrics"]["r_auroc"]
    assert r["estimators"] == sorted(names)
    assert r["spearman"] == pytest.approx(_spearman([a[n] for n in names], [b[n] for n in names]))
    best = max(names, key=a.get)
    assert r["rank"]["A"][best] == 1.0
    for label in ("A", "B"):
        halves = r["split_half"][label]
        assert halves["random"]["median"] == 0.9  # found in either layout
        assert halves["class"]["min"] == pytest.approx(0.5)
    assert "only_b" not in r["rank"]["B"]
