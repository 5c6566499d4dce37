"""One meaning of u for every estimator: higher u = less certain, and u is what the docs say.

docs/concepts/uncertainty.rst lists each estimator's u. For every registry method, every
post-hoc wrapper and every free baseline this file

- recomputes the documented definition independently (float64 numpy / scipy from the model's
  own outputs or parameters, brute-force loops, Monte-Carlo draws), and
- checks the orientation on a case whose answer is known without u: a flatter softmax, a wider
  spread of sampled embeddings, a higher temperature, a larger loss, inputs away from the data
  the posterior was fitted on, features far from the training features.

The list of cases is checked against the registries, so a new estimator without a case fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import ive
from scipy.stats import entropy as scipy_entropy
from scipy.stats import spearmanr
from torch import nn

import bayesurl.methods as methods
from bayesurl.posthoc import wrap
from bayesurl.posthoc.base import wrapper_names
from bayesurl.runs.estimators import BaselineScore

D_IN = 6


class _Feat(nn.Module):
    """A tiny backbone: inputs ``[N, 6]`` to features ``[N, 8]``."""

    num_features = 8

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D_IN, 8), nn.Tanh())

    def forward(self, x):
        return self.net(x)


@pytest.fixture(autouse=True)
def _seeded_one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(n)


def _inputs(n=64, seed=0):
    """Inputs with norms spread over two decades, so every u varies."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-1, 1, n)[:, None]
    return torch.randn(n, D_IN, generator=g) * scale


def _np(t):
    return t.detach().double().cpu().numpy()


def _make(name, **kw):
    torch.manual_seed(0)
    return methods.create(name, backbone=_Feat(), embed_dim=4, num_classes=2, **kw).eval()


def _rho(a, b):
    return spearmanr(a, b).statistic


# --------------------------------------------------------------------------- classifiers
def _classifier(name):
    """u = entropy of the (averaged) softmax; with 2 classes it decreases strictly with the
    probability of the predicted class, the model's confidence."""
    m = _make(name)
    torch.manual_seed(1)
    with torch.no_grad():
        out = m(_inputs())
    p = np.exp(_np(out.logits))
    p /= p.sum(1, keepdims=True)
    u = _np(out.uncertainty)
    np.testing.assert_allclose(u, scipy_entropy(p, axis=1), rtol=1e-4, atol=1e-6)
    assert _rho(u, -p.max(1)) > 0.999


def _losspred():
    """u = the predicted cross-entropy: after a little training it ranks the inputs by their
    actual cross-entropy (the answer known without u)."""
    m = _make("losspred")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, D_IN, generator=g)
    y = (x[:, 0] + 0.8 * torch.randn(256, generator=g) > 0).long()  # noisy labels: CE varies
    m.train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        m.training_loss((x, y)).backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        out = m(x)
        ce = nn.functional.cross_entropy(out.logits, y, reduction="none")
        head = m.predictor(out.embedding)
    torch.testing.assert_close(out.uncertainty, head.reshape(-1))
    assert _rho(_np(out.uncertainty), _np(ce)) > 0.5


# --------------------------------------------------------------------------- vMF family
def _mean_resultant(kappa, d):
    """A_D(kappa) = I_{D/2}(kappa) / I_{D/2-1}(kappa): the expected cosine of a vMF draw to
    its mean (scipy's scaled Bessel functions)."""
    return ive(d / 2, kappa) / ive(d / 2 - 1, kappa)


def _vmf(name):
    """u = 1/kappa; the input with the highest u has the widest spread of sampled embeddings
    around its mean (Monte Carlo), as the analytic A_D(kappa) says."""
    m = _make(name)
    with torch.no_grad():  # an untrained head's kappa barely varies: spread it (1 to ~100)
        m.kappa_head.mlp[-1].weight.mul_(20.0)
        m.kappa_head.output_scale.fill_(5.0)
    x = _inputs()
    with torch.no_grad():
        out = m(x)
    u, kappa = _np(out.uncertainty), _np(out.kappa).reshape(-1)
    assert kappa.max() > 3 * kappa.min()  # the premise: certain and uncertain inputs
    np.testing.assert_allclose(u, 1.0 / kappa, rtol=1e-5)
    lo, hi = int(np.argmin(u)), int(np.argmax(u))
    with torch.no_grad():
        s = m(x[[lo, hi]], n_samples=4000).samples.double()
    d = s.shape[-1]
    r = torch.nn.functional.normalize(s, dim=-1).mean(0).norm(dim=-1).numpy()
    want = _mean_resultant(kappa[[lo, hi]], d)
    np.testing.assert_allclose(r, want, atol=0.02)
    assert r[1] < r[0]  # the higher u: the more spread-out draws


def _infonce(name):
    """u = 1/||e(x)||, e the unnormalised embedding of the projection."""
    m = _make(name)
    x = _inputs()
    with torch.no_grad():
        out = m(x)
        e = m.net(x)
    u = _np(out.uncertainty)
    np.testing.assert_allclose(u, 1.0 / np.linalg.norm(_np(e), axis=1), rtol=1e-5)
    assert _rho(u, -np.linalg.norm(_np(e), axis=1)) > 0.999


def _contrastive_mcdropout():
    """u = 1/kappa_hat (Sra) of the dropout draws: Sra's formula in numpy on the same draws
    (the same generator state), larger for inputs whose draws spread more."""
    from bayesurl.heads.dropout import block_dropout_linear

    m = _make("contrastive_mcdropout", n_passes=64)
    x = _inputs()
    with torch.no_grad():
        torch.manual_seed(3)
        u = _np(m(x).uncertainty)
        torch.manual_seed(3)
        z = _np(block_dropout_linear(m.net.features(x), m.net.proj, m.p, m.groups, 64))
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    r = np.linalg.norm(z.mean(0), axis=-1)
    d = z.shape[-1]
    np.testing.assert_allclose(u, (1 - r**2) / (r * (d - r**2)), rtol=1e-4, atol=1e-9)
    assert _rho(u, 1 - r) > 0.999


# --------------------------------------------------------------------------- TaU
def _tau_reference(s, scale):
    tau = scale * (1 + np.exp(-s))  # TaU Algorithm 1: 1/tau = sigmoid(s) / scale
    return np.log(tau / scale), tau


def _tau():
    """u = log(tau / scale): the temperature on a log scale; a higher temperature flattens the
    input's similarity distribution (TaU section 2): the less certain input."""
    m = _make("tau", scale=0.1)
    x = _inputs()
    with torch.no_grad():
        out = m(x)
        s = _np(m.encode(x)[1])
    want, tau = _tau_reference(s, 0.1)
    u = _np(out.uncertainty)
    np.testing.assert_allclose(u, want, rtol=1e-5, atol=1e-7)
    assert _rho(u, tau) > 0.999 and (u >= 0).all()


def _posthoc_tau():
    enc = nn.Linear(D_IN, 4)
    w = wrap(enc, "tau", scale=0.2)
    x = _inputs()
    views = [((xb + 0.05 * torch.randn_like(xb), xb), torch.zeros(16)) for xb in x.split(16)]
    w.fit(views, epochs=2, progress=False)
    with torch.no_grad():
        u = _np(w(x).uncertainty)
        s = _np(w.logit(enc(x)))
    want, tau = _tau_reference(s, 0.2)
    np.testing.assert_allclose(u, want, rtol=1e-5, atol=1e-7)
    assert _rho(u, tau) > 0.999


# --------------------------------------------------------------------------- PVU
def _posthoc_pvu():
    """u = the head's score, trained to rank inputs by their task loss: after fitting it ranks
    held-out inputs by their actual cross-entropy."""
    enc = nn.Linear(D_IN, 4)
    clf = nn.Linear(4, 2)
    with torch.no_grad():
        enc.weight.copy_(torch.eye(4, D_IN))
        enc.bias.zero_()
        clf.weight.copy_(torch.tensor([[2.0, 0, 0, 0], [-2.0, 0, 0, 0]]))
        clf.bias.zero_()
    w = wrap(enc, "pvu", classifier=clf, hidden=32)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, D_IN, generator=g)
    y = torch.zeros(512, dtype=torch.long)  # CE = softplus(-4 x0): a known ranking
    w.fit([(xb, yb) for xb, yb in zip(x.split(64), y.split(64))], cached=False, epochs=30,
          lr=1e-2, progress=False)  # fmt: skip
    xt = torch.randn(200, D_IN, generator=g)
    with torch.no_grad():
        u = _np(w(xt).uncertainty)
        ce = _np(
            nn.functional.cross_entropy(clf(enc(xt)), torch.zeros(200).long(), reduction="none")
        )
        head = _np(w.head(enc(xt)).reshape(-1))
    np.testing.assert_allclose(u, head, rtol=1e-6)
    assert _rho(u, ce) > 0.8


# --------------------------------------------------------------------------- Laplace / LAM
def _laplace_data():
    """Training inputs in the first 3 input dimensions only; test inputs with the same norm
    along the 3 unseen dimensions: there the posterior is the prior's, wider."""
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(240, D_IN)
    x[:, :3] = torch.randn(240, 3, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    seen = torch.zeros(60, D_IN)
    seen[:, :3] = torch.randn(60, 3, generator=g)
    unseen = torch.zeros(60, D_IN)
    unseen[:, 3:] = torch.randn(60, 3, generator=g)
    unseen *= (seen.norm(dim=1) / unseen.norm(dim=1))[:, None]
    return x, y, seen, unseen


def _posthoc_laplace():
    """Embedding path: u = 1/kappa of the linearised predictive of the normalised embedding,
    ranked as the trace of the covariance of sampled embeddings (Monte Carlo); inputs in
    directions the fit never saw get the higher u. Classifier path: u = the entropy of the
    Laplace predictive."""
    x, y, seen, unseen = _laplace_data()
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Linear(D_IN, D_IN), nn.Linear(D_IN, 4))
    with torch.no_grad():  # features = inputs: the unseen dimensions stay unseen by the fit
        enc[0].weight.copy_(torch.eye(D_IN))
        enc[0].bias.zero_()
    w = wrap(enc, "laplace", prior_precision=1.0)
    w.fit([(xb, yb) for xb, yb in zip(x.split(60), y.split(60))], optimize_prior=False,
          progress=False)  # fmt: skip
    both = torch.cat([seen, unseen])
    with torch.no_grad():
        u = _np(w(both).uncertainty)
        s = w.sample(both, 2000, generator=torch.Generator().manual_seed(0)).double()
    spread = (s - s.mean(0)).pow(2).sum(-1).mean(0).numpy()  # trace of Cov of the draws
    assert _rho(u, spread) > 0.9
    assert np.median(u[60:]) > np.median(u[:60])
    # classifier path
    clf = nn.Linear(4, 4)
    wc = wrap(enc, "laplace", classifier=clf)
    wc.fit([(xb, yb) for xb, yb in zip(x.split(60), y.split(60))], progress=False)
    with torch.no_grad():
        out = wc(both)
        pred = wc.cla.predictive(enc(both))
    # the probit predictive softmax(mu / sqrt(1 + pi/8 var)) of the logit mean and variance
    mu, var = _np(pred.logits), _np(pred.logit_var)
    z = mu / np.sqrt(1 + math.pi / 8 * var)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(_np(out.uncertainty), scipy_entropy(p, axis=1), rtol=1e-4)
    # directions the fit never saw keep the prior's logit variance: the larger one
    assert np.median(var[60:].sum(1)) > np.median(var[:60].sum(1))


# --------------------------------------------------------------------------- free baselines
def _reference_data(seed=0):
    """Two labelled classes of training features; held-out inputs near them and far away."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(200) % 2
    shift = torch.tensor([4.0, 0, 0, 0, 0, 0])
    train = torch.randn(200, D_IN, generator=g, dtype=torch.float64) + shift * (2 * y[:, None] - 1)
    near = train[:20] + 0.1 * torch.randn(20, D_IN, generator=g, dtype=torch.float64)
    # 12 sd off along an axis the classes do not use: far in distance and in direction
    far = 0.5 * torch.randn(20, D_IN, generator=g, dtype=torch.float64)
    far[:, 5] += 12.0
    return train, y, torch.cat([near, far])


def _knn_u(f, train, k):
    """Mean cosine distance to the k nearest training features (a brute-force loop)."""
    want = []
    for v in f:
        cos = sorted(
            (float(v @ t / (np.linalg.norm(v) * np.linalg.norm(t))) for t in train), reverse=True
        )
        want.append(np.mean([1 - c for c in cos[:k]]))
    return np.array(want)


def _lw(rows):
    """Ledoit-Wolf covariance of centred rows (scikit-learn, the independent reference)."""
    from sklearn.covariance import LedoitWolf

    return LedoitWolf(assume_centered=True).fit(rows).covariance_


def _mahalanobis_u(f, train, y):
    """min over classes of (f - mu_c)^T Sigma^-1 (f - mu_c), Sigma the Ledoit-Wolf
    covariance of the class-centred training features (numpy solve)."""
    mus = np.stack([train[y == c].mean(0) for c in (0, 1)])
    cov = _lw(train - mus[y])
    d = [np.einsum("nd,nd->n", f - m, np.linalg.solve(cov, (f - m).T).T) for m in mus]
    return np.min(d, axis=0)


def _gmm_u(f, train, y):
    """-log sum_c pi_c N(f; mu_c, Sigma_c), each Sigma_c the Ledoit-Wolf covariance of its
    class (scipy's multivariate normal)."""
    from scipy.special import logsumexp
    from scipy.stats import multivariate_normal

    logs = []
    for c in (0, 1):
        rows = train[y == c]
        mu = rows.mean(0)
        pdf = multivariate_normal(mu, _lw(rows - mu))
        logs.append(np.log(len(rows) / len(train)) + pdf.logpdf(f))
    return -logsumexp(np.stack(logs), axis=0)


_REFERENCE_U = {
    "knn": lambda f, tr, y: _knn_u(f, tr, 5),
    "mahalanobis": _mahalanobis_u,
    "gmm": _gmm_u,
}


def _posthoc_reference(method):
    """knn: mean cosine distance to the k nearest reference embeddings; mahalanobis: squared
    distance to the nearest class mean under the shared Ledoit-Wolf covariance; gmm: -log
    density of the class-conditional mixture. Fitted through a linear encoder, higher for
    inputs away from the reference set."""
    enc = nn.Linear(D_IN, D_IN).double()
    with torch.no_grad():
        enc.weight.copy_(torch.eye(D_IN) + 0.1 * torch.ones(D_IN, D_IN))
        enc.bias.fill_(0.5)
    train, y, both = _reference_data()
    w = wrap(enc, method, **({"k": 5} if method == "knn" else {}))
    w.fit([(xb, yb) for xb, yb in zip(train.split(64), y.split(64))], progress=False)
    with torch.no_grad():
        u = _np(w(both).uncertainty)
        f, tr = _np(enc(both)), _np(enc(train))
    np.testing.assert_allclose(u, _REFERENCE_U[method](f, tr, _np(y).astype(int)), rtol=1e-9)
    assert u[20:].min() > u[:20].max()


def _baseline(score):
    """inverse_norm: u = 1/||f||; knn_distance, mahalanobis, gmm: the scores of the post-hoc
    wrappers above on the input features themselves, fitted on the training features (the
    recipe's rows), higher for features away from the training ones."""
    from bayesurl.runs.config import load_recipe
    from bayesurl.runs.estimators import BaselineEstimator

    options = {"knn_distance": {"k": 5}}.get(score, {})
    est = BaselineEstimator(
        load_recipe(
            "fashion_mnist/feature_norm",
            [("estimator.kwargs", {"score": score, **options})],
            preset="smoke",
        )
    )
    assert est.score is BaselineScore(score)
    train, y, both = _reference_data()
    if est.wrapped is not None:
        est.wrapped.fit([(train.float(), y)], progress=False)
    u = _np(est.predict(both.float()).uncertainty)
    f = _np(both.float())
    if score == "inverse_norm":
        np.testing.assert_allclose(u, 1 / np.linalg.norm(f, axis=1), rtol=1e-6)
        assert _rho(u, -np.linalg.norm(f, axis=1)) > 0.999
        return
    ref = _REFERENCE_U["knn" if score == "knn_distance" else score]
    # float32 features: the fit and the solves run in float64 on them
    np.testing.assert_allclose(u, ref(f, _np(train.float()), _np(y).astype(int)), rtol=1e-5)
    assert u[20:].min() > u[:20].max()


CASES = {
    **{n: (lambda n=n: _classifier(n)) for n in ("ce", "ensemble", "hetxl", "mcdropout", "sngp")},
    "losspred": _losspred,
    **{n: (lambda n=n: _vmf(n)) for n in ("elk", "hib", "mcinfonce", "nivmf")},
    "infonce": lambda: _infonce("infonce"),
    "contrastive": lambda: _infonce("contrastive"),
    "contrastive_mcdropout": _contrastive_mcdropout,
    "tau": _tau,
    "posthoc:tau": _posthoc_tau,
    "posthoc:pvu": _posthoc_pvu,
    "posthoc:laplace": _posthoc_laplace,
    **{f"posthoc:{m}": (lambda m=m: _posthoc_reference(m)) for m in _REFERENCE_U},
    **{f"baseline:{s.value}": (lambda s=s.value: _baseline(s)) for s in BaselineScore},
}


def test_every_estimator_has_a_case():
    registry = (
        set(methods.available())
        | {f"posthoc:{w}" for w in wrapper_names()}
        | {f"baseline:{s.value}" for s in BaselineScore}
    )
    assert set(CASES) == registry


@pytest.mark.parametrize("name", sorted(CASES))
def test_u_is_the_documented_definition_and_higher_means_less_certain(name):
    CASES[name]()


def test_documented_definitions_name_every_method():
    """The concepts page names every registry method and wrapper in its table."""
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "concepts" / "uncertainty.rst").read_text()
    for name in [*methods.available(), *wrapper_names(), *(s.value for s in BaselineScore)]:
        assert f"``{name}``" in page, name
    assert r"\log(\tau(x)/M)" in page  # TaU: the temperature on a log scale
