"""What the vMF methods' kappa head reads: the embedding (URL B.3-B.6, the default) or the
backbone features with one linear layer (HIB, Oh et al. 2019; LAM's HIB baseline).

References: numpy written from ``kappa = s * softplus(MLP(input)) + min_kappa`` with the
head's own weights, the backbone's features computed on their own, and a head built the way
the methods built it before the option existed (same seed, same draws).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bayesurl.methods as M
from bayesurl.heads.embedding import EmbeddingNet
from bayesurl.heads.kappa import KappaHead

SMALL = {"width": 8, "num_features": 32}
D, C = 5, 3
VMF_METHODS = ["hib", "elk", "nivmf", "mcinfonce"]


def _x(n: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed)).double()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _softplus(z: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0.0)


def _leaky(z: np.ndarray) -> np.ndarray:
    return np.where(z > 0, z, 0.01 * z)


def _hib(**kw) -> M.Method:
    torch.manual_seed(0)
    kw = {"warmup_u": None, **kw}
    return M.create("hib", embed_dim=D, num_classes=C, backbone_kwargs=SMALL, **kw).double()


def test_default_reads_the_embedding_with_a_three_layer_mlp():
    m = _hib().eval()
    x = _x()
    with torch.no_grad():
        e, kappa = m.embed_with_kappa(x)
        f = _np(m.net.backbone(x))
    proj = m.net.proj
    e_ref = f @ _np(proj.weight).T + _np(proj.bias)
    lin = [layer for layer in m.kappa_head.mlp if isinstance(layer, torch.nn.Linear)]
    assert len(lin) == 3 and lin[0].in_features == D
    z = e_ref
    for i, layer in enumerate(lin):
        z = z @ _np(layer.weight).T + _np(layer.bias)
        z = _leaky(z) if i < 2 else z
    kappa_ref = _softplus(z[:, 0]) + 1e-4  # the default min_kappa, no warm-up (s = 1)
    np.testing.assert_allclose(_np(e), e_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_np(kappa), kappa_ref, rtol=1e-12)
    assert m.hparams["kappa_input"] == "embedding" and m.hparams["min_kappa"] == 1e-4


def test_default_draws_the_same_weights_and_keeps_the_checkpoint_keys():
    m = _hib()
    # the construction before the option: the embedding net, then KappaHead(D) on the embedding
    torch.manual_seed(0)
    net = EmbeddingNet("small_convnet", D, **SMALL)
    head = KappaHead(D)
    old = {f"net.{k}": v for k, v in net.state_dict().items()}
    old.update({f"kappa_head.{k}": v for k, v in head.state_dict().items()})
    got = {k: v for k, v in m.state_dict().items() if k.split(".")[0] in ("net", "kappa_head")}
    assert sorted(got) == sorted(old)
    for k, v in old.items():
        torch.testing.assert_close(got[k], v.to(got[k].dtype), rtol=0, atol=0)
    # a checkpoint written before the option (hparams without its keys) rebuilds and loads
    hp = {k: v for k, v in m.hparams.items() if k not in ("kappa_input", "min_kappa")}
    rebuilt = M.create("hib", **hp).double()
    rebuilt.load_state_dict(m.state_dict(), strict=True)
    assert rebuilt.kappa_input == "embedding" and rebuilt.kappa_head.min_kappa == 1e-4


@pytest.mark.parametrize("warmup_u", [None, 0.05])
def test_features_input_is_a_linear_softplus_of_the_backbone_features(warmup_u):
    m = _hib(kappa_input="features", kappa_hidden=0, min_kappa=0.01, warmup_u=warmup_u)
    x = _x(8)
    m.train()
    e, kappa = m.embed_with_kappa(x)  # the first training batch warms up, if asked
    f = _np(m.net.backbone(x))
    assert f.shape[1] == m.net.feature_dim == SMALL["num_features"]
    (lin,) = list(m.kappa_head.mlp)
    assert isinstance(lin, torch.nn.Linear) and lin.in_features == f.shape[1]
    s = float(m.kappa_head.output_scale)
    kappa_ref = _softplus(f @ _np(lin.weight)[0] + _np(lin.bias)[0]) * s + 0.01
    np.testing.assert_allclose(_np(kappa), kappa_ref, rtol=1e-12)
    np.testing.assert_allclose(
        _np(e), f @ _np(m.net.proj.weight).T + _np(m.net.proj.bias), rtol=1e-12, atol=1e-12
    )
    if warmup_u is None:
        assert s == 1.0
    else:  # the warm-up solved mean(1/kappa) = warmup_u on the features of this batch
        assert s != 1.0
        assert np.mean(1.0 / kappa_ref) == pytest.approx(warmup_u, rel=1e-9)
    # evaluation: the same formula on the eval-mode features (the backbone has batch norm)
    out = m.eval()(x)
    f = _np(m.net.backbone(x))
    kappa_ref = _softplus(f @ _np(lin.weight)[0] + _np(lin.bias)[0]) * s + 0.01
    np.testing.assert_allclose(_np(out.kappa), kappa_ref, rtol=1e-12)


def test_the_kappa_term_trains_the_backbone_and_skips_the_projection():
    m = _hib(kappa_input="features", kappa_hidden=0, min_kappa=0.01).train()
    x = _x()
    _, kappa = m.embed_with_kappa(x)
    params = list(m.net.backbone.parameters())
    got = torch.autograd.grad(kappa.log().sum(), params + [m.net.proj.weight], allow_unused=True)
    # reference: the same formula on features computed on their own, differentiated by autograd
    lin = m.kappa_head.mlp[0]
    h = m.net.backbone(x)
    ref_kappa = torch.nn.functional.softplus(h @ lin.weight[0] + lin.bias[0]) + 0.01
    ref = torch.autograd.grad(ref_kappa.log().sum(), params)
    for g, r in zip(got[:-1], ref, strict=True):
        assert g is not None and float(g.abs().max()) > 0
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    assert got[-1] is None  # kappa does not pass through the embedding projection
    # with the default input kappa's gradient does reach the projection
    d = _hib().train()
    _, k = d.embed_with_kappa(x)
    (g_proj,) = torch.autograd.grad(k.log().sum(), [d.net.proj.weight])
    assert float(g_proj.abs().max()) > 0


def test_one_backbone_pass_per_call():
    m = _hib(kappa_input="features", kappa_hidden=0)
    calls = []
    m.net.backbone.register_forward_hook(lambda *a: calls.append(1))
    m.embed_with_kappa(_x())
    m.eval()(_x(), n_samples=2)
    assert len(calls) == 2


@pytest.mark.parametrize("name", VMF_METHODS)
def test_every_vmf_method_takes_the_options(name):
    torch.manual_seed(0)
    kw = {"kappa_input": "features", "kappa_hidden": 0, "min_kappa": 0.01, "warmup_u": None}
    m = M.create(name, embed_dim=D, num_classes=C, backbone_kwargs=SMALL, **kw).double()
    assert m.kappa_head.in_dim == SMALL["num_features"] and m.kappa_head.min_kappa == 0.01
    x, y = _x(6), torch.arange(6) % C
    batch = ((x, x + 0.1), y) if m.two_view else (x, y)
    loss = m.train().training_loss(batch)
    loss.backward()
    assert torch.isfinite(loss) and m.kappa_head.mlp[0].weight.grad is not None
    assert float(m.kappa_head.mlp[0].weight.grad.abs().max()) > 0
    rebuilt = M.create(name, **m.hparams)
    assert rebuilt.kappa_input == "features" and len(rebuilt.kappa_head.mlp) == 1


@pytest.mark.parametrize(
    ("kw", "error", "needle"),
    [
        ({"kappa_input": "feature"}, ValueError, "kappa_input"),
        ({"kappa_input": None}, ValueError, "kappa_input"),
        ({"kappa_hidden": -1}, ValueError, "kappa_hidden"),
        ({"kappa_hidden": 1.5}, ValueError, "kappa_hidden"),
        ({"kappa_hidden": "8"}, TypeError, "kappa_hidden"),
        ({"min_kappa": -0.1}, ValueError, "min_kappa"),
        ({"min_kappa": float("nan")}, ValueError, "min_kappa"),
        ({"min_kappa": "0.01"}, TypeError, "min_kappa"),
    ],
)
def test_bad_options_name_the_argument(kw, error, needle):
    with pytest.raises(error, match=needle):
        M.create("hib", embed_dim=D, backbone_kwargs=SMALL, **kw)
