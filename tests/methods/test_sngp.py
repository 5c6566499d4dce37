"""SNGP method: epoch hooks accumulate / reset / invert the precision; mean-field u."""

import math

import pytest
import torch

from bayesurl.methods.sngp import SNGP


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


def _sngp(**kw):
    torch.manual_seed(0)
    kw = {"spectral_norm": "none", "num_random_features": 32, **kw}
    return SNGP(backbone=Flat(), embed_dim=5, num_classes=3, **kw).double()


def _batches():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(n, 6, generator=g, dtype=torch.float64), torch.arange(n) % 3) for n in (4, 6)
    ]


def test_epoch_accumulates_brute_force_precision_and_mean_field_u():
    m = _sngp(ridge=1.0)
    m.train()
    m.on_epoch_start(0)
    ref = torch.eye(32, dtype=torch.float64)
    for x, y in _batches():
        m.training_loss((x, y))
        phi = m.gp.random_features(m.net(x)).detach()
        for i in range(phi.shape[0]):
            ref += torch.outer(phi[i], phi[i])
    torch.testing.assert_close(m.gp.precision, ref, rtol=1e-12, atol=1e-12)
    m.on_epoch_end(0)
    m.eval()
    x = torch.randn(5, 6, dtype=torch.float64)
    out = m(x)
    sigma = torch.linalg.inv(ref)
    phi = m.gp.random_features(m.net(x)).detach()
    for i in range(5):
        var = float(phi[i] @ sigma @ phi[i])
        logits = m.gp.beta.weight @ phi[i] + m.gp.beta.bias
        mf = logits / math.sqrt(1 + var)  # the URL code's mean-field factor 1
        torch.testing.assert_close(out.logits[i], mf)
        p = torch.softmax(mf, -1)
        torch.testing.assert_close(out.uncertainty[i], -(p * p.log()).sum())
    # the next epoch starts from the prior again
    m.on_epoch_start(1)
    torch.testing.assert_close(m.gp.precision, torch.eye(32, dtype=torch.float64))


def test_eval_mode_does_not_accumulate():
    m = _sngp()
    m.on_epoch_start(0)
    m.eval()
    x, y = _batches()[0]
    m.training_loss((x, y))
    torch.testing.assert_close(m.gp.precision, torch.eye(32, dtype=torch.float64))
    assert int(m.gp.n_accumulated) == 0


def test_uncertainty_grows_away_from_the_training_data():
    torch.manual_seed(3)
    m = SNGP(
        backbone=Flat(), embed_dim=5, num_classes=3, spectral_norm="none", layer_norm=False
    ).double()
    m.train()
    m.on_epoch_start(0)
    x = torch.randn(200, 6, dtype=torch.float64) * 0.1
    m.training_loss((x, torch.arange(200) % 3))
    m.on_epoch_end(0)
    m.eval()
    with torch.no_grad():
        var_in = m.gp(m.net(x[:20])).variance
        var_out = m.gp(m.net(torch.randn(20, 6, dtype=torch.float64) * 3 + 5)).variance
    assert float(var_out.mean()) > 3 * float(var_in.mean())


def test_spectral_norm_options():
    torch.manual_seed(0)
    m = SNGP(embed_dim=8, num_classes=3, backbone_kwargs={"num_features": 12, "width": 4})
    assert sum(1 for mod in m.net.modules() if hasattr(mod, "parametrizations")) == 5
    p = SNGP(
        embed_dim=8,
        num_classes=3,
        spectral_norm="projection",
        backbone_kwargs={"num_features": 12, "width": 4},
    )
    assert [n for n, mod in p.net.named_modules() if hasattr(mod, "parametrizations")] == ["proj"]
    with pytest.raises(ValueError, match="spectral_norm"):
        SNGP(num_classes=3, spectral_norm="some")


def test_a_recipes_none_spectral_norm_is_no_spectral_norm():
    """``imagenet_vit.toml`` says ``spectral_norm = "none"``, which the recipe road reads as
    ``None``: SNGP builds it as "none" (no parametrized layer), the same weights as "none"."""
    from bayesurl.runs import load_recipe

    kwargs = load_recipe("imagenet_vit/sngp").estimator.kwargs
    assert kwargs["spectral_norm"] is None
    small = {"embed_dim": 8, "num_classes": 3, "backbone_kwargs": {"num_features": 12, "width": 4}}
    torch.manual_seed(0)
    m = SNGP(spectral_norm=kwargs["spectral_norm"], **small)
    torch.manual_seed(0)
    ref = SNGP(spectral_norm="none", **small)
    assert not any(hasattr(mod, "parametrizations") for mod in m.net.modules())
    assert m.hparams["spectral_norm"] == "none"
    for (k, a), (_, b) in zip(m.state_dict().items(), ref.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
