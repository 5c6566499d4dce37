import torch
from torch import nn

import bayesurl.methods as M

from ._vmf_checks import SMALL, check_bad_input, check_forward, check_loss_decreases

NAME = "infonce"


def test_registered_and_forward():
    assert NAME in M.available()
    check_forward(NAME)


def test_training_loss_decreases():
    check_loss_decreases(NAME)


def test_bad_input():
    check_bad_input(NAME)


def test_uncertainty_is_inverse_norm_and_loss_is_infonce():
    from bayesurl.losses.infonce import infonce_loss

    torch.manual_seed(0)
    m = M.create(NAME, embed_dim=8, backbone_kwargs=SMALL, inverse_temperature=20.0).eval()
    assert m.two_view and not m.supervised and not m.has_distribution
    x1, x2 = torch.randn(5, 1, 28, 28), torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        out = m(x1)
        assert torch.allclose(out.uncertainty, 1.0 / out.embedding.norm(dim=1))
        e = m.embed(torch.cat([x1, x2]))
        assert torch.allclose(
            m.training_loss(((x1, x2), None)), infonce_loss(e[:5], e[5:], 20.0), atol=1e-5
        )


def test_module_backbone():
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 12))
    backbone.num_features = 12
    m = M.create(NAME, backbone=backbone, embed_dim=None)
    assert m(torch.randn(3, 1, 28, 28)).embedding.shape == (3, 12)
