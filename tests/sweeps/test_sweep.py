"""Tests of the sweep (bayesurl.sweeps.sweep / results) and the ``bayesurl benchmark`` command.

Moved from tests/test_benchmark.py (the old bayesurl.benchmark module is now bayesurl.runs).

References: metrics recomputed by brute-force loops / scikit-learn in float64 from the same
embeddings; aggregates against numpy (mean, std with ddof 1).
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import scipy.stats
import torch
from sklearn.metrics import roc_auc_score

from bayesurl.backbones import data_config
from bayesurl.cli import main
from bayesurl.commands.benchmark import parse_seeds
from bayesurl.data import as_tensors, default_transform, default_zero_shot
from bayesurl.methods import available, create
from bayesurl.runs import load_recipe
from bayesurl.runs.config import list_recipes, read_recipe_file
from bayesurl.runs.predict import embed, epoch_evaluator
from bayesurl.sweeps.report import report_columns
from bayesurl.sweeps.results import SweepResults, merge_results
from bayesurl.sweeps.sweep import resolve_estimators, run_sweep

SMOKE_METHODS = ["ce", "mcinfonce"]  # a scalar-u classifier and a vMF method with samples


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    res = run_sweep(
        SMOKE_METHODS, seeds=(0,), preset="smoke", out=out, progress=False, raise_errors=True
    )
    return res, out


@pytest.fixture(scope="module")
def small_data():
    return default_zero_shot(max_train=50, max_test=80, max_ood=40, val_fraction=0.0, seed=0)


def test_smoke_table_keys_and_ece_definedness(smoke):
    res, _ = smoke
    assert res.estimators == SMOKE_METHODS
    summ = res.summary()
    for m in SMOKE_METHODS:
        for c in report_columns():
            assert c.key in summ[m]
        for key in ("r@1", "r_auroc", "ausc", "ood_auroc", "train_time"):
            v = summ[m][key]["mean"]
            assert v is not None and math.isfinite(v), (m, key)
        assert 0.0 <= summ[m]["r@1"]["mean"] <= 1.0
        assert summ[m]["train_time"]["mean"] > 0
        assert summ[m]["r@1"]["sd"] is None  # one seed: no sd, not a made-up 0
    # CE has only a scalar u: ECE not available, never a number
    assert all(r["ece"] is None for r in res.runs if r["estimator"] == "ce")
    assert summ["ce"]["ece"]["mean"] is None and summ["ce"]["ece"]["n"] == 0
    # MCInfoNCE defines a vMF: ECE from samples
    ece = [r["ece"] for r in res.runs if r["estimator"] == "mcinfonce"]
    assert all(isinstance(e, float) and 0.0 <= e <= 1.0 for e in ece)
    smoke_samples = load_recipe("fashion_mnist/mcinfonce", preset="smoke").eval.samples
    assert all(r["n_samples"] == smoke_samples for r in res.runs if r["ece"])
    table = res.table()
    assert "R-AUROC" in table and "OOD AUROC" in table
    ce_row = next(line for line in table.splitlines() if line.startswith("ce "))
    assert "n/a" in ce_row


def test_smoke_files_written(smoke):
    res, out = smoke
    data = json.loads((out / "results.json").read_text())
    assert {"settings", "summary", "runs", "paired_vs_ce"} <= set(data)
    assert data["interval_over"] == "runs"  # the standard split is one split
    assert data["settings"]["preset"] == "smoke" and data["settings"]["seeds"] == [0]
    assert data["summary"]["ce"]["ece"]["mean"] is None
    assert data["summary"]["mcinfonce"]["ece"]["mean"] == pytest.approx(
        res.summary()["mcinfonce"]["ece"]["mean"]
    )
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["estimator"] for r in rows] == SMOKE_METHODS  # one row per run, one seed
    assert rows[0]["ece"] == ""  # CE: not available
    assert float(rows[1]["ece"]) == data["summary"]["mcinfonce"]["ece"]["mean"]
    assert float(rows[0]["r@1"]) == data["summary"]["ce"]["r@1"]["mean"]
    png = (out / "recall_vs_rauroc.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_smoke_is_reproducible(smoke):
    res, _ = smoke
    again = run_sweep(["ce"], seeds=(0,), preset="smoke", progress=False, raise_errors=True)
    a = next(r for r in res.runs if r["estimator"] == "ce")
    b = again.runs[0]
    for key in ("r@1", "r_auroc", "ausc", "ood_auroc", "final_loss"):
        assert a[key] == b[key], key


def _brute_r1(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    correct = np.zeros(len(x), dtype=bool)
    for i in range(len(x)):
        best, best_j = -np.inf, -1
        for j in range(len(x)):
            if j == i:
                continue
            s = float(x[i] @ x[j])
            if s > best:  # ties go to the lowest index
                best, best_j = s, j
        correct[i] = y[best_j] == y[i]
    return correct


def test_scores_of_a_method_match_brute_force(small_data):
    torch.manual_seed(0)
    method = create(
        "ce",
        backbone="small_convnet",
        embed_dim=8,
        num_classes=5,
        backbone_kwargs={"width": 4, "num_features": 16},
    ).double()
    tf = torch.nn.Sequential(default_transform(1), _ToDouble())
    res = epoch_evaluator(small_data, transform=tf, batch_size=32)(method, 0)
    x, y = as_tensors(small_data.test, tf)
    out = embed(method, x, batch_size=1000)
    correct = _brute_r1(out.embedding.numpy(), y.numpy())
    u = out.uncertainty.numpy()
    assert res["r@1"] == pytest.approx(correct.mean(), abs=1e-12)
    assert res["r_auroc"] == pytest.approx(roc_auc_score(~correct, u), abs=1e-9)
    # OOD AUROC: u(ood) positive against u(id_test) (held-out upstream; docs/concepts/zero_shot.rst)
    u_id = embed(method, as_tensors(small_data.id_test, tf)[0]).uncertainty.numpy()
    u_ood = embed(method, as_tensors(small_data.ood, tf)[0]).uncertainty.numpy()
    labels = np.r_[np.zeros(len(u_id)), np.ones(len(u_ood))]
    assert res["ood_auroc"] == pytest.approx(roc_auc_score(labels, np.r_[u_id, u_ood]), abs=1e-9)
    assert res["ece"] is None and res["n_samples"] == 0
    assert res["n_test"] == len(small_data.test) and res["n_ood"] == len(small_data.ood)


class _ToDouble(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def test_a_method_is_sampled_only_with_a_distribution(small_data):
    torch.manual_seed(0)
    kw = {"backbone": "small_convnet", "embed_dim": 8, "num_classes": 5}
    kw["backbone_kwargs"] = {"width": 4, "num_features": 16}
    vmf = create("mcinfonce", **kw)
    r1 = epoch_evaluator(small_data, n_samples=3, seed=1)(vmf, 0)
    r2 = epoch_evaluator(small_data, n_samples=3, seed=1)(vmf, 1)
    assert r1["ece"] is not None and r1["ece"] == r2["ece"]  # seeded draws
    ce = create("ce", **kw)
    r = epoch_evaluator(small_data, n_samples=5)(ce, 0)
    assert r["ece"] is None and r["n_samples"] == 0
    with pytest.raises(ValueError, match="n_samples"):
        epoch_evaluator(small_data, n_samples=-1)


def test_summary_matches_numpy():
    rng = np.random.default_rng(0)
    runs = []
    for m in ("a", "b"):
        for s in range(3):
            rec = {"estimator": m, "seed": s, "error": None}
            rec.update({c.key: float(rng.random()) for c in report_columns()})
            rec["ece"] = None if m == "a" else rec["ece"]
            runs.append(rec)
    res = SweepResults(runs=runs, settings={"seeds": [0, 1, 2]})
    summ = res.summary()
    for m in ("a", "b"):
        vals = np.array([r["r_auroc"] for r in runs if r["estimator"] == m])
        assert summ[m]["r_auroc"]["mean"] == pytest.approx(vals.mean())
        assert summ[m]["r_auroc"]["sd"] == pytest.approx(vals.std(ddof=1))
        half = scipy.stats.t.ppf(0.975, 2) * vals.std(ddof=1) / np.sqrt(3)
        assert summ[m]["r_auroc"]["high"] == pytest.approx(vals.mean() + half)
        assert summ[m]["r_auroc"]["n"] == 3
    assert summ["a"]["ece"]["mean"] is None
    assert "+-" in res.table()


def test_table_names_the_estimators_above_the_best_free_baseline():
    runs = [
        {"estimator": m, "seed": 0, "error": None, "r_auroc": v}
        for m, v in [("ce", 0.55), ("losspred", 0.62), ("elk", 0.61), ("feature_norm", 0.60),
                     ("feature_knn", 0.58)]
    ]  # fmt: skip
    lines = SweepResults(runs=runs, settings={"seeds": [0]}).table().splitlines()
    # one run each and no per-query records: nothing is tested, and the line says so (no
    # pointer to tests that do not exist)
    assert lines[-1] == (
        "R-AUROC above the best free baseline (feature_norm 0.600): losspred 0.620 (not "
        "tested), elk 0.610 (not tested)"
    )
    no_free = SweepResults(runs=runs[:2], settings={"seeds": [0]}).table()
    assert "free baseline" not in no_free


def test_failed_run_is_recorded_not_dropped(monkeypatch):
    from bayesurl.runs import estimators

    def broken(self, *args, **kwargs):
        raise RuntimeError("no_such_argument")

    monkeypatch.setattr(estimators.MethodEstimator, "fit", broken)
    res = run_sweep(["ce"], seeds=1, preset="smoke", progress=False)
    (run,) = res.runs
    assert run["error"] and "no_such_argument" in run["error"]
    assert run["r@1"] is None
    assert "FAILED ce seed 0" in res.table()
    assert res.summary()["ce"]["_runs"]["failed"] == 1
    with pytest.raises(RuntimeError, match="no_such_argument"):
        run_sweep(["ce"], seeds=1, preset="smoke", progress=False, raise_errors=True)


def test_unknown_method_option_is_an_error_before_training():
    with pytest.raises(ValueError, match=r"estimators\.ce\.kwargs\.no_such_argument"):
        run_sweep(
            ["ce"],
            seeds=1,
            preset="smoke",
            progress=False,
            overrides=["estimator.kwargs.no_such_argument=1"],
        )


def test_merge_separate_runs(smoke, tmp_path, capsys):
    res, _ = smoke
    a = SweepResults([r for r in res.runs if r["estimator"] == "ce"], dict(res.settings))
    b = SweepResults([r for r in res.runs if r["estimator"] != "ce"], dict(res.settings))
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    merged = merge_results([tmp_path / "a", tmp_path / "b" / "results.json"])
    assert merged.summary() == json.loads(json.dumps(res.summary()))
    with pytest.raises(ValueError, match="more than one source"):
        merge_results([tmp_path / "a", tmp_path / "a"])
    with pytest.raises(FileNotFoundError):
        merge_results([tmp_path / "nothing"])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json"):
        merge_results([tmp_path / "bad.json"])
    out = tmp_path / "m"
    rc = main(["benchmark", "--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)])
    assert rc == 0 and (out / "results.csv").is_file()
    assert "mcinfonce" in capsys.readouterr().out


def test_resolve_estimators_and_presets():
    every = list(read_recipe_file("fashion_mnist")["estimators"])
    assert resolve_estimators(None, "fashion_mnist") == every
    assert resolve_estimators("all", "fashion_mnist") == every
    assert resolve_estimators("CE, hetxl,ce", "fashion_mnist") == ["ce", "hetxl"]
    with pytest.raises(ValueError, match="valid names: .*ce") as err:
        resolve_estimators(["ce", "nosuch"], "fashion_mnist")
    assert "'nosuch'" in str(err.value)
    with pytest.raises(ValueError, match="empty"):
        resolve_estimators(",", "fashion_mnist")
    with pytest.raises(ValueError, match="valid presets"):
        run_sweep(["ce"], preset="huge", progress=False)
    with pytest.raises(ValueError, match="seeds"):
        run_sweep(["ce"], seeds=[], preset="smoke", progress=False)
    assert data_config("small_convnet").in_chans == 1 and data_config("resnet18").in_chans == 3
    # every registered method has a table in a recipe file (LAM eq. 1's two in the closed-set
    # recipe); fashion_mnist.toml has every URL method plus the post-hoc and LAM estimators
    used = {
        t.get("method", name)
        for dataset in list_recipes()
        for name, t in read_recipe_file(dataset)["estimators"].items()
        if t.get("kind", "method") == "method"
    }
    assert set(available()) <= used and len(every) >= 16


def test_parse_seeds():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    assert parse_seeds("3") == [0, 1, 2]
    assert parse_seeds("7,") == [7]
    for bad in ("0", "a", "1,-2", ""):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def test_cli_runs_and_writes(tmp_path, capsys):
    out = tmp_path / "b"
    rc = main(
        ["benchmark", "--preset", "smoke", "--methods", "ce", "--seeds", "0,"]
        + ["--out", str(out), "--no-progress", "--threads", "1"]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "R-AUROC" in text and "ce" in text
    for name in ("results.json", "results.csv", "recall_vs_rauroc.png"):
        assert (out / name).is_file()


def test_cli_unknown_method_lists_valid_names(tmp_path, capsys):
    rc = main(["benchmark", "--methods", "ce,bogus", "--out", str(tmp_path), "--no-progress"])
    assert rc != 0
    err = capsys.readouterr().err
    assert "bogus" in err
    for name in read_recipe_file("fashion_mnist")["estimators"]:
        assert name in err
    assert not (tmp_path / "results.json").exists()


def test_cli_bad_root_and_seeds(tmp_path, capsys):
    assert main(["benchmark", "--methods", "ce", "--root", str(tmp_path / "none")]) == 2
    assert "--root" in capsys.readouterr().err
    assert main(["benchmark", "--methods", "ce", "--seeds", "x"]) == 2
    assert "--seeds" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_follows_argument(small_data):
    method = create("ce", backbone="small_convnet", embed_dim=8, num_classes=5).cuda()
    out = embed(method, as_tensors(small_data.test, default_transform(1))[0])
    assert out.embedding.is_cuda
    res = epoch_evaluator(small_data)(method, 0)  # on the method's device
    assert 0.0 <= res["r@1"] <= 1.0


def test_progress_lines_leave_out_columns_no_run_computes(monkeypatch):
    """Frozen features have no pixels to crop: a sweep on them prints no "crop share" on any
    line (it read "crop share n/a" on every one); a sweep on pixels keeps the column."""
    from bayesurl.sweeps import pipeline
    from bayesurl.sweeps.sweep import run_sweep

    def fake(self, params):
        est = params["estimator"]
        return {"estimator": est, "method": est, "seed": params["seed"], "error": None,
                "r@1": 0.9, "r_auroc": 0.55, "crop_share": None}  # fmt: skip

    monkeypatch.setattr(pipeline.PipelineRun, "__call__", fake)
    for preset, crops in (("pretrained_quick", False), ("quick", True)):
        lines: list[str] = []
        run_sweep(["ce", "elk"], preset=preset, log=lines.append)
        runs = [x for x in lines if x.startswith("[")]
        assert len(runs) == 2 and all("R-AUROC 0.550" in x for x in runs)
        assert all(("crop share" in x) == crops for x in runs), (preset, runs)
