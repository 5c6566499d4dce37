"""LowRankGaussian against dense float64 references (torch.logdet, MultivariateNormal)."""

import math

import pytest
import torch
from torch.distributions import MultivariateNormal

from bayesurl.distributions.lowrank_gaussian import LowRankGaussian


@pytest.fixture(autouse=True)
def _one_thread():
    # intra-op threads only add contention for tensors this small
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _random(n=4, d=6, r=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(n, d, generator=g, dtype=dtype)
    v = torch.randn(n, d, r, generator=g, dtype=dtype)
    diag = torch.rand(n, d, generator=g, dtype=dtype) + 0.1
    return loc, v, diag


def _dense(v, diag):
    # independent reference: explicit loops over n, outer products
    n, d, r = v.shape
    out = torch.zeros(n, d, d, dtype=v.dtype)
    for i in range(n):
        for k in range(r):
            out[i] += torch.outer(v[i, :, k], v[i, :, k])
        out[i] += torch.diag(diag[i])
    return out


@pytest.mark.parametrize("r", [1, 3, 8])
def test_covariance_and_log_det_match_dense(r):
    loc, v, diag = _random(r=r)
    g = LowRankGaussian(loc, v, diag)
    dense = _dense(v, diag)
    torch.testing.assert_close(g.covariance_matrix, dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g.log_det(), torch.logdet(dense), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g.variance, torch.diagonal(dense, dim1=-2, dim2=-1))


def test_log_prob_and_entropy_match_multivariate_normal():
    loc, v, diag = _random(n=3, d=5, r=2)
    g = LowRankGaussian(loc, v, diag)
    ref = MultivariateNormal(loc, covariance_matrix=_dense(v, diag))
    x = torch.randn(7, 3, 5, dtype=torch.float64)
    torch.testing.assert_close(g.log_prob(x), ref.log_prob(x), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g.log_prob(x[0]), ref.log_prob(x[0]), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g.entropy(), ref.entropy(), rtol=1e-10, atol=1e-10)


def test_log_det_gradient_matches_dense_autograd():
    loc, v, diag = _random(n=2, d=4, r=2)
    v1 = v.clone().requires_grad_(True)
    v2 = v.clone().requires_grad_(True)
    (g1,) = torch.autograd.grad(LowRankGaussian(loc, v1, diag).log_det().sum(), v1)
    (g2,) = torch.autograd.grad(torch.logdet(_dense(v2, diag)).sum(), v2)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-10)


def test_samples_have_the_right_moments():
    loc, v, diag = _random(n=2, d=3, r=1)
    g = LowRankGaussian(loc, v, diag)
    s = g.rsample(200_000, generator=torch.Generator().manual_seed(1))
    assert s.shape == (200_000, 2, 3)
    # standard error of a mean ~ sqrt(var / S) <= ~0.01 here; 5 sigma
    torch.testing.assert_close(s.mean(0), loc, rtol=0, atol=0.03)
    centred = s - s.mean(0)
    emp = torch.einsum("snd,sne->nde", centred, centred) / (s.shape[0] - 1)
    torch.testing.assert_close(emp, _dense(v, diag), rtol=0, atol=0.06)


def test_rsample_is_reparameterised_and_reproducible():
    loc, v, diag = _random(n=2, d=3, r=2)
    loc.requires_grad_(True)
    g = LowRankGaussian(loc, v, diag)
    a = g.rsample(4, generator=torch.Generator().manual_seed(3))
    b = g.rsample(4, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b)
    (grad,) = torch.autograd.grad(a.sum(), loc)
    torch.testing.assert_close(grad, torch.full_like(loc, 4.0))


def test_zero_covariance_samples_equal_the_mean():
    loc = torch.randn(3, 4, dtype=torch.float64)
    g = LowRankGaussian(loc, torch.zeros(3, 4, 1, dtype=torch.float64), torch.zeros(3, 4).double())
    s = g.rsample(5)
    torch.testing.assert_close(s, loc.expand(5, 3, 4), rtol=0, atol=0)
    # gradients stay finite at d = 0 (no 0 * inf from the square root)
    d = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    v = torch.zeros(3, 4, 1, dtype=torch.float64, requires_grad=True)
    LowRankGaussian(loc, v, d).rsample(2).sum().backward()
    assert torch.isfinite(d.grad).all() and torch.isfinite(v.grad).all()
    with pytest.raises(ValueError, match="cov_diag"):
        g.log_det()


def test_dtype_follows_inputs():
    loc, v, diag = _random(dtype=torch.float32)
    g = LowRankGaussian(loc, v, diag)
    assert g.rsample(2).dtype == torch.float32
    assert g.log_det().dtype == torch.float32
    assert math.isfinite(float(g.log_det().sum()))


def test_bad_input_is_named():
    loc, v, diag = _random()
    with pytest.raises(ValueError, match="cov_factor"):
        LowRankGaussian(loc, v[:, :-1], diag)
    with pytest.raises(ValueError, match="cov_diag"):
        LowRankGaussian(loc, v, diag[:-1])
    with pytest.raises(ValueError, match="cov_diag"):
        LowRankGaussian(loc, v, -diag)
    with pytest.raises(ValueError, match="loc"):
        LowRankGaussian(loc.clone().fill_(float("nan")), v, diag)
    with pytest.raises(ValueError, match="loc"):
        LowRankGaussian(loc[0], v, diag)
    with pytest.raises(ValueError, match="n_samples"):
        LowRankGaussian(loc, v, diag).rsample(0)
