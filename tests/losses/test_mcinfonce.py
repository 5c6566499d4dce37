import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.losses import NTXentLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner
from scipy.special import logsumexp

from bayesurl.distributions.vmf import sample_vmf
from bayesurl.losses._base import contrastive_log_ratio
from bayesurl.losses.infonce import infonce_loss, two_view_labels
from bayesurl.losses.mcinfonce import MCInfoNCELoss, mcinfonce_loss

INF = float("inf")


def _dot(u, v):
    return sum(x * y for x, y in zip(u, v))


def _combine(terms, mc_average):
    """-log mean_k ratio_k (inside) or -mean_k log ratio_k (outside)."""
    if mc_average == "inside":
        return -math.log(sum(terms) / len(terms))
    return -sum(math.log(r) for r in terms) / len(terms)


def brute_explicit(
    za, zp, zn, t, divide_positive, denominator="positive", mc_average="inside", self_term=False
):
    """MCI eq. 7 / URL eq. 2 from the formula: loops over anchors, samples, negatives."""
    k_, b, m, _ = zn.shape
    out = []
    for i in range(b):
        terms = []
        for k in range(k_):
            a, p = za[k, i].tolist(), zp[k, i].tolist()
            pos = math.exp(t * _dot(a, p))
            neg_sum = sum(math.exp(t * _dot(a, zn[k, i, j].tolist())) for j in range(m))
            if denominator == "negatives":
                one = 1.0 if self_term else 0.0  # the URL code's e^0 self-similarity
                terms.append((one + pos) / (one + neg_sum))
            else:
                c = 1.0 / m if divide_positive else 1.0
                terms.append(pos / (c * pos + neg_sum / m))
        out.append(_combine(terms, mc_average))
    return torch.tensor(out)


@pytest.mark.parametrize("divide_positive", [False, True])
def test_explicit_negatives_match_brute_force(divide_positive):
    b, m, d, k, t = 4, 3, 5, 6, 7.0
    g = torch.Generator().manual_seed(0)
    mu_a, mu_p = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    mu_n = torch.randn(b, m, d, generator=g)
    ka, kp = torch.rand(b, generator=g) * 20 + 1, torch.rand(b, generator=g) * 20 + 1
    kn = torch.rand(b, m, generator=g) * 20 + 1
    got = mcinfonce_loss(
        mu_a,
        ka,
        mu_p,
        kp,
        mu_n,
        kn,
        n_samples=k,
        kappa_pos_scale=t,
        divide_positive=divide_positive,
        denominator="positive",
        generator=torch.Generator().manual_seed(5),
        reduction="none",
    )
    # redraw the same samples (same generator, same order)
    g2 = torch.Generator().manual_seed(5)
    za = sample_vmf(mu_a, ka, k, generator=g2)
    zp = sample_vmf(mu_p, kp, k, generator=g2)
    zn = sample_vmf(mu_n.reshape(b * m, d), kn.reshape(-1), k, generator=g2).reshape(k, b, m, d)
    ref = brute_explicit(za, zp, zn, t, divide_positive)
    assert torch.allclose(got, ref, atol=1e-10)
    if not divide_positive:
        assert (got >= 0).all()


def brute_in_batch(
    z, b, t, divide_positive, denominator="positive", mc_average="inside", self_term=False
):
    """In-batch (SimCLR) MCInfoNCE: 2B anchors, positive = other view, negatives = the rest."""
    k_, n, _ = z.shape
    out = []
    for i in range(n):
        j = (i + b) % n
        negs = [q for q in range(n) if q not in (i, j)]
        terms = []
        for k in range(k_):
            zi = z[k, i].tolist()
            pos = math.exp(t * _dot(zi, z[k, j].tolist()))
            neg_sum = sum(math.exp(t * _dot(zi, z[k, q].tolist())) for q in negs)
            if denominator == "negatives":
                one = 1.0 if self_term else 0.0
                terms.append((one + pos) / (one + neg_sum))
            else:
                c = 1.0 / len(negs) if divide_positive else 1.0
                terms.append(pos / (c * pos + neg_sum / len(negs)))
        out.append(_combine(terms, mc_average))
    return torch.tensor(out)


@pytest.mark.parametrize("divide_positive", [False, True])
def test_in_batch_and_pml_class_match_brute_force(divide_positive):
    b, d, k, t = 4, 3, 5, 9.0
    g = torch.Generator().manual_seed(1)
    e1, e2 = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    k1, k2 = torch.rand(b, generator=g) * 30, torch.rand(b, generator=g) * 30
    got = mcinfonce_loss(
        e1,
        k1,
        e2,
        k2,
        n_samples=k,
        kappa_pos_scale=t,
        divide_positive=divide_positive,
        denominator="positive",
        generator=torch.Generator().manual_seed(3),
        reduction="none",
    )
    z = sample_vmf(
        torch.cat([e1, e2]), torch.cat([k1, k2]), k, generator=torch.Generator().manual_seed(3)
    )
    ref = brute_in_batch(z, b, t, divide_positive)
    assert torch.allclose(got, ref, atol=1e-10)
    loss = MCInfoNCELoss(t, n_samples=k, divide_positive=divide_positive, denominator="positive")
    loss.generator = torch.Generator().manual_seed(3)
    pml = loss(torch.cat([e1, e2]), two_view_labels(b), kappa=torch.cat([k1, k2]))
    assert torch.allclose(pml, ref.mean(), atol=1e-10)


def test_kappa_inf_equals_infonce():
    """MCInfoNCE with kappa = inf is InfoNCE at temperature 1/kappa_pos (MCI section 4.1)."""
    b, d, t = 6, 4, 12.0
    g = torch.Generator().manual_seed(2)
    e1, e2 = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    ref = infonce_loss(e1, e2, t, denominator="all")  # SimCLR form
    pml = NTXentLoss(temperature=1.0 / t)(torch.cat([e1, e2]), two_view_labels(b))
    assert torch.allclose(ref, pml, atol=1e-8)
    # eq. 7 (positive divided by M too) = InfoNCE - log M, M = 2B - 2 negatives
    eq7 = mcinfonce_loss(
        e1, INF, e2, INF, n_samples=3, kappa_pos_scale=t, divide_positive=True,
        denominator="positive",
    )  # fmt: skip
    assert torch.allclose(eq7, ref - math.log(2 * b - 2), atol=1e-10)
    # reference code: InfoNCE whose negatives are averaged, not summed
    refc = mcinfonce_loss(e1, INF, e2, INF, n_samples=3, kappa_pos_scale=t, denominator="positive")
    z = torch.nn.functional.normalize(torch.cat([e1, e2]), dim=-1)
    logits = t * z @ z.T
    n = 2 * b
    expect = []
    for i in range(n):
        j = (i + b) % n
        neg = torch.stack([logits[i, q] for q in range(n) if q not in (i, j)])
        expect.append(
            -(
                logits[i, j]
                - torch.logaddexp(logits[i, j], torch.logsumexp(neg, 0) - math.log(n - 2))
            )
        )
    assert torch.allclose(refc, torch.stack(expect).mean(), atol=1e-10)
    # large but finite kappa converges to the same value
    near = mcinfonce_loss(
        e1, 1e11, e2, 1e11, n_samples=4, kappa_pos_scale=t, divide_positive=True,
        denominator="positive",
    )  # fmt: skip
    assert abs(float(near - eq7)) < 1e-3


def test_pml_contract_miner_and_ref_emb():
    g = torch.Generator().manual_seed(4)
    emb, labels = torch.randn(10, 5, generator=g), torch.randint(0, 3, (10,), generator=g)
    kappa = torch.full((10,), INF)
    loss = MCInfoNCELoss(8.0, n_samples=2, divide_positive=False, denominator="positive")
    tup = MultiSimilarityMiner(epsilon=0.5)(emb, labels)
    got = loss(emb, labels, tup, kappa=kappa)
    # with kappa = inf: brute force over the mined pairs
    a1, p, a2, n = tup
    z = torch.nn.functional.normalize(emb, dim=-1)
    vals = []
    for i in range(len(a1)):
        negs = [int(n[j]) for j in range(len(a2)) if a2[j] == a1[i]]
        pos = 8.0 * float(z[a1[i]] @ z[p[i]])
        if negs:
            neg = math.log(sum(math.exp(8.0 * float(z[a1[i]] @ z[q])) for q in negs) / len(negs))
            vals.append(-(pos - math.log(math.exp(pos) + math.exp(neg))))
        else:
            vals.append(0.0)
    assert torch.allclose(got, torch.tensor(vals).mean(), atol=1e-10)
    # ref_emb with its own concentration; the gradient reaches kappa
    ref = torch.randn(6, 5, generator=g)
    ref_labels = torch.randint(0, 3, (6,), generator=g)
    kap = torch.full((10,), 5.0, requires_grad=True)
    out = loss(emb, labels, ref_emb=ref, ref_labels=ref_labels, kappa=kap, ref_kappa=3.0)
    out.backward()
    assert torch.isfinite(out) and kap.grad.abs().sum() > 0
    # kappa read from the norms when not given
    assert torch.isfinite(loss(emb, labels))


@pytest.mark.parametrize("self_term", [True, False])
@pytest.mark.parametrize("mc_average", ["inside", "outside"])
def test_url_variants_match_brute_force(mc_average, self_term):
    """URL code (negatives only, summed) with the samples averaged inside / outside the log."""
    b, m, d, k, t = 3, 4, 5, 6, 7.0
    g = torch.Generator().manual_seed(7)
    mu_a, mu_p = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    mu_n = torch.randn(b, m, d, generator=g)
    ka, kp = torch.rand(b, generator=g) * 20 + 1, torch.rand(b, generator=g) * 20 + 1
    kn = torch.rand(b, m, generator=g) * 20 + 1
    got = mcinfonce_loss(
        mu_a, ka, mu_p, kp, mu_n, kn, n_samples=k, kappa_pos_scale=t, mc_average=mc_average,
        self_term=self_term, generator=torch.Generator().manual_seed(5), reduction="none",
    )  # fmt: skip
    g2 = torch.Generator().manual_seed(5)
    za = sample_vmf(mu_a, ka, k, generator=g2)
    zp = sample_vmf(mu_p, kp, k, generator=g2)
    zn = sample_vmf(mu_n.reshape(b * m, d), kn.reshape(-1), k, generator=g2).reshape(k, b, m, d)
    ref = brute_explicit(za, zp, zn, t, False, "negatives", mc_average, self_term)
    assert torch.allclose(got, ref, atol=1e-10)
    # in-batch negatives and the PML class
    e1, e2 = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    k1, k2 = torch.rand(4, generator=g) * 30, torch.rand(4, generator=g) * 30
    got = mcinfonce_loss(
        e1, k1, e2, k2, n_samples=k, kappa_pos_scale=t, mc_average=mc_average,
        self_term=self_term, generator=torch.Generator().manual_seed(3), reduction="none",
    )  # fmt: skip
    z = sample_vmf(
        torch.cat([e1, e2]), torch.cat([k1, k2]), k, generator=torch.Generator().manual_seed(3)
    )
    ref = brute_in_batch(z, 4, t, False, "negatives", mc_average, self_term)
    assert torch.allclose(got, ref, atol=1e-10)
    loss = MCInfoNCELoss(t, n_samples=k, mc_average=mc_average, self_term=self_term)
    loss.generator = torch.Generator().manual_seed(3)
    pml = loss(torch.cat([e1, e2]), two_view_labels(4), kappa=torch.cat([k1, k2]))
    assert torch.allclose(pml, ref.mean(), atol=1e-10)


def test_default_is_the_url_code_and_reduces_to_url_infonce():
    """Defaults: negatives-only denominator, log-mean-exp; kappa = inf gives URL InfoNCE."""
    b, d, t = 5, 4, 10.0
    g = torch.Generator().manual_seed(8)
    e1, e2 = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    got = mcinfonce_loss(e1, INF, e2, INF, n_samples=3, kappa_pos_scale=t)
    assert torch.allclose(got, infonce_loss(e1, e2, t, denominator="negatives"), atol=1e-10)
    loss = MCInfoNCELoss()
    assert (loss.denominator, loss.mc_average, loss.self_term) == ("negatives", "inside", True)


def url_code_mcinfonce(samples, target, t):
    """URL ``timm/loss/MCInfoNCE.py`` ``MCInfoNCE.forward`` (mkirchhof/url 9a92555, lines
    29-52) in numpy, from the vMF samples ``[K, N, D]`` on: the masks leave the diagonal at
    logit 0 in both log-sum-exps, and all positives of an anchor share one log-sum-exp."""
    sim = samples @ samples.transpose(0, 2, 1) * t
    mask = (target[:, None] == target[None, :]).astype(float)
    pos_mask = mask - np.eye(len(target))
    neg_mask = 1 - mask
    pos_add, neg_add = neg_mask * -1000, pos_mask * -1000
    per_sample = logsumexp(sim * pos_mask + pos_add, -1) - logsumexp(sim * neg_mask + neg_add, -1)
    per_example = logsumexp(per_sample, 0) - np.log(samples.shape[0])
    return -per_example.mean()


@pytest.mark.parametrize("supervised", [False, True])
def test_defaults_match_the_url_code(supervised):
    """Two views (default options) and class labels (``positives="logsumexp"``)."""
    from pytorch_metric_learning.reducers import MeanReducer

    g = torch.Generator().manual_seed(11)
    n, d, k, t = 10, 4, 5, 8.0
    emb = torch.randn(n, d, generator=g, dtype=torch.float64)
    kappa = torch.rand(n, generator=g, dtype=torch.float64) * 20 + 2
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 3]) if supervised else two_view_labels(5)
    z = sample_vmf(emb, kappa, k, generator=torch.Generator().manual_seed(4))
    want = url_code_mcinfonce(z.numpy(), labels.numpy(), t)
    kw = {"positives": "logsumexp"} if supervised else {}
    loss = MCInfoNCELoss(t, n_samples=k, reducer=MeanReducer(), **kw)
    loss.generator = torch.Generator().manual_seed(4)
    assert abs(float(loss(emb, labels, kappa=kappa)) - want) < 1e-10
    loss.generator = torch.Generator().manual_seed(4)
    if supervised:
        per_pair = MCInfoNCELoss(t, n_samples=k, reducer=MeanReducer())
        per_pair.generator = torch.Generator().manual_seed(4)
        assert abs(float(per_pair(emb, labels, kappa=kappa)) - want) > 1e-3
    else:
        no_self = MCInfoNCELoss(t, n_samples=k, self_term=False, reducer=MeanReducer())
        no_self.generator = torch.Generator().manual_seed(4)
        assert abs(float(no_self(emb, labels, kappa=kappa)) - want) > 1e-3


def test_self_term_and_logsumexp_need_the_url_denominator():
    mu = torch.randn(4, 3)
    with pytest.raises(ValueError, match="self_term"):
        mcinfonce_loss(mu, 1.0, mu, 1.0, denominator="positive", self_term=True)
    with pytest.raises(ValueError, match="positives"):
        MCInfoNCELoss(denominator="positive", positives="logsumexp")


def test_bad_input():
    mu = torch.randn(4, 3)
    with pytest.raises(ValueError, match="denominator"):
        mcinfonce_loss(mu, 1.0, mu, 1.0, denominator="all")
    with pytest.raises(ValueError, match="mc_average"):
        MCInfoNCELoss(mc_average="middle")
    with pytest.raises(ValueError, match="kappa_anchor"):
        mcinfonce_loss(mu, torch.ones(3), mu, 1.0)
    with pytest.raises(ValueError, match="kappa_pos"):
        mcinfonce_loss(mu, 1.0, mu, torch.tensor([1.0, float("nan"), 1.0, 1.0]))
    with pytest.raises(ValueError, match="mu_pos"):
        mcinfonce_loss(mu, 1.0, mu[:2], 1.0)
    with pytest.raises(ValueError, match="mu_neg"):
        mcinfonce_loss(mu, 1.0, mu, 1.0, torch.randn(4, 2, 5), 1.0)
    with pytest.raises(ValueError, match="kappa_neg"):
        mcinfonce_loss(mu, 1.0, mu, 1.0, torch.randn(4, 2, 3))
    with pytest.raises(ValueError, match="n_samples"):
        mcinfonce_loss(mu, 1.0, mu, 1.0, n_samples=0)
    with pytest.raises(ValueError, match="embeddings"):
        MCInfoNCELoss()(mu.clone().fill_(float("nan")), torch.arange(4), kappa=1.0)
    with pytest.raises(ValueError, match="labels"):
        MCInfoNCELoss()(mu, torch.arange(3), kappa=1.0)
    with pytest.raises(ValueError, match="kappa"):
        MCInfoNCELoss()(mu, torch.arange(4), kappa=-torch.ones(4))
    with pytest.raises(ValueError, match="ref_kappa"):
        MCInfoNCELoss()(mu, torch.arange(4), kappa=1.0, ref_kappa=1.0)


def test_dtype_follows_inputs_and_half_precision_is_promoted():
    g = torch.Generator().manual_seed(8)
    emb = torch.randn(6, 4, generator=g)
    labels = two_view_labels(3)
    loss = MCInfoNCELoss(8.0, n_samples=4)
    assert loss(emb.float(), labels, kappa=20.0).dtype == torch.float32
    assert loss(emb, labels, kappa=20.0).dtype == torch.float64
    out = loss(emb.to(torch.bfloat16), labels, kappa=torch.full((6,), 20.0, dtype=torch.bfloat16))
    assert out.dtype == torch.float32 and torch.isfinite(out)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = loss(emb.float(), labels, kappa=20.0)
    assert inside.dtype == torch.float32


def test_learnable_kappa_pos_scale():
    g = torch.Generator().manual_seed(9)
    mu_a, mu_p = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    t = torch.tensor(10.0, requires_grad=True)
    loss = mcinfonce_loss(
        mu_a,
        20.0,
        mu_p,
        20.0,
        torch.randn(4, 2, 3, generator=g),
        20.0,
        n_samples=3,
        kappa_pos_scale=t,
        generator=g,
    )
    loss.backward()
    assert torch.isfinite(t.grad) and t.grad != 0
    with pytest.raises(ValueError, match="kappa_pos_scale"):
        mcinfonce_loss(mu_a, 1.0, mu_p, 1.0, kappa_pos_scale=torch.tensor(-1.0))
    with pytest.raises(ValueError, match="kappa_pos_scale"):
        mcinfonce_loss(mu_a, 1.0, mu_p, 1.0, kappa_pos_scale=torch.ones(2))


@settings(max_examples=50, deadline=None)
@given(
    pos=st.floats(-50, 50),
    negs=st.lists(st.floats(-50, 50), min_size=1, max_size=8),
)
def test_log_ratio_bounds(pos, negs):
    """Reference variant: ratio <= 1 (loss >= 0); eq. 7 variant: ratio <= M (loss >= -log M)."""
    p, n = torch.tensor([pos]), torch.tensor([negs])
    m = len(negs)
    ref = contrastive_log_ratio(p, n, None, divide_positive=False)
    eq7 = contrastive_log_ratio(p, n, None, divide_positive=True)
    assert float(ref) <= 1e-12
    assert float(eq7) <= math.log(m) + 1e-12
    # both agree with the formula
    mean_neg = sum(math.exp(v) for v in negs) / m
    assert math.isclose(float(ref), pos - math.log(math.exp(pos) + mean_neg), abs_tol=1e-9)
    assert math.isclose(float(eq7), pos - math.log(math.exp(pos) / m + mean_neg), abs_tol=1e-9)


def test_url_taylor_sampler_reaches_the_loss():
    from pytorch_metric_learning.reducers import MeanReducer

    g = torch.Generator().manual_seed(12)
    emb = torch.randn(8, 32, generator=g, dtype=torch.float64)
    kappa = torch.full((8,), 12.0, dtype=torch.float64)
    labels = two_view_labels(4)
    z = sample_vmf(emb, kappa, 4, generator=torch.Generator().manual_seed(1), sampler="url_taylor")
    want = url_code_mcinfonce(z.numpy(), labels.numpy(), 8.0)
    loss = MCInfoNCELoss(8.0, n_samples=4, sampler="url_taylor", reducer=MeanReducer())
    loss.generator = torch.Generator().manual_seed(1)
    assert abs(float(loss(emb, labels, kappa=kappa)) - want) < 1e-10
