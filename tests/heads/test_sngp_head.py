"""SNGP random-feature GP layer against brute-force float64 references."""

import math

import pytest
import torch
from torch import nn

from bayesurl.heads.sngp import RandomFeatureGP, mean_field_logits, spectral_normalize


@pytest.fixture(autouse=True)
def _one_thread():
    # intra-op threads only add contention for tensors this small
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _gp(**kw):
    torch.manual_seed(0)
    kw.setdefault("num_random_features", 16)
    return RandomFeatureGP(5, 3, **kw).double()


def _layer_norm(h):
    mu = h.mean(-1, keepdim=True)
    var = ((h - mu) ** 2).mean(-1, keepdim=True)
    return (h - mu) / torch.sqrt(var + 1e-5)


def test_random_features_formula():
    gp = _gp(length_scale=2.0)
    h = torch.randn(4, 5, dtype=torch.float64)
    hn = _layer_norm(h)  # fresh LayerNorm: weight 1, bias 0
    m = gp.num_random_features
    ref = torch.empty(4, m, dtype=torch.float64)
    for i in range(4):
        for j in range(m):
            ref[i, j] = math.sqrt(2 / m) * math.cos(float(gp.rf_weight[j] @ hn[i] + gp.rf_bias[j]))
    torch.testing.assert_close(gp.random_features(h), ref, rtol=1e-10, atol=1e-12)
    # W ~ N(0, 1/l^2): the random projection is scaled by the length scale
    assert 0.25 < float(gp.rf_weight.std()) < 0.75


def test_precision_accumulates_brute_force_sum_and_resets():
    gp = _gp(ridge=0.7)
    gp.reset_precision()  # start of an epoch (also re-creates s I in the module's dtype)
    batches = [torch.randn(n, 5, dtype=torch.float64) for n in (3, 4, 2)]
    ref = 0.7 * torch.eye(16, dtype=torch.float64)
    for h in batches:
        phi = gp(h).features
        gp.accumulate(phi)
        for i in range(phi.shape[0]):
            ref += torch.outer(phi[i], phi[i])
    torch.testing.assert_close(gp.precision, ref, rtol=1e-12, atol=1e-12)
    assert int(gp.n_accumulated) == 9
    gp.update_covariance()
    torch.testing.assert_close(gp.covariance, torch.linalg.inv(ref), rtol=1e-9, atol=1e-10)
    gp.reset_precision()
    torch.testing.assert_close(gp.precision, 0.7 * torch.eye(16, dtype=torch.float64))
    assert int(gp.n_accumulated) == 0
    # the covariance of the finished epoch stays in use until the next update
    torch.testing.assert_close(gp.covariance, torch.linalg.inv(ref), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize(
    ("kwargs", "factor"),
    # default: the URL code's ``mean_field_factor=1`` (sngp_layers.py lines 105, 133)
    [({}, 1.0), ({"mean_field_factor": math.pi / 8}, math.pi / 8)],
)
def test_mean_field_logits_match_formula(kwargs, factor):
    gp = _gp(**kwargs)
    for _ in range(2):
        gp.accumulate(gp(torch.randn(6, 5, dtype=torch.float64)).features)
    gp.update_covariance()
    h = torch.randn(4, 5, dtype=torch.float64)
    out = gp(h)
    sigma = torch.linalg.inv(gp.precision)
    for i in range(4):
        phi = out.features[i]
        var = float(phi.detach() @ sigma @ phi.detach())
        torch.testing.assert_close(out.variance[i], torch.tensor(var).double())
        logits = gp.beta.weight @ phi + gp.beta.bias
        torch.testing.assert_close(out.logits[i], logits)
        torch.testing.assert_close(out.mean_field_logits[i], logits / math.sqrt(1 + factor * var))


def test_prior_covariance_before_any_update():
    gp = _gp(ridge=2.0)
    out = gp(torch.randn(3, 5, dtype=torch.float64))
    torch.testing.assert_close(out.variance, (out.features**2).sum(-1) / 2.0)


def test_mean_field_function_broadcasts_and_checks():
    logits = torch.randn(3, 4, dtype=torch.float64)
    var = torch.rand(3, dtype=torch.float64)
    torch.testing.assert_close(
        mean_field_logits(logits, var, 0.5), logits / torch.sqrt(1 + 0.5 * var)[:, None]
    )
    torch.testing.assert_close(mean_field_logits(logits, var, 0.0), logits)
    with pytest.raises(ValueError, match="factor"):
        mean_field_logits(logits, var, -1.0)


def _sigma_max(w):
    return float(torch.linalg.matrix_norm(w.detach().flatten(1).double(), ord=2))


@pytest.mark.parametrize("bound", [1.0, 3.0])
def test_spectral_normalize_bounds_the_largest_singular_value(bound):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(16, 8), nn.Linear(8, 4))
    with torch.no_grad():
        net[0].weight.mul_(20)
        net[2].weight.mul_(20)
        net[3].weight.mul_(1e-3)  # already below the bound: must stay as it is
    small = net[3].weight.detach().clone()
    assert spectral_normalize(net, bound, layer_types=(nn.Linear, nn.Conv2d)) == 3
    x = torch.randn(2, 1, 4, 4)
    for _ in range(200):  # power iterations run in training-mode forwards
        net(x)
    for layer in (net[0], net[2]):
        assert abs(_sigma_max(layer.weight) - bound) < 2e-3 * bound
    torch.testing.assert_close(net[3].weight, small)
    # eval mode: no power iteration, the weight is frozen
    net.eval()
    w = net[2].weight.detach().clone()
    net(x)
    torch.testing.assert_close(net[2].weight, w)
    # idempotent: no double parametrisation; gradients reach the original weight
    spectral_normalize(net, bound)
    assert len(net[2].parametrizations.weight) == 1
    net.train()
    net(x).sum().backward()
    assert net[2].parametrizations.weight.original.grad is not None


def test_forward_without_variance():
    gp = _gp()
    h = torch.randn(3, 5, dtype=torch.float64)
    out = gp(h, with_variance=False)
    assert out.variance is None and out.mean_field_logits is None
    torch.testing.assert_close(out.logits, gp(h).logits)


def test_bad_input():
    gp = _gp()
    with pytest.raises(ValueError, match="h"):
        gp(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="h"):
        gp(torch.full((2, 5), float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError, match="ridge"):
        RandomFeatureGP(5, 3, ridge=0.0)
    with pytest.raises(ValueError, match="bound"):
        spectral_normalize(nn.Linear(2, 2), bound=0.0)
    with pytest.raises(ValueError, match="num_random_features"):
        RandomFeatureGP(5, 3, num_random_features=0)
