"""Kronecker (EKFAC) contrastive curvature against the exact GGN built by torch.func (float64)."""

from __future__ import annotations

import io
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import hessian, jacrev

from bayesurl.laplace import MetricLaplace, ggn_diagonal, split_pairs
from bayesurl.laplace.kron import (
    KronPosterior,
    augment,
    contrastive_blocks,
    dense_ggn,
    eigencorrected_curvature,
    kron_eigenbasis,
    kron_factors,
    nearest_kronecker_svd,
)

COMBOS = list(itertools.product(["fixed", "positive", "full"], ["euclidean", "arccos"]))
D, F, N, MARGIN = 4, 6, 24, 0.9


def _setup(seed: int = 0):
    """Class-clustered ReLU features (as a trained backbone gives) and a random last layer."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(N) % 4
    centers = torch.randn(4, F, generator=g, dtype=torch.float64)
    phi = (centers[y] + 0.5 * torch.randn(N, F, generator=g, dtype=torch.float64)).relu()
    torch.manual_seed(seed)
    layer = nn.Linear(F, D).double()
    a1 = torch.arange(N)
    pairs = (a1, (a1 + 4) % N, a1, (a1 + 1) % N)
    return layer, phi, y, pairs


def _exact_ggn(layer: nn.Linear, phi, pairs, approximation, geometry, margin=MARGIN):
    """Dense sum over pairs of J^T H J, [W | b] row-major, by jacrev / hessian (LAM eq. 6)."""
    w, b = layer.weight.detach(), layer.bias.detach()
    theta = torch.cat([w, b[:, None]], 1).reshape(-1)

    def out(t, x):
        m = t.reshape(D, F + 1)
        return x @ m[:, :F].T + m[:, F]

    a1, p, a2, n = split_pairs(pairs, phi.shape[0])
    u = nn.functional.normalize(layer(phi), dim=1).detach()
    terms = [(int(i), int(j), 1.0) for i, j in zip(a1, p)]
    if approximation != "positive":
        terms += [
            (int(i), int(j), -1.0) for i, j in zip(a2, n) if float((u[i] - u[j]).norm()) < margin
        ]
    total = torch.zeros(theta.numel(), theta.numel(), dtype=theta.dtype)
    eye = torch.eye(D, dtype=theta.dtype)
    for i, j, sign in terms:
        x = phi[[i, j]]
        if geometry == "euclidean":

            def f(t, x=x):
                return nn.functional.normalize(out(t, x), dim=1).reshape(-1)

            h = torch.cat([torch.cat([eye, -eye], 1), torch.cat([-eye, eye], 1)])
        else:

            def f(t, x=x):
                return out(t, x).reshape(-1)

            h = hessian(lambda q: 1 - (q[:D] @ q[D:]) / (q[:D].norm() * q[D:].norm()))(
                f(theta).detach()
            )
        if approximation == "fixed":
            h = h.clone()
            h[:D, D:] = 0
            h[D:, :D] = 0
        jac = jacrev(f)(theta)
        total += sign * jac.T @ h @ jac
    return total


def _blocks(layer, phi, pairs, approximation, geometry):
    z = layer(phi).detach()
    return contrastive_blocks(
        z, pairs, approximation=approximation, geometry=geometry, margin=MARGIN
    ), augment(phi, True)


@pytest.mark.parametrize("approximation,geometry", COMBOS)
def test_blocks_give_the_exact_ggn(approximation, geometry):
    layer, phi, _, pairs = _setup()
    blocks, inputs = _blocks(layer, phi, pairs, approximation, geometry)
    exact = _exact_ggn(layer, phi, pairs, approximation, geometry)
    if approximation != "positive":  # negatives inside the margin are present
        assert blocks.i.numel() > N
    torch.testing.assert_close(dense_ggn(blocks, inputs), exact, atol=1e-12, rtol=0)


@pytest.mark.parametrize("approximation,geometry", COMBOS)
def test_als_factors_equal_the_svd_nearest_kronecker_product(approximation, geometry):
    layer, phi, _, pairs = _setup()
    blocks, inputs = _blocks(layer, phi, pairs, approximation, geometry)
    exact = _exact_ggn(layer, phi, pairs, approximation, geometry)
    info: dict = {}
    g, a = kron_factors(blocks, inputs, max_iter=5000, tol=1e-14, info=info)
    g_ref, a_ref = nearest_kronecker_svd(exact, D, F + 1)
    assert info["n_iter"] < 5000
    torch.testing.assert_close(a, a_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(g, g_ref, atol=1e-10 * float(g_ref.abs().max()), rtol=0)
    torch.testing.assert_close(torch.kron(g, a), torch.kron(g_ref, a_ref), atol=1e-10, rtol=0)
    # a single ALS iteration is not enough in general: the stopping rule matters
    g1, a1 = kron_factors(blocks, inputs, max_iter=1)
    assert float((torch.kron(g1, a1) - torch.kron(g_ref, a_ref)).abs().max()) > 1e-8


@pytest.mark.parametrize("approximation,geometry", COMBOS)
def test_eigencorrected_curvature_is_the_rotated_ggn_diagonal(approximation, geometry):
    layer, phi, _, pairs = _setup(1)
    blocks, inputs = _blocks(layer, phi, pairs, approximation, geometry)
    exact = _exact_ggn(layer, phi, pairs, approximation, geometry)
    q_g, q_a = kron_eigenbasis(*kron_factors(blocks, inputs, tol=1e-12))
    q = torch.kron(q_g, q_a)
    s = eigencorrected_curvature(blocks, inputs, q_g, q_a)
    torch.testing.assert_close(s.reshape(-1), torch.diagonal(q.T @ exact @ q), atol=1e-10, rtol=0)
    # in the identity basis it is the diagonal GGN of ggn_diagonal ([W | b] layout)
    eye_g, eye_a = torch.eye(D, dtype=phi.dtype), torch.eye(F + 1, dtype=phi.dtype)
    s0 = eigencorrected_curvature(blocks, inputs, eye_g, eye_a)
    diag = ggn_diagonal(
        layer,
        phi,
        pairs,
        approximation=approximation,
        geometry=geometry,
        margin=MARGIN,
        clamp=False,
    )
    ref = torch.cat([diag[: D * F].reshape(D, F), diag[D * F :, None]], 1)
    torch.testing.assert_close(s0, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(s0.reshape(-1), torch.diagonal(exact), atol=1e-12, rtol=0)


def _fitted(approximation, geometry, prior=1.0, scale=1.0):
    layer, phi, y, pairs = _setup(2)
    model = nn.Sequential(nn.Identity(), layer)

    def miner(_emb, _y):
        return pairs

    la = MetricLaplace(
        model,
        approximation=approximation,
        geometry=geometry,
        margin=MARGIN,
        prior_precision=prior,
        hessian_scale=scale,
        hessian_structure="kron",
        hessian_pairs="inside_margin",  # the reference GGN drops negatives outside the margin
    )
    la.kron_tol = 1e-13
    la.fit([(phi, y)], miner=miner, progress=False)
    return la, layer, phi, pairs


def _perm() -> torch.Tensor:
    """Row-major [W | b] position of each parameters_to_vector entry."""
    idx = torch.arange(D * (F + 1)).reshape(D, F + 1)
    return torch.cat([idx[:, :F].reshape(-1), idx[:, F]])


def _dense_posterior_cov(la):
    """Dense covariance of the kron posterior, [W | b] row-major, from its stated formula."""
    q = torch.kron(la._kron.q_g, la._kron.q_a)
    prec = q @ torch.diag(la.posterior_precision) @ q.T
    return torch.linalg.inv(prec)


@pytest.mark.parametrize("approximation,geometry", COMBOS)
def test_closed_form_predictive_equals_dense_linearised_predictive(approximation, geometry):
    la, layer, phi, pairs = _fitted(approximation, geometry, prior=0.7, scale=1.3)
    exact = _exact_ggn(layer, phi, pairs, approximation, geometry)
    # the fitted curvature is the exact GGN's, rotated and clamped
    q = torch.kron(la._kron.q_g, la._kron.q_a)
    torch.testing.assert_close(la.hessian, torch.diagonal(q.T @ exact @ q), atol=1e-10, rtol=0)
    cov = _dense_posterior_cov(la)
    x = torch.cat([phi, phi[:5] * 3 + 1])
    z = layer(x).detach()
    jz = torch.einsum("de,nf->ndef", torch.eye(D, dtype=x.dtype), augment(x, True))
    jz = jz.reshape(x.shape[0], D, -1)
    nz = z.norm(dim=1)
    u = z / nz[:, None]
    proj = (torch.eye(D, dtype=x.dtype) - u[:, :, None] * u[:, None]) / nz[:, None, None]
    ju = proj @ jz
    ref_cov = ju @ cov @ ju.transpose(1, 2)
    emb, cov_u = la.predictive_covariance(x)
    torch.testing.assert_close(emb, u, atol=1e-12, rtol=0)
    torch.testing.assert_close(cov_u, ref_cov, atol=1e-10, rtol=0)
    out = la.predictive(x)
    trace = torch.diagonal(ref_cov, dim1=1, dim2=2).sum(1)
    from bayesurl.laplace import kappa_from_trace

    torch.testing.assert_close(out.kappa, kappa_from_trace(trace, D), rtol=1e-9, atol=0)
    _, var = la.predictive_variance(x)
    torch.testing.assert_close(
        var, torch.diagonal(jz @ cov @ jz.transpose(1, 2), dim1=1, dim2=2), atol=1e-10, rtol=0
    )


def test_samples_have_the_dense_covariance_and_evidence_matches_dense():
    la, layer, phi, _ = _fitted("positive", "euclidean", prior=0.5)
    cov = _dense_posterior_cov(la)
    perm = _perm()
    # sample() maps eps through L = Q diag(std): L L^T is the posterior covariance
    lmat = la._to_params(torch.diag(la.posterior_variance.sqrt()))  # [P basis, P params]
    torch.testing.assert_close(lmat.T @ lmat, cov[perm][:, perm], atol=1e-10, rtol=0)
    draws = la.sample(20000, generator=torch.Generator().manual_seed(0))
    emp = torch.cov((draws - la.mean).T)
    assert float((emp - cov[perm][:, perm]).abs().max()) < 0.05 * float(cov.diagonal().max())
    # evidence: -0.5 lam |theta|^2 + 0.5 P log lam - 0.5 logdet(precision), dense
    lam = 0.5
    prec = torch.linalg.inv(cov)
    ref = 0.5 * (
        -lam * float((la.mean**2).sum())
        + la.n_params * torch.log(torch.tensor(lam, dtype=torch.float64))
        - torch.logdet(prec)
    )
    torch.testing.assert_close(la.log_marginal_likelihood(), ref, atol=1e-10, rtol=0)


def test_per_parameter_prior_enters_through_its_basis_diagonal():
    la, *_ = _fitted("full", "arccos")
    lam = torch.linspace(0.5, 2.0, la.n_params, dtype=torch.float64)
    la.prior_precision = lam
    q = torch.kron(la._kron.q_g, la._kron.q_a)
    lam_rm = torch.zeros(la.n_params, dtype=torch.float64)
    lam_rm[_perm()] = lam
    expected = torch.diagonal(q.T @ torch.diag(lam_rm) @ q)
    prior = la.posterior_precision - la.hessian.clamp_min(0)
    torch.testing.assert_close(prior, expected, atol=1e-12, rtol=0)
    # a constant per-parameter prior is the scalar prior
    la.prior_precision = torch.full((la.n_params,), 0.8, dtype=torch.float64)
    lml_vec = la.log_marginal_likelihood()
    la.prior_precision = 0.8
    torch.testing.assert_close(la.log_marginal_likelihood(), lml_vec, atol=1e-12, rtol=0)


def test_optimize_prior_precision_maximises_kron_evidence():
    la, *_ = _fitted("fixed", "arccos")
    best = la.optimize_prior_precision()
    for factor in (0.9, 1.1):
        assert float(la.log_marginal_likelihood(best * factor)) < float(
            la.log_marginal_likelihood(best)
        )


@pytest.mark.parametrize("memory", ["ekfac", "factors"])
@pytest.mark.parametrize("approximation,geometry", [("fixed", "arccos"), ("full", "arccos")])
def test_online_update_is_the_nearest_kronecker_of_the_decayed_sum(memory, approximation, geometry):
    layer, phi, _, pairs = _setup(3)
    blocks1, inputs = _blocks(layer, phi, pairs, approximation, geometry)
    with torch.no_grad():
        layer.weight.add_(0.1)
    blocks2, _ = _blocks(layer, phi, pairs, approximation, geometry)
    opts = {"clamp_batch": True, "tol": 1e-14, "max_iter": 5000}
    post = KronPosterior(D, F, True)
    s1, _ = post.update(blocks1, inputs, **opts)
    g1, a1, q1 = post.g, post.a, torch.kron(post.q_g, post.q_a)
    old = q1 @ torch.diag(s1) @ q1.T  # the EKFAC curvature after step 1
    decay = 0.7
    s2, _ = post.update(blocks2, inputs, s1, decay=decay, memory=memory, **opts)
    ggn2 = dense_ggn(blocks2, inputs)
    kept = old if memory == "ekfac" else torch.kron(g1, a1)
    g_ref, a_ref = nearest_kronecker_svd(decay * kept + ggn2, D, F + 1)
    torch.testing.assert_close(
        torch.kron(post.g, post.a), torch.kron(g_ref, a_ref), atol=1e-10, rtol=0
    )
    q2 = torch.kron(post.q_g, post.q_a)
    expected = decay * torch.diagonal(q2.T @ old @ q2) + torch.diagonal(q2.T @ ggn2 @ q2).clamp_min(
        0
    )
    torch.testing.assert_close(s2, expected, atol=1e-10, rtol=0)
    # the ALS warm-started at the old A reaches the same factors
    warm = KronPosterior(D, F, True)
    warm.update(blocks1, inputs, **opts)
    warm.update(blocks2, inputs, s1, decay=decay, memory=memory, warm_start=True, **opts)
    torch.testing.assert_close(
        torch.kron(warm.g, warm.a), torch.kron(post.g, post.a), atol=1e-10, rtol=0
    )
    with pytest.raises(ValueError, match="memory"):
        post.update(blocks2, inputs, s2, decay=decay, memory="sum")


def test_online_kron_training_keeps_a_finite_psd_posterior():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)).double()
    x = torch.randn(64, 6, dtype=torch.float64)
    y = torch.arange(64) % 4
    la = MetricLaplace(net, mode="online", hessian_structure="kron", dataset_size=64, alpha=0.1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        la.online_step(x, y, opt, generator=g)
        assert bool((la.hessian >= 0).all())  # per-batch clamp: S never goes negative
        assert bool(torch.isfinite(la.posterior_variance).all())
    assert la._kron.fitted and float(la.hessian.sum()) > 0
    assert bool(torch.isfinite(la.predictive(x).uncertainty).all())


def test_kron_state_dict_roundtrip_weights_only():
    la, layer, phi, _ = _fitted("full", "euclidean", prior=0.3)
    buf = io.BytesIO()
    torch.save(la.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    other = MetricLaplace(nn.Sequential(nn.Identity(), layer), hessian_structure="kron")
    other.load_state_dict(state)
    torch.testing.assert_close(other.predictive(phi).kappa, la.predictive(phi).kappa)
    diag = MetricLaplace(nn.Sequential(nn.Identity(), layer))
    with pytest.raises(ValueError, match="'kron' posterior"):
        diag.load_state_dict(state)
    bad = dict(state)
    bad["eigvecs_a"] = bad["eigvecs_a"][:-1]
    with pytest.raises(ValueError, match="eigvecs_a"):
        other.load_state_dict(bad)


def test_unknown_structure_rejected():
    with pytest.raises(ValueError, match="hessian_structure"):
        MetricLaplace(nn.Linear(3, 2), hessian_structure="full")


# ---------------------------------------------------------------------- MLP head, per layer
def _head_setup(seed: int = 4):
    from collections import OrderedDict

    torch.manual_seed(seed)
    head = nn.Sequential(nn.Linear(F, 5), nn.Tanh(), nn.Linear(5, D)).double()
    model = nn.Sequential(OrderedDict(backbone=nn.Identity(), head=head))
    _, phi, y, pairs = _setup(seed)
    return model, head, phi, y, pairs


def _exact_head_ggn(head, phi, pairs, approximation, geometry):
    """Dense pair GGN over all head parameters, each layer's block in [W | b] row-major."""
    from torch.func import functional_call

    names = [n for n, _ in head.named_parameters()]
    shapes = [p.shape for _, p in head.named_parameters()]
    theta = torch.nn.utils.parameters_to_vector(head.parameters()).detach()

    def unflat(t):
        out, i = {}, 0
        for n, s in zip(names, shapes):
            out[n] = t[i : i + s.numel()].reshape(s)
            i += s.numel()
        return out

    z = head(phi).detach()
    a1, p, a2, n = split_pairs(pairs, phi.shape[0])
    u = nn.functional.normalize(z, dim=1)
    terms = [(int(i), int(j), 1.0) for i, j in zip(a1, p)]
    if approximation != "positive":
        terms += [
            (int(i), int(j), -1.0) for i, j in zip(a2, n) if float((u[i] - u[j]).norm()) < MARGIN
        ]
    eye = torch.eye(D, dtype=phi.dtype)
    total = torch.zeros(theta.numel(), theta.numel(), dtype=phi.dtype)
    for i, j, sign in terms:
        x = phi[[i, j]]
        if geometry == "euclidean":

            def f(t, x=x):
                return nn.functional.normalize(
                    functional_call(head, unflat(t), (x,)), dim=1
                ).reshape(-1)

            h = torch.cat([torch.cat([eye, -eye], 1), torch.cat([-eye, eye], 1)])
        else:

            def f(t, x=x):
                return functional_call(head, unflat(t), (x,)).reshape(-1)

            h = hessian(lambda q: 1 - (q[:D] @ q[D:]) / (q[:D].norm() * q[D:].norm()))(
                f(theta).detach()
            )
        if approximation == "fixed":
            h = h.clone()
            h[:D, D:] = 0
            h[D:, :D] = 0
        jac = jacrev(f)(theta)
        total += sign * jac.T @ h @ jac
    # per-layer blocks in [W | b] row-major
    blocks, start = [], 0
    for lin in [m for m in head if isinstance(m, nn.Linear)]:
        d, f_in = lin.out_features, lin.in_features
        k = d * (f_in + 1)
        idx = torch.arange(k).reshape(d, f_in + 1)
        order = torch.cat([idx[:, :f_in].reshape(-1), idx[:, f_in]])  # vector pos -> row-major
        blk = total[start : start + k, start : start + k]
        rm = torch.zeros_like(blk)
        rm[order[:, None], order[None, :]] = blk
        blocks.append(rm)
        start += k
    return blocks


@pytest.mark.parametrize("approximation,geometry", [("fixed", "arccos"), ("full", "euclidean")])
def test_mlp_head_per_layer_kron_matches_the_exact_block_diagonal_ggn(approximation, geometry):
    from bayesurl.laplace.kron_head import KronHeadLaplace

    model, head, phi, y, pairs = _head_setup()
    la = KronHeadLaplace(
        model,
        "head",
        approximation=approximation,
        geometry=geometry,
        margin=MARGIN,
        prior_precision=0.6,
        hessian_scale=1.2,
    )
    la.kron_tol, la.kron_max_iter = 1e-14, 5000
    la.fit([(phi, y)], miner=lambda e, t: pairs)
    exact = _exact_head_ggn(head, phi, pairs, approximation, geometry)
    covs = []
    for post, s, blk in zip(la.posteriors, la.curvature, exact):
        g_ref, a_ref = nearest_kronecker_svd(blk, post.d, post.width)
        torch.testing.assert_close(
            torch.kron(post.g, post.a), torch.kron(g_ref, a_ref), atol=1e-10, rtol=0
        )
        q = torch.kron(post.q_g, post.q_a)
        torch.testing.assert_close(s, torch.diagonal(q.T @ blk @ q), atol=1e-10, rtol=0)
        prec = q @ torch.diag(1.2 * s.clamp_min(0) + 0.6) @ q.T
        covs.append(torch.linalg.inv(prec))
    cov = torch.block_diag(*covs)  # row-major per layer
    # dense linearised predictive: J_u of the normalised head output w.r.t. row-major params
    from torch.func import functional_call

    lins = [m for m in head if isinstance(m, nn.Linear)]

    def from_rowmajor(t):
        params, i = {}, 0
        for k, lin in zip([0, 2], lins):
            d, f_in = lin.out_features, lin.in_features
            m = t[i : i + d * (f_in + 1)].reshape(d, f_in + 1)
            params[f"{k}.weight"], params[f"{k}.bias"] = m[:, :f_in], m[:, f_in]
            i += d * (f_in + 1)
        return params

    theta_rm = torch.cat(
        [torch.cat([lin.weight, lin.bias[:, None]], 1).reshape(-1) for lin in lins]
    ).detach()
    x = torch.cat([phi[:6], phi[:3] * 2])

    def emb(t):
        return nn.functional.normalize(functional_call(head, from_rowmajor(t), (x,)), dim=1)

    ju = jacrev(emb)(theta_rm)  # [N, D, P]
    ref = torch.einsum("ndp,pq,neq->nde", ju, cov, ju)
    u, cov_u = la.predictive_covariance(x)
    torch.testing.assert_close(cov_u, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(u, emb(theta_rm).detach(), atol=1e-12, rtol=0)
    trace = torch.diagonal(ref, dim1=1, dim2=2).sum(1)
    from bayesurl.laplace import kappa_from_trace

    torch.testing.assert_close(
        la.predictive(x).kappa, kappa_from_trace(trace, D), rtol=1e-9, atol=0
    )
    # evidence and samples from the same block-diagonal posterior
    perm_cov = cov  # samples are in parameters_to_vector order: compare their covariance
    draws = la.sample(20000, generator=torch.Generator().manual_seed(0)) - la.mean
    assert draws.shape[1] == perm_cov.shape[0]
    ref_lml = 0.5 * (
        -0.6 * float((la.mean**2).sum())
        + la.n_params * torch.log(torch.tensor(0.6, dtype=torch.float64))
        - torch.logdet(torch.block_diag(*[torch.linalg.inv(c) for c in covs]))
    )
    torch.testing.assert_close(la.log_marginal_likelihood(), ref_lml, atol=1e-10, rtol=0)
    best = la.optimize_prior_precision()
    assert float(la.log_marginal_likelihood(best)) >= float(la.log_marginal_likelihood(best * 1.1))


def test_mlp_head_rejects_bad_heads():
    from bayesurl.laplace.kron_head import KronHeadLaplace

    model, head, *_ = _head_setup()
    with pytest.raises(ValueError, match="head"):
        KronHeadLaplace(model, "nope")
    ends_in_relu = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with pytest.raises(ValueError, match="end in an nn.Linear"):
        KronHeadLaplace(nn.Sequential(ends_in_relu), ends_in_relu)
    bn = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="parameter-free"):
        KronHeadLaplace(nn.Sequential(bn), bn)
    with pytest.raises(ValueError, match="prior_precision"):
        KronHeadLaplace(model, head, prior_precision=-1.0)
    one = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with pytest.raises(ValueError, match="D >= 2"):
        KronHeadLaplace(nn.Sequential(one), one)
    la = KronHeadLaplace(model, head)
    bad = torch.zeros(3, F, dtype=torch.float64)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="x"):
        la.predictive(bad)


def test_diag_predictive_covariance_equals_dense_linearised_predictive():
    layer, phi, y, pairs = _setup(5)
    la = MetricLaplace(
        nn.Sequential(nn.Identity(), layer),
        approximation="full",
        margin=MARGIN,
        prior_precision=0.4,
    )
    la.fit([(phi, y)], miner=lambda e, t: pairs, progress=False)
    var_rm = torch.zeros_like(la.posterior_variance)
    var_rm[_perm()] = la.posterior_variance  # [W | b] row-major
    cov = torch.diag(var_rm)
    z = layer(phi).detach()
    jz = torch.einsum("de,nf->ndef", torch.eye(D, dtype=phi.dtype), augment(phi, True))
    jz = jz.reshape(N, D, -1)
    nz = z.norm(dim=1)
    u = z / nz[:, None]
    proj = (torch.eye(D, dtype=phi.dtype) - u[:, :, None] * u[:, None]) / nz[:, None, None]
    ref = proj @ jz @ cov @ jz.transpose(1, 2) @ proj
    emb, cov_u = la.predictive_covariance(phi)
    torch.testing.assert_close(cov_u, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(emb, u, atol=1e-12, rtol=0)


def test_mlp_head_state_dict_roundtrip_weights_only():
    from bayesurl.laplace.kron_head import KronHeadLaplace

    model, head, phi, y, pairs = _head_setup()
    la = KronHeadLaplace(model, "head", approximation="positive", margin=MARGIN)
    la.fit([(phi, y)], miner=lambda e, t: pairs)
    buf = io.BytesIO()
    torch.save(la.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    other = KronHeadLaplace(model, "head")
    other.load_state_dict(state)
    torch.testing.assert_close(other.predictive(phi).kappa, la.predictive(phi).kappa)
    with torch.no_grad():
        head[0].weight.add_(1.0)
    with pytest.raises(ValueError, match="another head"):
        KronHeadLaplace(model, "head").load_state_dict(state)


def test_fit_without_reset_adds_to_the_kron_posterior():
    layer, phi, y, pairs = _setup(6)
    model = nn.Sequential(nn.Identity(), layer)
    la = MetricLaplace(model, approximation="full", margin=MARGIN, hessian_structure="kron",
                       hessian_pairs="inside_margin")  # fmt: skip
    la.kron_tol = 1e-14
    la.kron_max_iter = 5000
    half = N // 2
    first = tuple(t[:half] for t in pairs)
    second = tuple(t[half:] for t in pairs)
    la.fit([(phi, y)], miner=lambda e, t: first, progress=False)
    q1 = torch.kron(la._kron.q_g, la._kron.q_a)
    old = q1 @ torch.diag(la.hessian) @ q1.T
    la.fit([(phi, y)], miner=lambda e, t: second, reset=False, progress=False)
    blocks, inputs = _blocks(layer, phi, second, "full", "arccos")
    ggn2 = dense_ggn(blocks, inputs)
    g_ref, a_ref = nearest_kronecker_svd(old + ggn2, D, F + 1)
    torch.testing.assert_close(
        torch.kron(la._kron.g, la._kron.a), torch.kron(g_ref, a_ref), atol=1e-10, rtol=0
    )
    q2 = torch.kron(la._kron.q_g, la._kron.q_a)
    torch.testing.assert_close(
        la.hessian, torch.diagonal(q2.T @ (old + ggn2) @ q2), atol=1e-10, rtol=0
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    d=st.integers(1, 4),
    f=st.integers(1, 5),
    combo=st.sampled_from(COMBOS),
)
def test_eigencorrection_in_any_kronecker_basis_is_the_rotated_diagonal(seed, d, f, combo):
    """Property: for any orthonormal Q_G (x) Q_A, S = diag(Q^T GGN Q); and the ALS product is
    the least-squares Kronecker fit (its residual is orthogonal to it)."""
    approximation, geometry = combo
    g = torch.Generator().manual_seed(seed)
    n = 10
    phi = torch.randn(n, f, generator=g, dtype=torch.float64)
    z = torch.randn(n, d, generator=g, dtype=torch.float64) + 0.5
    a1 = torch.arange(n)
    pairs = (a1, (a1 + 1) % n, a1, (a1 + 3) % n)
    blocks = contrastive_blocks(
        z, pairs, approximation=approximation, geometry=geometry, margin=10.0
    )
    inputs = augment(phi, True)
    ggn = dense_ggn(blocks, inputs)
    q_g = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    q_a = torch.linalg.qr(torch.randn(f + 1, f + 1, generator=g, dtype=torch.float64))[0]
    q = torch.kron(q_g, q_a)
    s = eigencorrected_curvature(blocks, inputs, q_g, q_a).reshape(-1)
    scale = float(ggn.abs().max())
    atol = 1e-12 + 1e-10 * scale
    torch.testing.assert_close(s, torch.diagonal(q.T @ ggn @ q), atol=atol, rtol=0)
    if float(ggn.norm()) > 1e-6:
        gk, ak = kron_factors(blocks, inputs, max_iter=20000, tol=1e-13)
        prod = torch.kron(gk, ak)
        resid = ggn - prod
        assert abs(float((resid * prod).sum())) <= 1e-8 * float(ggn.norm()) ** 2
