"""The URL / MCI code's vMF sampler as an opt-in (``sampler="url_taylor"``)."""

import math

import numpy as np
import pytest
import torch

from bayesurl.distributions.vmf import sample_vmf, vmf_mean_resultant_length


def url_code_w(kappa, m, n, rng):
    """mkirchhof/url 9a92555, ``timm/utils/vmf_sampler.py`` ``__sample_w_rej`` and
    ``__while_loop`` (lines 99-186), transcribed in numpy for one kappa and n draws."""
    c = math.sqrt(4 * kappa**2 + (m - 1) ** 2)
    b_true = (-2 * kappa + c) / (m - 1)
    b_app = (m - 1) / (4 * kappa)
    s = min(max(0.0, kappa - 10), 1.0)
    b = b_app * s + b_true * (1 - s)
    a = (m - 1 + 2 * kappa + c) / 4
    d = (4 * a * b) / (1 + b) - (m - 1) * math.log(m - 1)
    out = np.empty(0)
    while out.size < n:
        e = rng.beta((m - 1) / 2, (m - 1) / 2, size=n)
        u = rng.uniform(1e-20, 1 - 1e-20, size=n)
        w = (1 - (1 + b) * e) / (1 - (1 - b) * e)
        t = (2 * a * b) / (1 - (1 - b) * e)
        accept = (m - 1) * np.log(t) - t + d > np.log(u)
        out = np.concatenate([out, w[accept]])
    return out[:n]


@pytest.mark.parametrize(("dim", "kappa"), [(64, 12.0), (16, 5.0), (16, 30.0)])
def test_url_taylor_matches_the_code_in_distribution(dim, kappa):
    n = 40_000
    ref = url_code_w(kappa, dim, n, np.random.default_rng(0))
    mu = torch.zeros(1, dim, dtype=torch.float64)
    mu[0, 0] = 1.0
    g = torch.Generator().manual_seed(0)
    z = sample_vmf(
        mu, torch.tensor([kappa], dtype=torch.float64), n, generator=g, sampler="url_taylor"
    )
    w = z[:, 0, 0].numpy()
    se = math.sqrt(ref.var() / n + w.var() / n)
    assert abs(w.mean() - ref.mean()) < 5 * se
    assert abs(np.quantile(w, 0.5) - np.quantile(ref, 0.5)) < 0.02
    exact = float(vmf_mean_resultant_length(torch.tensor(kappa, dtype=torch.float64), dim))
    if kappa > 10 and kappa < dim:  # the Taylor envelope's bias (E[w] = A_D(kappa) exactly)
        assert abs(ref.mean() - exact) > 0.1
        z0 = sample_vmf(mu, torch.tensor([kappa], dtype=torch.float64), n, generator=g)
        assert abs(float(z0[:, 0, 0].mean()) - exact) < 5 * math.sqrt(w.var() / n) + 1e-3


def test_url_taylor_gradient_is_pathwise_through_b():
    """The code's kappa gradient: dw/dkappa at the accepted Beta draw e, through b only."""
    dim, kappa = 16, 12.0
    k = torch.tensor([kappa], dtype=torch.float64, requires_grad=True)
    mu = torch.zeros(1, dim, dtype=torch.float64)
    mu[0, 0] = 1.0
    z = sample_vmf(mu, k, 2000, generator=torch.Generator().manual_seed(3), sampler="url_taylor")
    w = z[:, 0, 0]
    (grad,) = torch.autograd.grad(w.sum(), k)
    # for kappa >= 11, b = (D - 1) / (4 kappa) and w = (1 - (1 + b) e) / (1 - (1 - b) e):
    # invert w for e, then differentiate by hand (numpy)
    wn = w.detach().numpy()
    b = (dim - 1) / (4 * kappa)
    e = (1 - wn) / ((1 + b) - (1 - b) * wn)
    dw_db = (-e * (1 - (1 - b) * e) - (1 - (1 + b) * e) * e) / (1 - (1 - b) * e) ** 2
    db_dk = -(dim - 1) / (4 * kappa**2)
    assert float(grad) == pytest.approx(float((dw_db * db_dk).sum()), rel=1e-6)


def test_unknown_sampler():
    with pytest.raises(ValueError, match="sampler"):
        sample_vmf(torch.randn(2, 4), 1.0, 3, sampler="taylor")
