import pytest
import torch

import bayesurl.methods as M

from ._vmf_checks import (
    SMALL,
    check_bad_input,
    check_forward,
    check_loss_decreases,
    check_warm_kappa_moves,
)

NAME = "nivmf"


def test_registered_and_forward():
    assert NAME in M.available()
    check_forward(NAME)


def test_training_loss_decreases():
    check_loss_decreases(NAME)


def test_warm_kappa_moves():
    check_warm_kappa_moves(NAME)


def test_bad_input():
    check_bad_input(NAME)


def test_requires_classes_and_proxies_are_parameters():
    with pytest.raises(ValueError, match="num_classes"):
        M.create(NAME, num_classes=None, backbone_kwargs=SMALL)
    m = M.create(NAME, embed_dim=8, num_classes=4, backbone_kwargs=SMALL, n_samples=2)
    params = list(m.parameters())
    assert any(p is m.loss_fn.proxies.raw_kappa for p in params)
    assert m.loss_fn.proxies.raw_kappa.shape == (4, 8)
    assert m.loss_fn.n_samples == 2
    x = torch.randn(5, 1, 28, 28)
    assert torch.isfinite(m.training_loss((x, torch.tensor([0, 1, 2, 3, 0]))))
