import pytest
import torch
import torch.nn.functional as F

from bayesurl.heads.kappa import KappaHead, inverse_softplus


def test_positive_shapes_and_not_constant():
    torch.manual_seed(0)
    head = KappaHead(8)
    x = torch.randn(32, 8)
    k = head(x)
    assert k.shape == (32,) and (k > 0).all()
    # never zero-initialised: kappa varies across inputs from the start (PVU)
    assert k.std() > 1e-3
    # three linear layers
    assert sum(isinstance(m, torch.nn.Linear) for m in head.modules()) == 3
    # dtype follows the module / input
    head64 = KappaHead(8).double()
    assert head64(x.double()).dtype == torch.float64


def test_inverse_softplus_matches_softplus():
    y = torch.tensor([1e-6, 0.3, 1.0, 20.0, 1000.0], dtype=torch.float64)
    assert torch.allclose(F.softplus(inverse_softplus(y)), y, rtol=1e-12)
    with pytest.raises(ValueError, match="positive"):
        inverse_softplus(torch.tensor([0.0]))


def test_warmup_sets_mean_uncertainty():
    torch.manual_seed(1)
    head = KappaHead(6, warmup_u=1e-3).double()
    x = torch.randn(64, 6, dtype=torch.float64)
    assert not bool(head.warmed_up)
    assert head.warmup_(x)
    u = 1.0 / head(x).detach()
    assert abs(float(u.mean()) - 1e-3) < 1e-9
    assert u.std() > 0  # still input-dependent
    # only once (the flag is a buffer, so it is saved in checkpoints)
    assert not head.warmup_(torch.randn(64, 6, dtype=torch.float64))
    assert "warmed_up" in head.state_dict()
    # without warmup_u nothing happens
    plain = KappaHead(6)
    before = plain.mlp[-1].bias.clone()
    assert not plain.warmup_(torch.randn(4, 6))
    assert torch.equal(plain.mlp[-1].bias, before)


def test_warmup_to_large_uncertainty():
    torch.manual_seed(2)
    head = KappaHead(4, warmup_u=5.0).double()
    x = torch.randn(16, 4, dtype=torch.float64)
    head.warmup_(x)
    assert abs(float((1.0 / head(x).detach()).mean()) - 5.0) < 1e-8


def test_bad_input():
    with pytest.raises(ValueError, match="in_dim"):
        KappaHead(0)
    with pytest.raises(ValueError, match="warmup_u"):
        KappaHead(3, warmup_u=-1.0)
    head = KappaHead(3)
    with pytest.raises(ValueError, match="embedding"):
        head(torch.randn(2, 4))
    with pytest.raises(ValueError, match="embedding"):
        head(torch.randn(2, 3, 1))
    with pytest.raises(ValueError, match="embedding"):
        KappaHead(3, warmup_u=0.1).warmup_(torch.full((2, 3), float("nan")))
