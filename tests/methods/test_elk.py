import pytest
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

NAME = "elk"


def test_registered_and_forward():
    assert NAME in M.available()
    check_forward(NAME)


def test_training_loss_decreases():
    check_loss_decreases(NAME)


def test_warm_kappa_moves():
    check_warm_kappa_moves(NAME)


def test_bad_input():
    check_bad_input(NAME)


def test_requires_classes_and_matches_loss():
    with pytest.raises(ValueError, match="num_classes"):
        M.create(NAME, num_classes=None, backbone_kwargs=SMALL)
    with pytest.raises(ValueError, match="num_classes"):
        M.create(NAME, num_classes=1, backbone_kwargs=SMALL)
    torch.manual_seed(0)
    m = M.create(NAME, embed_dim=8, num_classes=4, backbone_kwargs=SMALL, warmup_u=None).eval()
    x, y = torch.randn(6, 1, 28, 28), torch.tensor([0, 1, 2, 3, 0, 1])
    from bayesurl.losses.elk import elk_proxy_loss

    with torch.no_grad():
        e, kappa = m.embed_with_kappa(x)
        pmu, pk = m.loss_fn.proxies()
        ref = elk_proxy_loss(e, kappa, y, pmu, pk)
        assert torch.allclose(m.training_loss((x, y)), ref, atol=1e-6)
    assert isinstance(m.loss_fn.proxies, nn.Module)
    # the proxies are trained with the method
    assert any(p is m.loss_fn.proxies.direction for p in m.parameters())
