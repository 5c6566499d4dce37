import math

import numpy as np
import pytest
import torch
from scipy.special import ive

from bayesurl.distributions.vmf import sample_vmf
from bayesurl.losses.elk import elk_pairwise_log_kernel
from bayesurl.losses.nivmf import NivMFLoss, nivmf_elk_logits, nivmf_log_density, nivmf_loss


def scipy_log_c(k, d):
    v = d / 2 - 1
    return v * math.log(k) - d / 2 * math.log(2 * math.pi) - (math.log(ive(v, k)) + k)


def brute_nivmf_log_density(z, mu, kappa, density="eccv22"):
    """ECCV22 eq. 4 or the URL code, K = diag(kappa), written with explicit matrices."""
    z = np.asarray(z) / np.linalg.norm(z)
    mu = np.asarray(mu) / np.linalg.norm(mu)
    k_mat = np.diag(np.asarray(kappa))
    kmu, kz = k_mat @ mu, k_mat @ z
    kn = np.linalg.norm(kmu)
    if density == "url":
        cos = z @ kmu / kn
        log_d = np.log(np.diag(k_mat)).sum() - 2 * np.log(kn)
    else:
        cos = kz @ kmu / (np.linalg.norm(kz) * kn)
        log_d = np.log(np.diag(k_mat)).sum() - np.log(kn)
    return scipy_log_c(kn, len(z)) + log_d + kn * cos


@pytest.mark.parametrize("density", ["url", "eccv22"])
def test_log_density_variants_match_formula(density):
    g = torch.Generator().manual_seed(10)
    d, c = 5, 3
    z = torch.randn(3, d, generator=g, dtype=torch.float64)
    pmu = torch.randn(c, d, generator=g, dtype=torch.float64)
    pk = torch.rand(c, d, generator=g, dtype=torch.float64) * 30 + 0.5
    got = nivmf_log_density(z, pmu, pk, density=density)
    for a in range(3):
        for j in range(c):
            ref = brute_nivmf_log_density(z[a], pmu[j], pk[j], density)
            assert math.isclose(float(got[a, j]), ref, rel_tol=1e-10, abs_tol=1e-9)


def test_default_density_is_the_url_code():
    g = torch.Generator().manual_seed(11)
    z, pmu = torch.randn(4, 3, generator=g), torch.randn(2, 3, generator=g)
    pk = torch.rand(2, 3, generator=g) * 10 + 1
    torch.testing.assert_close(nivmf_log_density(z, pmu, pk), nivmf_log_density(z, pmu, pk, "url"))
    assert NivMFLoss(2, 3).density == "url"
    with pytest.raises(ValueError, match="density"):
        nivmf_log_density(z, pmu, pk, "paper")


def test_log_density_matches_formula():
    g = torch.Generator().manual_seed(0)
    d, c = 6, 3
    z = torch.randn(2, 4, d, generator=g)
    pmu = torch.randn(c, d, generator=g)
    pk = torch.rand(c, d, generator=g) * 30 + 0.5
    got = nivmf_log_density(z, pmu, pk, density="eccv22")
    assert got.shape == (2, 4, c)
    for a in range(2):
        for b in range(4):
            for j in range(c):
                ref = brute_nivmf_log_density(z[a, b], pmu[j], pk[j])
                assert math.isclose(float(got[a, b, j]), ref, rel_tol=1e-10, abs_tol=1e-9)


def test_isotropic_proxies_equal_vmf_up_to_constant():
    g = torch.Generator().manual_seed(1)
    d, c = 5, 4
    z = torch.randn(20, d, generator=g)
    pmu = torch.nn.functional.normalize(torch.randn(c, d, generator=g), dim=-1)
    cs = torch.tensor([2.0, 7.0, 15.0, 40.0])
    got = nivmf_log_density(z, pmu, cs.unsqueeze(1).expand(c, d), density="eccv22")
    zn = torch.nn.functional.normalize(z, dim=-1)
    for j in range(c):
        vmf = torch.tensor([scipy_log_c(float(cs[j]), d)]) + cs[j] * (zn @ pmu[j])
        diff = got[:, j] - vmf
        # the constant is (D - 1) log c, the same for every z
        assert torch.allclose(diff, torch.full_like(diff, (d - 1) * math.log(cs[j])), atol=1e-9)


def test_loss_with_shared_isotropic_proxies_equals_vmf_proxy_loss():
    """Same samples, vMF proxies: the constant cancels in the softmax -> identical losses."""
    g = torch.Generator().manual_seed(2)
    n, d, c, s, kc = 6, 4, 3, 5, 9.0
    mu, kappa = torch.randn(n, d, generator=g), torch.rand(n, generator=g) * 10 + 1
    labels = torch.randint(0, c, (n,), generator=g)
    pmu = torch.randn(c, d, generator=g)
    got = nivmf_loss(
        mu,
        kappa,
        labels,
        pmu,
        torch.full((c, d), kc),
        n_samples=s,
        generator=torch.Generator().manual_seed(3),
        reduction="none",
    )
    z = sample_vmf(mu, kappa, s, generator=torch.Generator().manual_seed(3))
    pmn = torch.nn.functional.normalize(pmu, dim=-1)
    for i in range(n):
        logits = []
        for j in range(c):
            vals = [scipy_log_c(kc, d) + kc * float(z[q, i] @ pmn[j]) for q in range(s)]
            logits.append(math.log(sum(math.exp(v) for v in vals) / s))
        ref = -logits[int(labels[i])] + math.log(sum(math.exp(v) for v in logits))
        assert math.isclose(float(got[i]), ref, rel_tol=1e-10)


@pytest.mark.parametrize(("density", "power"), [("eccv22", 1), ("url", 2)])
def test_isotropic_mc_logits_converge_to_analytic_elk(density, power):
    """K = c I: both densities are the vMF density times c^(D - power)."""
    g = torch.Generator().manual_seed(4)
    n, d, c, kc = 3, 3, 2, 6.0
    mu, kappa = torch.randn(n, d, generator=g), torch.tensor([2.0, 5.0, 9.0])
    pmu = torch.randn(c, d, generator=g)
    mc = nivmf_elk_logits(
        mu, kappa, pmu, torch.full((c, d), kc), n_samples=100_000, generator=g, density=density
    )
    analytic = elk_pairwise_log_kernel(mu, kappa, pmu, torch.full((c,), kc))
    assert torch.allclose(mc - (d - power) * math.log(kc), analytic, atol=0.02)


def test_pml_class_and_gradients():
    g = torch.Generator().manual_seed(5)
    n, d, c = 8, 4, 3
    emb, labels = torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)
    kappa = torch.rand(n, generator=g) * 10 + 1
    loss = NivMFLoss(c, d, kappa_scale=8.0, n_samples=4)
    loss.generator = torch.Generator().manual_seed(6)
    pmu, pk = loss.proxies()
    ref = nivmf_loss(
        emb, kappa, labels, pmu, pk, n_samples=4, generator=torch.Generator().manual_seed(6)
    )
    e, k = emb.clone().requires_grad_(), kappa.clone().requires_grad_()
    got = loss(e, labels, kappa=k)
    assert torch.allclose(got, ref, rtol=1e-12)
    got.backward()
    for t in (e.grad, k.grad, loss.proxies.direction.grad, loss.proxies.raw_kappa.grad):
        assert torch.isfinite(t).all() and t.abs().sum() > 0


def test_bad_input():
    mu = torch.randn(4, 3)
    with pytest.raises(ValueError, match="proxy_kappa"):
        nivmf_log_density(mu, torch.randn(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="proxy_kappa"):
        nivmf_log_density(mu, torch.randn(2, 3), -torch.ones(2, 3))
    with pytest.raises(ValueError, match="dimension"):
        nivmf_log_density(torch.randn(4, 5), torch.randn(2, 3), torch.ones(2, 3))
    loss = NivMFLoss(2, 3)
    with pytest.raises(ValueError, match="labels"):
        loss(mu, torch.tensor([0, 1, 2, 0]), kappa=torch.ones(4))
    with pytest.raises(ValueError, match="ref_emb"):
        loss(mu, torch.zeros(4, dtype=torch.long), ref_emb=mu.clone(), kappa=1.0)
    with pytest.raises(ValueError, match="kappa"):
        loss(mu, torch.zeros(4, dtype=torch.long), kappa=torch.tensor([1.0, 1.0, float("nan"), 1]))
