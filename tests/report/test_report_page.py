"""The report's model and page (bayesurl.report), checked against the records by plain loops."""

import json
import re
import shutil

import numpy as np
import pytest

from bayesurl.report import load_source, report_model, write_report
from bayesurl.runs.queries import read_queries


def _model(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def test_galleries_hold_the_extreme_queries(bench_dir):
    info = write_report(bench_dir, k=5)
    html = info["path"].read_text()
    model = _model(html)
    assert [e["name"] for e in model["estimators"]] == ["ce", "elk"] and model["compare"]
    for est in model["estimators"]:
        rec = read_queries(bench_dir / "queries" / f"{est['name']}_s0.npz")
        # reference: Python's stable sort of (u, id) pairs
        by_u = sorted(range(len(rec.u)), key=lambda i: (float(rec.u[i]), i))
        assert est["least"] == by_u[:5]
        high = sorted(range(len(rec.u)), key=lambda i: (-float(rec.u[i]), -i))
        assert est["most"] == high[:5]
        for q in est["most"] + est["least"]:
            u, _, nb, hit = est["q"][str(q)]
            assert nb == int(rec.neighbour[q]) and hit == bool(rec.label[nb] == rec.label[q])
            assert f"q{q}" in model["thumbs"] and f"q{nb}" in model["thumbs"]
        ood = est["ood"]
        assert [i for i, *_ in ood["top"]] == sorted(
            range(len(rec.ood_u)), key=lambda i: (-float(rec.ood_u[i]), i)
        )[:5]
        thr = np.quantile(rec.id_u, 0.95)
        assert ood["flagged"] == pytest.approx(float(np.mean(rec.ood_u > thr)))
        counts = {c["label"]: c["n"] for c in est["per_class"]}
        assert counts == {int(c): int((rec.label == c).sum()) for c in np.unique(rec.label)}


def test_page_is_self_contained(bench_dir):
    html = write_report(bench_dir)["path"].read_text()
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    # every src / href is a data: URI or an in-page anchor; no host is named anywhere
    assert not re.search(r"https?://", html)
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html)


def test_results_without_records_give_table_and_plots(bench_dir, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(bench_dir, old, ignore=shutil.ignore_patterns("queries", "*.html"))
    info = write_report(old)
    model = _model(info["path"].read_text())
    assert model["estimators"] == [] and model["missing"] == ["ce", "elk"]
    assert [r[0] for r in model["rows"]] == ["ce", "elk"]
    assert [p["name"] for p in model["plots"]] == ["recall_vs_rauroc.png", "training_curves.png"]


def test_bad_folders(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_source(tmp_path / "absent")
    with pytest.raises(ValueError, match="results.json"):
        load_source(tmp_path)
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match="results.json"):
        load_source(tmp_path)


def test_k_must_be_positive(bench_dir):
    with pytest.raises(ValueError, match="`k`"):
        report_model(load_source(bench_dir), k=0)


def test_run_command_writes_record_and_report(tmp_path, capsys):
    from bayesurl.cli import main

    out = tmp_path / "run"
    small = ["--set", "data.max_train=96", "--set", "data.max_test=60", "--set", "data.max_ood=40"]
    code = main(["run", "fashion_mnist/ce", "--preset", "smoke", *small, "--out", str(out),
                 "--no-progress"])  # fmt: skip
    assert code == 0 and "report" in capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    rec = read_queries(out / "queries.npz")
    assert rec.hit.mean() == pytest.approx(result["metrics"]["r@1"], abs=1e-12)
    model = _model((out / "report.html").read_text())
    assert [e["name"] for e in model["estimators"]] == ["ce"] and not model["compare"]


def test_records_over_class_splits_are_found(bench_dir, tmp_path):
    """A protocol over class splits names its records ``<estimator>_split<k>_s<seed>``."""
    copy = tmp_path / "splits"
    shutil.copytree(bench_dir, copy, ignore=shutil.ignore_patterns("*.html"))
    for p in sorted((copy / "queries").glob("*_s0.npz")):
        shutil.copy(p, p.with_name(p.name.replace("_s0", "_split1_s0")))
        p.rename(p.with_name(p.name.replace("_s0", "_split0_s3")))
    model = _model(write_report(copy)["path"].read_text())
    assert [(e["name"], e["split"], e["seed"]) for e in model["estimators"]] == [
        ("ce", 0, 3),
        ("elk", 0, 3),
    ]
