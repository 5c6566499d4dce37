"""HET-XL method: zero covariance equals CE (float64), log det u, samples, temperature."""

import pytest
import torch

from bayesurl.methods.ce import CE
from bayesurl.methods.hetxl import HetXL


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


def _pair():
    torch.manual_seed(0)
    het = HetXL(backbone=Flat(), embed_dim=5, num_classes=4, n_mc=8).double()
    head = het.head
    head.min_scale = 0.0
    with torch.no_grad():
        head.cov_factor.weight.zero_()
        head.cov_factor.bias.zero_()
        head.diag_std.weight.zero_()
        head.diag_std.bias.fill_(-1000.0)  # softplus(-1000) == 0 exactly in float64
    ce = CE(backbone=Flat(), embed_dim=5, num_classes=4).double()
    ce.net.load_state_dict(het.net.state_dict())
    ce.classifier.load_state_dict(head.classifier.state_dict())
    return het, ce


def test_zero_covariance_equals_ce():
    het, ce = _pair()
    x = torch.randn(9, 6, dtype=torch.float64)
    y = torch.randint(0, 4, (9,))
    torch.testing.assert_close(
        het.training_loss((x, y)), ce.training_loss((x, y)), rtol=1e-12, atol=1e-12
    )
    a, b = het(x), ce(x)
    torch.testing.assert_close(a.embedding, b.embedding)
    torch.testing.assert_close(a.logits, torch.log_softmax(b.logits, -1))
    torch.testing.assert_close(a.uncertainty, b.uncertainty)
    # and the gradients of the shared parameters agree
    het.training_loss((x, y)).backward()
    ce.training_loss((x, y)).backward()
    torch.testing.assert_close(het.net.proj.weight.grad, ce.net.proj.weight.grad)


def test_logdet_uncertainty_matches_dense_covariance():
    torch.manual_seed(1)
    m = HetXL(backbone=Flat(), embed_dim=5, num_classes=3, rank=2, uncertainty="logdet").double()
    x = torch.randn(4, 6, dtype=torch.float64)
    out = m(x, n_samples=6)
    dense = m.head.distribution(out.embedding).covariance_matrix
    torch.testing.assert_close(out.uncertainty, torch.logdet(dense))
    assert out.samples.shape == (6, 4, 5)


def test_temperature_is_learned():
    torch.manual_seed(2)
    m = HetXL(backbone=Flat(), embed_dim=5, num_classes=3)
    x, y = torch.randn(8, 6), torch.arange(8) % 3
    m.training_loss((x, y)).backward()
    assert m.head.log_temperature.grad is not None and m.head.log_temperature.grad != 0
    torch.testing.assert_close(m.temperature, torch.tensor(1.0))


def test_bad_uncertainty_name():
    with pytest.raises(ValueError, match="uncertainty"):
        HetXL(backbone=Flat(), num_classes=3, uncertainty="det")
