"""vMF numerics for every finite kappa in float32 / float64, against mpmath.

References: mpmath's arbitrary-precision Bessel I (50 digits) where it converges, Hankel's
large-argument expansion (A&S 9.7.1) beyond; ``1 - A_D(kappa)`` against the same.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesurl.distributions import VonMisesFisher, sample_vmf
from bayesurl.distributions.vmf import (
    _vmf_one_minus_a,
    log_bessel_iv,
    vmf_log_normalizer,
    vmf_mean_resultant_length,
)

# no global `mpmath.mp.dps = 50` here: set at import it leaked into every later test of the
# process (masking tests that need the precision and set none); `_ref` sets its own with workdps
TOL = {torch.float32: 2e-6, torch.float64: 1e-10}


def _ref(kappa: float, d: int) -> tuple[float, float]:
    """(log C_D(kappa), 1 - A_D(kappa)) to double precision."""
    with mpmath.workdps(50 + int(max(0.0, math.log10(kappa)))):
        return _ref_mp(kappa, d)


def _ref_mp(kappa: float, d: int) -> tuple[float, float]:
    v = mpmath.mpf(d) / 2 - 1
    k = mpmath.mpf(kappa)
    if kappa < 1e6:
        log_i = mpmath.log(mpmath.besseli(v, k))
        oma = 1 - mpmath.besseli(v + 1, k) / mpmath.besseli(v, k)
    else:  # Hankel: I_v(x) e^-x sqrt(2 pi x) = 1 - (4v^2 - 1)/(8x) + (4v^2-1)(4v^2-9)/(2!(8x)^2)...
        mu_ = 4 * v * v

        def scaled(nu_sq4: mpmath.mpf) -> mpmath.mpf:
            term, total = mpmath.mpf(1), mpmath.mpf(1)
            for j in range(1, 12):
                term *= -(nu_sq4 - (2 * j - 1) ** 2) / (j * 8 * k)
                total += term
            return total

        log_i = k - mpmath.log(2 * mpmath.pi * k) / 2 + mpmath.log(scaled(mu_))
        oma = 1 - scaled(4 * (v + 1) ** 2) / scaled(mu_)
    log_c = v * mpmath.log(k) - mpmath.mpf(d) / 2 * mpmath.log(2 * mpmath.pi) - log_i
    return float(log_c), float(oma)


EXPONENTS = [-30, -3, 0, 1, 2, 4, 7, 12, 19, 20, 30, 38]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("d", [2, 3, 16, 64, 512])
def test_log_normalizer_and_resultant_length_for_every_finite_kappa(dtype, d):
    exps = EXPONENTS + ([60, 150, 300] if dtype == torch.float64 else [])
    for e in exps:
        kappa = 10.0**e
        log_c, oma = _ref(kappa, d)
        got = vmf_log_normalizer(torch.tensor(kappa, dtype=dtype), d)
        a = vmf_mean_resultant_length(torch.tensor(kappa, dtype=dtype), d)
        got_oma = _vmf_one_minus_a(torch.tensor(kappa, dtype=dtype), d)
        assert got.dtype == dtype and torch.isfinite(got), (e, got)
        assert abs(got.item() - log_c) <= TOL[dtype] * max(1.0, abs(log_c)), (e, got, log_c)
        assert 0.0 <= a.item() <= 1.0
        assert abs(a.item() - (1 - oma)) <= TOL[dtype], (e, a, 1 - oma)
        assert abs(got_oma.item() - oma) <= 1e2 * TOL[dtype] * oma, (e, got_oma, oma)


def test_issue_examples():
    # vmf_mean_resultant_length(1e20, 64) in float32 was 3.6e16; vmf_log_normalizer(1e30, 64) NaN
    a = vmf_mean_resultant_length(torch.tensor(1e20, dtype=torch.float32), 64)
    assert a.item() == pytest.approx(1.0, abs=1e-7) and a.item() <= 1.0
    lc = vmf_log_normalizer(torch.tensor(1e30, dtype=torch.float32), 64)
    assert torch.isfinite(lc) and lc.item() == pytest.approx(_ref(1e30, 64)[0], rel=1e-6)
    assert torch.isfinite(log_bessel_iv(3.0, torch.tensor(1e30, dtype=torch.float32)))
    # sample_vmf with a zero mean direction returned samples around a made-up direction
    mu = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="`mu`.*all-zero row"):
        sample_vmf(mu, 5.0, 4)
    with pytest.raises(ValueError, match="`loc`.*all-zero row"):
        VonMisesFisher(mu, torch.ones(2))
    with pytest.raises(ValueError, match="`n_samples`"):
        sample_vmf(mu[:1], 5.0, 2.5)  # type: ignore[arg-type]
    # VonMisesFisher(e1, inf).log_prob(-e1) was NaN
    e1 = torch.tensor([[1.0, 0.0, 0.0]])
    dist = VonMisesFisher(e1, torch.tensor([math.inf]))
    assert dist.log_prob(-e1).item() == -math.inf
    assert dist.log_prob(e1).item() == math.inf
    assert dist.entropy().item() == -math.inf


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_prob_and_entropy_at_huge_kappa(dtype):
    d = 8
    for kappa in (1e8, 1e20, 1e30):
        mu = torch.zeros(1, d, dtype=dtype)
        mu[0, 0] = 1.0
        dist = VonMisesFisher(mu, torch.tensor([kappa], dtype=dtype))
        log_c, oma = _ref(kappa, d)
        # at the mode: log C + kappa (reference in float64)
        want = (
            log_c + kappa
            if kappa < 1e15
            else (d / 2 - 1) * math.log(kappa)
            - (d / 2) * math.log(2 * math.pi)
            + 0.5 * math.log(2 * math.pi * kappa)
        )
        got = dist.log_prob(mu)
        assert torch.isfinite(got) and got.item() == pytest.approx(want, rel=1e-5)
        ent = dist.entropy()
        want_ent = -want + kappa * oma
        assert torch.isfinite(ent) and ent.item() == pytest.approx(want_ent, rel=1e-5, abs=1e-4)
        z = dist.rsample(3, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(z).all() and torch.allclose(z.norm(dim=-1), torch.ones(()).to(dtype))


@settings(max_examples=150, deadline=None)
@given(
    log10_kappa=st.floats(-40, 38),
    d=st.sampled_from([2, 3, 5, 32, 200]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_property_finite_and_bounded(log10_kappa, d, dtype):
    k = torch.tensor([10.0**log10_kappa], dtype=dtype, requires_grad=True)
    lc = vmf_log_normalizer(k, d)
    a = vmf_mean_resultant_length(k.detach(), d)
    assert torch.isfinite(lc).all() and ((a >= 0) & (a <= 1)).all()
    (g,) = torch.autograd.grad(lc.sum(), k)
    assert torch.isfinite(g).all() and torch.allclose(g, -a, rtol=1e-5, atol=1e-29)


@pytest.mark.parametrize("d", [2, 3, 10])
def test_large_kappa_sampler_has_the_right_mean_resultant_length(d):
    # kappa >= 1e6 uses the Gamma-proposal rejection sampler: E[kappa (1 - w)] = kappa (1 - A_D)
    from bayesurl.distributions.vmf import _sample_w

    kappa = torch.tensor([2e6], dtype=torch.float64)
    w = _sample_w(kappa, d, 40000, torch.Generator().manual_seed(1))[:, 0]
    t = kappa * (1.0 - w)
    want = (kappa * _vmf_one_minus_a(kappa, d)).item()
    se = t.std().item() / math.sqrt(len(t))
    assert abs(t.mean().item() - want) < 4 * se, (t.mean().item(), want, se)
    # the variance of t -> (D - 1) / 2, the Gamma limit
    assert t.var().item() == pytest.approx((d - 1) / 2, rel=0.05)


def test_integer_mean_directions_are_refused_naming_mu():
    with pytest.raises(TypeError, match="`mu` must be a floating-point tensor, got torch.int64"):
        sample_vmf(torch.tensor([[1, 0, 0]]), torch.tensor([2.0]), 3)
