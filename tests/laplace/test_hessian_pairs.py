"""Which pairs enter LAM's Hessian: ``hessian_miner`` x ``hessian_pairs`` against an autograd
Hessian over the tuples of PML's own miners (float64)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pytorch_metric_learning.miners import (
    BatchEasyHardMiner,
    PairMarginMiner,
    TripletMarginMiner,
)
from torch import nn
from torch.func import hessian

from bayesurl.laplace import HessianMiner, HessianPairs, MetricLaplace, split_pairs
from bayesurl.laplace.metric import MAX_TRIPLETS
from bayesurl.posthoc import wrap

MARGIN = 0.1  # between the hardest negatives' distances: some inside, some outside


def _case():
    """Three classes on a circle-ish layout: some hardest negatives inside the margin, some
    outside, several positives per anchor (so the miners disagree)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    g = torch.Generator().manual_seed(1)
    y = torch.arange(12) % 3
    centres = torch.tensor([[2.0, 0, 0], [0, 2.0, 0], [1.4, 1.4, 0.3]], dtype=torch.float64)
    x = centres[y] + 0.6 * torch.randn(12, 3, generator=g, dtype=torch.float64)
    return net, x, y


PML_MINERS = {
    "hard": lambda: BatchEasyHardMiner(pos_strategy="hard", neg_strategy="hard"),
    "loss_pairs": lambda: PairMarginMiner(pos_margin=0.0, neg_margin=MARGIN),
    "triplets": lambda: TripletMarginMiner(margin=MARGIN, type_of_triplets="all"),
}


def _autograd_hessian(net, x, tup, inside_only: bool) -> torch.Tensor:
    """Diagonal of the autograd Hessian in the last layer's parameters of
    ``sum_pos (1 - cos) - sum_neg (1 - cos)`` over the tuple's pairs (negatives outside the
    margin left out when ``inside_only``). The layer is linear in its parameters, so this
    Hessian is the contrastive GGN of LAM eq. 6 with the arccos geometry and no
    approximation (``full``)."""
    body, last = net[:-1], net[-1]
    with torch.no_grad():
        phi = body(x)
        u = nn.functional.normalize(last(phi), dim=1)
    a1, p, a2, n = split_pairs(tup, len(x))
    keep = torch.ones(len(a2), dtype=torch.bool)
    if inside_only:
        keep = (u[a2] - u[n]).norm(dim=1) < MARGIN
    a2, n = a2[keep], n[keep]
    d, f = last.out_features, last.in_features
    theta = torch.cat([last.weight.reshape(-1), last.bias]).detach()

    def loss(t):
        z = phi @ t[: d * f].reshape(d, f).T + t[d * f :]
        cos = nn.functional.cosine_similarity
        return (1 - cos(z[a1], z[p])).sum() - (1 - cos(z[a2], z[n])).sum()

    return torch.diagonal(hessian(loss)(theta))


@pytest.mark.parametrize("miner", [m.value for m in HessianMiner])
@pytest.mark.parametrize("pairs", [p.value for p in HessianPairs])
def test_pair_set_hessian_matches_autograd(miner, pairs):
    net, x, y = _case()
    la = MetricLaplace(net, approximation="full", geometry="arccos", margin=MARGIN,
                       hessian_miner=miner, hessian_pairs=pairs)  # fmt: skip
    la.fit([(x, y)], progress=False)
    with torch.no_grad():
        u = nn.functional.normalize(net(x), dim=1)
    tup = PML_MINERS[miner]()(u, y)
    want = _autograd_hessian(net, x, tup, inside_only=pairs == "inside_margin")
    torch.testing.assert_close(la.hessian, want, rtol=1e-9, atol=1e-10)


def test_the_pair_sets_differ_on_this_case():
    """The crafted case is one where the choice matters: every pair set gives another H."""
    net, x, y = _case()
    hs = {}
    for miner in HessianMiner:
        for pairs in HessianPairs:
            la = MetricLaplace(net, approximation="fixed", margin=MARGIN, hessian_miner=miner,
                               hessian_pairs=pairs)  # fmt: skip
            hs[miner.value, pairs.value] = la.fit([(x, y)], progress=False).hessian
    # loss_pairs mines no negative outside the margin: hessian_pairs cannot change it
    torch.testing.assert_close(hs["loss_pairs", "inside_margin"], hs["loss_pairs", "all_mined"])
    del hs["loss_pairs", "all_mined"]
    keys = list(hs)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert not torch.allclose(hs[a], hs[b]), (a, b)


def test_triplets_are_capped_at_the_lam_codes_max_pairs():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3)).double()
    y = torch.arange(80) % 2  # 80 x 39 x 40 triplets before the margin test
    x = torch.randn(80, 4, dtype=torch.float64)
    la = MetricLaplace(net, approximation="positive", margin=10.0, hessian_miner="triplets",
                       hessian_pairs="all_mined")  # fmt: skip
    la.fit([(x, y)], progress=False)
    assert la.n_pairs == MAX_TRIPLETS  # positive: one (a, p) pair per kept triplet
    again = MetricLaplace(net, approximation="positive", margin=10.0, hessian_miner="triplets")
    torch.testing.assert_close(again.fit([(x, y)], progress=False).hessian, la.hessian)


def test_hessian_miner_bad_value_and_state_round_trip():
    net, x, y = _case()
    with pytest.raises(ValueError, match="hessian_miner"):
        MetricLaplace(net, hessian_miner="all")
    la = MetricLaplace(net, margin=MARGIN, hessian_miner="loss_pairs", hessian_pairs="all_mined")
    la.fit([(x, y)], progress=False)
    other = MetricLaplace(net)
    other.load_state_dict(la.state_dict())
    assert other.hessian_miner is HessianMiner.LOSS_PAIRS
    assert other.hessian_pairs is HessianPairs.ALL_MINED
    old = {k: v for k, v in la.state_dict().items() if k != "hessian_miner"}
    other.load_state_dict(old)  # a state saved before the option existed: the hard miner
    assert other.hessian_miner is HessianMiner.HARD


def test_wrapper_passes_the_pair_set_and_saves_it(tmp_path):
    net, x, y = _case()
    w = wrap(net, "laplace", approximation="fixed", geometry="arccos", margin=MARGIN,
             hessian_miner="triplets", hessian_pairs="all_mined")  # fmt: skip
    w.fit([(x, y)], progress=False)
    assert w.la.hessian_miner is HessianMiner.TRIPLETS
    direct = MetricLaplace(net, margin=MARGIN, hessian_miner="triplets", hessian_pairs="all_mined")
    torch.testing.assert_close(w.la.hessian, direct.fit([(x, y)], progress=False).hessian)
    w.save(tmp_path / "w.pt")
    from bayesurl.posthoc import load

    back = load(tmp_path / "w.pt", net)
    assert back.la.hessian_miner is HessianMiner.TRIPLETS
    assert back.la.hessian_pairs is HessianPairs.ALL_MINED


def test_the_default_is_the_one_the_docs_name():
    """MetricLaplace mines the LAM code's triplets and keeps every one (measured best on most
    of four roads); the post-hoc wrapper keeps the hard pairs it was measured with on the
    folder road. The docs page states both."""
    net, x, y = _case()
    la = MetricLaplace(net)
    assert la.hessian_miner is HessianMiner.TRIPLETS
    assert la.hessian_pairs is HessianPairs.ALL_MINED
    online = MetricLaplace(net, mode="online", dataset_size=12)
    assert online.hessian_miner is HessianMiner.TRIPLETS
    w = wrap(net, "laplace")
    assert w.la.hessian_miner is HessianMiner.HARD
    assert w.la.hessian_pairs is HessianPairs.INSIDE_MARGIN
    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "laplace.rst").read_text()
    text = " ".join(page.split())
    assert 'default is ``hessian_miner="triplets"``, ``hessian_pairs="all_mined"``' in text
    assert '``wrap(encoder, "laplace")`` keeps ``hessian_miner="hard"``' in text
