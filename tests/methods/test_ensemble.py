"""Ensemble method (URL B.10): pooled predictive, entropy and JSD against brute-force loops."""

import math

import pytest
import scipy.stats
import torch

from bayesurl.methods.ensemble import Ensemble


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Flat(torch.nn.Module):
    num_features = 10

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 10)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def _brute_probs(m, x):
    e = m.net(x).detach()
    probs = []
    for k in range(m.heads.num_heads):
        w, b = m.heads.head(k)
        rows = []
        for n in range(x.shape[0]):
            z = [float(v) for v in (w @ e[n] + b).detach()]
            s = sum(math.exp(v) for v in z)
            rows.append([math.exp(v) / s for v in z])
        probs.append(rows)
    return torch.tensor(probs, dtype=torch.float64)  # [K, N, C]


@pytest.mark.parametrize("uncertainty", ["entropy", "jsd"])
def test_pooled_predictive_and_uncertainty_match_brute_force(uncertainty):
    torch.manual_seed(0)
    m = Ensemble(Flat(), embed_dim=5, num_classes=4, num_heads=3, uncertainty=uncertainty)
    m = m.double()
    x = torch.randn(6, 6, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    out = m(x)
    probs = _brute_probs(m, x)
    mean = probs.mean(0)
    torch.testing.assert_close(out.logits.exp().detach(), mean, rtol=1e-12, atol=1e-14)
    if uncertainty == "entropy":
        ref = scipy.stats.entropy(mean.numpy(), axis=-1)
    else:
        ref = scipy.stats.entropy(mean.numpy(), axis=-1) - scipy.stats.entropy(
            probs.numpy(), axis=-1
        ).mean(0)
    torch.testing.assert_close(out.uncertainty.detach(), torch.from_numpy(ref))
    loss = -sum(math.log(float(mean[n, y[n]])) for n in range(6)) / 6
    torch.testing.assert_close(m.training_loss((x, y)), torch.tensor(loss).double())


def test_jsd_is_zero_for_identical_heads():
    torch.manual_seed(1)
    m = Ensemble(Flat(), embed_dim=5, num_classes=3, num_heads=4, uncertainty="jsd").double()
    w, b = m.heads.head(0)
    with torch.no_grad():
        m.heads.linear.weight.copy_(w.repeat(4, 1))
        m.heads.linear.bias.copy_(b.repeat(4))
    out = m(torch.randn(5, 6, dtype=torch.float64))
    torch.testing.assert_close(out.uncertainty, torch.zeros(5, dtype=torch.float64))


def test_heads_start_different_and_all_get_gradients():
    torch.manual_seed(2)
    m = Ensemble(Flat(), embed_dim=5, num_classes=3)
    assert m.heads.num_heads == 10
    m.training_loss((torch.randn(8, 6), torch.arange(8) % 3)).backward()
    g = m.heads.linear.weight.grad.reshape(10, 3, 5)
    assert all(g[k].abs().sum() > 0 for k in range(10))
    w0, _ = m.heads.head(0)
    w1, _ = m.heads.head(1)
    assert not torch.allclose(w0, w1)
