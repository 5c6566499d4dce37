"""TaU-SimCLR loss against PML's NT-Xent and a brute-force double loop (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.losses import NTXentLoss

from bayesurl.heads.temperature import TemperatureHead, inverse_temperature, temperature
from bayesurl.losses.tau import TaULoss, tau_simclr_loss


def _views(n=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = z1 + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
    s1 = torch.randn(n, generator=g, dtype=torch.float64) * 2
    s2 = torch.randn(n, generator=g, dtype=torch.float64) * 2
    return z1, z2, s1, s2


def _loop_loss(z1, z2, s1, s2, scale, reference):
    """Row-by-row TaU loss written out with Python loops (TaU section 2: own 1/tau per row)."""
    if reference:
        return _reference_code_loss(z1, z2, s1, s2, scale)
    n = z1.shape[0]
    z = [v / v.norm() for v in torch.cat([z1, z2])]
    a = [1.0 / (scale * (1 + math.exp(-float(s)))) for s in torch.cat([s1, s2])]
    total = 0.0
    for i in range(2 * n):
        p = (i + n) % (2 * n)
        terms = [math.exp(a[i] * float(z[i] @ z[j])) for j in range(2 * n) if j != i]
        total += -a[i] * float(z[i] @ z[p]) + math.log(sum(terms))
    return total / (2 * n)


def _reference_code_loss(z1, z2, s1, s2, t, eps=0.0):
    """TaU code ``TaU_SimCLR.get_loss`` (mhw32/temperature-as-uncertainty-public d6c6f05,
    ``src/objectives/simclr.py`` lines 61-83, ``simclr_mask=False``) in numpy; ``eps`` is the
    code's 1e-6, 0 here."""
    loc1 = (z1 / z1.norm(dim=1, keepdim=True)).numpy()
    loc2 = (z2 / z2.norm(dim=1, keepdim=True)).numpy()
    temp1 = 1 / (1 + np.exp(-s1.numpy()[:, None]))
    temp2 = 1 / (1 + np.exp(-s2.numpy()[:, None]))
    loc = np.concatenate([loc1, loc2])
    temp = np.concatenate([temp1, temp2])
    n = loc.shape[0]
    cov = loc @ loc.T
    var = np.tile(temp, (1, n))
    sim = np.exp(cov * var / t)
    m = np.eye(n // 2, dtype=bool)
    m = np.concatenate([np.concatenate([m, m], 1)] * 2, 0)
    neg = sim[~m].reshape(n, -1).sum(-1)
    pos = np.exp((loc1 * loc2).sum(-1) * (temp1 / t)[:, 0])
    pos = np.concatenate([pos, pos])
    return float(-np.log(pos / (neg + eps)).mean())


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_matches_brute_force_loop(variant):
    z1, z2, s1, s2 = _views()
    got = tau_simclr_loss(z1, z2, s1, s2, scale=0.1, variant=variant)
    want = _loop_loss(z1, z2, s1, s2, 0.1, variant == "reference")
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("scale", [0.1, 0.5])
def test_s_to_inf_is_simclr_at_tau_scale(scale):
    """As s -> inf, 1/tau -> 1/scale: the loss equals PML's NT-Xent at temperature = scale."""
    z1, z2, _, _ = _views(n=8, d=7, seed=1)
    big = torch.full((8,), 1e4, dtype=torch.float64)
    got = tau_simclr_loss(z1, z2, big, big, scale=scale)
    emb = torch.cat([z1, z2])
    labels = torch.cat([torch.arange(8), torch.arange(8)])
    want = NTXentLoss(temperature=scale)(emb, labels)
    assert float(got) == pytest.approx(float(want), rel=1e-10)
    # and at finite but large s it converges to it
    near = tau_simclr_loss(z1, z2, big / 1e3 * 3, big / 1e3 * 3, scale=scale)
    assert float(near) == pytest.approx(float(want), rel=1e-6)


def test_constant_temperature_is_simclr():
    z1, z2, _, _ = _views(n=5, d=4, seed=2)
    s = torch.zeros(5, dtype=torch.float64)  # 1/tau = 0.5 / 0.1 -> tau = 0.2
    got = tau_simclr_loss(z1, z2, s, s, scale=0.1)
    want = NTXentLoss(temperature=0.2)(torch.cat([z1, z2]), torch.cat([torch.arange(5)] * 2))
    assert float(got) == pytest.approx(float(want), rel=1e-10)


@settings(max_examples=60, deadline=None)
@given(st.floats(-40.0, 30.0), st.floats(0.01, 5.0))
def test_tau_strictly_above_scale(s, scale):
    tau = temperature(torch.tensor([s], dtype=torch.float64), scale)
    assert float(tau) > scale
    # consistent with the inverse temperature
    a = inverse_temperature(torch.tensor([s], dtype=torch.float64), scale)
    assert float(tau * a) == pytest.approx(1.0, rel=1e-12)


def test_tau_bounds_at_extremes():
    s = torch.tensor([-math.inf, -1e3, 0.0, 1e3, math.inf])
    tau = temperature(s, 0.1)
    assert bool((tau >= 0.1).all())
    assert float(tau[-1]) == pytest.approx(0.1)
    assert math.isinf(float(tau[0]))


def test_gradient_reaches_temperature_and_is_finite():
    z1, z2, s1, s2 = _views()
    s1.requires_grad_(True)
    s2.requires_grad_(True)
    for variant in ("paper", "reference"):
        loss = tau_simclr_loss(z1, z2, s1, s2, variant=variant)
        g1, g2 = torch.autograd.grad(loss, (s1, s2), allow_unused=True)
        assert torch.isfinite(g1).all() and g1.abs().sum() > 0
        # the reference code scales view 2's denominators by view 2's temperature
        assert torch.isfinite(g2).all() and g2.abs().sum() > 0


def test_module_and_head_follow_dtype():
    head = TemperatureHead(5).double()
    z1, z2, _, _ = _views()
    loss = TaULoss(variant="reference")(z1, z2, head(z1), head(z2))
    assert loss.dtype == torch.float64 and loss.ndim == 0


def test_bad_input():
    z1, z2, s1, s2 = _views()
    with pytest.raises(ValueError, match="length mismatch"):
        tau_simclr_loss(z1, z2[:-1], s1, s2)
    with pytest.raises(ValueError, match="`s1`"):
        tau_simclr_loss(z1, z2, s1[:, None], s2)
    bad = z1.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="`z1`"):
        tau_simclr_loss(bad, z2, s1, s2)
    with pytest.raises(ValueError, match="variant"):
        tau_simclr_loss(z1, z2, s1, s2, variant="nope")
    with pytest.raises(ValueError, match="scale"):
        TaULoss(scale=0.0)
    with pytest.raises(ValueError, match="at least 2"):
        tau_simclr_loss(z1[:1], z2[:1], s1[:1], s2[:1])
    with pytest.raises(ValueError, match="features"):
        TemperatureHead(5)(torch.randn(3, 4))
