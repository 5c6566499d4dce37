"""The folder road's scores that train nothing (knn, mahalanobis, gmm): cross-fitted over five
folds, each image encoded once, u equal to an independent per-fold reference (numpy /
scikit-learn on the other folds' features), labels where the method needs them."""

from __future__ import annotations

import csv
import json
import re
import warnings

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.covariance import LedoitWolf
from test_folder import FAST, _folder, _spy_backbone

import bayesurl.folder.road as road
from bayesurl.cli import main
from bayesurl.data.folder import scan_image_folder
from bayesurl.folder import CROSSFIT_FOLDS, U_MEANING, FolderMethod, FolderOptions, score_folder
from bayesurl.folder.fit import fold_ids

METHODS = ["knn", "mahalanobis", "gmm"]


def _capture(monkeypatch):
    """What the road cross-fits on: the features and labels of the readable images."""
    seen = {}
    crossfit = road.crossfit

    def spied(method, fx, fit_ids, labelled, generator, *options):
        seen["feats"], seen["labels"] = fx.feats.clone(), fx.labels.clone()
        return crossfit(method, fx, fit_ids, labelled, generator, *options)

    monkeypatch.setattr(road, "crossfit", spied)
    return seen


def _folds(scan, n, labels, seed=0):
    """The folds the road deals: the seeded stream past the fit sample's draw."""
    gen = torch.Generator().manual_seed(seed)
    torch.randperm(len(scan.paths), generator=gen)
    return fold_ids(labels, n, CROSSFIT_FOLDS, gen).numpy()


def _lw(rows):
    return LedoitWolf(assume_centered=True, store_precision=False).fit(rows).covariance_


def _reference_u(method, ref, ref_y, query):
    """u of ``query`` from the reference rows alone (float64 numpy / scipy / scikit-learn)."""
    if method == "knn":
        unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
        dist = 1 - unit(query) @ unit(ref).T
        return np.sort(dist, axis=1)[:, :10].mean(1)
    classes = np.unique(ref_y)
    mus = np.stack([ref[ref_y == c].mean(0) for c in classes])
    if method == "mahalanobis":
        cov = _lw(ref - mus[np.searchsorted(classes, ref_y)])
        d = [np.einsum("nd,nd->n", query - m, np.linalg.solve(cov, (query - m).T).T) for m in mus]
        return np.min(d, axis=0)
    logs = [
        np.log(np.mean(ref_y == c)) + multivariate_normal(m, _lw(ref[ref_y == c] - m)).logpdf(query)
        for c, m in zip(classes, mus)
    ]
    return -logsumexp(np.stack(logs), axis=0)


@pytest.mark.parametrize("method", METHODS)
def test_labelled_folder_u_is_the_other_folds_reference(tmp_path, monkeypatch, method):
    images = _folder(tmp_path / "imgs", n=10)  # 3 classes x 10 images, one broken file
    rows = _spy_backbone(monkeypatch)
    seen = _capture(monkeypatch)
    with pytest.warns(UserWarning, match="broken.png"):
        res = score_folder(images, out=tmp_path / "out", method=method, **FAST)
    assert sum(rows) == 30  # each readable image encoded once, no augmented view
    feats, labels = seen["feats"].double().numpy(), seen["labels"].numpy()
    strata = None if method == "knn" else seen["labels"]  # knn deals without the classes
    fold = _folds(scan_image_folder(images), len(feats), strata)
    want = np.empty(len(feats))
    for f in range(CROSSFIT_FOLDS):
        out = fold != f
        want[~out] = _reference_u(method, feats[out], labels[out], feats[~out])
    # float32 features: 1 - cos of nearby images carries float32 rounding (1e-7 absolute)
    np.testing.assert_allclose(res.record.u, want, rtol=1e-5, atol=1e-6)
    # the table: every file, ranked by u; R@1 from the CSV's classes
    with (tmp_path / "out" / "uncertainty.csv").open() as f:
        table = list(csv.DictReader(f))
    good = [r for r in table if not r["error"]]
    assert len(table) == 31 and [int(r["u_rank"]) for r in good] == list(range(1, 31))
    r1 = sum(r["class"] == r["neighbour_class"] for r in good) / len(good)
    assert res.metrics["r@1"] == pytest.approx(r1)
    info = json.loads((tmp_path / "out" / "folder.json").read_text())
    assert info["fit"]["folds"] == CROSSFIT_FOLDS and info["estimator"] == method
    assert info["fit"]["labels_used"] is (method != "knn")
    assert "other 4 of 5 folds" in info["describe"][1]
    readme = (tmp_path / "out" / "README.md").read_text()
    assert U_MEANING[method] in readme


def test_flat_folder_mahalanobis_is_refused_before_encoding_and_the_others_run(
    tmp_path, monkeypatch
):
    images = _folder(tmp_path / "flat", labelled=False, n=10, corrupt=False)
    rows = _spy_backbone(monkeypatch)
    with pytest.raises(ValueError, match="`method` 'mahalanobis'.*class sub-folders"):
        score_folder(images, out=tmp_path / "m", method="mahalanobis", **FAST)
    assert rows == []  # nothing was encoded
    for method in ("knn", "gmm"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # k-means may drop a lone cluster
            res = score_folder(images, out=tmp_path / method, method=method, **FAST)
        assert res.metrics is None and np.isfinite(res.record.u).all()
        assert res.info["fit"]["labels_used"] is False
    assert res.info["fit"]["kmeans_components"] == 8  # 24 reference images, 3 per component
    assert "k-means components" in res.info["describe"][1]


def test_options_and_command_know_the_new_methods(tmp_path, capsys):
    for name in METHODS:
        assert FolderOptions(method=name.upper()).method is FolderMethod(name)
        assert FolderOptions(method=name).fit_max == 5000  # a fit image costs no encoding
    images = _folder(tmp_path / "imgs", n=8, corrupt=False)
    out = tmp_path / "out"
    code = main(["folder", str(images), "--out", str(out), "--method", "gmm",
                 "--backbone", "small_convnet", "--random-weights", "--batch-size", "8",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "R@1 " in printed and (out / "report.html").is_file()
    assert re.search("R-AUROC +n/a +R-AUROC is undefined: all 24 queries", printed)  # all right
    assert "ECE" not in printed and "OOD" not in printed


def test_wrapper_options_reach_the_cross_fitted_fit(tmp_path):
    """``--option k=3`` for knn is the k of every fold's fit (the folder's own default is
    min(FOLDER_K, smallest reference)), recorded in the fit report; an option the wrapper
    lacks is refused by name before anything is encoded."""
    images = _folder(tmp_path / "imgs", n=8, corrupt=False)
    res = score_folder(images, out=tmp_path / "out", method="knn", wrapper_options={"k": 3},
                       pretrained=False, **FAST)  # fmt: skip
    assert res.info["fit"]["k"] == 3
    default = score_folder(images, out=tmp_path / "d", method="knn", pretrained=False, **FAST)
    assert default.info["fit"]["k"] != 3
    assert not np.allclose(res.record.u, default.record.u)
    with pytest.raises(ValueError, match="`wrapper_options`: method 'knn' has no option 'kk'"):
        FolderOptions(method="knn", wrapper_options={"kk": 3})
