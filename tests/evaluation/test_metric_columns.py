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
    head = results_table(recs, settings).splitlines()[1]
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
    assert "HALF" in src.columns
    i = src.columns.index("HALF")
    assert src.rows[0][i][0] == doc["summary"][src.rows[0][0]]["half_r1"]["mean"]
    if with_split:  # the protocol report's table
        spec = importlib.util.spec_from_file_location(
            "protocol_report", ROOT / "tools" / "protocol_report.py"
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert ("half_r1", "HALF") in mod._columns()


def test_the_metric_is_gone_after_the_fixture(tmp_path):
    recs = _records(False)
    assert "HALF" not in results_table(recs, {"seeds": [0, 1]})
