"""vMF against independent references: scipy's Bessel functions, mpmath, autograd, Monte Carlo."""

import math

import mpmath
import numpy as np
import pytest
import scipy.special as sp
import torch

from bayesurl.distributions import (
    VonMisesFisher,
    kappa_from_resultant_length,
    log_bessel_iv,
    sample_vmf,
    vmf_log_normalizer,
    vmf_mean_resultant_length,
)

DIMS = [2, 3, 10, 512, 2048]
KAPPAS = [1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5]


def _ref_log_iv(v: float, x: float) -> float:
    """scipy where it is finite, else mpmath at 50 digits."""
    with np.errstate(all="ignore"):
        val = np.log(sp.ive(v, x)) + x
    if np.isfinite(val):
        return float(val)
    with mpmath.workdps(50):  # restores the global precision: no test depends on another
        return float(mpmath.log(mpmath.besseli(v, x)))


def _ref_log_c(d: int, k: float) -> float:
    v = d / 2 - 1
    return v * math.log(k) - d / 2 * math.log(2 * math.pi) - _ref_log_iv(v, k)


@pytest.mark.parametrize("d", DIMS)
def test_log_normalizer_matches_scipy(d):
    k = torch.tensor(KAPPAS, dtype=torch.float64)
    ours = vmf_log_normalizer(k, d)
    ref = torch.tensor([_ref_log_c(d, float(x)) for x in KAPPAS], dtype=torch.float64)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("d", DIMS)
def test_gradient_is_minus_mean_resultant_length(d):
    k = torch.tensor(KAPPAS, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(vmf_log_normalizer(k, d).sum(), k)
    assert torch.isfinite(g).all()
    # 50 digits set here (not left behind by `_ref_log_iv` in an earlier test): the default
    # 15 raise NoConvergence at D = 2048
    with np.errstate(all="ignore"), mpmath.workdps(50):
        ratio = [float(mpmath.besseli(d / 2, x) / mpmath.besseli(d / 2 - 1, x)) for x in KAPPAS]
    torch.testing.assert_close(-g, torch.tensor(ratio, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(-g, vmf_mean_resultant_length(k.detach(), d), rtol=1e-9, atol=1e-13)


def test_gradient_matches_finite_differences():
    k = torch.tensor([0.5, 7.0, 300.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: vmf_log_normalizer(x, 10), (k,))


def test_limits_and_uniform_normaliser():
    for d in (2, 3, 10, 2048):
        area = math.log(2) + d / 2 * math.log(math.pi) - math.lgamma(d / 2)
        assert float(
            vmf_log_normalizer(torch.tensor(0.0, dtype=torch.float64), d)
        ) == pytest.approx(-area, rel=1e-12)
    assert vmf_mean_resultant_length(torch.tensor(math.inf), 5) == 1.0
    assert vmf_mean_resultant_length(torch.tensor(0.0), 5) == 0.0


def test_log_bessel_small_orders_match_scipy():
    x = torch.logspace(-3, 3, 40, dtype=torch.float64)
    for v in (0.0, 0.5, 1.0, 3.5, 20.0, 79.5, 100.0):
        ref = torch.tensor([_ref_log_iv(v, float(t)) for t in x], dtype=torch.float64)
        torch.testing.assert_close(log_bessel_iv(v, x), ref, rtol=1e-11, atol=1e-11)


def test_bad_input():
    with pytest.raises(ValueError, match="kappa"):
        vmf_log_normalizer(torch.tensor([-1.0]), 3)
    with pytest.raises(ValueError, match="kappa"):
        vmf_log_normalizer(torch.tensor([math.nan]), 3)
    with pytest.raises(ValueError, match="dim"):
        vmf_log_normalizer(torch.tensor([1.0]), 1)
    with pytest.raises(ValueError, match="mu"):
        sample_vmf(torch.randn(3), torch.ones(3), 2)
    with pytest.raises(ValueError, match="kappa"):
        sample_vmf(torch.randn(3, 4), torch.ones(2), 2)


@pytest.mark.parametrize("d", [2, 3, 10, 512, 2048])
def test_sampler_mean_resultant_length(d):
    g = torch.Generator().manual_seed(d)
    kappas = torch.tensor([0.5, 5.0, 50.0, 1e3, 1e5], dtype=torch.float64)
    mu = torch.nn.functional.normalize(torch.randn(5, d, dtype=torch.float64, generator=g), dim=-1)
    s = 4000
    z = sample_vmf(mu, kappas, s, generator=g)
    assert z.shape == (s, 5, d)
    torch.testing.assert_close(z.norm(dim=-1), torch.ones(s, 5, dtype=torch.float64))
    cos = (z * mu).sum(-1)
    mean, se = cos.mean(0), cos.std(0) / math.sqrt(s)
    expected = vmf_mean_resultant_length(kappas, d)
    assert ((mean - expected).abs() <= 5 * se + 1e-12).all(), (mean, expected, se)
    # the tangent part is isotropic: the mean of its orthogonal component has squared norm
    # E[1 - w^2] / S (a chi-square with D-1 dofs scaled), not a bias towards any direction
    zbar = z.mean(0)
    orth = zbar - (zbar * mu).sum(-1, keepdim=True) * mu
    expected_sq = (1 - cos**2).mean(0) / s
    ratio = orth.pow(2).sum(-1) / expected_sq
    dof = d - 1
    assert (ratio - 1).abs().max() < 6 * math.sqrt(2 / dof) + 0.05, ratio


def test_kappa_inf_returns_mean_and_is_reproducible():
    # a fixed draw (the global RNG state depends on which tests ran before), and the mean
    # direction as sample_vmf normalises it: normalising an already unit float32 vector again
    # can move it by 2 ulp (1.2e-7), which made an atol=1e-7 comparison with `mu` order-dependent
    mu = torch.nn.functional.normalize(
        torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    )
    k = torch.tensor([1.0, math.inf, 3.0, math.inf])
    z = sample_vmf(mu, k, 3, generator=torch.Generator().manual_seed(1))
    unit = torch.nn.functional.normalize(mu, dim=-1)
    assert torch.equal(z[:, 1], unit[1].expand(3, 6)) and torch.equal(z[:, 3], unit[3].expand(3, 6))
    torch.testing.assert_close(z[:, 1], mu[1].expand(3, 6), rtol=0, atol=3e-7)
    assert not torch.allclose(z[:, 0], mu[0].expand(3, 6))
    z2 = sample_vmf(mu, k, 3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(z, z2)


def test_rsample_gradients_flow_to_mu_and_kappa():
    mu = torch.randn(3, 8, requires_grad=True)
    k = torch.tensor([2.0, 20.0, 200.0], requires_grad=True)
    z = VonMisesFisher(mu, k).rsample(64)
    (z[..., 0].sum()).backward()
    assert torch.isfinite(mu.grad).all() and mu.grad.abs().sum() > 0
    assert torch.isfinite(k.grad).all() and k.grad.abs().sum() > 0


def test_log_prob_integrates_to_one_on_circle():
    # D = 2: integrate the density over the angle numerically
    mu = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    for kappa in (0.3, 4.0, 60.0):
        dist = VonMisesFisher(mu, torch.tensor([kappa], dtype=torch.float64))
        theta = torch.linspace(-math.pi, math.pi, 20001, dtype=torch.float64)
        z = torch.stack([theta.cos(), theta.sin()], -1).unsqueeze(1)
        p = dist.log_prob(z).exp().squeeze(1)
        assert float(torch.trapezoid(p, theta)) == pytest.approx(1.0, rel=1e-8)


def test_entropy_matches_monte_carlo():
    mu = torch.nn.functional.normalize(torch.randn(2, 5, dtype=torch.float64), dim=-1)
    dist = VonMisesFisher(mu, torch.tensor([3.0, 30.0], dtype=torch.float64))
    z = dist.sample(20000, generator=torch.Generator().manual_seed(0))
    mc = -dist.log_prob(z).mean(0)
    torch.testing.assert_close(mc, dist.entropy(), rtol=0, atol=0.03)


def test_sra_estimate_inverts_mean_resultant_length_roughly():
    for d in (10, 512):
        k = torch.tensor([5.0, 50.0, 500.0], dtype=torch.float64)
        r = vmf_mean_resultant_length(k, d)
        k_hat = kappa_from_resultant_length(r, d)
        assert torch.all((k_hat / k - 1).abs() < 0.15)


@pytest.mark.parametrize("d", [2, 3, 10, 2048])
def test_float32_huge_kappa_is_accepted_and_finite(d):
    mu = torch.nn.functional.normalize(torch.randn(3, d), dim=-1)
    k = torch.tensor([1e5, 1e7, 1e9], requires_grad=True)
    z = sample_vmf(mu, k, 8, generator=torch.Generator().manual_seed(0))
    assert z.dtype == torch.float32 and torch.isfinite(z).all()
    cos = (z.detach() * mu).sum(-1)
    assert (cos > 0.98).all()  # A_2048(1e5) = 0.9898
    z[..., 0].sum().backward()
    assert torch.isfinite(k.grad).all()


@pytest.mark.parametrize("kappa", [2.8611174857570283e307, 1e308, 1.7976931348623157e308])
@pytest.mark.parametrize("dim", [2, 3, 2048])
def test_log_normalizer_finite_up_to_the_largest_float64(kappa, dim) -> None:
    """``2 pi s`` overflowed float64 for kappa > 2.86e307 (found by hypothesis): log C_D was
    +inf. Against mpmath's Bessel function at 15 digits."""
    k = torch.tensor(kappa, dtype=torch.float64)
    lc = vmf_log_normalizer(k, dim)
    assert math.isfinite(float(lc)) and float(lc) < 0
    mp_k = mpmath.mpf(kappa)
    v = mpmath.mpf(dim) / 2 - 1
    ref = (
        v * mpmath.log(mp_k)
        - dim / 2 * mpmath.log(2 * mpmath.pi)
        - (mpmath.log(mpmath.besseli(v, mp_k)) - mp_k)
    )
    assert float(lc) == pytest.approx(float(ref - mp_k), rel=1e-12)
