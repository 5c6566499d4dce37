"""ContrastiveLoss against a brute-force loop over pairs (float64)."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.miners import PairMarginMiner
from pytorch_metric_learning.reducers import SumReducer

from bayesurl.losses.contrastive import ContrastiveLoss


def _loop(emb, labels, margin, pairs=None):
    u = torch.nn.functional.normalize(emb, dim=1)
    total = 0.0
    n = len(labels)
    if pairs is None:
        pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    for i, j in pairs:
        d = float((u[i] - u[j]).norm())
        if labels[i] == labels[j]:
            total += 0.5 * d**2
        else:
            total += 0.5 * max(0.0, margin - d) ** 2
    return total


@pytest.mark.parametrize("margin", [0.3, 1.0, 1.7])
def test_sum_matches_loop(margin):
    torch.manual_seed(0)
    emb = torch.randn(10, 5, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 3])
    loss = ContrastiveLoss(margin=margin, reducer=SumReducer())
    assert float(loss(emb, labels)) == pytest.approx(_loop(emb, labels, margin), rel=1e-10)


def test_indices_tuple_restricts_pairs():
    torch.manual_seed(1)
    emb = torch.randn(8, 3, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    tup = (torch.tensor([0, 2]), torch.tensor([1, 3]), torch.tensor([0, 4]), torch.tensor([2, 7]))
    loss = ContrastiveLoss(margin=1.5, reducer=SumReducer())
    pairs = [(0, 1), (2, 3), (0, 2), (4, 7)]
    want = _loop(emb, labels, 1.5, pairs)
    assert float(loss(emb, labels, tup)) == pytest.approx(want, rel=1e-10)
    mined = PairMarginMiner(pos_margin=0.0, neg_margin=1.5)(emb, labels)
    assert float(loss(emb, labels, mined)) == pytest.approx(_loop(emb, labels, 1.5), rel=1e-10)


def test_differs_from_pml_contrastive():
    from pytorch_metric_learning.losses import ContrastiveLoss as PML

    torch.manual_seed(2)
    emb = torch.randn(6, 3, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    ours = ContrastiveLoss(margin=1.0, reducer=SumReducer())(emb, labels)
    pml = PML(pos_margin=0, neg_margin=1.0, reducer=SumReducer())(emb, labels)
    assert not torch.isclose(ours, pml)


def test_gradient_flows_and_bad_margin():
    emb = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    ContrastiveLoss(margin=0.5)(emb, torch.tensor([0, 0, 1, 1, 2, 2])).backward()
    assert emb.grad is not None and torch.isfinite(emb.grad).all()
    with pytest.raises(ValueError, match="margin"):
        ContrastiveLoss(margin=0.0)
