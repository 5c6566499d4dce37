import torch
from torch import nn

import bayesurl.methods as M

from ._vmf_checks import (
    SMALL,
    check_bad_input,
    check_forward,
    check_loss_decreases,
    check_warm_kappa_moves,
)

NAME = "mcinfonce"


def test_registered_and_forward():
    assert NAME in M.available()
    check_forward(NAME)


def test_training_loss_decreases():
    check_loss_decreases(NAME)


def test_warm_kappa_moves():
    check_warm_kappa_moves(NAME)


def test_bad_input():
    check_bad_input(NAME)


def test_module_backbone_and_options():
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 24))
    m = M.create(
        NAME,
        backbone=backbone,
        embed_dim=8,
        backbone_kwargs={"probe_input": torch.zeros(1, 1, 28, 28)},
        n_samples=4,
        divide_positive=True,
        inverse_temperature=10.0,
    )
    assert m.two_view and not m.supervised and m.has_distribution
    assert m.hparams["backbone"] == "<module Sequential>"
    assert "probe_input" not in m.hparams["backbone_kwargs"]
    x = torch.randn(4, 1, 28, 28)
    loss = m.training_loss(((x, x.flip(-1)), None))
    assert torch.isfinite(loss)
    # divide_positive: loss may go below 0 (down to -log M); the reference variant cannot
    assert m.loss_fn.divide_positive
    out = m.eval()(x, n_samples=2)
    assert out.samples.shape == (2, 4, 8)


def test_loss_equals_functional_core_on_method_outputs():
    torch.manual_seed(1)
    m = M.create(NAME, embed_dim=8, backbone_kwargs=SMALL, n_samples=3, warmup_u=None).eval()
    x1, x2 = torch.randn(4, 1, 28, 28), torch.randn(4, 1, 28, 28)
    from bayesurl.losses.mcinfonce import mcinfonce_loss

    with torch.no_grad():
        e, kappa = m.embed_with_kappa(torch.cat([x1, x2]))
        m.loss_fn.generator = torch.Generator().manual_seed(5)
        got = m.training_loss(((x1, x2), None))
        ref = mcinfonce_loss(
            e[:4],
            kappa[:4],
            e[4:],
            kappa[4:],
            n_samples=3,
            kappa_pos_scale=16.0,
            generator=torch.Generator().manual_seed(5),
        )
    assert torch.allclose(got, ref, atol=1e-6)
