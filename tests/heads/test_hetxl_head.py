"""HET-XL head against float64 references: CE at zero covariance, brute-force MC softmax,
dense log det."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bayesurl.distributions.lowrank_gaussian import LowRankGaussian
from bayesurl.heads.hetxl import HetXLHead, mc_softmax_log_probs


@pytest.fixture(autouse=True)
def _one_thread():
    # intra-op threads only add contention for tensors this small
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _head(d=6, c=4, r=2, **kw):
    torch.manual_seed(0)
    return HetXLHead(d, c, rank=r, **kw).double()


def _zero_covariance(head):
    with torch.no_grad():
        head.cov_factor.weight.zero_()
        head.cov_factor.bias.zero_()
        head.diag_std.weight.zero_()
        head.diag_std.bias.fill_(-1000.0)  # softplus(-1000) == 0 exactly in float64


def test_zero_covariance_equals_cross_entropy():
    head = _head(min_scale=0.0)
    _zero_covariance(head)
    e = torch.randn(9, 6, dtype=torch.float64)
    y = torch.randint(0, 4, (9,))
    out = head(e, n_mc=7)
    torch.testing.assert_close(out.samples, e.expand(7, 9, 6), rtol=0, atol=0)
    ref = F.cross_entropy(e @ head.classifier.weight.T + head.classifier.bias, y)
    torch.testing.assert_close(F.nll_loss(out.log_probs, y), ref, rtol=1e-12, atol=1e-12)


def test_zero_covariance_with_temperature_is_tempered_softmax():
    head = _head(min_scale=0.0, temperature=2.5)
    _zero_covariance(head)
    e = torch.randn(5, 6, dtype=torch.float64)
    logits = e @ head.classifier.weight.T + head.classifier.bias
    torch.testing.assert_close(head(e).log_probs, torch.log_softmax(logits / 2.5, -1))


def test_mc_softmax_matches_brute_force_loop():
    head = _head()
    with torch.no_grad():
        head.log_temperature.fill_(0.3)
    e = torch.randn(3, 6, dtype=torch.float64)
    out = head(e, n_mc=5, generator=torch.Generator().manual_seed(2))
    w, b, tau = head.classifier.weight, head.classifier.bias, math.exp(0.3)
    for n in range(3):
        probs = torch.zeros(4, dtype=torch.float64)
        for k in range(5):
            z = (w @ out.samples[k, n] + b) / tau
            probs += torch.exp(z) / torch.exp(z).sum() / 5
        torch.testing.assert_close(out.log_probs[n].exp(), probs, rtol=1e-12, atol=1e-14)


def test_distribution_parameters_and_log_det_match_dense():
    head = _head(r=3)
    e = torch.randn(4, 6, dtype=torch.float64)
    dist = head.distribution(e)
    v = (e @ head.cov_factor.weight.T + head.cov_factor.bias).reshape(4, 6, 3)
    std = torch.log1p(torch.exp(e @ head.diag_std.weight.T + head.diag_std.bias)) + 1e-3
    dense = torch.stack([v[n] @ v[n].T + torch.diag(std[n] ** 2) for n in range(4)])
    torch.testing.assert_close(dist.covariance_matrix, dense)
    torch.testing.assert_close(dist.log_det(), torch.logdet(dense), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dist.mean, e)


def test_gradients_reach_covariance_and_temperature():
    head = _head()
    e = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 4, (8,))
    F.nll_loss(head(e).log_probs, y).backward()
    for p in (head.cov_factor.weight, head.diag_std.weight, head.log_temperature, e):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_fixed_temperature_is_a_buffer():
    head = HetXLHead(4, 3, learn_temperature=False, temperature=0.5)
    assert "log_temperature" not in dict(head.named_parameters())
    torch.testing.assert_close(head.temperature, torch.tensor(0.5))


def test_functional_matches_degenerate_gaussian():
    e = torch.randn(5, 3, dtype=torch.float64)
    g = LowRankGaussian(e, torch.zeros(5, 3, 1).double(), torch.zeros(5, 3).double())
    w, b = torch.randn(2, 3).double(), torch.randn(2).double()
    torch.testing.assert_close(
        mc_softmax_log_probs(g.rsample(3), w, b), torch.log_softmax(e @ w.T + b, -1)
    )


def test_bad_input():
    head = HetXLHead(4, 3)
    with pytest.raises(ValueError, match="embedding"):
        head(torch.randn(2, 5))
    with pytest.raises(ValueError, match="embedding"):
        head(torch.full((2, 4), float("nan")))
    with pytest.raises(ValueError, match="rank"):
        HetXLHead(4, 3, rank=0)
    with pytest.raises(ValueError, match="temperature"):
        HetXLHead(4, 3, temperature=0.0)
    with pytest.raises(ValueError, match="samples"):
        mc_softmax_log_probs(torch.randn(2, 3), torch.randn(2, 3))


@pytest.mark.parametrize("diag_noise", ["independent", "shared"])
def test_diag_noise_covariance(diag_noise):
    """Empirical covariance of the head's samples: ``V V^T + diag(d)`` (HET-XL), or
    ``V V^T + sqrt(d) sqrt(d)^T`` for the URL code's ``sqrt(d) * randn(B, S, 1)``
    (mkirchhof/url 9a92555, ``timm/layers/hetxl_layers.py`` lines 30-35), from numpy."""
    torch.manual_seed(0)
    head = HetXLHead(4, 3, rank=1, n_mc=200_000, diag_noise=diag_noise).double()
    phi = torch.randn(1, 4, dtype=torch.float64)
    with torch.no_grad():
        out = head(phi, generator=torch.Generator().manual_seed(1))
    v = head.cov_factor(phi).reshape(4, 1).detach().numpy()
    sd = (F.softplus(head.diag_std(phi)) + head.min_scale).detach().numpy()[0]
    if diag_noise == "shared":
        want = v @ v.T + np.outer(sd, sd)
    else:
        want = v @ v.T + np.diag(sd**2)
    got = np.cov(out.samples[:, 0].numpy(), rowvar=False)
    np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())
    # the off-diagonal sd_i sd_j of the shared draw is far above the tolerance
    assert np.abs(np.outer(sd, sd) - np.diag(sd**2)).max() > 0.1 * np.abs(want).max()


def test_diag_noise_default_and_bad_value():
    assert HetXLHead(4, 3).diag_noise.value == "independent"
    with pytest.raises(ValueError, match="diag_noise"):
        HetXLHead(4, 3, diag_noise="scalar")
