import math

import numpy as np
import pytest
import torch
from pytorch_metric_learning.miners import MultiSimilarityMiner

from bayesurl.distributions.vmf import sample_vmf
from bayesurl.losses.hib import HIBLoss, hib_loss


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def match_p(z1, z2, i, j, t, b):
    """p(i, j) = (1/K) sum_k sigmoid(t s_ik^T s_jk + b), URL B.6, by loops."""
    k_ = z1.shape[0]
    return sum(sig(t * float(z1[k, i] @ z2[k, j]) + b) for k in range(k_)) / k_


@pytest.mark.parametrize("term", ["log_p", "log1m_p"])
def test_pml_class_matches_url_eq5(term):
    g = torch.Generator().manual_seed(0)
    n, d, k, t, b = 8, 4, 5, 6.0, -2.0
    emb, labels = torch.randn(n, d, generator=g), torch.randint(0, 3, (n,), generator=g)
    kappa = torch.rand(n, generator=g) * 20 + 1
    loss = HIBLoss(t, b, n_samples=k, negative_term=term, eps=0.0)
    loss.generator = torch.Generator().manual_seed(7)
    got = loss(emb, labels, kappa=kappa)
    z = sample_vmf(emb, kappa, k, generator=torch.Generator().manual_seed(7))
    same = [(i, j) for i in range(n) for j in range(n) if i != j and labels[i] == labels[j]]
    diff = [(i, j) for i in range(n) for j in range(n) if labels[i] != labels[j]]
    pos = -sum(math.log(match_p(z, z, i, j, t, b)) for i, j in same) / len(same)
    if term == "log_p":
        neg = sum(math.log(match_p(z, z, i, j, t, b)) for i, j in diff) / len(diff)
    else:
        neg = -sum(math.log(1 - match_p(z, z, i, j, t, b)) for i, j in diff) / len(diff)
    assert math.isclose(float(got), pos + neg, rel_tol=1e-10)


def test_pml_contract_miner_and_ref_emb():
    g = torch.Generator().manual_seed(1)
    n, d, k, t, b = 10, 5, 3, 8.0, 0.5
    emb, labels = torch.randn(n, d, generator=g), torch.randint(0, 3, (n,), generator=g)
    kappa = torch.full((n,), float("inf"))  # samples = means: deterministic reference
    tup = MultiSimilarityMiner(epsilon=0.3)(emb, labels)
    got = HIBLoss(t, b, n_samples=k, eps=0.0)(emb, labels, tup, kappa=kappa)
    z = torch.nn.functional.normalize(emb, dim=-1)
    a1, p, a2, nn_ = tup
    pos = -sum(math.log(sig(t * float(z[i] @ z[j]) + b)) for i, j in zip(a1, p)) / max(len(a1), 1)
    neg = sum(math.log(sig(t * float(z[i] @ z[j]) + b)) for i, j in zip(a2, nn_)) / max(len(a2), 1)
    assert math.isclose(float(got), pos + neg, rel_tol=1e-10, abs_tol=1e-12)
    ref = torch.randn(4, d, generator=g)
    ref_labels = torch.tensor([0, 1, 2, 0])
    kap = torch.full((n,), 10.0, requires_grad=True)
    out = HIBLoss(t, b, n_samples=k)(
        emb, labels, ref_emb=ref, ref_labels=ref_labels, kappa=kap, ref_kappa=5.0
    )
    out.backward()
    assert torch.isfinite(out) and kap.grad.abs().sum() > 0


@pytest.mark.parametrize("term", ["log_p", "log1m_p"])
def test_contrastive_functional_matches_brute_force(term):
    g = torch.Generator().manual_seed(2)
    bsz, m, d, k, t, b = 3, 4, 5, 4, 5.0, -1.0
    mu_a, mu_p = torch.randn(bsz, d, generator=g), torch.randn(bsz, d, generator=g)
    mu_n = torch.randn(bsz, m, d, generator=g)
    ka, kp = torch.rand(bsz, generator=g) * 9 + 1, torch.rand(bsz, generator=g) * 9 + 1
    kn = torch.rand(bsz, m, generator=g) * 9 + 1
    got = hib_loss(
        mu_a,
        ka,
        mu_p,
        kp,
        mu_n,
        kn,
        n_samples=k,
        scale=t,
        bias=b,
        negative_term=term,
        eps=0.0,
        generator=torch.Generator().manual_seed(3),
        reduction="none",
    )
    g2 = torch.Generator().manual_seed(3)
    za, zp = sample_vmf(mu_a, ka, k, generator=g2), sample_vmf(mu_p, kp, k, generator=g2)
    zn = sample_vmf(mu_n.reshape(-1, d), kn.reshape(-1), k, generator=g2).reshape(k, bsz, m, d)
    for i in range(bsz):
        ref = -math.log(match_p(za, zp, i, i, t, b))
        for j in range(m):
            p = sum(sig(t * float(za[q, i] @ zn[q, i, j]) + b) for q in range(k)) / k
            ref += (math.log(p) if term == "log_p" else -math.log(1 - p)) / m
        assert math.isclose(float(got[i]), ref, rel_tol=1e-10)
    # in-batch negatives: same as the PML class on two-view labels
    inb = hib_loss(
        mu_a,
        ka,
        mu_p,
        kp,
        n_samples=k,
        scale=t,
        bias=b,
        negative_term=term,
        eps=0.0,
        generator=torch.Generator().manual_seed(4),
        reduction="none",
    )
    z = sample_vmf(
        torch.cat([mu_a, mu_p]), torch.cat([ka, kp]), k, generator=torch.Generator().manual_seed(4)
    )
    n = 2 * bsz
    for i in range(n):
        j = (i + bsz) % n
        ref = -math.log(match_p(z, z, i, j, t, b))
        negs = [q for q in range(n) if q not in (i, j)]
        for q in negs:
            p = match_p(z, z, i, q, t, b)
            ref += (math.log(p) if term == "log_p" else -math.log(1 - p)) / len(negs)
        assert math.isclose(float(inb[i]), ref, rel_tol=1e-10)


def test_bad_input():
    mu = torch.randn(4, 3)
    with pytest.raises(ValueError, match="negative_term"):
        HIBLoss(negative_term="log(1-p)")
    with pytest.raises(ValueError, match="eps"):
        HIBLoss(eps=-1e-3)
    with pytest.raises(ValueError, match="scale"):
        hib_loss(mu, 1.0, mu, 1.0, scale=-1.0)
    with pytest.raises(ValueError, match="kappa"):
        HIBLoss()(mu, torch.arange(4), kappa=torch.ones(5))
    with pytest.raises(ValueError, match="labels"):
        HIBLoss()(mu)
    with pytest.raises(ValueError, match="mu_anchor"):
        hib_loss(mu[:, :1], 1.0, mu[:, :1], 1.0)


def test_learnable_scale_and_bias():
    g = torch.Generator().manual_seed(9)
    mu = torch.randn(4, 3, generator=g)
    a, b = torch.tensor(2.0, requires_grad=True), torch.tensor(0.5, requires_grad=True)
    hib_loss(mu, 10.0, mu.flip(0), 10.0, n_samples=2, scale=a, bias=b, generator=g).backward()
    assert a.grad != 0 and b.grad != 0
    with pytest.raises(ValueError, match="bias"):
        hib_loss(mu, 10.0, mu, 10.0, bias=float("nan"))


def url_code_hib(samples, target, t, b, commit):
    """URL ``timm/loss/HedgedInstance.py`` ``forward`` from the vMF samples on, in numpy
    (mkirchhof/url, lines 31-44): ``+log p`` for different pairs at 9a92555 / 0bd3ea0,
    ``log(1 - p)`` at bf67867; ``EPS = 1e-5`` added to the averaged p at every commit."""
    logits = samples @ samples.transpose(0, 2, 1) * t + b
    match_prob = (1 / (1 + np.exp(-logits))).mean(0) + 1e-5
    mask = (target[:, None] == target[None, :]).astype(float)
    pos_mask = mask - np.eye(len(target))
    neg_mask = 1 - mask
    pos = (np.log(match_prob) * pos_mask).sum(-1) / pos_mask.sum(-1)
    if commit == "bf67867":
        bce = pos + (np.log(1 - match_prob) * neg_mask).sum(-1) / neg_mask.sum(-1)
    else:
        bce = pos - (np.log(match_prob) * neg_mask).sum(-1) / neg_mask.sum(-1)
    return -bce.mean()


@pytest.mark.parametrize(("commit", "term"), [("0bd3ea0", "log_p"), ("bf67867", "log1m_p")])
def test_matches_the_url_code_by_commit(commit, term):
    g = torch.Generator().manual_seed(9)
    bsz, d, k, t, b = 4, 5, 6, 12.0, -6.0
    e1 = torch.randn(bsz, d, generator=g, dtype=torch.float64)
    e2 = e1 + 0.3 * torch.randn(bsz, d, generator=g, dtype=torch.float64)
    k1 = torch.rand(bsz, generator=g, dtype=torch.float64) * 20 + 5
    k2 = torch.rand(bsz, generator=g, dtype=torch.float64) * 20 + 5
    z = sample_vmf(
        torch.cat([e1, e2]), torch.cat([k1, k2]), k, generator=torch.Generator().manual_seed(2)
    )
    want = url_code_hib(z.numpy(), np.tile(np.arange(bsz), 2), t, b, commit)
    kw = {"n_samples": k, "scale": t, "bias": b, "negative_term": term}
    got = hib_loss(e1, k1, e2, k2, generator=torch.Generator().manual_seed(2), **kw)
    assert abs(float(got) - want) < 1e-10
    loss = HIBLoss(t, b, n_samples=k, negative_term=term)
    loss.generator = torch.Generator().manual_seed(2)
    pml = loss(torch.cat([e1, e2]), torch.arange(bsz).repeat(2), kappa=torch.cat([k1, k2]))
    assert abs(float(pml) - want) < 1e-10
    # without the code's EPS the +log p term of far-apart pairs differs visibly
    no_eps = hib_loss(e1, k1, e2, k2, generator=torch.Generator().manual_seed(2), eps=0.0, **kw)
    if term == "log_p":
        assert abs(float(no_eps) - want) > 1e-2


def test_mci_code_variant():
    """MCI ``utils/losses.py`` class ``HedgedInstance.forward`` (b0f70c0, lines 86-111) in
    numpy from the samples on: ``mean_k log sigmoid`` and the negative term divided by M
    after its mean."""
    g = torch.Generator().manual_seed(13)
    bsz, m, d, k, a, b = 3, 4, 5, 6, 2.0, 0.5
    mu_a, mu_p = torch.randn(bsz, d, generator=g), torch.randn(bsz, d, generator=g)
    mu_n = torch.randn(bsz, m, d, generator=g)
    ka, kp = torch.rand(bsz, generator=g) * 9 + 1, torch.rand(bsz, generator=g) * 9 + 1
    kn = torch.rand(bsz, m, generator=g) * 9 + 1
    got = hib_loss(
        mu_a, ka, mu_p, kp, mu_n, kn, n_samples=k, scale=a, bias=b, negative_term="log1m_p",
        eps=0.0, mc_average="outside", negative_weight=1 / m,
        generator=torch.Generator().manual_seed(3),
    )  # fmt: skip
    g2 = torch.Generator().manual_seed(3)
    za = sample_vmf(mu_a, ka, k, generator=g2).double().numpy()[:, :, None]  # [K, B, 1, D]
    zp = sample_vmf(mu_p, kp, k, generator=g2).double().numpy()[:, :, None]
    zn = sample_vmf(mu_n.reshape(-1, d), kn.reshape(-1), k, generator=g2).double().numpy()
    zn = zn.reshape(k, bsz, m, d)
    py1_pos = 1 / (1 + np.exp(-(a * (za * zp).sum(-1) + b)))
    py1_neg = 1 / (1 + np.exp(-(a * (za * zn).sum(-1) + b)))
    log_py1_pos = np.log(py1_pos).mean(0)
    log_py0_neg = np.log(1 - py1_neg).mean(0)
    want = -(log_py1_pos.mean() + log_py0_neg.mean() / log_py0_neg.shape[-1])
    assert abs(float(got) - want) < 1e-5  # float32 samples
    with pytest.raises(ValueError, match="eps"):
        hib_loss(mu_a, ka, mu_p, kp, mc_average="outside")
