"""LAM eq. 1 methods: ``contrastive`` and ``contrastive_mcdropout``; block dropout.

References: LAM eq. 1 written as a Python loop over the pairs (float64), numpy's Sra formula
for ``1 / kappa_hat``, and the block structure of the dropout masks read off an identity
layer.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import bayesurl.methods as methods
from bayesurl.backbones import LamConvNet, build_backbone
from bayesurl.heads.dropout import block_dropout_linear


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _data(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4
    x = torch.randn(n, 1, 28, 28, generator=g) * 0.5 + y.view(-1, 1, 1, 1).float()
    return x, y


def _eq1_loop(e: torch.Tensor, y: torch.Tensor, margin: float) -> float:
    """LAM eq. 1 averaged over the pairs with a non-zero loss, positives and negatives
    separately (the reducer of the loss), written out pair by pair."""
    u = [[c / math.sqrt(sum(a * a for a in v)) for c in v] for v in e.double().tolist()]
    pos, neg = [], []
    for i in range(len(u)):
        for j in range(len(u)):
            if i == j:
                continue
            d = math.sqrt(sum((a - b) ** 2 for a, b in zip(u[i], u[j], strict=True)))
            if int(y[i]) == int(y[j]) and d > 0:
                pos.append(0.5 * d * d)
            elif int(y[i]) != int(y[j]) and d < margin:
                neg.append(0.5 * (margin - d) ** 2)
    return (sum(pos) / len(pos) if pos else 0.0) + (sum(neg) / len(neg) if neg else 0.0)


def test_contrastive_loss_is_eq1_over_the_loss_pairs():
    torch.manual_seed(0)
    m = methods.create("contrastive", backbone="lam_convnet", embed_dim=3, margin=0.7).double()
    x, y = _data()
    loss = m.training_loss((x.double(), y))
    with torch.no_grad():
        e = m.net(x.double())
    assert float(loss.detach()) == pytest.approx(_eq1_loop(e, y, 0.7), rel=1e-9)


def test_contrastive_output_is_the_unit_embedding_and_inverse_norm():
    torch.manual_seed(0)
    m = methods.create("contrastive", backbone="lam_convnet", embed_dim=3).double().eval()
    x, _ = _data(5)
    out = m(x.double())
    e = m.net(x.double()).detach().numpy()
    norm = np.linalg.norm(e, axis=1)
    np.testing.assert_allclose(out.embedding.detach().numpy(), e / norm[:, None], rtol=1e-12)
    np.testing.assert_allclose(out.uncertainty.detach().numpy(), 1.0 / norm, rtol=1e-12)
    assert out.samples is None and not m.has_distribution


def test_block_dropout_keeps_or_drops_whole_blocks_at_rate_p():
    torch.manual_seed(0)
    n, f, groups, p = 50, 12, 4, 0.3
    h = torch.rand(n, f, dtype=torch.float64) + 0.5  # no zero features
    eye = nn.Linear(f, f, bias=False).double()
    with torch.no_grad():
        eye.weight.copy_(torch.eye(f, dtype=torch.float64))
    z = block_dropout_linear(h, eye, p, groups, 200)  # [S, N, F] = dropped h / (1 - p)
    blocks = (z * (1 - p) / h).reshape(200, n, groups, f // groups)
    kept = blocks[..., 0]
    # within a block every feature shares the decision; a decision is 0 or 1
    assert torch.allclose(blocks, kept[..., None].expand_as(blocks), atol=1e-12)
    assert torch.all((kept.abs() < 1e-12) | ((kept - 1).abs() < 1e-12))
    rate = float(1 - kept.mean())
    sd = math.sqrt(p * (1 - p) / kept.numel())
    assert abs(rate - p) < 5 * sd
    # p = 0: every draw is the layer itself
    lin = nn.Linear(f, 3).double()
    np.testing.assert_allclose(
        block_dropout_linear(h, lin, 0.0, groups, 3).detach().numpy(),
        np.broadcast_to(lin(h).detach().numpy(), (3, n, 3)),
        rtol=1e-12,
    )


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"groups": 5}, "groups"), ({"p": 1.0}, "`p`"), ({"n_draws": 0}, "n_draws")],
)
def test_block_dropout_bad_input(kwargs, needle):
    args = {"p": 0.1, "groups": 4, "n_draws": 2, **kwargs}
    with pytest.raises(ValueError, match=needle):
        block_dropout_linear(torch.ones(2, 12), nn.Linear(12, 3), **args)


def test_mcdropout_u_is_sra_of_its_passes_and_samples_are_unit():
    torch.manual_seed(0)
    m = methods.create(
        "contrastive_mcdropout", backbone="lam_convnet", embed_dim=3, p=0.2, n_passes=16
    ).double()
    assert m.groups == 64 and m.has_distribution  # LamConvNet's channels
    x, _ = _data(6)
    torch.manual_seed(1)
    out = m(x.double(), n_samples=16)
    # the same seed, the passes drawn again: u from numpy's Sra formula on them
    torch.manual_seed(1)
    passes = m._draws(m.net.features(x.double()), 16).detach().numpy()
    r = np.linalg.norm(passes.mean(axis=0), axis=1)
    d = passes.shape[-1]
    np.testing.assert_allclose(
        out.uncertainty.detach().numpy(), (1 - r**2) / (r * (d - r**2)), rtol=1e-9
    )
    mean = passes.mean(axis=0)
    np.testing.assert_allclose(
        out.embedding.detach().numpy(), mean / np.linalg.norm(mean, axis=1)[:, None], rtol=1e-9
    )
    assert out.samples.shape == (16, 6, 3)
    np.testing.assert_allclose(out.samples.norm(dim=-1).detach().numpy(), 1.0, rtol=1e-12)


def test_mcdropout_training_loss_decreases():
    torch.manual_seed(0)
    m = methods.create("contrastive_mcdropout", backbone="lam_convnet", embed_dim=3, margin=0.7)
    x, y = _data()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = m.training_loss((x, y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"embed_dim": None}, "embed_dim"),
        ({"dropout_groups": 7}, "dropout_groups"),
        ({"p": 0.0}, "`p`"),
        ({"n_passes": 1}, "n_passes"),
    ],
)
def test_mcdropout_bad_options_name_the_argument(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        methods.create(
            "contrastive_mcdropout", backbone="lam_convnet", **{"embed_dim": 3, **kwargs}
        )


def test_lam_convnet_features_are_the_channel_maps_flattened():
    net = LamConvNet()
    x = torch.randn(2, 1, 28, 28)
    maps = net.features[:-1](x)  # before the flatten: [N, 64, 5, 5]
    assert maps.shape == (2, 64, 5, 5)
    assert torch.equal(net(x), maps.reshape(2, -1))
    module, dim = build_backbone("lam_convnet", in_chans=3)
    assert dim == 1600 and module.features[0].in_channels == 3
