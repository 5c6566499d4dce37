"""A metric declared once: a registered metric's column shows in every table by itself."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from bayesurl.evaluation import evaluate
from bayesurl.evaluation.table import Column, Metric, Need, register_metric, unregister_metric
from bayesurl.report.sources import load_source
from bayesurl.sweeps.report import results_table, write_results
from bayesurl.sweeps.results import SweepResults

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def throwaway():
    """A metric ``half_r1`` (R@1 / 2) with the title ``HALF``, removed again afterwards."""
    metric = Metric(
        "half_r1",
        lambda o: ("half_r1",),
        (Need.NEIGHBOURS,),
        lambda ctx: {"half_r1": float(ctx.correct.double().mean()) / 2},
        lambda ctx: 1,
        columns=(Column("half_r1", "HALF", digits=4, always=True),),
    )
    register_metric(metric)
    yield metric
    unregister_metric("half_r1")


def _records(with_split: bool) -> list[dict]:
    recs = []
    for m, base in (("ce", 0.5), ("elk", 0.6)):
        for split in range(4 if with_split else 1):
            for seed in range(2):
                r = {"estimator": m, "method": m, "seed": seed, "error": None}
                v = base + 0.01 * split + 0.001 * seed
                r.update({"r@1": v, "r_auroc": v, "half_r1": v / 2, "train_time": 1.0})
                if with_split:
                    r.update(split=split, downstream=[split], tuned_on=[])
                recs.append(r)
    return recs


def test_evaluate_writes_the_registered_metric(throwaway):
    import torch

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 4, generator=g, dtype=torch.float64), torch.arange(30) % 3
    res = evaluate(x, y, exclude=["half_r1"])
    assert "half_r1" in res and res["half_r1"] is None  # `always`: present, not computed
    res = evaluate(x, y)
    assert res["half_r1"] == pytest.approx(res["r@1"] / 2)


@pytest.mark.parametrize("with_split", [False, True])
def test_a_registered_metric_shows_in_every_table(throwaway, tmp_path, with_split):
    recs = _records(with_split)
    settings = {"preset": "t", "dataset": "d", "seeds": [0, 1]}
    # the run table of a sweep
    head = results_table(recs, settings).splitlines()[2]  # after the title and the caption
    assert "HALF" in head.split()
    assert "HALF" in SweepResults(runs=recs, settings=settings).table()
    # the sweep report (json, csv) and its HTML source
    out = tmp_path / "rep"
    write_results(recs, out, settings)
    doc = json.loads((out / "results.json").read_text())
    assert doc["summary"]["elk"]["half_r1"]["mean"] == pytest.approx(
        sum(r["half_r1"] for r in recs if r["estimator"] == "elk") / (8 if with_split else 2)
    )
    assert "half_r1" in doc["paired_vs_ce"]
    assert "half_r1" in (out / "results.csv").read_text().splitlines()[0].split(",")
    src = load_source(out)
    keys = [c.key for c in src.columns]
    assert "half_r1" in keys
    i = keys.index("half_r1") + 1  # after the estimator's name
    assert src.rows[0][i][0] == doc["summary"][src.rows[0][0]]["half_r1"]["mean"]
    if with_split:  # the protocol report's table
        spec = importlib.util.spec_from_file_location(
            "protocol_report", ROOT / "tools" / "protocol_report.py"
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert throwaway.columns[0] in mod._columns()
        text = mod.report(out, None)  # its 4 digits, the best (elk's) bold
        elk = doc["summary"]["elk"]["half_r1"]
        assert "HALF" in text and f"**{elk['mean']:.4f}** ± " in text


def test_the_metric_is_gone_after_the_fixture(tmp_path):
    recs = _records(False)
    assert "HALF" not in results_table(recs, {"seeds": [0, 1]})


def test_direction_is_declared_once_by_the_column():
    """torchmetrics' ``higher_is_better`` of each class is its column's."""
    from bayesurl.evaluation import metrics as tm
    from bayesurl.evaluation.table import metric_column

    pairs = {tm.RecallAtK: "r@1", tm.MAPAtK: "map@5", tm.RAUROC: "r_auroc", tm.AUSC: "ausc",
             tm.AUSE: "ause", tm.RetrievalECE: "ece", tm.OODAUROC: "ood_auroc",
             tm.OODAUPRC: "ood_auprc"}  # fmt: skip
    for cls, key in pairs.items():
        assert cls.higher_is_better is metric_column(key).higher_is_better, cls
    assert tm.RetrievalECE.higher_is_better is False and tm.AUSE.higher_is_better is False
    with pytest.raises(ValueError, match="no metric declares a column for 'nope'"):
        metric_column("nope")


@pytest.fixture
def lower_better():
    """A throwaway metric ``miss`` (1 - R@1) whose column says lower is better."""
    col = Column("miss", "MISS", higher_is_better=False, always=True)
    register_metric(Metric("miss", lambda o: ("miss",), (Need.NEIGHBOURS,), lambda c: {},
                           columns=(col,)))  # fmt: skip
    yield col
    unregister_metric("miss")


def test_the_paired_test_and_the_table_read_the_direction(lower_better):
    from bayesurl.sweeps.aggregate import paired_comparison

    recs = [
        {"method": m, "estimator": m, "seed": s, "split": 0, "error": None,
         "r@1": 1 - v - 0.01 * s * (m == "elk"), "miss": v + 0.01 * s * (m == "elk")}
        for m, v in (("ce", 0.5), ("elk", 0.2))
        for s in range(3)
    ]  # fmt: skip
    # elk misses less: better on the lower-is-better metric, as on R@1
    assert paired_comparison(recs, "miss")["elk"]["verdict"] == "better"
    assert paired_comparison(recs, "r@1")["elk"]["verdict"] == "better"
    assert paired_comparison(recs, "miss")["elk"]["mean_diff"] > 0  # positive is better
    assert paired_comparison(recs, "miss", higher_is_better=True)["elk"]["verdict"] == "worse"
    with pytest.raises(ValueError, match="higher_is_better"):
        paired_comparison(recs, "train_time")
    # the text table marks the best of each column, in its direction, where the paired t-test
    # over the three seeds separates it from the runner-up
    lines = results_table(recs, {"seeds": [0, 1, 2]}).splitlines()
    head, rows = lines[2], {ln.split()[0]: ln for ln in lines[4:6]}
    col = head.index("MISS")
    assert "*" in rows["elk"] and "*" not in rows["ce"]
    assert rows["elk"].rstrip().endswith("*") and len(rows["elk"]) >= col
    assert any("lower for MISS" in ln for ln in lines)
