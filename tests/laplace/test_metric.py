"""MetricLaplace: fit, prior, sampling, closed-form predictive, online update (float64)."""

from __future__ import annotations

import io
import math

import pytest
import torch
from scipy.optimize import minimize_scalar
from torch import nn

from bayesurl.laplace import (
    MetricLaplace,
    OnlineMetricLaplace,
    PosthocMetricLaplace,
    ggn_diagonal,
    kappa_from_trace,
    train_contrastive,
    train_online,
)
from bayesurl.losses.contrastive import ContrastiveLoss


def _net(seed: int = 0, f_in: int = 6, hidden: int = 8, d: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(f_in, hidden), nn.Tanh(), nn.Linear(hidden, d)).double()


def _data(n: int = 32, f_in: int = 6, seed: int = 1, classes: int = 4):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    centers = torch.randn(classes, f_in, generator=g, dtype=torch.float64) * 2
    x = centers[y] + 0.5 * torch.randn(n, f_in, generator=g, dtype=torch.float64)
    return x, y


def _batches(x, y, b):
    return [(x[i : i + b], y[i : i + b]) for i in range(0, len(y), b)]


def _consecutive_pair_miner(emb, labels):
    """Fixed pairs (2k, 2k+1) inside a batch, positive or negative by label."""
    i = torch.arange(0, len(labels) - 1, 2)
    j = i + 1
    same = labels[i] == labels[j]
    return i[same], j[same], i[~same], j[~same]


@pytest.mark.parametrize("approximation", ["fixed", "positive", "full"])
@pytest.mark.parametrize("geometry", ["euclidean", "arccos"])
def test_fit_independent_of_batch_size_with_fixed_pairs(approximation, geometry):
    x, y = _data()
    y = torch.tensor([0, 0, 0, 1] * 8)  # consecutive pairs: both positives and negatives
    net = _net()
    fits = []
    for b in (4, 8, 32):
        la = MetricLaplace(net, approximation=approximation, geometry=geometry, margin=2.0)
        la.fit(_batches(x, y, b), miner=_consecutive_pair_miner, progress=False)
        fits.append(la.hessian)
    torch.testing.assert_close(fits[0], fits[1])
    torch.testing.assert_close(fits[0], fits[2])
    # and equal to one ggn_diagonal call over all the data
    with torch.no_grad():
        phi = net[1](net[0](x))
    ref = ggn_diagonal(
        net[2],
        phi,
        _consecutive_pair_miner(None, y),
        approximation=approximation,
        geometry=geometry,
        margin=2.0,
        clamp=False,
    )
    torch.testing.assert_close(fits[0], ref)


def test_posterior_precision_nonnegative_hessian_and_report():
    x, y = _data()
    la = MetricLaplace(_net(), approximation="full", geometry="arccos", margin=1.5)
    la.fit(_batches(x, y, 16), progress=False)
    assert la.fit_report[-1]["clamped_fraction"] == la.clamped_fraction
    assert 0.0 <= la.clamped_fraction <= 1.0
    assert bool((la.posterior_precision >= la.prior_precision).all())
    raw = la.hessian
    torch.testing.assert_close(la.posterior_precision, raw.clamp_min(0) + la.prior_precision)


def test_trained_model_keeps_clamped_fraction_low():
    """With the hard pairs (one positive and one negative inside the margin per anchor)
    training moves the fixed diagonal from mostly clamped to almost nowhere clamped."""
    x, y = _data(n=64, seed=2)
    net = _net(3)
    fractions = []
    for epochs in (0, 8):
        opt = torch.optim.Adam(net.parameters(), lr=3e-2)
        train_contrastive(net, _batches(x, y, 32), opt, epochs, margin=0.5, progress=False)
        la = MetricLaplace(net, approximation="fixed", geometry="arccos", margin=0.5,
                           hessian_miner="hard", hessian_pairs="inside_margin")  # fmt: skip
        la.fit(_batches(x, y, 32), progress=False)
        fractions.append(la.clamped_fraction)
    assert fractions[1] <= 0.05 < fractions[0]


def test_sample_mean_and_variance():
    x, y = _data()
    la = MetricLaplace(_net(), approximation="positive", prior_precision=3.0)
    la.fit(_batches(x, y, 32), progress=False)
    n = 20000
    s = la.sample(n, generator=torch.Generator().manual_seed(0))
    var = la.posterior_variance
    assert s.shape == (n, la.n_params)
    z = (s.mean(0) - la.mean) / (var / n).sqrt()
    assert float(z.abs().max()) < 5.0
    # sample variance: relative sd of s^2 estimate is sqrt(2/n) ~ 1%
    rel = s.var(0) / var - 1
    assert float(rel.abs().max()) < 6 * (2 / n) ** 0.5
    # generator makes it reproducible
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    torch.testing.assert_close(la.sample(3, g1), la.sample(3, g2))


def test_closed_form_predictive_variance_matches_samples():
    x, y = _data()
    net = _net()
    la = MetricLaplace(net, approximation="fixed", geometry="euclidean", prior_precision=2.0)
    la.fit(_batches(x, y, 32), progress=False)
    mean, var = la.predictive_variance(x)
    n = 20000
    w, b = la._split(la.sample(n, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():
        phi = net[1](net[0](x))
    z = torch.einsum("nf,sdf->snd", phi, w) + b[:, None, :]
    rel = z.var(0) / var - 1
    assert float(rel.abs().max()) < 6 * (2 / n) ** 0.5
    zm = (z.mean(0) - mean) / (var / n).sqrt()
    assert float(zm.abs().max()) < 5.0


def test_predictive_trace_and_kappa_match_sampled_normalised_embeddings():
    x, y = _data()
    net = _net()
    la = MetricLaplace(net, approximation="fixed", prior_precision=2000.0)
    la.fit(_batches(x, y, 32), progress=False)
    out = la.predictive(x, n_samples=4000, generator=torch.Generator().manual_seed(2))
    assert out.embedding.shape == (32, 4) and out.uncertainty.shape == (32,)
    assert out.samples.shape == (4000, 32, 4)
    torch.testing.assert_close(out.embedding.norm(dim=1), torch.ones(32, dtype=torch.float64))
    # closed form by hand: last layer Linear(8, 4), parameters flattened as [W (4 x 8), b (4)]
    pv = la.posterior_variance
    w_var, b_var = pv[:32].reshape(4, 8), pv[32:]
    with torch.no_grad():
        phi = net[1](net[0](x))
        z = net[2](phi)
    var = (phi**2) @ w_var.T + b_var  # var(z_d) = sum_f sigma2_df phi_f^2 + sigma2_b,d
    norm2 = (z**2).sum(1)
    u = z / norm2.sqrt()[:, None]
    trace = (var * (1 - u**2)).sum(1) / norm2  # linearised tr Cov(z / ||z||)
    assert float(trace.min()) > 1e-4  # not a degenerate (zero-variance) case
    # the samples' own moments: their variance is the closed-form trace (small posterior
    # variance: the linearisation holds to a few %, the 4000-draw estimate to ~2 %)
    torch.testing.assert_close(out.samples.var(0).sum(1), trace, rtol=0.1, atol=0)
    torch.testing.assert_close(
        out.samples.mean(0) / out.samples.mean(0).norm(dim=1, keepdim=True), u, rtol=0, atol=0.02
    )
    # kappa: the Sra moment match of R^2 = 1 / (1 + trace) (docs/concepts/uncertainty.rst,
    # "Samples"), evaluated here
    r = (1 / (1 + trace)).sqrt()
    torch.testing.assert_close(out.kappa, r * (4 - r**2) / (1 - r**2), rtol=1e-8, atol=0)
    r_s = out.samples.mean(0).norm(dim=1)  # and against the samples' mean resultant length
    torch.testing.assert_close(out.kappa, r_s * (4 - r_s**2) / (1 - r_s**2), rtol=0.15, atol=0)
    torch.testing.assert_close(out.uncertainty, 1 / out.kappa)


def test_kappa_from_trace_is_sra_formula():
    t = torch.tensor([1e-4, 0.01, 0.3, 3.0, 300.0], dtype=torch.float64)
    r = (1 / (1 + t)).sqrt()
    kappa = kappa_from_trace(t, 8)
    torch.testing.assert_close(kappa, r * (8 - r**2) / (1 - r**2))
    # second-order agreement with R^2 = 1 - t for small t; strictly monotone, no clipping
    r_lin = (1 - t[:2]).sqrt()
    torch.testing.assert_close(
        kappa[:2], r_lin * (8 - r_lin**2) / (1 - r_lin**2), rtol=2e-2, atol=0
    )
    assert bool((kappa[1:] < kappa[:-1]).all())


def test_optimize_prior_precision_matches_scipy():
    x, y = _data()
    la = MetricLaplace(_net(), approximation="fixed", geometry="arccos", margin=1.0)
    la.fit(_batches(x, y, 32), progress=False)
    lam = la.optimize_prior_precision()
    res = minimize_scalar(
        lambda t: -float(la.log_marginal_likelihood(10.0**t)),
        bounds=(-6, 6),
        method="bounded",
        options={"xatol": 1e-10},
    )
    assert lam == pytest.approx(10.0**res.x, rel=1e-4)
    assert float(la.prior_precision) == pytest.approx(lam)
    # brute-force value of the objective, one parameter at a time
    want = 0.0
    for t, hh in zip(la.mean.tolist(), la.hessian.clamp_min(0).tolist()):
        want += -0.5 * lam * t**2 + 0.5 * math.log(lam) - 0.5 * math.log(hh + lam)
    assert float(la.log_marginal_likelihood()) == pytest.approx(float(want), rel=1e-8)


def test_online_update_follows_formula():
    x, y = _data()
    net = _net()
    la = MetricLaplace(
        net, mode="online", alpha=0.1, dataset_size=320, n_weight_samples=2, margin=1.5
    )
    assert isinstance(la, OnlineMetricLaplace)
    la.hessian = torch.rand(la.n_params, dtype=torch.float64)
    h_old, std_old = la.hessian.clone(), la.posterior_variance.sqrt()
    ref_net = _net()
    ref_net.load_state_dict(net.state_dict())
    theta_old = la.mean.clone()
    xb, yb = x[:16], y[:16]
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    loss = la.online_step(xb, yb, opt, generator=torch.Generator().manual_seed(7))

    # independent reconstruction: same draws, brute-force expected loss and its gradient
    eps = torch.randn(
        (2, la.n_params), generator=torch.Generator().manual_seed(7), dtype=h_old.dtype
    )
    noise = eps * std_old
    from pytorch_metric_learning.miners import PairMarginMiner, TripletMarginMiner

    phi = ref_net[1](ref_net[0](xb))
    z0 = ref_net[2](phi)
    u0 = nn.functional.normalize(z0.detach(), dim=1)
    tup = PairMarginMiner(0.0, 1.5)(u0, yb)
    # the default Hessian pairs: every triplet of the LAM code's miner (fewer than its cap)
    h_tup = TripletMarginMiner(margin=1.5, type_of_triplets="all")(u0, yb)
    assert 0 < len(h_tup[0]) < 5000
    lossf = ContrastiveLoss(margin=1.5)
    d, f = 4, 8
    total = 0
    h_batch = torch.zeros_like(h_old)
    for s in range(2):
        w = ref_net[2].weight + noise[s, : d * f].reshape(d, f)
        b = ref_net[2].bias + noise[s, d * f :]
        total = total + lossf(nn.functional.normalize(phi @ w.T + b, dim=1), yb, tup)
        lay = nn.Linear(f, d).double()
        with torch.no_grad():
            lay.weight.copy_(w)
            lay.bias.copy_(b)
        h_batch += ggn_diagonal(
            lay,
            phi.detach(),
            h_tup,
            approximation="fixed",
            geometry="arccos",
            margin=math.inf,
            clamp=False,
        )
    total = total / 2
    assert loss == pytest.approx(float(total.detach()), rel=1e-10)
    grads = torch.autograd.grad(total, list(ref_net.parameters()))
    for p_new, p_old, g in zip(net.parameters(), ref_net.parameters(), grads):
        torch.testing.assert_close(p_new.detach(), p_old.detach() - g)
    want = 0.9 * h_old + (320 / 16) * (h_batch / 2).clamp_min(0.0)
    torch.testing.assert_close(la.hessian, want)
    assert not torch.allclose(la.mean, theta_old)


def test_train_online_runs_and_learns():
    x, y = _data(n=64, seed=4)
    net = _net(5)
    la = MetricLaplace(net, mode="online", margin=0.5, alpha=0.01)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    hist = train_online(
        la,
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32),
        opt,
        6,
        optimize_prior_every=2,
        progress=False,
    )
    assert float(la.prior_precision) != 1.0  # re-tuned by the marginal likelihood
    assert hist[-1] < hist[0]
    assert la.dataset_size == 64 and len(la.fit_report) == 6
    assert bool((la.hessian > 0).any())
    out = la.predictive(x)
    assert torch.isfinite(out.uncertainty).all()


def test_state_dict_roundtrip_weights_only():
    x, y = _data()
    net = _net()
    la = MetricLaplace(
        net, approximation="positive", geometry="euclidean", margin=1.2, hessian_pairs="all_mined"
    )
    la.fit(_batches(x, y, 32), progress=False)
    la.optimize_prior_precision()
    buf = io.BytesIO()
    torch.save(la.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    net2 = _net(seed=9)
    la2 = MetricLaplace(net2, last_layer="2")
    la2.load_state_dict(state)
    assert isinstance(la2, PosthocMetricLaplace)
    torch.testing.assert_close(la2.hessian, la.hessian)
    torch.testing.assert_close(la2.mean, la.mean)
    assert la2.approximation.value == "positive" and la2.margin == 1.2
    assert la2.hessian_pairs.value == "all_mined"
    torch.testing.assert_close(la2.posterior_variance, la.posterior_variance)
    torch.testing.assert_close(la2.prior_precision, la.prior_precision)
    bad = dict(state)
    bad["hessian"] = state["hessian"].clone()
    bad["hessian"][0] = float("nan")
    with pytest.raises(ValueError, match="hessian"):
        la2.load_state_dict(bad)
    with pytest.raises(ValueError, match="missing"):
        la2.load_state_dict({"hessian": state["hessian"]})
    short = dict(state)
    short["mean"] = state["mean"][:-1]
    with pytest.raises(ValueError, match="mean"):
        la2.load_state_dict(short)


def test_device_and_dtype_follow_model():
    x, y = _data()
    net = _net().float()
    la = MetricLaplace(net, approximation="fixed")
    la.fit(_batches(x.float(), y, 32), progress=False)
    assert la.hessian.dtype == torch.float32
    assert la.predictive(x.float()).embedding.dtype == torch.float32


def test_bad_input_rejected():
    x, y = _data()
    with pytest.raises(ValueError, match="nn.Linear"):
        MetricLaplace(nn.Sequential(nn.Conv1d(1, 1, 1)))
    with pytest.raises(ValueError, match="last_layer"):
        MetricLaplace(nn.Sequential(nn.Linear(2, 2), nn.Conv1d(1, 1, 1)), last_layer="1")
    with pytest.raises(ValueError, match="last_layer"):
        MetricLaplace(_net(), last_layer="nope")
    with pytest.raises(ValueError, match="mode"):
        MetricLaplace(_net(), mode="sometimes")
    with pytest.raises(ValueError, match="approximation"):
        MetricLaplace(_net(), approximation="diag")
    with pytest.raises(ValueError, match="prior_precision"):
        MetricLaplace(_net(), prior_precision=-1.0)
    with pytest.raises(ValueError, match="online"):
        MetricLaplace(_net(), alpha=0.1)
    empty = torch.tensor([], dtype=torch.long)
    la = MetricLaplace(_net())
    with pytest.raises(ValueError, match="no pairs"):
        la.fit(_batches(x, y, 8), miner=lambda e, l: (empty, empty, empty, empty), progress=False)
    # non-finite features / Hessian
    huge = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 4)).double()
    with torch.no_grad():
        huge[0].weight.fill_(1e200)
    with pytest.raises(ValueError, match="features|hessian"):
        MetricLaplace(huge).fit(_batches(x, y, 32), progress=False)
    with pytest.raises(ValueError, match="dataset_size"):
        MetricLaplace(_net(), mode="online").online_step(
            x, y, torch.optim.SGD(_net().parameters(), lr=0.1)
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_follows_model():
    x, y = _data()
    net = _net().cuda()
    la = MetricLaplace(net, approximation="full", geometry="arccos", margin=1.5)
    la.fit(_batches(x.cuda(), y.cuda(), 16), progress=False)
    out = la.predictive(x.cuda(), n_samples=2, generator=torch.Generator("cuda").manual_seed(0))
    assert la.hessian.is_cuda and out.embedding.is_cuda and out.samples.is_cuda


def test_prior_optimisation_refuses_fully_clamped_hessian():
    la = MetricLaplace(_net())
    la.hessian = -torch.ones(la.n_params, dtype=torch.float64)
    assert la.clamped_fraction == 1.0
    with pytest.raises(ValueError, match="clamped"):
        la.optimize_prior_precision()
    with pytest.raises(ValueError, match="bounds"):
        la.optimize_prior_precision(bounds=(0.0, 1.0))


def test_online_loss_in_a_foreign_loop_equals_online_step():
    x, y = _data()
    nets = [_net(), _net()]
    las = [MetricLaplace(n, mode="online", dataset_size=64, margin=1.5) for n in nets]
    opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
    las[0].online_step(x[:16], y[:16], opts[0], generator=torch.Generator().manual_seed(3))
    loss = las[1].online_loss(x[:16], y[:16], generator=torch.Generator().manual_seed(3))
    opts[1].zero_grad()
    loss.backward()
    opts[1].step()
    torch.testing.assert_close(las[0].hessian, las[1].hessian)
    for p0, p1 in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(p0, p1)


@pytest.mark.parametrize("approximation", ["fixed", "full"])
def test_online_hessian_clamps_each_batch_like_a_loop(approximation):
    """LAM eq. 5 with the per-step ReLU (eq. 9): H_t = (1 - a) H_{t-1} + (N / b) relu(H_b).

    Reference: a plain loop over batches with the same weight draws and ``ggn_diagonal`` of
    a copy of the last layer. The mean weights are frozen (lr = 0) so every draw is
    reproducible; at least one raw batch Hessian must have a negative entry, otherwise the
    test could not tell a per-batch clamp from a clamp of the total.
    """
    x, y = _data(n=64, seed=2)
    y = torch.tensor([0, 0, 1, 2] * 16)
    net = _net(3)
    alpha, n_total, b, lam = 0.2, 640, 16, 1.0
    la = MetricLaplace(
        net,
        mode="online",
        approximation=approximation,
        alpha=alpha,
        dataset_size=n_total,
        margin=2.0,
        prior_precision=lam,
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    gen = torch.Generator().manual_seed(11)
    for xb, yb in _batches(x, y, b):
        la.online_step(xb, yb, opt, hessian_miner=_consecutive_pair_miner, generator=gen)

    ref_gen = torch.Generator().manual_seed(11)
    last = net[2]
    d, f = last.out_features, last.in_features
    theta = torch.cat([last.weight.detach().reshape(-1), last.bias.detach()])
    h_ref = torch.zeros(d * f + d, dtype=torch.float64)
    saw_negative = False
    for xb, yb in _batches(x, y, b):
        std = (h_ref.clamp_min(0.0) + lam).rsqrt()
        noise = torch.randn((1, theta.numel()), generator=ref_gen, dtype=torch.float64) * std
        lay = nn.Linear(f, d).double()
        with torch.no_grad():
            lay.weight.copy_((theta + noise[0])[: d * f].reshape(d, f))
            lay.bias.copy_((theta + noise[0])[d * f :])
        phi = net[1](net[0](xb)).detach()
        u = nn.functional.normalize(net[2](phi).detach(), dim=1)
        h_b = ggn_diagonal(
            lay,
            phi,
            _consecutive_pair_miner(u, yb),
            approximation=approximation,
            geometry="arccos",
            margin=2.0,
            clamp=False,
        )
        saw_negative |= bool((h_b < 0).any())
        h_ref = (1 - alpha) * h_ref + (n_total / b) * torch.relu(h_b)
    assert saw_negative
    torch.testing.assert_close(la.hessian, h_ref)
    assert bool((la.hessian >= 0).all())


@pytest.mark.parametrize("approximation", ["fixed", "full"])
def test_online_training_keeps_running_hessian_nonnegative(approximation):
    """After a few real online steps (Adam, default miners) no entry of H is negative."""
    x, y = _data(n=128, seed=6)
    net = _net(7)
    la = MetricLaplace(net, mode="online", approximation=approximation, margin=0.5, alpha=1e-3)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    train_online(la, loader, opt, 2, progress=False, generator=torch.Generator().manual_seed(0))
    assert float(la.hessian.min()) >= 0.0
    assert float(la.hessian.max()) > 0.0
    assert la.clamped_fraction < 1.0


def test_predictive_u_from_samples_is_sra_of_the_draws():
    """LAM-code u: a vMF fitted to the returned draws by Sra's approximation (numpy)."""
    import numpy as np

    x, y = _data()
    la = MetricLaplace(_net(), prior_precision=3.0).fit(_batches(x, y, 8), progress=False)
    out = la.predictive(
        x, n_samples=50, generator=torch.Generator().manual_seed(2), u_from="samples"
    )
    s = out.samples.numpy()
    for i in range(0, len(y), 7):
        r = np.linalg.norm(s[:, i].mean(axis=0))
        d = s.shape[-1]
        assert float(out.kappa[i]) == pytest.approx(r * (d - r**2) / (1 - r**2), rel=1e-9)
    assert torch.allclose(out.uncertainty, 1.0 / out.kappa)
    trace = la.predictive(x, n_samples=50, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(trace.samples, out.samples)  # same draws, other u
    rho = np.corrcoef(
        np.argsort(np.argsort(trace.uncertainty.numpy())),
        np.argsort(np.argsort(out.uncertainty.numpy())),
    )[0, 1]
    assert rho > 0.8  # same ranking to second order
    with pytest.raises(ValueError, match="u_from"):
        la.predictive(x, n_samples=50, u_from="sample")
    with pytest.raises(ValueError, match="n_samples"):
        la.predictive(x, n_samples=1, u_from="samples")


def test_hessian_scale_and_per_parameter_prior_enter_posterior_and_predictive():
    """beta != 1 and a [P] prior: precision, evidence and sampled outputs against loops."""
    x, y = _data()
    net = _net()
    beta = 0.3
    la = MetricLaplace(net, approximation="positive", hessian_scale=beta, margin=1.5)
    la.fit(_batches(x, y, 16), progress=False)
    p = la.n_params
    lam = torch.linspace(0.5, 5.0, p, dtype=torch.float64)
    la.prior_precision = lam
    h = la.hessian.tolist()
    want_prec = [beta * max(hh, 0.0) + lt for hh, lt in zip(h, lam.tolist())]
    torch.testing.assert_close(la.posterior_precision, torch.tensor(want_prec, dtype=torch.float64))
    want_lml = 0.0
    for t, hh, lt in zip(la.mean.tolist(), h, lam.tolist()):
        want_lml += -0.5 * lt * t**2 + 0.5 * math.log(lt) - 0.5 * math.log(beta * max(hh, 0) + lt)
    assert float(la.log_marginal_likelihood()) == pytest.approx(want_lml, rel=1e-10)
    # predictive variance of z = W phi + b from samples of the [P] posterior
    mean, var = la.predictive_variance(x)
    n = 20000
    w, b = la._split(la.sample(n, generator=torch.Generator().manual_seed(3)))
    with torch.no_grad():
        phi = net[1](net[0](x))
    z = torch.einsum("nf,sdf->snd", phi, w) + b[:, None, :]
    assert float((z.var(0) / var - 1).abs().max()) < 6 * (2 / n) ** 0.5
    # and beta changes it: the same fit with beta = 1 is more concentrated
    la1 = MetricLaplace(net, approximation="positive", margin=1.5, prior_precision=lam)
    la1.fit(_batches(x, y, 16), progress=False)
    assert bool((la1.predictive_variance(x)[1] < var).all())
    with pytest.raises(ValueError, match="prior_precision"):
        la.prior_precision = torch.ones(p + 1, dtype=torch.float64)


def test_optimize_prior_precision_clips_to_bounds():
    x, y = _data()
    la = MetricLaplace(_net(), approximation="fixed", geometry="arccos", margin=1.0)
    la.fit(_batches(x, y, 32), progress=False)
    free = la.optimize_prior_precision()
    assert 1e-6 < free < 1e6
    # the objective is concave in lambda: a box on either side of the optimum ends at its edge
    assert la.optimize_prior_precision(bounds=(free * 10, free * 100)) == pytest.approx(free * 10)
    assert float(la.prior_precision) == pytest.approx(free * 10)
    assert la.optimize_prior_precision(bounds=(free / 100, free / 10)) == pytest.approx(free / 10)
    lml = [float(la.log_marginal_likelihood(v)) for v in (free / 10, free, free * 10)]
    assert lml[1] > max(lml[0], lml[2])  # the clipped values are worse (scipy-free check)
    with pytest.raises(ValueError, match="bounds"):
        la.optimize_prior_precision(bounds=(1.0, 0.5))


def test_online_lam_code_update_and_start():
    """The LAM code's update (laplace_online_model.py lines 48-51, 149, 157 at e0188f4):
    ``H_0 = N`` (stochman ``init_hessian``), ``H <- m H + relu(mean_s h_s / #tuples * N^2)``,
    written as a loop with the same weight draws (lr = 0 keeps the mean fixed)."""
    x, y = _data(n=64, seed=2)
    y = torch.tensor([0, 0, 1, 2] * 16)
    net = _net(3)
    alpha, n_total, b, lam = 0.2, 640, 16, 1.0
    la = MetricLaplace(
        net,
        mode="online",
        alpha=alpha,
        dataset_size=n_total,
        margin=2.0,
        prior_precision=lam,
        init_hessian=n_total,
        online_scale="dataset_squared_over_tuples",
    )
    assert bool((la.hessian == n_total).all())
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    gen = torch.Generator().manual_seed(11)
    for xb, yb in _batches(x, y, b):
        la.online_step(xb, yb, opt, hessian_miner=_consecutive_pair_miner, generator=gen)

    ref_gen = torch.Generator().manual_seed(11)
    last = net[2]
    d, f = last.out_features, last.in_features
    theta = torch.cat([last.weight.detach().reshape(-1), last.bias.detach()])
    h_ref = torch.full((d * f + d,), float(n_total), dtype=torch.float64)
    for xb, yb in _batches(x, y, b):
        std = 1.0 / (h_ref.clamp_min(0.0) + lam).sqrt()
        noise = torch.randn((1, theta.numel()), generator=ref_gen, dtype=torch.float64) * std
        lay = nn.Linear(f, d).double()
        with torch.no_grad():
            lay.weight.copy_((theta + noise[0])[: d * f].reshape(d, f))
            lay.bias.copy_((theta + noise[0])[d * f :])
        phi = net[1](net[0](xb)).detach()
        u = nn.functional.normalize(net[2](phi).detach(), dim=1)
        tup = _consecutive_pair_miner(u, yb)
        h_b = ggn_diagonal(lay, phi, tup, approximation="fixed", geometry="arccos", margin=2.0)
        n_tuples = len(tup[0]) + len(tup[2])
        h_ref = (1 - alpha) * h_ref + torch.relu(h_b / n_tuples * n_total**2)
    torch.testing.assert_close(la.hessian, h_ref)
    # the default N / b scale and H_0 = 0 differ by orders of magnitude here
    default = MetricLaplace(_net(3), mode="online", dataset_size=n_total)
    assert bool((default.hessian == 0).all())


def test_all_mined_pairs_keep_negatives_outside_the_margin():
    """``hessian_pairs="all_mined"``: the LAM code's calculator has no margin test."""
    x, _ = _data()
    y = torch.tensor([0, 0, 0, 1] * 8)  # consecutive pairs: positives and negatives
    net = _net()
    kw = {"approximation": "full", "geometry": "arccos", "margin": 0.05}
    tup = _consecutive_pair_miner(None, y)
    la = MetricLaplace(net, hessian_pairs="all_mined", **kw)
    la.fit([(x, y)], miner=lambda e, lab: tup, progress=False)
    phi = net[1](net[0](x)).detach()
    want = ggn_diagonal(net[2], phi, tup, approximation="full", geometry="arccos",
                        margin=math.inf, clamp=False)  # fmt: skip
    torch.testing.assert_close(la.hessian, want)
    inside = MetricLaplace(net, hessian_pairs="inside_margin", **kw)
    inside.fit([(x, y)], miner=lambda e, lab: tup, progress=False)
    assert not torch.allclose(inside.hessian, want)
    with pytest.raises(ValueError, match="hessian_pairs"):
        MetricLaplace(net, hessian_pairs="every")
    with pytest.raises(ValueError, match="online_scale"):
        MetricLaplace(net, mode="online", dataset_size=4, online_scale="n2")
