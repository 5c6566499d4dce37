import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.special import ive

from bayesurl.distributions.vmf import sample_vmf
from bayesurl.losses.elk import (
    ELKLoss,
    elk_contrastive_loss,
    elk_log_kernel,
    elk_pairwise_log_kernel,
    elk_proxy_loss,
)


def scipy_log_c(k, d):
    """log C_D(kappa) from scipy's exponentially scaled Bessel function (independent)."""
    v = d / 2 - 1
    return v * math.log(k) - d / 2 * math.log(2 * math.pi) - (math.log(ive(v, k)) + k)


def brute_log_elk(m1, k1, m2, k2):
    m1 = np.asarray(m1) / np.linalg.norm(m1)
    m2 = np.asarray(m2) / np.linalg.norm(m2)
    d = len(m1)
    k3 = float(np.linalg.norm(k1 * m1 + k2 * m2))
    return scipy_log_c(k1, d) + scipy_log_c(k2, d) - scipy_log_c(k3, d)


@pytest.mark.parametrize("d", [3, 16, 128])
def test_kernel_matches_scipy_formula(d):
    g = torch.Generator().manual_seed(d)
    mu1, mu2 = torch.randn(5, d, generator=g), torch.randn(5, d, generator=g)
    k1, k2 = torch.rand(5, generator=g) * 50 + 0.5, torch.rand(5, generator=g) * 50 + 0.5
    got = elk_log_kernel(mu1, k1, mu2, k2)
    ref = [brute_log_elk(mu1[i], float(k1[i]), mu2[i], float(k2[i])) for i in range(5)]
    assert np.allclose(got.numpy(), ref, rtol=1e-9, atol=1e-8)
    pw = elk_pairwise_log_kernel(mu1, k1, mu2, k2)
    for i in range(5):
        for j in range(5):
            assert math.isclose(
                float(pw[i, j]),
                brute_log_elk(mu1[i], float(k1[i]), mu2[j], float(k2[j])),
                rel_tol=1e-9,
                abs_tol=1e-8,
            )


def test_kernel_matches_monte_carlo():
    """ELK = E_{z~p}[q(z)] = E_{z~q}[p(z)]: sample both vMFs and average the likelihood."""
    d, n = 3, 200_000
    g = torch.Generator().manual_seed(0)
    mu1, mu2 = torch.randn(1, d, generator=g), torch.randn(1, d, generator=g)
    mu1, mu2 = mu1 / mu1.norm(), mu2 / mu2.norm()
    k1, k2 = 4.0, 7.0
    analytic = float(elk_log_kernel(mu1, torch.tensor(k1), mu2, torch.tensor(k2)))
    for (ma, ka), (mb, kb) in [((mu1, k1), (mu2, k2)), ((mu2, k2), (mu1, k1))]:
        z = sample_vmf(ma, ka, n, generator=g)[:, 0]
        lik = np.exp(scipy_log_c(kb, d) + kb * (z @ mb[0]).numpy())
        est, se = lik.mean(), lik.std() / math.sqrt(n)
        assert abs(est - math.exp(analytic)) < 4 * se


def brute_proxy_nca(mu, kappa, labels, pmu, pkappa):
    out = []
    for i in range(len(mu)):
        sims = [
            brute_log_elk(mu[i], float(kappa[i]), pmu[c], float(pkappa[c])) for c in range(len(pmu))
        ]
        lse = math.log(sum(math.exp(s) for s in sims))
        out.append(-sims[int(labels[i])] + lse)
    return np.array(out)


def test_proxy_loss_and_pml_class_match_brute_force():
    g = torch.Generator().manual_seed(1)
    n, d, c = 7, 6, 4
    emb = torch.randn(n, d, generator=g) * 3
    kappa = torch.rand(n, generator=g) * 10 + 0.1
    labels = torch.randint(0, c, (n,), generator=g)
    loss = ELKLoss(c, d, kappa_scale=8.0)
    pmu, pkappa = loss.proxies()
    ref = brute_proxy_nca(emb, kappa, labels, pmu.detach(), pkappa.detach())
    got = elk_proxy_loss(emb, kappa, labels, pmu, pkappa, reduction="none")
    assert np.allclose(got.detach().numpy(), ref, rtol=1e-9)
    assert torch.allclose(loss(emb, labels, kappa=kappa), torch.tensor(ref.mean()), rtol=1e-9)
    # kappa=None reads the concentration from the embedding norm
    ref_norm = brute_proxy_nca(emb, emb.norm(dim=1), labels, pmu.detach(), pkappa.detach())
    assert np.isclose(float(loss(emb, labels).detach()), ref_norm.mean(), rtol=1e-9)
    # gradients reach the embeddings, kappa and both proxy parameters
    e = emb.clone().requires_grad_()
    k = kappa.clone().requires_grad_()
    loss(e, labels, kappa=k).backward()
    for t in (e.grad, k.grad, loss.proxies.direction.grad, loss.proxies.raw_kappa.grad):
        assert torch.isfinite(t).all() and t.abs().sum() > 0


def test_contrastive_matches_brute_force():
    g = torch.Generator().manual_seed(2)
    b, m, d, s = 3, 4, 5, 2.0
    mu_a, mu_p = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    mu_n = torch.randn(b, m, d, generator=g)
    ka, kp, kn = (
        torch.rand(b, generator=g) * 9 + 1,
        torch.rand(b, generator=g) * 9 + 1,
        torch.rand(b, m, generator=g) * 9 + 1,
    )
    got = elk_contrastive_loss(mu_a, ka, mu_p, kp, mu_n, kn, scale=s, reduction="none")
    ref = []
    for i in range(b):
        pos = math.exp(s * brute_log_elk(mu_a[i], float(ka[i]), mu_p[i], float(kp[i])))
        neg = (
            sum(
                math.exp(s * brute_log_elk(mu_a[i], float(ka[i]), mu_n[i, j], float(kn[i, j])))
                for j in range(m)
            )
            / m
        )
        ref.append(-math.log(pos / (pos + neg)))
    assert np.allclose(got.numpy(), ref, rtol=1e-9)
    # in-batch: 2B anchors with 2B - 2 negatives each
    inb = elk_contrastive_loss(mu_a, ka, mu_p, kp, scale=s, reduction="none")
    mus, ks = torch.cat([mu_a, mu_p]), torch.cat([ka, kp])
    ref = []
    for i in range(2 * b):
        j = (i + b) % (2 * b)

        def sim(q, i=i):
            return math.exp(s * brute_log_elk(mus[i], float(ks[i]), mus[q], float(ks[q])))

        negs = [sim(q) for q in range(2 * b) if q not in (i, j)]
        ref.append(-math.log(sim(j) / (sim(j) + sum(negs) / len(negs))))
    assert np.allclose(inb.numpy(), ref, rtol=1e-9)


def test_bad_input():
    mu = torch.randn(4, 3)
    with pytest.raises(ValueError, match="kappa"):
        elk_pairwise_log_kernel(mu, torch.full((4,), float("inf")), mu, torch.ones(4))
    with pytest.raises(ValueError, match="dimension"):
        elk_log_kernel(mu, torch.ones(4), torch.randn(4, 2), torch.ones(4))
    loss = ELKLoss(3, 3)
    with pytest.raises(ValueError, match="labels"):
        loss(mu, torch.tensor([0, 1, 2, 3]), kappa=torch.ones(4))
    with pytest.raises(ValueError, match="labels"):
        loss(mu, None, kappa=torch.ones(4))
    with pytest.raises(ValueError, match="indices_tuple"):
        loss(mu, torch.zeros(4, dtype=torch.long), (torch.tensor([0]),) * 3, kappa=1.0)
    with pytest.raises(ValueError, match="embeddings"):
        loss(mu.clone().fill_(float("nan")), torch.zeros(4, dtype=torch.long), kappa=1.0)
    with pytest.raises(ValueError, match="num_classes"):
        ELKLoss(1, 3)


@settings(max_examples=40, deadline=None)
@given(
    k1=st.floats(0.01, 500.0),
    k2=st.floats(0.01, 500.0),
    c1=st.floats(-1.0, 1.0),
    c2=st.floats(-1.0, 1.0),
    d=st.sampled_from([2, 3, 10, 64]),
)
def test_kernel_properties(k1, k2, c1, c2, d):
    """Symmetric, increasing in the cosine of the means, equal to the scipy formula."""
    # the scipy reference takes log I_v(0) = -inf when ||k1 mu1 + k2 mu2|| = 0 exactly
    assume(not (k1 == k2 and c1 == -1.0))
    e1 = torch.zeros(d)
    e1[0] = 1.0

    def at(c):
        v = torch.zeros(d)
        v[0], v[1] = c, math.sqrt(max(1 - c * c, 0.0))
        return v

    k1t, k2t = torch.tensor(k1), torch.tensor(k2)
    a = elk_log_kernel(e1, k1t, at(c1), k2t)
    assert torch.allclose(a, elk_log_kernel(at(c1), k2t, e1, k1t))
    b = elk_log_kernel(e1, k1t, at(c2), k2t)
    if c1 > c2 + 1e-9:
        assert a >= b - 1e-9
    assert math.isclose(float(a), brute_log_elk(e1, k1, at(c1), k2), rel_tol=1e-8, abs_tol=1e-7)


def test_contrastive_elk_rejects_bad_explicit_negatives():
    mu = torch.nn.functional.normalize(torch.randn(4, 3), dim=-1)
    k = torch.full((4,), 5.0)
    with pytest.raises(ValueError, match="at least one negative"):
        elk_contrastive_loss(mu, k, mu, k, torch.zeros(4, 0, 3), torch.zeros(4, 0))
    with pytest.raises(ValueError, match="kappa_neg"):
        elk_contrastive_loss(mu, k, mu, k, mu.unsqueeze(1))
    with pytest.raises(ValueError, match="mu_neg"):
        elk_contrastive_loss(mu, k, mu, k, torch.randn(3, 2, 3), torch.ones(3, 2))
    with pytest.raises(ValueError, match="reduction"):
        elk_contrastive_loss(mu, k, mu, k, reduction="max")


def test_contrastive_sum_matches_the_mci_code():
    """MCI ``utils/losses.py`` class ``ELK.forward`` (b0f70c0, lines 58-75) with explicit
    negatives, in numpy: ``mean(sim_pos) - logsumexp(cat(sim_pos, sim_neg))``, the negatives
    summed; ``log_ppk`` from scipy's Bessel function."""
    from scipy.special import logsumexp

    g = torch.Generator().manual_seed(21)
    b, m, d, scale = 3, 4, 5, 2.0
    mu_a = torch.nn.functional.normalize(
        torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1
    )
    mu_p = torch.nn.functional.normalize(
        torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1
    )
    mu_n = torch.nn.functional.normalize(
        torch.randn(b, m, d, generator=g, dtype=torch.float64), dim=-1
    )
    ka, kp = torch.rand(b, generator=g) * 20 + 1, torch.rand(b, generator=g) * 20 + 1
    kn = torch.rand(b, m, generator=g) * 20 + 1
    ka, kp, kn = ka.double(), kp.double(), kn.double()

    def log_c(k):
        v = d / 2 - 1
        return v * np.log(k) - d / 2 * np.log(2 * np.pi) - np.log(ive(v, k)) - k

    def log_ppk(mu1, k1, mu2, k2):
        k3 = np.linalg.norm(k1[..., None] * mu1 + k2[..., None] * mu2, axis=-1)
        return (log_c(k1) + log_c(k2) - log_c(k3)) * scale

    a, ka_ = mu_a.numpy()[:, None], ka.numpy()[:, None]
    sim_pos = log_ppk(a, ka_, mu_p.numpy()[:, None], kp.numpy()[:, None])
    sim_neg = log_ppk(a, ka_, mu_n.numpy(), kn.numpy())
    want = -np.mean(sim_pos.mean(1) - logsumexp(np.concatenate([sim_pos, sim_neg], 1), axis=1))
    got = elk_contrastive_loss(mu_a, ka, mu_p, kp, mu_n, kn, scale=scale, negatives="sum")
    assert abs(float(got) - want) < 1e-9
    mean = elk_contrastive_loss(mu_a, ka, mu_p, kp, mu_n, kn, scale=scale)
    assert abs(float(mean) - want) > 1e-3
    with pytest.raises(ValueError, match="negatives"):
        elk_contrastive_loss(mu_a, ka, mu_p, kp, mu_n, kn, negatives="max")
