"""Credible image intervals: vMF cosine quantile vs closed form / scipy quadrature, coverage
against scipy's vMF sampler, retrieval vs a brute-force loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, optimize
from scipy.stats import vonmises_fisher

from bayesurl.posthoc.credible import (
    credible_mask,
    credible_threshold,
    retrieve,
    vmf_cosine_quantile,
)


def _scipy_quantile(kappa: float, dim: int, q: float) -> float:
    """Quantile of w = 1 - x / kappa from quad + brentq, independent of the library's grid.

    With x = kappa (1 - w) the density is exp(-x) x^e (2 kappa - x)^e, e = (D - 3) / 2, on
    [0, 2 kappa]. For D = 2 (e < 0) the endpoint factors go into quad's algebraic weights, so
    the integrable singularities are handled exactly; for D >= 3 the smooth density is scaled
    by its value at the mode and integrated with the mode as a break point.
    """
    e = (dim - 3) / 2.0
    top = 2.0 * kappa
    if e < 0:
        mid = min(kappa, 300.0)

        def head(b):
            return integrate.quad(
                lambda x: math.exp(-x) * (1 - x / top) ** e, 0.0, b, weight="alg", wvar=(e, 0.0)
            )[0]

        def tail(a):
            if top > 600.0:  # beyond x = 300 the mass is below e^-250
                f = lambda x: math.exp(-x) * x**e * (1 - x / top) ** e  # noqa: E731
                return integrate.quad(f, a, np.inf)[0]
            return integrate.quad(
                lambda x: math.exp(-x) * x**e / top**e, a, top, weight="alg", wvar=(0.0, e)
            )[0]
    else:
        # mode of -x + e log x + e log(top - x)
        b_ = top + 2 * e
        mode = (b_ - math.sqrt(b_ * b_ - 4 * e * top)) / 2 if e > 0 else 0.0

        def logf(x):
            if e == 0:
                return -x
            if x <= 0 or x >= top:
                return -math.inf
            return -x + e * math.log(x) + e * math.log(top - x)

        c = logf(mode) if e > 0 else 0.0
        mid = mode
        upper = min(top, mode + 80.0 + 15 * math.sqrt(e + 1))

        def f(x):
            return math.exp(logf(x) - c)

        def head(b):
            return integrate.quad(f, 0.0, b, limit=200)[0]

        def tail(a):
            return integrate.quad(f, a, upper, limit=200)[0]

    total = head(mid) + tail(mid)

    def cdf_x(x):
        return head(x) / total if x <= mid else 1.0 - tail(x) / total

    hi = top * (1 - 1e-15)
    x_star = optimize.brentq(lambda x: cdf_x(x) - (1.0 - q), 1e-300, hi, xtol=1e-14, rtol=1e-13)
    return 1.0 - x_star / kappa


@pytest.mark.parametrize("q", [0.05, 0.5, 0.99])
def test_d3_closed_form_vs_numerical_and_analytic_cdf(q):
    kappa = torch.tensor([0.0, 1e-4, 0.3, 2.0, 20.0, 300.0, 1e5], dtype=torch.float64)
    closed = vmf_cosine_quantile(kappa, 3, q)
    numeric = vmf_cosine_quantile(kappa, 3, q, method="numerical")
    assert torch.allclose(closed, numeric, atol=2e-6, rtol=0)
    # the closed form satisfies the analytic CDF F(w) = (e^{kw} - e^{-k}) / (e^k - e^{-k})
    for k, w in zip(kappa[1:].tolist(), closed[1:].tolist()):
        log_num = k * (w - 1) + math.log1p(-math.exp(-k * (w + 1)))
        log_den = math.log1p(-math.exp(-2 * k))
        assert math.exp(log_num - log_den) == pytest.approx(q, rel=1e-9)
    assert float(closed[0]) == pytest.approx(2 * q - 1)


# sqrt(top - x) at D = 4 makes quad warn near the far end; the answers agree to 2e-6 anyway
@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("dim", [2, 4, 16, 128])
@pytest.mark.parametrize("kappa", [0.5, 8.0, 200.0])
def test_general_dim_vs_scipy_quadrature(dim, kappa):
    got = float(vmf_cosine_quantile(torch.tensor([kappa], dtype=torch.float64), dim, 0.1))
    want = _scipy_quantile(kappa, dim, 0.1)
    assert got == pytest.approx(want, abs=2e-6)


def test_large_dim_and_extreme_kappa_stay_finite_and_monotone():
    kappa = torch.logspace(-3, 8, 23, dtype=torch.float64)
    for dim in (2, 3, 64, 2048):
        t = vmf_cosine_quantile(kappa, dim, 0.05)
        assert torch.isfinite(t).all()
        assert bool((t.diff() >= -1e-9).all()), dim  # more concentrated -> higher threshold
        assert bool((t <= 1).all() and (t >= -1).all())
    inf = vmf_cosine_quantile(torch.tensor([math.inf]), 10, 0.05)
    assert float(inf) == 1.0


@pytest.mark.parametrize("dim,kappa", [(3, 4.0), (3, 60.0), (10, 25.0), (32, 80.0)])
def test_coverage_matches_p_on_scipy_samples(dim, kappa):
    p, n = 0.9, 20000
    rng = np.random.default_rng(dim)
    mu = rng.standard_normal(dim)
    mu /= np.linalg.norm(mu)
    z = vonmises_fisher(mu, kappa).rvs(n, random_state=rng)
    t = float(credible_threshold(torch.tensor(kappa, dtype=torch.float64), dim, p))
    coverage = float(np.mean(z @ mu >= t))
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(coverage - p) < 4.5 * sigma, (coverage, p)


def test_retrieve_matches_brute_force_loop():
    g = torch.Generator().manual_seed(0)
    gallery = torch.randn(60, 5, generator=g, dtype=torch.float64)
    query = torch.randn(7, 5, generator=g, dtype=torch.float64)
    kappa = torch.tensor([0.5, 2.0, 5.0, 10.0, 40.0, 200.0, 1e4], dtype=torch.float64)
    hits = retrieve(query, kappa, gallery, p=0.8, chunk_size=3)
    mask = credible_mask(query, kappa, gallery, p=0.8, chunk_size=2)
    for i in range(7):
        t = _scipy_quantile(float(kappa[i]), 5, 0.2)
        qi = query[i] / query[i].norm()
        want = []
        for j in range(60):
            cos = float(qi @ (gallery[j] / gallery[j].norm()))
            if cos >= t + 1e-9:
                want.append((cos, j))
            elif cos > t - 1e-9:  # too close to the threshold to call
                pytest.skip("a gallery item lies on the threshold")
        want = [j for _, j in sorted(want, reverse=True)]
        assert hits[i].tolist() == want
        assert sorted(mask[i].nonzero().squeeze(1).tolist()) == sorted(want)
    sizes = [len(h) for h in hits]
    assert sizes == sorted(sizes, reverse=True)  # sharper posterior, smaller interval


def test_float32_inputs_and_scalar_kappa():
    gallery = torch.nn.functional.normalize(torch.randn(30, 3), dim=1)
    hits = retrieve(gallery[:4], 10.0, gallery, p=0.95)
    assert len(hits) == 4 and all(h.dtype == torch.int64 for h in hits)
    assert all(int(i) in h.tolist() for i, h in enumerate(hits))  # the query itself
    assert credible_threshold(torch.tensor([3.0]), 3).dtype == torch.float32


def test_accepts_outputs_with_kappa():
    from bayesurl.types import Output

    g = torch.nn.functional.normalize(torch.randn(40, 3, dtype=torch.float64), dim=1)
    kappa = torch.tensor([3.0, 300.0], dtype=torch.float64)
    q = Output(embedding=g[:2], uncertainty=1 / kappa, kappa=kappa)
    gal = Output(embedding=g, uncertainty=torch.ones(40, dtype=torch.float64))
    got = retrieve(q, None, gal, p=0.9)
    want = retrieve(g[:2], kappa, g, p=0.9)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="without `kappa`"):
        retrieve(Output(embedding=g[:2], uncertainty=1 / kappa), None, g)
    with pytest.raises(ValueError, match="required"):
        retrieve(g[:2], None, g)


def test_bad_input():
    g = torch.randn(10, 4)
    with pytest.raises(ValueError, match="`p`"):
        retrieve(g[:2], 1.0, g, p=1.0)
    with pytest.raises(ValueError, match="dimensions"):
        retrieve(g[:2, :3], 1.0, g)
    with pytest.raises(ValueError, match="query_kappa"):
        retrieve(g[:2], torch.tensor([1.0, -1.0]), g)
    with pytest.raises(ValueError, match="length mismatch"):
        retrieve(g[:2], torch.tensor([1.0, 2.0, 3.0]), g)
    bad = g.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="`gallery`"):
        retrieve(g[:2], 1.0, bad)
    with pytest.raises(ValueError, match="`query_mu`"):
        retrieve(torch.zeros(1, 4), 1.0, g)
    with pytest.raises(ValueError, match="dim"):
        vmf_cosine_quantile(1.0, 1, 0.5)
    with pytest.raises(ValueError, match="closed form"):
        vmf_cosine_quantile(1.0, 4, 0.5, method="closed_form")
    with pytest.raises(ValueError, match="kappa"):
        vmf_cosine_quantile(torch.tensor([float("nan")]), 3, 0.5)
