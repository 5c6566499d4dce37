"""The scores that train nothing (kNN distance, Mahalanobis, Gaussian-mixture density) against
scikit-learn in float64, at D = 1,280 as well as small D; save / load with weights_only; dtype
and device; bad input named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from sklearn.cluster import KMeans
from sklearn.covariance import (
    EmpiricalCovariance,
    LedoitWolf,
    ShrunkCovariance,
    ledoit_wolf_shrinkage,
)
from sklearn.mixture import GaussianMixture as SkGaussianMixture
from sklearn.neighbors import NearestNeighbors
from torch import nn

from bayesurl.distributions.gaussian_mixture import (
    fit_gaussians,
    kmeans,
    kmeans_plus_plus,
)
from bayesurl.distributions.gaussian_mixture import (
    ledoit_wolf_shrinkage as our_shrinkage,
)
from bayesurl.posthoc import GMMWrapper, KNNWrapper, MahalanobisWrapper, load, wrap

RTOL = 1e-6


def _data(n=400, d=12, classes=3, seed=0, queries=60):
    """Correlated Gaussian classes with different means and scales; queries in and out."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    x = (
        rng.normal(size=(n, d)) @ mix * (1 + 0.5 * y[:, None])
        + 2.0 * rng.normal(size=(classes, d))[y]
    )
    q = np.concatenate([x[:queries // 2] + 0.3 * rng.normal(size=(queries // 2, d)),
                        3 * rng.normal(size=(queries - queries // 2, d))])  # fmt: skip
    return x, y, q


def _fit(method, x, y=None, **options):
    w = wrap(nn.Identity(), method, **options)
    xt = torch.as_tensor(x)
    w.fit([xt if y is None else (xt, torch.as_tensor(y))], progress=False)
    return w


def _u(w, q):
    return w(torch.as_tensor(q)).uncertainty.numpy()


def _class_means(x, y):
    return np.stack([x[y == c].mean(0) for c in np.unique(y)])


def _sk_min_mahalanobis(est, q, mus):
    return np.min(np.stack([est.mahalanobis(q - m) for m in mus], 1), 1)


def _sk_mixture(x, labels, kind):
    """scikit-learn's GaussianMixture with fixed parameters: the class means, weights n_c / N
    and the Ledoit-Wolf covariances of ``kind`` ("full": per class, "tied": pooled)."""
    classes = np.unique(labels)
    mus = _class_means(x, labels)
    if kind == "full":
        covs = np.stack(
            [LedoitWolf(store_precision=False).fit(x[labels == c]).covariance_ for c in classes]
        )
        chol = np.stack([np.linalg.inv(np.linalg.cholesky(c)).T for c in covs])
    else:
        centred = x - mus[np.searchsorted(classes, labels)]
        covs = LedoitWolf(assume_centered=True, store_precision=False).fit(centred).covariance_
        chol = np.linalg.inv(np.linalg.cholesky(covs)).T
    gm = SkGaussianMixture(len(classes), covariance_type=kind)
    gm.weights_ = np.array([np.mean(labels == c) for c in classes])
    gm.means_, gm.covariances_, gm.precisions_cholesky_ = mus, covs, chol
    return gm


# ------------------------------------------------------------------ agreement with scikit-learn
@pytest.mark.parametrize(("n", "d"), [(60, 5), (40, 90), (300, 1280)])
def test_ledoit_wolf_intensity_is_scikit_learns(n, d):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 3, d) + rng.uniform(-1, 1, d)
    y = x - x.mean(0)
    ours = our_shrinkage(torch.as_tensor(y.T @ y), float((np.sum(y * y, 1) ** 2).sum()), n)
    assert ours == pytest.approx(ledoit_wolf_shrinkage(x), rel=1e-9)


@pytest.mark.parametrize(
    ("shrinkage", "reference"),
    [(0.0, EmpiricalCovariance(assume_centered=True)),
     ("ledoit_wolf", LedoitWolf(assume_centered=True)),
     (0.3, ShrunkCovariance(shrinkage=0.3, assume_centered=True))],
)  # fmt: skip
def test_mahalanobis_is_scikit_learns_on_class_centred_rows(shrinkage, reference):
    x, y, q = _data()
    mus = _class_means(x, y)
    est = reference.fit(x - mus[y])
    got = _u(_fit("mahalanobis", x, y, shrinkage=shrinkage), q)
    np.testing.assert_allclose(got, _sk_min_mahalanobis(est, q, mus), rtol=RTOL)


def test_mahalanobis_at_the_width_of_efficientnet_features_with_fewer_points_than_dimensions():
    """D = 1,280 with 300 points in 3 classes: the empirical covariance is singular, the
    Ledoit-Wolf one is not, and the Cholesky solves give scikit-learn's distances to 1e-6."""
    x, y, q = _data(n=300, d=1280, queries=40, seed=2)
    mus = _class_means(x, y)
    est = LedoitWolf(assume_centered=True).fit(x - mus[y])
    w = _fit("mahalanobis", x, y)
    np.testing.assert_allclose(_u(w, q), _sk_min_mahalanobis(est, q, mus), rtol=RTOL)
    with pytest.raises(ValueError, match=r"D > n.*`shrinkage`"):
        _fit("mahalanobis", x, y, shrinkage=0.0)
    # float32 features: the fit and the solves run in float64 on them (the same u as float64
    # features of the same values), u comes back in float32
    x32, q32 = x.astype(np.float32), q.astype(np.float32)
    u32 = _fit("mahalanobis", x32, y)(torch.as_tensor(q32)).uncertainty
    assert u32.dtype == torch.float32
    u64 = _u(_fit("mahalanobis", x32.astype(np.float64), y), q32.astype(np.float64))
    np.testing.assert_allclose(u32.numpy(), u64, rtol=1e-7)


@pytest.mark.parametrize(
    ("kind", "n", "d"), [("full", 400, 12), ("tied", 400, 12), ("full", 240, 1280)]
)
def test_class_gaussian_mixture_is_scikit_learns_score_samples(kind, n, d):
    x, y, q = _data(n=n, d=d, queries=40)
    got = _u(_fit("gmm", x, y, covariance=kind), q)
    np.testing.assert_allclose(got, -_sk_mixture(x, y, kind).score_samples(q), rtol=RTOL)


def test_kmeans_is_scikit_learns_lloyd_from_the_same_start():
    x, _, _ = _data(n=500, d=8, seed=3)
    init = kmeans_plus_plus(torch.as_tensor(x), 6, torch.Generator().manual_seed(0))
    centres, labels = kmeans(torch.as_tensor(x), 6, init=init)
    sk = KMeans(6, init=init.numpy(), n_init=1, algorithm="lloyd", tol=0.0, max_iter=300).fit(x)
    np.testing.assert_array_equal(labels.numpy(), sk.labels_)
    np.testing.assert_allclose(centres.numpy(), sk.cluster_centers_, rtol=1e-9, atol=1e-12)


def test_kmeans_mixture_is_scikit_learns_on_the_clusters_it_found():
    x, _, q = _data(n=500, d=8, seed=3)
    w = _fit("gmm", x, components=4, seed=5)
    init = kmeans_plus_plus(torch.as_tensor(x), 4, torch.Generator().manual_seed(5))
    _, labels = kmeans(torch.as_tensor(x), 4, init=init)
    want = -_sk_mixture(x, labels.numpy(), "full").score_samples(q)
    np.testing.assert_allclose(_u(w, q), want, rtol=RTOL)
    # no labels were needed, and labels given are not used
    np.testing.assert_allclose(_u(_fit("gmm", x, np.zeros(500, int), components=4, seed=5), q),
                               want, rtol=RTOL)  # fmt: skip


@pytest.mark.parametrize("reduce", ["mean", "kth"])
@pytest.mark.parametrize("d", [7, 1280])
def test_knn_is_scikit_learns_cosine_neighbours(reduce, d):
    x, _, q = _data(n=300, d=d, queries=50)
    dist, _ = NearestNeighbors(n_neighbors=9, metric="cosine").fit(x).kneighbors(q)
    want = dist.mean(1) if reduce == "mean" else dist[:, -1]
    np.testing.assert_allclose(_u(_fit("knn", x, k=9, reduce=reduce), q), want, rtol=RTOL,
                               atol=1e-12)  # fmt: skip


def test_fit_gaussians_weights_and_log_det():
    x, y, q = _data(n=200, d=5)
    mix, report = fit_gaussians(torch.as_tensor(x), torch.as_tensor(y))
    covs = [LedoitWolf().fit(x[y == c]).covariance_ for c in range(3)]
    np.testing.assert_allclose(mix.log_det().numpy(), [np.linalg.slogdet(c)[1] for c in covs],
                               rtol=1e-10)  # fmt: skip
    np.testing.assert_allclose(mix.log_weights.exp().numpy(), np.bincount(y) / 200)
    assert report["counts"] == np.bincount(y).tolist() and len(report["shrinkage"]) == 3
    comp = mix.component_log_prob(torch.as_tensor(q)).numpy()
    np.testing.assert_allclose(mix.log_prob(torch.as_tensor(q)).numpy(), logsumexp(comp, 1))


# ------------------------------------------------------------------ through wrap, save and load
class _Net(nn.Module):
    """A small frozen encoder with BatchNorm statistics: images [N, 1, 4, 4] -> [N, 6]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.BatchNorm1d(12), nn.ReLU(),
                                 nn.Linear(12, 6))  # fmt: skip
        self.net.train()
        with torch.no_grad():
            self.net(torch.randn(64, 1, 4, 4) * 2 + 1)

    def forward(self, x):
        return self.net(x)


def _images(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    return torch.randn(n, 1, 4, 4, generator=g) + y[:, None, None, None].float(), y


FITTED = {
    "knn": {"k": 4},
    "mahalanobis": {},
    "gmm": {},
    "gmm_kmeans": {"components": 3, "covariance": "tied"},
}


def _wrapped(name, enc):
    method = "gmm" if name.startswith("gmm") else name
    w = wrap(enc, method, **FITTED[name])
    x, y = _images()
    report = w.fit([(x[:48], y[:48]), (x[48:], y[48:])], progress=False)
    assert report["n_reference"] == 96
    return w


@pytest.mark.parametrize("name", sorted(FITTED))
def test_wrapped_embedding_untouched_and_save_load_round_trip(name, tmp_path):
    enc = _Net()
    w = _wrapped(name, enc)
    x, _ = _images(10, seed=1)
    emb, u = w(x)
    with torch.no_grad():
        assert torch.equal(emb, enc.eval()(x))  # the encoder's embedding, bit for bit
    assert u.shape == (10,) and u.dtype == emb.dtype and bool(torch.isfinite(u).all())
    w.save(tmp_path / "w.pt")
    raw = torch.load(tmp_path / "w.pt", weights_only=True)
    assert raw["method"] == w.method and not any(k.startswith("encoder.") for k in raw["state"])
    again = load(tmp_path / "w.pt", _Net())
    assert type(again) is type(w) and again.config() == w.config()
    torch.testing.assert_close(again(x).uncertainty, u, rtol=0, atol=0)
    fresh = wrap(_Net(), w.method, **FITTED[name])
    fresh._load_head_state(w.head_state_dict())
    torch.testing.assert_close(fresh(x).uncertainty, u, rtol=0, atol=0)
    with pytest.raises(ValueError, match="fitted on 6-dim"):
        load(tmp_path / "w.pt", nn.Sequential(nn.Flatten(), nn.Linear(16, 5)))


def test_float64_state_survives_casts_and_u_follows_the_input_dtype():
    w = _wrapped("gmm", _Net())
    x, _ = _images(8, seed=2)
    with torch.no_grad():
        emb = w.embed(x)
    u32 = w(x).uncertainty
    w.half()  # the encoder is cast, the Cholesky factors are not
    assert w.scale_tril.dtype == torch.float64 and w.means.dtype == torch.float64
    u64 = w.uncertainty_from(emb.double())
    assert u32.dtype == torch.float32 and u64.dtype == torch.float64
    torch.testing.assert_close(u64.float(), u32, rtol=0, atol=0)  # float64 inside, rounded once
    w.double()
    assert w(x.double()).uncertainty.dtype == torch.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", sorted(FITTED))
def test_fit_and_predict_on_cuda_match_cpu(name):
    x, _ = _images(12, seed=3)
    cpu = _wrapped(name, _Net())(x).uncertainty
    gpu = _wrapped(name, _Net().cuda())
    assert next(b for n, b in gpu.named_buffers() if not n.startswith("encoder.")).is_cuda
    torch.testing.assert_close(gpu(x.cuda()).uncertainty.cpu(), cpu, rtol=1e-4, atol=1e-6)


def test_identity_encoder_keeps_the_features_device_and_registers_every_method():
    from bayesurl.posthoc.base import wrapper_names

    assert {"knn", "mahalanobis", "gmm"} <= set(wrapper_names())
    assert isinstance(wrap(nn.Identity(), "knn"), KNNWrapper)
    assert isinstance(wrap(nn.Identity(), "mahalanobis"), MahalanobisWrapper)
    assert isinstance(wrap(nn.Identity(), "gmm"), GMMWrapper)


# ------------------------------------------------------------------ bad input
def test_labels_missing_for_the_labelled_scores_are_named():
    x, _, _ = _data()
    with pytest.raises(ValueError, match="`loader` yields no labels.*'mahalanobis'"):
        _fit("mahalanobis", x)
    with pytest.raises(ValueError, match=r"`components`=None.*`components`=K"):
        _fit("gmm", x)
    _fit("knn", x)  # needs none
    with pytest.raises(ValueError, match="some batches have labels and others do not"):
        wrap(nn.Identity(), "knn").fit([torch.as_tensor(x[:5]), (torch.as_tensor(x[5:]),
                                        torch.zeros(len(x) - 5))], progress=False)  # fmt: skip


def test_too_few_points_per_class_are_named():
    x, y, _ = _data(n=40, d=4)
    y = y.copy()
    y[0] = 7  # a class of one point
    with pytest.raises(ValueError, match=r"at least 2 reference points.*`labels` 7 has 1"):
        _fit("mahalanobis", x, y)
    y[1] = 8
    y[2] = 8  # a class of two: its own covariance cannot be estimated
    with pytest.raises(ValueError, match=r"at least 3 reference points.*`labels` 7 has 1, 8 has 2"):
        _fit("gmm", x, y)
    with pytest.raises(ValueError, match=r"`components` = 20 k-means components need at least 60"):
        _fit("gmm", x, components=20)


def test_singular_covariance_without_shrinkage_is_named():
    x, y, _ = _data(n=30, d=40)
    with pytest.raises(ValueError, match=r"30 reference points in 40 dimensions \(D > n\).*"
                       r"`shrinkage`='ledoit_wolf'"):  # fmt: skip
        _fit("mahalanobis", x, y, shrinkage=0)
    same = np.repeat(x[:1], 12, axis=0)  # no spread at all: nothing to shrink towards
    with pytest.raises(ValueError, match="not positive definite"):
        _fit("mahalanobis", same, np.arange(12) % 2)


def test_small_kmeans_clusters_are_dropped_with_a_warning():
    x, _, q = _data(n=200, d=3)
    x = np.concatenate([x, [[90.0, 90, 90], [-90.0, 90, -90]]])  # two lone outliers
    w = wrap(nn.Identity(), "gmm", components=6)
    with pytest.warns(UserWarning, match="fewer than 3 reference points and were dropped"):
        report = w.fit([torch.as_tensor(x)], progress=False)
    assert report["components"] + report["dropped_components"] == 6
    assert report["dropped_components"] >= 1 and min(report["component_sizes"]) >= 3
    assert np.isfinite(_u(w, q)).all()


@pytest.mark.parametrize(
    ("method", "options", "match"),
    [("knn", {"k": 0}, "`k` must be an integer >= 1"),
     ("knn", {"reduce": "median"}, "`reduce` must be 'mean' or 'kth'"),
     ("mahalanobis", {"shrinkage": "oas"}, "`shrinkage` must be 'ledoit_wolf' or a number"),
     ("mahalanobis", {"shrinkage": 1.5}, "`shrinkage` must be <= 1.0"),
     ("gmm", {"covariance": "diag"}, "`covariance` must be 'full' or 'tied'"),
     ("gmm", {"components": 0}, "`components` must be an integer >= 1"),
     ("gmm", {"bogus": 1}, r"unknown option\(s\) \['bogus'\]")],
)  # fmt: skip
def test_bad_options_are_named(method, options, match):
    with pytest.raises(ValueError, match=match):
        wrap(nn.Identity(), method, **options)


def test_knn_needs_k_reference_points_and_every_wrapper_needs_a_fit():
    x, _, q = _data(n=5, d=3, queries=4)
    with pytest.raises(ValueError, match=r"`k` = 10 neighbours, but the reference set has 5"):
        _fit("knn", x)
    for method in ("knn", "mahalanobis", "gmm"):
        with pytest.raises(ValueError, match="not fitted"):
            wrap(nn.Identity(), method)(torch.as_tensor(q))
    w = _fit("knn", x, k=2)
    with pytest.raises(ValueError, match="returns 4-dim embeddings, but the knn wrapper was"):
        w(torch.zeros(2, 4, dtype=torch.float64))
