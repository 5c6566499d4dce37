"""The protocol rows of the scores that train nothing (``feature_knn``,
``feature_mahalanobis``, ``feature_gmm``, ``feature_gmm_kmeans``; and the same wrappers on a
trained base's embedding): they run end to end on the smoke preset, fit on the upstream
training inputs with their labels, and their checkpoint reloads with weights_only."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.covariance import LedoitWolf
from torch import nn

from bayesurl.posthoc import load
from bayesurl.runs import load_recipe, run
from bayesurl.runs.data import build_data

ROWS = ["feature_knn", "feature_mahalanobis", "feature_gmm", "feature_gmm_kmeans"]


@pytest.mark.parametrize("name", ROWS)
def test_row_runs_and_its_checkpoint_reloads(name, tmp_path):
    cfg = load_recipe(f"fashion_mnist/{name}", preset="smoke")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # k-means on 200 pixel rows may drop a lone cluster
        res = run(cfg, out=tmp_path, keep_outputs=True)
    assert res.error is None
    for key in ("r@1", "r_auroc", "ood_auroc"):
        assert math.isfinite(res.metrics[key]), key
    assert res.fit["fit"]["n_reference"] == 200  # the smoke preset's upstream images
    raw = torch.load(res.checkpoint, weights_only=True)
    assert raw["config"]["embed_dim"] == 784  # the normalised pixels of the from-scratch road
    wrapped = load(res.checkpoint, nn.Identity())
    out, _ = res.outputs["test"]
    torch.testing.assert_close(wrapped(out.embedding).uncertainty, out.uncertainty)


def test_mahalanobis_row_fits_the_upstream_training_classes():
    """The shared covariance and the class means are those of the upstream training inputs
    (deterministic transform, labels 0..K-1): scikit-learn on them gives the row's u."""
    cfg = load_recipe("fashion_mnist/feature_mahalanobis", preset="smoke")
    res = run(cfg, keep_outputs=True)
    data = build_data(cfg)
    images = torch.stack([data.sets.train[i][0] for i in range(len(data.sets.train))])
    labels = np.array([int(data.sets.train[i][1]) for i in range(len(data.sets.train))])
    x = data.transform(images).flatten(1).double().numpy()
    mus = np.stack([x[labels == c].mean(0) for c in np.unique(labels)])
    est = LedoitWolf(assume_centered=True).fit(x - mus[np.searchsorted(np.unique(labels), labels)])
    out, _ = res.outputs["test"]
    q = out.embedding.double().numpy()
    want = np.min(np.stack([est.mahalanobis(q - m) for m in mus], 1), 1)
    np.testing.assert_allclose(out.uncertainty.double().numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("wrapper", ["knn", "mahalanobis", "gmm"])
def test_wrappers_on_a_trained_base_are_posthoc_rows(wrapper):
    """``kind = "posthoc"`` with these wrappers: the score fitted on the CE base's embedding
    of the upstream images (Lee et al.'s setting for Mahalanobis: a trained classifier)."""
    cfg = load_recipe(
        "fashion_mnist/pvu",
        [("estimator.wrapper", wrapper), ("estimator.fit", {})],
        preset="smoke",
    )
    res = run(cfg)
    assert res.error is None and math.isfinite(res.metrics["r_auroc"])
    assert res.fit["fit"]["n_reference"] == 200


def test_row_options_are_checked_when_the_row_is_built():
    from bayesurl.runs.estimators import BaselineEstimator

    def build(**kwargs):
        return BaselineEstimator(
            load_recipe("fashion_mnist/feature_gmm", [("estimator.kwargs", kwargs)], preset="smoke")
        )

    with pytest.raises(ValueError, match=r"unknown key `estimators.feature_gmm.kwargs.bogus`"):
        build(score="gmm", bogus=1)
    with pytest.raises(ValueError, match=r"`estimators.feature_gmm.kwargs`: `covariance` must"):
        build(score="gmm", covariance="diag")
    with pytest.raises(ValueError, match="score 'inverse_norm' takes no options"):
        build(score="inverse_norm", k=3)
    assert build(score="mahalanobis", shrinkage=0.5).wrapped.shrinkage == 0.5
