"""Losspred loss (URL B.9, eq. 8) against a brute-force loop; gradient detachment; predictor."""

import math

import pytest
import torch

from bayesurl.losses.losspred import LossPredictionLoss, LossPredictor, losspred_loss


@pytest.fixture(autouse=True)
def _one_thread():
    # intra-op threads only add contention for tensors this small
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _brute(logits, u, y, lam):
    n = logits.shape[0]
    ce_sum, sq_sum = 0.0, 0.0
    for i in range(n):
        row = [float(v) for v in logits[i]]
        m = max(row)
        ce = -(row[int(y[i])] - m - math.log(sum(math.exp(v - m) for v in row)))
        ce_sum += ce
        sq_sum += (float(u[i]) - ce) ** 2
    return ce_sum / n + lam * sq_sum / n


@pytest.mark.parametrize("lam", [0.0, 0.04, 0.7])
def test_matches_brute_force(lam):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 4, generator=g, dtype=torch.float64) * 3
    u = torch.rand(9, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 4, (9,), generator=g)
    ref = _brute(logits, u, y, lam)
    torch.testing.assert_close(losspred_loss(logits, u, y, lam), torch.tensor(ref).double())
    torch.testing.assert_close(LossPredictionLoss(lam)(logits, u, y), torch.tensor(ref).double())


def test_target_is_detached():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.rand(6, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 3, (6,), generator=g)
    ce = torch.nn.functional.cross_entropy(logits, y)
    (g_ce,) = torch.autograd.grad(ce, logits)
    g_logits, g_u = torch.autograd.grad(losspred_loss(logits, u, y, lam=0.5), (logits, u))
    # the L2 term gives no gradient to the logits ...
    torch.testing.assert_close(g_logits, g_ce)
    # ... and d/du = 2 lam (u - CE_i) / N
    ce_i = torch.nn.functional.cross_entropy(logits, y, reduction="none").detach()
    torch.testing.assert_close(g_u, 2 * 0.5 * (u.detach() - ce_i) / 6)
    # the ablation without detach does pass gradient to the logits through the target
    g2, _ = torch.autograd.grad(losspred_loss(logits, u, y, 0.5, detach_target=False), (logits, u))
    assert not torch.allclose(g2, g_ce)


def test_predictor_is_positive_and_detaches_on_request():
    torch.manual_seed(0)
    e = torch.randn(5, 8, requires_grad=True)
    pred = LossPredictor(8)
    u = pred(e)
    assert u.shape == (5,) and bool((u > 0).all())
    (g,) = torch.autograd.grad(u.sum(), e)
    assert g.abs().sum() > 0
    det = LossPredictor(8, detach_input=True)
    assert det(e).grad_fn is not None
    det(e).sum().backward()
    assert e.grad is None


def test_warmup_sets_the_mean_once():
    torch.manual_seed(0)
    pred = LossPredictor(8, warmup_u=1e-3)
    e = torch.randn(32, 8)
    assert pred.warmup_(e) is True
    torch.testing.assert_close(pred(e).mean(), torch.tensor(1e-3), rtol=1e-3, atol=0)
    assert pred.warmup_(e) is False
    assert LossPredictor(8).warmup_(e) is False


def test_bad_input():
    logits, u, y = torch.randn(4, 3), torch.rand(4), torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match="length mismatch"):
        losspred_loss(logits, u[:3], y)
    with pytest.raises(ValueError, match="labels"):
        losspred_loss(logits, u, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="labels"):
        losspred_loss(logits, u, y.float())
    with pytest.raises(ValueError, match="logits"):
        losspred_loss(torch.full((4, 3), float("nan")), u, y)
    with pytest.raises(ValueError, match="u"):
        losspred_loss(logits, u[:, None], y)
    with pytest.raises(ValueError, match="lam"):
        LossPredictionLoss(-1.0)
    with pytest.raises(ValueError, match="embedding"):
        LossPredictor(8)(torch.randn(2, 7))
