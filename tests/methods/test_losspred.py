"""Losspred method (URL B.9, eq. 8): loss vs brute force from its parts; u is the predictor;
stop-gradient option; warm-up on the first training batch."""

import math

import pytest
import torch

from bayesurl.methods.losspred import Losspred


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


def test_loss_matches_brute_force_and_u_is_the_prediction():
    torch.manual_seed(0)
    m = Losspred(Flat(), embed_dim=5, num_classes=3, lam=0.3).double()
    x = torch.randn(7, 6, dtype=torch.float64)
    y = torch.arange(7) % 3
    out = m(x)
    torch.testing.assert_close(out.uncertainty, m.predictor(out.embedding))
    assert bool((out.uncertainty > 0).all())
    ce_sum, sq_sum = 0.0, 0.0
    for i in range(7):
        z = [float(v) for v in out.logits[i].detach()]
        ce = math.log(sum(math.exp(v) for v in z)) - z[int(y[i])]
        ce_sum += ce
        sq_sum += (float(out.uncertainty[i].detach()) - ce) ** 2
    ref = ce_sum / 7 + 0.3 * sq_sum / 7
    torch.testing.assert_close(m.training_loss((x, y)), torch.tensor(ref).double())


@pytest.mark.parametrize("detach_input", [False, True])
def test_predictor_gradient_reaches_backbone_only_without_detach(detach_input):
    torch.manual_seed(1)
    m = Losspred(Flat(), embed_dim=5, num_classes=3, lam=1.0, detach_input=detach_input)
    x = torch.randn(6, 6)
    u = m(x).uncertainty
    (g,) = torch.autograd.grad(u.sum(), m.net.proj.weight, allow_unused=True)
    if detach_input:
        assert g is None
    else:
        assert g is not None and g.abs().sum() > 0


def test_warmup_on_first_training_batch():
    torch.manual_seed(2)
    m = Losspred(Flat(), embed_dim=5, num_classes=3, warmup_u=1e-3)
    x, y = torch.randn(16, 6), torch.arange(16) % 3
    m.train()
    m.training_loss((x, y))
    assert bool(m.predictor.warmed_up)
    torch.testing.assert_close(m(x).uncertainty.mean(), torch.tensor(1e-3), rtol=1e-3, atol=0)
    assert m.hparams["warmup_u"] == 1e-3


def test_bad_lambda():
    with pytest.raises(ValueError, match="lam"):
        Losspred(Flat(), num_classes=3, lam=-0.1)
