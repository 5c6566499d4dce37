"""The registered joint TaU-SimCLR method: contract, loss vs PML NT-Xent at s -> inf."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.losses import NTXentLoss
from torch import nn

from bayesurl.losses.tau import tau_simclr_loss
from bayesurl.methods import available, create
from bayesurl.methods.tau import TaU


class _MLP(nn.Module):
    num_features = 10

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(16, 10), nn.Tanh())

    def forward(self, x):
        return self.net(x)


def _batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 4, 4, generator=g)
    return ((x + 0.1 * torch.randn(x.shape, generator=g), x), torch.zeros(n, dtype=torch.long))


def test_registered_and_contract():
    assert "tau" in available()
    m = create("tau", backbone=_MLP(), embed_dim=5, scale=0.2)
    assert isinstance(m, TaU) and m.two_view and not m.supervised and not m.has_distribution
    out = m(torch.randn(3, 1, 4, 4))
    assert out.embedding.shape == (3, 5) and out.uncertainty.shape == (3,)
    t = create("tau", backbone=_MLP(), embed_dim=5, scale=0.2, uncertainty="temperature")
    assert bool((t(torch.randn(3, 1, 4, 4)).uncertainty > 0.2).all())  # tau > scale
    assert m.hparams["embed_dim"] == 5 and m.hparams["variant"] == "paper"


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_training_loss_is_tau_loss_of_the_split_outputs(variant):
    m = TaU(_MLP(), embed_dim=5, variant=variant).double()
    (x1, x2), y = _batch()
    x1, x2 = x1.double(), x2.double()
    o1, o2 = m.net(x1), m.net(x2)
    want = tau_simclr_loss(o1[:, :5], o2[:, :5], o1[:, 5], o2[:, 5], variant=variant)
    assert torch.allclose(m.training_loss(((x1, x2), y)), want, rtol=1e-12)


def test_large_s_is_simclr_at_tau_equal_scale():
    m = TaU(_MLP(), embed_dim=5, scale=0.1).double()
    with torch.no_grad():  # the temperature output is a constant 1e4
        m.net.proj.weight[5].zero_()
        m.net.proj.bias[5] = 1e4
    (x1, x2), y = _batch()
    x1, x2 = x1.double(), x2.double()
    loss = m.training_loss(((x1, x2), y))
    z = torch.cat([m.net(x1)[:, :5], m.net(x2)[:, :5]])
    want = NTXentLoss(temperature=0.1)(z, torch.cat([torch.arange(8)] * 2))
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-10)


def test_a_few_steps_reduce_the_loss_and_reach_the_backbone():
    torch.manual_seed(0)
    m = TaU(_MLP(), embed_dim=4)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    batch = _batch(16)
    first = float(m.training_loss(batch).detach())
    for _ in range(30):
        opt.zero_grad()
        loss = m.training_loss(batch)
        loss.backward()
        opt.step()
    assert float(loss.detach()) < first
    assert m.net.backbone.net[1].weight.grad.abs().sum() > 0


def test_bad_input():
    m = TaU(_MLP(), embed_dim=4)
    with pytest.raises(ValueError, match="two views"):
        m.training_loss((torch.randn(4, 1, 4, 4), torch.zeros(4)))
    with pytest.raises(ValueError, match="no embedding distribution"):
        m(torch.randn(2, 1, 4, 4), n_samples=3)
    with pytest.raises(ValueError, match="scale"):
        TaU(_MLP(), scale=0.0)
    with pytest.raises(ValueError, match="variant"):
        TaU(_MLP(), variant="x")
    with pytest.raises(ValueError, match="embed_dim"):
        TaU(_MLP(), embed_dim=0)


def test_uncertainty_options_rank_alike_and_log_temperature_breaks_float32_ties():
    """u = log(tau / 0.1) (default) vs u = tau = 0.1 (1 + e^-s) vs u = -s: same order, and
    the default matches an independent float64 log of the temperature."""
    import math

    m = TaU(_MLP(), embed_dim=5, scale=0.1)
    assert m.uncertainty == "log_temperature" and m.hparams["uncertainty"] == "log_temperature"
    t = TaU(_MLP(), embed_dim=5, scale=0.1, uncertainty="temperature")
    g = TaU(_MLP(), embed_dim=5, scale=0.1, uncertainty="logit")
    t.load_state_dict(m.state_dict())
    g.load_state_dict(m.state_dict())
    x = _batch(n=16)[0][0]
    u_log, u_tau, u_logit = m(x).uncertainty, t(x).uncertainty, g(x).uncertainty
    s = m.encode(x)[1]
    torch.testing.assert_close(u_logit, -s)
    want = [0.1 * (1 + math.exp(-v)) for v in s.tolist()]
    assert torch.allclose(u_tau.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6)
    want_log = [math.log(w / 0.1) for w in want]
    assert torch.allclose(u_log.double(), torch.tensor(want_log, dtype=torch.float64), rtol=1e-5)
    assert bool((u_log >= 0).all())
    assert torch.equal(torch.argsort(u_log), torch.argsort(u_tau))
    assert torch.equal(torch.argsort(u_logit), torch.argsort(u_tau))
    with torch.no_grad():  # s = 17, 18, 19: tau ties at 0.1 in float32, -s does not
        m.net.proj.weight[5].zero_()
        t.net.proj.weight[5].zero_()
    big = torch.tensor([17.0, 18.0, 19.0, 60.0])
    assert len(set((0.1 * (1.0 + torch.exp(-big))).tolist())) == 1
    from bayesurl.heads.temperature import log_temperature_ratio

    assert len(set(log_temperature_ratio(big).tolist())) == 4
    assert len(set((-big).tolist())) == 4
    with pytest.raises(ValueError, match="uncertainty"):
        TaU(_MLP(), embed_dim=5, uncertainty="tau")
