import math

import pytest
import torch
from pytorch_metric_learning.losses import NTXentLoss
from pytorch_metric_learning.miners import BatchEasyHardMiner

from bayesurl.losses.infonce import InfoNCELoss, infonce_loss, two_view_labels


def brute_infonce(z1, z2, t):
    """URL eq. 1 / SimCLR, one anchor at a time, from the formula."""
    z = [[c / math.sqrt(sum(c * c for c in v)) for c in v] for v in torch.cat([z1, z2]).tolist()]
    b = len(z1)
    out = []
    for i in range(2 * b):
        j = (i + b) % (2 * b)
        dot = lambda u, v: sum(x * y for x, y in zip(u, v))  # noqa: E731
        denom = sum(math.exp(t * dot(z[i], z[k])) for k in range(2 * b) if k != i)
        out.append(-t * dot(z[i], z[j]) + math.log(denom))
    return torch.tensor(out)


@pytest.mark.parametrize("t", [1.0, 8.0, 64.0])
def test_matches_brute_force_and_pml(t):
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    ref = brute_infonce(z1, z2, t)
    assert torch.allclose(infonce_loss(z1, z2, t, reduction="none"), ref, atol=1e-10)
    assert torch.allclose(infonce_loss(z1, z2, t), ref.mean(), atol=1e-10)
    assert torch.allclose(InfoNCELoss(t).two_view(z1, z2), ref.mean(), atol=1e-8)
    pml = NTXentLoss(temperature=1.0 / t)(torch.cat([z1, z2]), two_view_labels(5))
    assert torch.allclose(pml, ref.mean(), atol=1e-8)


def test_pml_contract_miner_and_ref_emb():
    g = torch.Generator().manual_seed(1)
    emb, labels = torch.randn(12, 6, generator=g), torch.randint(0, 3, (12,), generator=g)
    loss = InfoNCELoss(10.0)
    tup = BatchEasyHardMiner()(emb, labels)
    assert torch.allclose(loss(emb, labels, tup), NTXentLoss(0.1)(emb, labels, tup))
    ref = torch.randn(7, 6, generator=g)
    ref_labels = torch.randint(0, 3, (7,), generator=g)
    got = loss(emb, labels, ref_emb=ref, ref_labels=ref_labels)
    assert torch.allclose(got, NTXentLoss(0.1)(emb, labels, ref_emb=ref, ref_labels=ref_labels))
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


def test_gradient_flows_and_dtype_follows():
    z1 = torch.randn(4, 3, dtype=torch.float32, requires_grad=True)
    z2 = torch.randn(4, 3, dtype=torch.float32)
    loss = infonce_loss(z1, z2, 8.0)
    assert loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(z1.grad).all() and z1.grad.abs().sum() > 0
