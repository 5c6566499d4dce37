"""CE method (URL B.1) against a brute-force float64 cross-entropy and scipy's entropy."""

import math

import pytest
import scipy.stats
import torch

from bayesurl.methods.ce import CE


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Flat(torch.nn.Module):
    """A BatchNorm-free backbone, deterministic in train and eval mode."""

    num_features = 10

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 10)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def test_loss_and_uncertainty_match_brute_force():
    torch.manual_seed(0)
    m = CE(backbone=Flat(), embed_dim=5, num_classes=4).double()
    x = torch.randn(7, 6, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    out = m(x)
    e = m.net.proj(torch.tanh(m.net.backbone.lin(x)))
    torch.testing.assert_close(out.embedding, e)
    ref = 0.0
    for i in range(7):
        z = [float(v) for v in (m.classifier.weight @ e[i] + m.classifier.bias).detach()]
        ref -= z[int(y[i])] - math.log(sum(math.exp(v) for v in z))
    torch.testing.assert_close(m.training_loss((x, y)), torch.tensor(ref / 7).double())
    probs = torch.softmax(out.logits, -1).detach().numpy()
    torch.testing.assert_close(
        out.uncertainty.detach(), torch.from_numpy(scipy.stats.entropy(probs, axis=-1))
    )
    assert out.samples is None and m(x, n_samples=4).samples is None


def test_dtype_follows_module_and_gradients_reach_backbone():
    m = CE(backbone=Flat(), embed_dim=None, num_classes=3)
    loss = m.training_loss((torch.randn(4, 6), torch.tensor([0, 1, 2, 0])))
    loss.backward()
    assert m.net.backbone.lin.weight.grad.abs().sum() > 0
    assert m(torch.randn(2, 6)).embedding.dtype == torch.float32
