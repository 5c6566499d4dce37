"""wrap(): embeddings unchanged bit for bit, save/load and state_dict round trips, bad input;
post-hoc TaU trains its temperature head only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bayesurl
from bayesurl.posthoc import PosthocOutput, PosthocTaU, load, wrap
from bayesurl.types import Output

# laplace-torch / BackPACK chatter on the Laplace paths
pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook:UserWarning"),
    pytest.mark.filterwarnings("ignore:By default `link_approx`:UserWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
]


def _encoder(dim=6, seed=0):
    torch.manual_seed(seed)
    enc = nn.Sequential(
        nn.Flatten(),
        nn.Linear(16, 12),
        nn.BatchNorm1d(12),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(12, dim),
    )
    enc.train()
    # non-trivial BatchNorm statistics
    with torch.no_grad():
        for _ in range(3):
            enc(torch.randn(32, 1, 4, 4) * 2 + 1)
    return enc


class _Opaque(nn.Module):
    """An encoder whose attributes say nothing about its output width (like a timm model)."""

    def __init__(self, inner, num_features=512):
        super().__init__()
        self.inner = inner
        self.num_features = num_features  # timm: the width before the head, not the output
        self.embed_dim = num_features  # a ViT's token width: not the output either

    def forward(self, x):
        return self.inner(x)


def _labelled(n_batches=4, batch=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        y = torch.randint(0, 3, (batch,), generator=g)
        x = torch.randn(batch, 1, 4, 4, generator=g) + y[:, None, None, None].float()
        out.append((x, y))
    return out


def _views(n_batches=3, batch=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, 1, 4, 4, generator=g)
        v1 = x + 0.1 * torch.randn(x.shape, generator=g)
        v2 = x + 0.1 * torch.randn(x.shape, generator=g)
        out.append(((v1, v2), torch.zeros(batch, dtype=torch.long)))
    return out


def _fitted(method, enc, tmp_path):
    if method == "pvu":
        w = wrap(enc, "pvu", classifier=nn.Linear(6, 3), hidden=16)
        w.fit(_labelled(), epochs=2, cache_dir=tmp_path / "cache", progress=False)
    elif method == "tau":
        w = wrap(enc, "tau", embed_dim=6)
        w.fit(_views(), epochs=2, progress=False)
    elif method == "laplace":
        w = wrap(enc, "laplace", margin=1.0)
        w.fit(_labelled(), progress=False)
    elif method == "laplace_kron":  # Kronecker-factored (EKFAC) contrastive posterior
        w = wrap(enc, "laplace", margin=1.0, hessian_structure="kron")
        w.fit(_labelled(), progress=False)
    else:  # laplace-torch last-layer Laplace of a classifier on the embedding
        w = wrap(enc, "laplace", classifier=_classifier())
        w.fit(_labelled(), progress=False)
    return w


def _classifier(seed=1):
    torch.manual_seed(seed)
    return nn.Linear(6, 3)


METHODS = ["pvu", "tau", "laplace", "laplace_kron", "laplace_classifier"]
#: modules that are not saved and go back in on load
LOAD_OPTIONS = {"laplace_classifier": lambda: {"classifier": _classifier()}}


@pytest.mark.parametrize("method", METHODS)
def test_embedding_is_the_encoders_bit_for_bit(method, tmp_path):
    enc = _encoder()
    w = _fitted(method, enc, tmp_path)
    x = torch.randn(9, 1, 4, 4)
    w.train()  # the wrapper's mode never changes the encoder's
    assert not enc.training
    ref = _encoder()  # identical weights, evaluated independently
    ref.eval()
    with torch.no_grad():
        want = ref(x)
        out = w(x)
    assert isinstance(out, Output) and isinstance(out, PosthocOutput)
    assert torch.equal(out.embedding, want)
    emb, u = out  # the dual-output API
    assert emb is out.embedding and u.shape == (9,)
    assert torch.isfinite(u).all() and bool((u > 0).all())
    # the encoder was not trained
    for (k, a), (_, b) in zip(enc.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("method", METHODS)
def test_save_load_and_state_dict_round_trip(method, tmp_path):
    enc = _encoder()
    w = _fitted(method, enc, tmp_path)
    x = torch.randn(7, 1, 4, 4)
    with torch.no_grad():
        before = w(x)
    path = tmp_path / "w.pt"
    w.save(path)
    raw = torch.load(path, weights_only=True)  # loads without pickle
    assert raw["method"] == method.split("_")[0]
    assert not any(k.startswith("encoder.") for k in raw["state"])
    opts = LOAD_OPTIONS.get(method, dict)
    for loaded in (load(path, _encoder(), **opts()), type(w).load(path, _encoder(), **opts())):
        with torch.no_grad():
            after = loaded(x)
        assert torch.equal(before.embedding, after.embedding)
        assert torch.equal(before.uncertainty, after.uncertainty)
    # state_dict into a freshly wrapped copy
    fresh = wrap(_encoder(), method.split("_")[0], **{**w.config(), **opts()})
    fresh.load_state_dict(w.state_dict())
    with torch.no_grad():
        again = fresh(x)
    assert torch.equal(before.uncertainty, again.uncertainty)


def test_load_rejects_bad_files_and_mismatched_encoders(tmp_path):
    enc = _encoder()
    w = _fitted("pvu", enc, tmp_path)
    path = tmp_path / "w.pt"
    w.save(path)
    with pytest.raises(ValueError, match="does not fit"):
        load(path, nn.Linear(16, 5))  # its out_features says 5
    with pytest.raises(ValueError, match="does not fit"):
        load(path, _encoder(dim=5))  # a Sequential ending in Linear(12, 5)
    # a module whose width only a forward pass shows: probed at load on the saved item shape
    with pytest.raises(ValueError, match="fitted on 6-dim embeddings, the encoder returns 5"):
        load(path, _Opaque(_encoder(dim=5)))
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.pt", enc)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pt' is not a checkpoint"):
        load(tmp_path / "junk.pt", enc)
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a bayesurl post-hoc"):
        load(tmp_path / "other.pt", enc)
    torch.save({"format": "bayesurl.posthoc/1", "method": "pvu"}, tmp_path / "cut.pt")
    with pytest.raises(ValueError, match="corrupted"):
        load(tmp_path / "cut.pt", enc)
    with pytest.raises(ValueError, match="not 'tau'"):
        PosthocTaU.load(path, _encoder())


def test_bad_input():
    enc = _encoder()
    with pytest.raises(ValueError, match="unknown `method`"):
        wrap(enc, "ensemble")
    with pytest.raises(ValueError, match="unknown option"):
        wrap(enc, "pvu", learning_rate=1.0)
    with pytest.raises(TypeError, match="nn.Module"):
        wrap(lambda x: x, "pvu")
    # mismatched shapes: a head for 5 features on a 6-dim encoder
    w = wrap(enc, "pvu", embed_dim=5)
    with pytest.raises(ValueError, match="returns 6-dim embeddings"):
        w(torch.randn(3, 1, 4, 4))
    with pytest.raises(ValueError, match="not fitted"):
        wrap(nn.Flatten(), "pvu")(torch.randn(3, 1, 4, 4))
    with pytest.raises(ValueError, match="encoder output"):
        wrap(nn.Identity(), "pvu", embed_dim=4)(torch.randn(3, 1, 4, 4))
    with pytest.raises(ValueError, match="no embedding distribution"):
        wrap(enc, "tau", embed_dim=6).sample(torch.randn(2, 1, 4, 4), 3)
    # TaU needs two views
    with pytest.raises(ValueError, match="two augmented views"):
        wrap(enc, "tau").fit(_labelled(1), progress=False)


def test_lazy_top_level_wrap():
    assert bayesurl.wrap is wrap


def test_posthoc_tau_trains_head_only_and_tau_above_scale():
    enc = _encoder()
    enc_state = {k: v.clone() for k, v in enc.state_dict().items()}
    w = wrap(enc, "tau", scale=0.2)
    out = w.fit(_views(n_batches=6), epochs=4, lr=5e-2, progress=False)
    assert out["losses"][-1] < out["losses"][0]
    for k, v in enc.state_dict().items():
        assert torch.equal(v, enc_state[k]), k
    x = torch.randn(20, 1, 4, 4)
    with torch.no_grad():
        u = w(x).uncertainty  # default: u = log(tau / scale) = log(1 + e^-s)
        s = w.head(enc(x)).reshape(-1)
    torch.testing.assert_close(
        u.double(), torch.log1p(torch.exp(-s.double())), rtol=1e-5, atol=1e-7
    )
    # u = tau = scale (1 + e^-s) (TaU Algorithm 1): above the scale, same ranking
    w.uncertainty = "temperature"
    with torch.no_grad():
        tau = w(x).uncertainty
    torch.testing.assert_close(tau, 0.2 * (1 + torch.exp(-s)))
    assert bool((tau > 0.2).all())
    assert torch.equal(torch.argsort(tau), torch.argsort(u))
    with pytest.raises(ValueError, match="uncertainty"):
        wrap(enc, "tau", uncertainty="tau")
    # augment= turns single-view batches into two views
    g = torch.Generator().manual_seed(0)
    w2 = wrap(_encoder(), "tau", variant="reference")
    res = w2.fit(
        [torch.randn(16, 1, 4, 4)],
        augment=lambda x: x + 0.1 * torch.randn(x.shape, generator=g),
        progress=False,
    )
    assert len(res["losses"]) == 1


def _closed_form_trace(enc, la, x):
    """LAM section 3 by hand: var(z_d) = sum_f s2_df phi_f^2 + s2_b,d of the encoder's last
    Linear(12, 6) (parameters flattened as [W, b]), pushed through z / ||z|| linearly."""
    with torch.no_grad():
        phi = enc[:-1](x).double()
        z = enc[-1](phi.float()).double()
    pv = la.posterior_variance.double()
    var = (phi**2) @ pv[:72].reshape(6, 12).T + pv[72:]
    norm2 = (z**2).sum(1)
    u = z / norm2.sqrt()[:, None]
    return (var * (1 - u**2)).sum(1) / norm2, u


def _sra(trace, d):
    # R^2 = 1 / (1 + trace), kappa by Sra (docs/concepts/uncertainty.rst, "Samples")
    r = (1 / (1 + trace)).sqrt()
    return r * (d - r**2) / (1 - r**2)


def test_laplace_wrapper_uncertainty_matches_metric_laplace_and_samples(tmp_path):
    enc = _encoder()
    w = _fitted("laplace", enc, tmp_path)
    x = torch.randn(8, 1, 4, 4)
    with torch.no_grad():
        out = w(x)
    trace, u = _closed_form_trace(enc, w.la, x)
    torch.testing.assert_close(out.kappa.double(), _sra(trace, 6), rtol=1e-5, atol=0)
    torch.testing.assert_close(out.uncertainty.double(), 1 / _sra(trace, 6), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.nn.functional.normalize(out.embedding, dim=1).double(), u)
    ref = w.la.predictive(x)  # and the Laplace helper's own closed-form predictive
    assert torch.allclose(out.uncertainty, ref.uncertainty, rtol=1e-5)
    # samples: normalised draws whose moments match the closed form where the linearisation
    # holds (a tight posterior; the fitted one has trace ~ 0.5, outside it)
    w.la.prior_precision = 2500.0
    trace, u = _closed_form_trace(enc, w.la, x)
    assert float(trace.min()) > 1e-4
    n = 4000
    s = w.sample(x, n, generator=torch.Generator().manual_seed(0)).double()
    assert s.shape == (n, 8, 6)
    assert torch.allclose(s.norm(dim=-1), torch.ones(n, 8, dtype=torch.float64))
    torch.testing.assert_close(s.var(0).sum(1), trace, rtol=0.1, atol=0)
    r = s.mean(0).norm(dim=1)
    torch.testing.assert_close(r * (6 - r**2) / (1 - r**2), _sra(trace, 6), rtol=0.15, atol=0)
    torch.testing.assert_close(s.mean(0) / r[:, None], u, rtol=0, atol=0.02)
    with torch.no_grad():
        torch.testing.assert_close(w(x).kappa.double(), _sra(trace, 6), rtol=1e-5, atol=0)


def test_laplace_kron_wrapper_matches_the_dense_posterior(tmp_path):
    enc = _encoder()
    w = _fitted("laplace_kron", enc, tmp_path)
    assert w.la.hessian_structure.value == "kron"
    x = torch.randn(8, 1, 4, 4)
    with torch.no_grad():
        out = w(x)
        phi = enc[:-1](x).double()
        z = enc[-1](phi.float()).double()
    # the posterior covariance in parameter order ([W, b]) from the basis and variances
    lmat = w.la._to_params(torch.diag(w.la.posterior_variance.sqrt())).double()
    cov = lmat.T @ lmat
    jz = torch.zeros(8, 6, 78, dtype=torch.float64)  # dz_d / d(W_df, b_d)
    for d in range(6):
        jz[:, d, d * 12 : (d + 1) * 12] = phi
        jz[:, d, 72 + d] = 1.0
    norm2 = (z**2).sum(1)
    u = z / norm2.sqrt()[:, None]
    proj = (torch.eye(6, dtype=torch.float64) - u[:, :, None] * u[:, None]) / norm2.sqrt()[
        :, None, None
    ]
    ju = proj @ jz
    trace = torch.einsum("ndp,pq,ndq->n", ju, cov, ju)
    torch.testing.assert_close(out.kappa.double(), _sra(trace, 6), rtol=1e-5, atol=0)
    ref = w.la.predictive(x)
    assert torch.allclose(out.uncertainty, ref.uncertainty, rtol=1e-5)
    s = w.sample(x, 5, generator=torch.Generator().manual_seed(0))
    assert s.shape == (5, 8, 6)


def test_laplace_rejects_encoders_without_a_last_linear():
    conv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
    with pytest.raises(ValueError, match="last nn.Linear"):
        wrap(conv, "laplace")
    ends_in_relu = nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.ReLU())
    w = wrap(ends_in_relu, "laplace")
    with pytest.raises(ValueError, match="not the output of its last nn.Linear"):
        w(torch.randn(4, 1, 4, 4))


def test_classifier_laplace_matches_laplace_torch_and_needs_its_classifier(tmp_path):
    enc = _encoder()
    w = _fitted("laplace_classifier", enc, tmp_path)
    x = torch.randn(8, 1, 4, 4)
    with torch.no_grad():
        out = w(x)
        e = _encoder().eval()(x)
        # laplace-torch's own GLM predictive with the probit link on the same embeddings
        probs = w.cla.la(e, pred_type="glm", link_approx="probit")
    entropy = -(probs * probs.log()).sum(1)
    assert torch.allclose(out.uncertainty, entropy, rtol=1e-4, atol=1e-6)
    assert torch.allclose(out.logits, w.classifier(e), rtol=1e-5)
    with pytest.raises(ValueError, match="over logits"):
        w.sample(x, 2)
    path = tmp_path / "w.pt"
    w.save(path)
    with pytest.raises(ValueError, match="classifier=clf"):
        load(path, _encoder())
    with pytest.raises(ValueError, match="another classifier"):
        load(path, _encoder(), classifier=_classifier(seed=7))
    unfitted = wrap(_encoder(), "laplace", classifier=_classifier())
    with pytest.raises(ValueError, match="fit"):
        unfitted(x)


class _ProjAndKappa(nn.Module):
    """Like the vMF methods: the embedding is `proj`, a later `kappa` Linear is a side head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.proj = nn.Linear(16, 6)
        self.kappa = nn.Linear(6, 1)
        self.last_kappa = None

    def forward(self, x):
        z = self.proj(x.flatten(1))
        self.last_kappa = self.kappa(z)
        return z


def test_laplace_finds_the_embedding_layer_and_rejects_a_wrong_one():
    enc = _ProjAndKappa()
    w = wrap(enc, "laplace")
    assert w.la.last_layer is enc.kappa  # the naive choice: the last nn.Linear
    w.fit(_labelled(), progress=False)
    assert w.la.last_layer is enc.proj and w.config()["last_layer"] == "proj"
    x = torch.randn(5, 1, 4, 4)
    with torch.no_grad():
        assert torch.equal(w(x).embedding, enc(x))
    with pytest.raises(ValueError, match="not the output of its last nn.Linear"):
        wrap(_ProjAndKappa(), "laplace", last_layer="kappa").fit(_labelled(), progress=False)
