"""The URL code's polynomial vMF normaliser as an option of ELK and nivMF."""

import numpy as np
import pytest
import torch
from scipy.special import ive

from bayesurl.losses.elk import ELKLoss, elk_pairwise_log_kernel
from bayesurl.losses.nivmf import nivmf_log_density
from bayesurl.losses.normalizer import check_normalizer


def url_log_vmf_norm_const(kappa, dim=10):
    """mkirchhof/url 9a92555, ``timm/utils/misc.py`` lines 57-80, transcribed (numpy); the
    exact branch from scipy."""
    if dim == 4:
        return -0.826604 - 0.354357 * kappa - 0.383723 * kappa**1.1
    if dim == 8:
        return -1.29737 + 0.36841 * kappa - 0.80936 * kappa**1.1
    elif dim == 10:
        return -1.27184 + 0.67365 * kappa - 0.98726 * kappa**1.1
    elif dim == 16:
        return -0.23773 + 1.39146 * kappa - 1.39819 * kappa**1.1
    elif dim == 32:
        return 8.07579 + 2.28954 * kappa - 1.86925 * kappa**1.1
    elif dim == 64:
        return 38.82967 + 2.34269 * kappa - 1.77425 * kappa**1.1
    elif dim == 512:
        return 866.3 + 0.1574 * kappa - 0.0236 * kappa**1.5
    elif dim >= 1024:
        return 2095 - 0.01204 * kappa - 0.0007967 * kappa**1.9
    return exact_log_c(kappa, dim)


def exact_log_c(kappa, dim):
    v = dim / 2 - 1
    return v * np.log(kappa) - dim / 2 * np.log(2 * np.pi) - np.log(ive(v, kappa)) - kappa


@pytest.mark.parametrize("dim", [5, 16, 64])
def test_elk_url_poly_matches_the_url_elk_sim(dim):
    """URL ``elk_sim`` (``timm/loss/expected_likelihood.py`` lines 33-41, rho = 1)."""
    g = torch.Generator().manual_seed(dim)
    mu1 = torch.nn.functional.normalize(
        torch.randn(4, dim, generator=g, dtype=torch.float64), dim=-1
    )
    mu2 = torch.nn.functional.normalize(
        torch.randn(3, dim, generator=g, dtype=torch.float64), dim=-1
    )
    k1 = torch.rand(4, generator=g, dtype=torch.float64) * 40 + 1
    k2 = torch.rand(3, generator=g, dtype=torch.float64) * 40 + 1
    a1, a2, c1, c2 = mu1.numpy(), mu2.numpy(), k1.numpy(), k2.numpy()
    k3 = np.linalg.norm((c1[:, None] * a1)[:, None] + (c2[:, None] * a2)[None], axis=-1)
    f = url_log_vmf_norm_const
    want = f(c1[:, None], dim) + f(c2[None], dim) - f(k3, dim)
    got = elk_pairwise_log_kernel(mu1, k1, mu2, k2, normalizer="url_poly")
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-9)
    exact = elk_pairwise_log_kernel(mu1, k1, mu2, k2)
    if dim == 5:  # no fit for D = 5: the code falls back to the exact value
        np.testing.assert_allclose(exact.numpy(), want, rtol=1e-9)
    else:
        assert np.abs(exact.numpy() - want).max() > 1e-2


def test_elk_loss_option_reaches_the_logits():
    loss = ELKLoss(3, 16, normalizer="url_poly")
    e = torch.randn(5, 16)
    k = torch.rand(5) * 10 + 1
    mu, kap = loss.proxies()
    want = elk_pairwise_log_kernel(e, k, mu, kap, normalizer="url_poly")
    torch.testing.assert_close(loss.logits(e, k), want)


@pytest.mark.parametrize("dim", [16, 64])
def test_nivmf_url_poly_uses_the_fit_at_dimension_10(dim):
    """URL ``nivmf_elk_sim`` (lines 80-113): ``log_vmf_norm_const(norm_mu2)`` without ``dim``."""
    g = torch.Generator().manual_seed(1)
    z = torch.nn.functional.normalize(torch.randn(6, dim, generator=g, dtype=torch.float64), dim=-1)
    mu = torch.randn(3, dim, generator=g, dtype=torch.float64)
    kap = torch.rand(3, dim, generator=g, dtype=torch.float64) * 3 + 0.5
    mu2 = mu.numpy() / np.linalg.norm(mu.numpy(), axis=-1, keepdims=True) * kap.numpy()
    norm_mu2 = np.linalg.norm(mu2, axis=-1)
    cos = z.numpy() @ (mu2 / norm_mu2[:, None]).T
    detterm = np.log(kap.numpy()).sum(-1) - 2 * np.log(norm_mu2)
    want = url_log_vmf_norm_const(norm_mu2) + norm_mu2 * cos + detterm
    got = nivmf_log_density(z, mu, kap, density="url", normalizer="url_poly")
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-9)
    exact = nivmf_log_density(z, mu, kap, density="url")
    np.testing.assert_allclose(
        exact.numpy(),
        want - url_log_vmf_norm_const(norm_mu2) + exact_log_c(norm_mu2, dim),
        rtol=1e-9,
    )


def test_unknown_normalizer():
    with pytest.raises(ValueError, match="normalizer"):
        check_normalizer("poly")
    with pytest.raises(ValueError, match="normalizer"):
        ELKLoss(3, 4, normalizer="fit")
