import torch

import bayesurl.methods as M

from ._vmf_checks import (
    SMALL,
    check_bad_input,
    check_forward,
    check_loss_decreases,
    check_warm_kappa_moves,
)

NAME = "hib"


def test_registered_and_forward():
    assert NAME in M.available()
    check_forward(NAME)


def test_training_loss_decreases():
    check_loss_decreases(NAME)


def test_warm_kappa_moves():
    check_warm_kappa_moves(NAME)


def test_bad_input():
    check_bad_input(NAME)


def test_negative_term_option_and_loss_match():
    torch.manual_seed(0)
    x, y = torch.randn(6, 1, 28, 28), torch.tensor([0, 1, 2, 0, 1, 2])
    for term in ("log_p", "log1m_p"):
        m = M.create(
            NAME,
            embed_dim=8,
            backbone_kwargs=SMALL,
            negative_term=term,
            n_samples=3,
            warmup_u=None,
        ).eval()
        from bayesurl.losses.hib import HIBLoss

        with torch.no_grad():
            e, kappa = m.embed_with_kappa(x)
            m.loss_fn.generator = torch.Generator().manual_seed(1)
            got = m.training_loss((x, y))
            ref_loss = HIBLoss(16.0, -8.0, 3, term)
            ref_loss.generator = torch.Generator().manual_seed(1)
            assert torch.allclose(got, ref_loss(e, y, kappa=kappa), atol=1e-6)
    # labels need not be bounded without num_classes
    m = M.create(NAME, embed_dim=8, backbone_kwargs=SMALL, num_classes=None)
    assert torch.isfinite(m.training_loss((x, y * 100)))
