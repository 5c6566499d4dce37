import math

import numpy as np
import pytest
import torch
from pytorch_metric_learning.losses import NTXentLoss
from pytorch_metric_learning.miners import BatchEasyHardMiner

from bayesurl.losses.infonce import InfoNCELoss, infonce_loss, two_view_labels


def brute_infonce(z1, z2, t, denominator="negatives"):
    """URL eq. 1 (negatives only) or SimCLR (positive too), one anchor at a time."""
    z = [[c / math.sqrt(sum(c * c for c in v)) for c in v] for v in torch.cat([z1, z2]).tolist()]
    b = len(z1)
    out = []
    for i in range(2 * b):
        j = (i + b) % (2 * b)
        dot = lambda u, v: sum(x * y for x, y in zip(u, v))  # noqa: E731
        skip = {i} if denominator == "all" else {i, j}
        denom = sum(math.exp(t * dot(z[i], z[k])) for k in range(2 * b) if k not in skip)
        out.append(-t * dot(z[i], z[j]) + math.log(denom))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("denominator", ["negatives", "all"])
@pytest.mark.parametrize("t", [1.0, 8.0, 64.0])
def test_matches_brute_force_and_pml(t, denominator):
    g = torch.Generator().manual_seed(0)
    z1 = torch.randn(5, 4, generator=g, dtype=torch.float64)
    z2 = torch.randn(5, 4, generator=g, dtype=torch.float64)
    ref = brute_infonce(z1, z2, t, denominator)
    kw = {"denominator": denominator, "self_term": False}
    assert torch.allclose(infonce_loss(z1, z2, t, reduction="none", **kw), ref, atol=1e-10)
    assert torch.allclose(infonce_loss(z1, z2, t, **kw), ref.mean(), atol=1e-10)
    assert torch.allclose(InfoNCELoss(t, **kw).two_view(z1, z2), ref.mean(), atol=1e-8)
    if denominator == "all":
        pml = NTXentLoss(temperature=1.0 / t)(torch.cat([z1, z2]), two_view_labels(5))
        assert torch.allclose(pml, ref.mean(), atol=1e-8)


def test_default_is_the_url_denominator():
    g = torch.Generator().manual_seed(3)
    z1, z2 = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    assert InfoNCELoss().denominator == "negatives"
    assert torch.allclose(infonce_loss(z1, z2), infonce_loss(z1, z2, denominator="negatives"))
    # dropping the positive from the denominator lowers every anchor's loss
    assert bool(
        (
            infonce_loss(z1, z2, reduction="none", self_term=False)
            < infonce_loss(z1, z2, reduction="none", denominator="all")
        ).all()
    )


def _brute_mined(emb, tup, t, denominator):
    """Per mined positive pair: -t s_ap + log sum over the anchor's mined negatives."""
    z = torch.nn.functional.normalize(emb.double(), dim=1)
    a1, p, a2, n = tup
    out = []
    for a, q in zip(a1.tolist(), p.tolist()):
        negs = [k for aa, k in zip(a2.tolist(), n.tolist()) if aa == a]
        if not negs:
            out.append(0.0)
            continue
        terms = [math.exp(t * float(z[a] @ z[k])) for k in negs]
        if denominator == "all":
            terms.append(math.exp(t * float(z[a] @ z[q])))
        out.append(-t * float(z[a] @ z[q]) + math.log(sum(terms)))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("denominator", ["negatives", "all"])
def test_pml_contract_miner_and_ref_emb(denominator):
    from pytorch_metric_learning.miners import PairMarginMiner
    from pytorch_metric_learning.reducers import MeanReducer

    g = torch.Generator().manual_seed(1)
    emb = torch.randn(12, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (12,), generator=g)
    loss = InfoNCELoss(10.0, denominator=denominator, self_term=False, reducer=MeanReducer())
    tup = PairMarginMiner(pos_margin=0.0, neg_margin=0.0)(emb, labels)  # cosine: all pairs
    from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

    tup = lmu.convert_to_pairs(tup, labels)
    want = _brute_mined(emb, tup, 10.0, denominator).mean()
    assert torch.allclose(loss(emb, labels, tup), want, atol=1e-10)
    if denominator == "all":
        mined = BatchEasyHardMiner()(emb, labels)
        ref_loss = InfoNCELoss(10.0, denominator="all")
        assert torch.allclose(ref_loss(emb, labels, mined), NTXentLoss(0.1)(emb, labels, mined))
        ref = torch.randn(7, 6, generator=g, dtype=torch.float64)
        ref_labels = torch.randint(0, 3, (7,), generator=g)
        got = ref_loss(emb, labels, ref_emb=ref, ref_labels=ref_labels)
        want_ref = NTXentLoss(0.1)(emb, labels, ref_emb=ref, ref_labels=ref_labels)
        assert torch.allclose(got, want_ref)
        assert torch.isfinite(got)


def test_bad_input():
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match="inverse_temperature"):
        infonce_loss(z, z, 0.0)
    with pytest.raises(ValueError, match="same shape"):
        infonce_loss(z, z[:3])
    with pytest.raises(ValueError, match="z1"):
        infonce_loss(z[:1], z[:1])
    with pytest.raises(ValueError, match="z2"):
        infonce_loss(z, z.clone().fill_(float("nan")))
    with pytest.raises(ValueError, match="reduction"):
        infonce_loss(z, z, reduction="max")
    with pytest.raises(ValueError, match="denominator"):
        infonce_loss(z, z, denominator="positives")
    with pytest.raises(ValueError, match="denominator"):
        InfoNCELoss(denominator="none")
    with pytest.raises(ValueError, match="positives"):
        InfoNCELoss(positives="mean")
    with pytest.raises(TypeError, match="self_term"):
        infonce_loss(z, z, self_term="yes")


def test_gradient_flows_and_dtype_follows():
    z1 = torch.randn(4, 3, dtype=torch.float32, requires_grad=True)
    z2 = torch.randn(4, 3, dtype=torch.float32)
    loss = infonce_loss(z1, z2, 8.0)
    assert loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(z1.grad).all() and z1.grad.abs().sum() > 0


def url_code_infonce(features, target, t):
    """URL ``timm/loss/MCInfoNCE.py`` class ``InfoNCE.forward`` (mkirchhof/url 9a92555, lines
    68-91), transcribed in numpy: the masks with -1000 offsets leave the diagonal at logit 0."""
    f = features / np.linalg.norm(features, axis=1, keepdims=True)
    sim = f @ f.T * t
    mask = (target[:, None] == target[None, :]).astype(float)
    pos_mask = mask - np.eye(len(target))
    neg_mask = 1 - mask
    pos_add, neg_add = neg_mask * -1000, pos_mask * -1000

    def lse(x):
        m = x.max(-1, keepdims=True)
        return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]

    per_row = lse(sim * pos_mask + pos_add) - lse(sim * neg_mask + neg_add)
    return -per_row.mean()


@pytest.mark.parametrize("t", [1.0, 16.0])
def test_default_matches_the_url_code_two_views(t):
    g = torch.Generator().manual_seed(5)
    z1 = torch.randn(6, 5, generator=g, dtype=torch.float64)
    z2 = torch.randn(6, 5, generator=g, dtype=torch.float64)
    # the URL code interleaves the views: rows (x1_0, x2_0, x1_1, x2_1, ...)
    feats = torch.stack([z1, z2], 1).reshape(12, 5).numpy()
    want = url_code_infonce(feats, np.repeat(np.arange(6), 2), t)
    assert abs(float(infonce_loss(z1, z2, t)) - want) < 1e-10
    assert abs(float(InfoNCELoss(t).two_view(z1, z2)) - want) < 1e-10
    # the e^0 self term is not a rounding matter
    assert abs(float(infonce_loss(z1, z2, t, self_term=False)) - want) > 1e-3


def test_logsumexp_positives_match_the_url_code_with_labels():
    from pytorch_metric_learning.reducers import MeanReducer

    g = torch.Generator().manual_seed(6)
    emb = torch.randn(12, 5, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 1])  # every anchor has a positive
    want = url_code_infonce(emb.numpy(), labels.numpy(), 8.0)
    loss = InfoNCELoss(8.0, positives="logsumexp", reducer=MeanReducer())
    assert abs(float(loss(emb, labels)) - want) < 1e-10
    pairs = InfoNCELoss(8.0, reducer=MeanReducer())(emb, labels)
    assert abs(float(pairs) - want) > 1e-3


@pytest.mark.parametrize("denominator", ["negatives", "all"])
@pytest.mark.parametrize("self_term", [None, False, True])
def test_two_view_dense_path_equals_the_pair_based_path(denominator, self_term):
    """two_view's [2B, 2B] shortcut gives the value and gradient of PML's pair-based path."""
    g = torch.Generator().manual_seed(11)
    z1 = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    z2 = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    loss = InfoNCELoss(8.0, denominator=denominator, self_term=self_term)
    assert loss._dense_two_view()
    dense = loss.two_view(z1, z2)
    pairs = loss(torch.cat([z1, z2]), two_view_labels(7))
    assert torch.allclose(dense, pairs, atol=1e-12)
    g_dense = torch.autograd.grad(dense, (z1, z2))
    g_pairs = torch.autograd.grad(pairs, (z1, z2))
    for a, b in zip(g_dense, g_pairs):
        assert torch.allclose(a, b, atol=1e-12)


def test_two_view_keeps_the_pair_based_path_for_a_custom_reducer():
    from pytorch_metric_learning.reducers import SumReducer

    g = torch.Generator().manual_seed(12)
    z1, z2 = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    loss = InfoNCELoss(8.0, reducer=SumReducer())
    assert not loss._dense_two_view()
    want = InfoNCELoss(8.0)(torch.cat([z1, z2]), two_view_labels(6)) * 12
    assert torch.allclose(loss.two_view(z1, z2), want, rtol=1e-5)
