import numpy as np
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
    with pytest.raises(ValueError, match="hidden_dim"):
        KappaHead(3, hidden_dim=-1)
    with pytest.raises(ValueError, match="hidden_dim"):
        KappaHead(3, hidden_dim=2.5)
    with pytest.raises(TypeError, match="hidden_dim"):
        KappaHead(3, hidden_dim="8")
    with pytest.raises(ValueError, match="min_kappa"):
        KappaHead(3, min_kappa=float("nan"))


def test_hidden_dim_zero_is_one_linear_layer():
    torch.manual_seed(3)
    head = KappaHead(7, hidden_dim=0, min_kappa=0.01).double()
    (lin,) = list(head.mlp)
    assert isinstance(lin, torch.nn.Linear) and (lin.in_features, lin.out_features) == (7, 1)
    x = torch.randn(5, 7, dtype=torch.float64)
    w, b = lin.weight.detach().numpy()[0], float(lin.bias)
    z = x.numpy() @ w + b
    ref = np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0.0) + 0.01
    np.testing.assert_allclose(head(x).detach().numpy(), ref, rtol=1e-13)


def _warm(head: KappaHead, x: torch.Tensor) -> KappaHead:
    assert head.warmup_(x)
    return head


@pytest.mark.parametrize("warmup_u", [1e-3, 1e-2])
def test_warm_head_gradient_is_on_log_scale(warmup_u):
    """After the warm-up d log kappa / d(last bias) is O(1), as in the URL code (ELK kappa fix).

    Reference written independently of the module: ``kappa = s softplus(a) + m`` gives
    ``d log kappa / d b = s sigmoid(a) / kappa``. The old additive warm-up (bias shifted to
    ``a ~ 1/warmup_u``) had ``d log kappa / d b = 1 / kappa ~ warmup_u``.
    """
    torch.manual_seed(3)
    head = _warm(KappaHead(6, warmup_u=warmup_u).double(), x := torch.randn(64, 6).double())
    bias = head.mlp[-1].bias
    kappa = head(x)
    # per-sample d log kappa_i / d b by autograd
    (g,) = torch.autograd.grad(
        kappa.log(), bias, grad_outputs=torch.eye(len(x)).double(), is_grads_batched=True
    )
    g = g.squeeze(-1)
    assert float(g.median()) > 0.1  # old code: ~warmup_u
    with torch.no_grad():
        a = head.mlp(x).squeeze(-1)
        s = float(head.output_scale)
        ref = s * torch.sigmoid(a) / (s * F.softplus(a) + head.min_kappa)
    torch.testing.assert_close(g, ref, rtol=1e-10, atol=0)
    assert s > 0.1 / warmup_u  # the scale carries the warm-up, not the bias


def test_warm_head_moves_kappa_in_one_adam_step():
    """ELK kappa investigation: one AdamW step (lr 1e-3) changes the warmed-up kappa measurably.

    Old code (bias shifted to softplus's linear regime): |d log kappa| ~ 1e-6 per step.
    """
    torch.manual_seed(4)
    x = torch.randn(64, 6).double()
    head = _warm(KappaHead(6, warmup_u=1e-3).double(), x)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.0)
    before = head(x).detach()
    head(x).log().mean().backward()  # any loss that depends on kappa
    opt.step()
    change = (head(x).detach() / before).log().abs()
    assert float(change.median()) > 1e-4
    # the warm-up state is a pair of buffers, not parameters: the step did not touch it
    assert not any(p is head.output_scale for p in head.parameters())


def test_warmup_scale_in_state_dict_and_old_checkpoints_load():
    torch.manual_seed(5)
    x = torch.randn(16, 4).double()
    head = _warm(KappaHead(4, warmup_u=1e-3).double(), x)
    state = head.state_dict()
    assert "output_scale" in state and float(state["output_scale"]) > 1.0
    fresh = KappaHead(4, warmup_u=1e-3).double()
    fresh.load_state_dict(state)
    assert bool(fresh.warmed_up) and torch.equal(fresh(x), head(x))
    # a checkpoint from before the scale existed (warm-up baked into the bias): scale 1
    old = {k: v for k, v in state.items() if k != "output_scale"}
    fresh = KappaHead(4, warmup_u=1e-3).double()
    fresh.load_state_dict(old)
    assert float(fresh.output_scale) == 1.0
    a = head.mlp(x).squeeze(-1).detach()
    torch.testing.assert_close(fresh(x).detach(), F.softplus(a) + fresh.min_kappa)


def test_warmup_scale_with_min_kappa_and_bad_target():
    torch.manual_seed(6)
    x = torch.randn(32, 4).double()
    head = _warm(KappaHead(4, warmup_u=50.0, min_kappa=1e-2).double(), x)
    assert abs(float((1.0 / head(x).detach()).mean()) - 50.0) < 1e-8
    with pytest.raises(ValueError, match="warmup_u"):
        KappaHead(4, warmup_u=200.0, min_kappa=1e-2)
