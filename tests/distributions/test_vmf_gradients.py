"""Kappa gradients of the vMF sampler (implicit reparameterisation) against independent
references: scipy quadrature of the gradient integral and of the CDF, closed forms for D = 3,
exact expectations (scipy Bessel ratios) and large Monte-Carlo averages, all in float64.

Before the fix (pathwise gradient through Wood's Beta proposal without the rejection
correction), a 400k-sample estimate of d/dkappa E[mu^T z] gave (exact A_D'(kappa) in brackets):
D = 2: kappa 5 -> 0.0177 (0.0232, -24 %), kappa 20 -> 0.00122 (0.00128, -5 %);
D = 10: kappa 5 -> 0.0565 (0.0611), kappa 20 -> 0.00874 (0.00917).
"""

import math

import mpmath
import numpy as np
import pytest
import scipy.integrate as si
import scipy.special as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesurl.distributions.vmf import sample_vmf, vmf_cosine_grad_kappa

F64 = torch.float64


def _ref_a(d: int, k: float) -> float:
    """A_D(kappa) by mpmath (independent of the package's Bessel code)."""
    with mpmath.workdps(30):  # restores the global precision on exit
        return float(mpmath.besseli(d / 2, k) / mpmath.besseli(d / 2 - 1, k))


def _ref_a_prime(d: int, k: float) -> float:
    """A_D'(kappa) = 1 - A^2 - (D - 1) A / kappa (exact identity), A from mpmath."""
    a = _ref_a(d, k)
    return 1.0 - a * a - (d - 1) * a / k


def _quad_grad(w: float, k: float, d: int) -> float:
    """dw/dkappa = int_{t>w} (t - A) p(t) dt / p(w) (or minus the integral over t < w, the side
    where t - A keeps its sign) by QUADPACK, in the distance e from the end point t = +-1:

    int_0^{e_w} (a_e - e) exp(kappa_e (e_w - e)) [e (2 - e) / (e_w (2 - e_w))]^nu de,

    e_w = 1 -+ w, a_e = 1 -+ A, kappa_e = +-kappa. The interval is cut where the integrand is
    below exp(-60) of its peak on a 400k-point grid; D = 2 uses QUADPACK's algebraic weight
    e^(-1/2) where the interval reaches e = 0."""
    a_ = _ref_a(d, k)
    nu = (d - 3) / 2
    sg = 1.0 if w >= a_ else -1.0
    ew, ae, ke = 1.0 - sg * w, 1.0 - sg * a_, sg * k
    lnorm = math.log(ew) + math.log(2.0 - ew)

    def log_g(e):
        return ke * (ew - e) + nu * (np.log(e) + np.log(2.0 - e) - lnorm)

    e = np.linspace(0.0, ew, 400_001)[1:-1]
    lg = log_g(e)
    keep = np.nonzero(lg > lg.max() - 60.0)[0]
    i0, i1 = max(keep[0] - 2, 0), min(keep[-1] + 2, e.size - 1)
    lo = 0.0 if i0 == 0 else float(e[i0])
    hi = ew if i1 == e.size - 1 else float(e[i1])
    if d == 2 and lo == 0.0:

        def f(x):
            return (ae - x) * math.exp(ke * (ew - x) + nu * (math.log(2.0 - x) - lnorm))

        val, _ = si.quad(
            f, 0.0, hi, weight="alg", wvar=(nu, 0.0), epsabs=0, epsrel=1e-13, limit=500
        )
        return val

    def f(x):
        return (ae - x) * math.exp(float(log_g(x)))

    peak = float(e[np.argmax(lg)])
    pts = [p for p in (peak, ae) if lo < p < hi]
    val, _ = si.quad(f, lo, hi, points=pts or None, epsabs=0, epsrel=1e-13, limit=500)
    return val


def _quad_tail(w: float, k: float, d: int, upper: bool) -> tuple[float, float]:
    """(P(t > w) or P(t < w), p(w)) for concentration k, by quadrature over the angle.

    Densities are scaled by exp(-kappa) so that nothing overflows; scipy's quad."""
    m = d - 2

    def dens(phi):
        return math.exp(k * (math.cos(phi) - 1.0)) * math.sin(phi) ** m

    th = math.acos(w)
    mode = math.acos(min(1.0, 2 * k / (m + math.sqrt(m * m + 4 * k * k)))) if m else 0.0
    width = 1.0 / math.sqrt(k + m + 1.0)
    grid = sorted(
        {0.0, math.pi, th, mode}
        | {min(math.pi, max(0.0, mode + j * width)) for j in range(-40, 41)}
    )
    pieces = [
        si.quad(dens, a, b, epsabs=0, epsrel=1e-13, limit=200)[0] for a, b in zip(grid, grid[1:])
    ]
    lows = [g for g in grid[:-1]]
    z = math.fsum(pieces)
    tail = math.fsum(p for p, a in zip(pieces, lows) if (a < th if upper else a >= th))
    # p_t(w) = p_theta(theta_w) / sin(theta_w)
    return tail / z, dens(th) / math.sin(th) / z


def _fd_cdf_grad(w: float, k: float, d: int) -> float:
    """-dF/dkappa / p(w) with a 4-point (O(h^4)) difference of the quadrature CDF."""
    upper = w >= _ref_a(d, k)
    h = 1e-3 * k
    s = [_quad_tail(w, k + j * h, d, upper)[0] for j in (-2, -1, 1, 2)]
    ds = (s[0] - 8 * s[1] + 8 * s[2] - s[3]) / (12 * h)
    dtail = ds if upper else -ds  # d/dkappa of P(t > w) = -dF/dkappa
    return dtail / _quad_tail(w, k, d, upper)[1]


def _cosines(d: int, k: float, n: int = 4000, seed: int = 0) -> list[float]:
    """Sampled cosines at quantiles 0 (min), 0.01, 0.5, 0.99, 1 (max) of n draws."""
    mu = torch.zeros(1, d, dtype=F64)
    mu[0, 0] = 1.0
    z = sample_vmf(
        mu, torch.tensor([k], dtype=F64), n, generator=torch.Generator().manual_seed(seed)
    )
    w = z[:, 0, 0].sort().values
    return [float(w[i]) for i in (0, n // 100, n // 2, n - n // 100, n - 1)]


@pytest.mark.parametrize("d", [2, 3, 10, 512, 2048])
@pytest.mark.parametrize("k", [0.5, 20.0, 1e3, 1e5])
def test_dw_dkappa_matches_quadrature_of_the_integral(d, k):
    ws = _cosines(d, k)
    ours = vmf_cosine_grad_kappa(torch.tensor(ws, dtype=F64), torch.tensor(k, dtype=F64), d)
    ref = torch.tensor([_quad_grad(w, k, d) for w in ws], dtype=F64)
    assert (ours > 0).all()
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("d", [2, 10, 512])
@pytest.mark.parametrize("k", [0.5, 20.0, 1e3])
def test_dw_dkappa_matches_finite_difference_of_the_cdf(d, k):
    ws = _cosines(d, k, seed=1)[1:4]
    ours = vmf_cosine_grad_kappa(torch.tensor(ws, dtype=F64), torch.tensor(k, dtype=F64), d)
    ref = torch.tensor([_fd_cdf_grad(w, k, d) for w in ws], dtype=F64)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("k", [0.01, 1.0, 30.0, 1e4])
def test_dw_dkappa_matches_closed_form_for_d3(k):
    # D = 3 has the inverse CDF w(u, kappa) = 1 + log(u + (1 - u) exp(-2 kappa)) / kappa;
    # its autograd derivative at fixed u is the exact dw/dkappa
    u = torch.tensor([1e-6, 0.01, 0.3, 0.5, 0.9, 0.999], dtype=F64)
    kap = torch.full_like(u, k).requires_grad_()
    w = 1.0 + torch.logaddexp(torch.log(u), torch.log1p(-u) - 2.0 * kap) / kap
    (exact,) = torch.autograd.grad(w.sum(), kap)  # w_i depends on kap_i only
    ours = vmf_cosine_grad_kappa(w.detach(), kap.detach(), 3)
    torch.testing.assert_close(ours, exact, rtol=1e-8, atol=0)


# Bias of the old pathwise gradient at these settings (see the module docstring).
_OLD = {(2, 5.0): 0.0177, (2, 20.0): 0.00122, (10, 5.0): 0.0565, (10, 20.0): 0.00874}


@pytest.mark.parametrize(("d", "k"), list(_OLD))
def test_mean_resultant_gradient_is_unbiased(d, k):
    # 200 independent rows x 1000 draws = 200k samples; one gradient per row gives the SE
    rows, s = 200, 1000
    kap = torch.full((rows,), k, dtype=F64, requires_grad=True)
    mu = torch.nn.functional.normalize(
        torch.randn(rows, d, dtype=F64, generator=torch.Generator().manual_seed(5)), dim=-1
    )
    z = sample_vmf(mu, kap, s, generator=torch.Generator().manual_seed(d))
    (z * mu).sum(-1).mean(0).sum().backward()
    g = kap.grad
    mean, se = float(g.mean()), float(g.std()) / math.sqrt(rows)
    exact = _ref_a_prime(d, k)
    # independent check of A_D' by a finite difference of scipy's Bessel ratio
    ratio = lambda x: sp.ive(d / 2, x) / sp.ive(d / 2 - 1, x)  # noqa: E731
    assert exact == pytest.approx((ratio(k + 1e-4) - ratio(k - 1e-4)) / 2e-4, rel=1e-6)
    assert abs(mean - exact) <= 4 * se, (mean, exact, se)
    # the test has the power to see the old bias
    assert abs(_OLD[(d, k)] - exact) > 4 * se


@pytest.mark.parametrize(("d", "k"), [(2, 5.0), (10, 20.0)])
def test_gradient_of_squared_projection_matches_exact_expectation(d, k):
    # E[(a^T z)^2] = c^2 E[w^2] + (1 - c^2) (1 - E[w^2]) / (D - 1), c = a^T mu,
    # E[w^2] = 1 - (D - 1) A_D(kappa) / kappa
    g = torch.Generator().manual_seed(11)
    mu = torch.nn.functional.normalize(torch.randn(d, dtype=F64, generator=g), dim=0)
    a = torch.nn.functional.normalize(mu + 0.8 * torch.randn(d, dtype=F64, generator=g), dim=0)
    c2 = float(a @ mu) ** 2
    assert c2 < 0.9

    def expected(x: float) -> float:
        ew2 = 1.0 - (d - 1) * _ref_a(d, x) / x
        return c2 * ew2 + (1.0 - c2) * (1.0 - ew2) / (d - 1)

    h = 1e-3 * k
    exact = (expected(k + h) - expected(k - h)) / (2 * h)
    rows, s = 200, 1000
    kap = torch.full((rows,), k, dtype=F64, requires_grad=True)
    z = sample_vmf(mu.expand(rows, d), kap, s, generator=torch.Generator().manual_seed(3))
    (z @ a).square().mean(0).sum().backward()
    mean, se = float(kap.grad.mean()), float(kap.grad.std()) / math.sqrt(rows)
    assert abs(mean - exact) <= 4 * se, (mean, exact, se)
    assert se < 0.05 * abs(exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("d", "k"), [(2048, 1.0), (2048, 1e3), (2048, 1e5), (2, 1e5), (10, 1e-3)])
def test_gradients_are_finite(dtype, d, k):
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(4, d, dtype=dtype, generator=g).requires_grad_()
    kap = torch.full((4,), k, dtype=dtype, requires_grad=True)
    z = sample_vmf(mu, kap, 16, generator=g)
    (z * torch.randn(z.shape, dtype=dtype, generator=g)).sum().backward()
    assert torch.isfinite(kap.grad).all() and torch.isfinite(mu.grad).all()
    assert kap.grad.abs().sum() > 0


def test_float32_gradient_at_huge_kappa_is_right():
    # in float32, w rounds to 1 for kappa = 1e5, D = 2; the sin(theta) path must not blow up
    d, k, rows, s = 2, 1e5, 100, 400
    mu = torch.zeros(rows, d)
    mu[:, 0] = 1.0
    a = torch.tensor([0.6, 0.8])
    kap = torch.full((rows,), k, requires_grad=True)
    z = sample_vmf(mu, kap, s, generator=torch.Generator().manual_seed(2))
    (z @ a).square().mean(0).sum().backward()
    ew2 = lambda x: 1.0 - (d - 1) * _ref_a(d, x) / x  # noqa: E731
    dew2 = (ew2(k * 1.001) - ew2(k * 0.999)) / (0.002 * k)
    exact = (0.36 - 0.64) * dew2
    mean, se = float(kap.grad.double().mean()), float(kap.grad.double().std()) / math.sqrt(rows)
    assert abs(mean - exact) <= 4 * se + 1e-3 * abs(exact), (mean, exact, se)


def test_values_do_not_depend_on_the_gradient_and_limits_hold():
    mu = torch.nn.functional.normalize(torch.randn(4, 7, dtype=F64), dim=-1)
    kap = torch.tensor([1e-9, 2.0, math.inf, 300.0], dtype=F64)
    z0 = sample_vmf(mu, kap, 50, generator=torch.Generator().manual_seed(4))
    kg = kap.clone().requires_grad_()
    z1 = sample_vmf(mu, kg, 50, generator=torch.Generator().manual_seed(4))
    assert torch.equal(z0, z1)
    z1.sum().backward()
    assert torch.isfinite(kg.grad).all()
    assert kg.grad[2] == 0  # kappa = inf returns mu
    torch.testing.assert_close(z1[:, 2].detach(), mu[2].expand(50, 7))


def test_endpoints_and_bad_input():
    k = torch.tensor(3.0, dtype=F64)
    out = vmf_cosine_grad_kappa(torch.tensor([-1.0, 1.0], dtype=F64), k, 5)
    assert torch.equal(out, torch.zeros(2, dtype=F64))
    with pytest.raises(ValueError, match="`w`"):
        vmf_cosine_grad_kappa(torch.tensor([1.5]), k, 5)
    with pytest.raises(ValueError, match="`w`"):
        vmf_cosine_grad_kappa(torch.tensor([math.nan]), k, 5)
    with pytest.raises(ValueError, match="kappa"):
        vmf_cosine_grad_kappa(torch.tensor([0.5]), torch.tensor(0.0), 5)
    with pytest.raises(ValueError, match="dim"):
        vmf_cosine_grad_kappa(torch.tensor([0.5]), k, 1)


@settings(max_examples=60, deadline=None)
@given(
    d=st.sampled_from([2, 3, 4, 10, 128, 2048]),
    log_k=st.floats(-3.0, 5.0),
    u=st.floats(0.0, 1.0),
)
def test_dw_dkappa_is_finite_and_nonnegative(d, log_k, u):
    # the family is stochastically increasing in kappa (monotone likelihood ratio exp(kappa t))
    w = torch.tensor([2.0 * u - 1.0], dtype=F64)
    out = vmf_cosine_grad_kappa(w, torch.tensor(10.0**log_k, dtype=F64), d)
    assert torch.isfinite(out).all() and (out >= 0).all()
