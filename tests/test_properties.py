"""Property-based tests over the public entry points.

Random shapes, dtypes, NaN / inf placement and label patterns go into ``evaluate``, the vMF
functions, ``sample_vmf``, ``MetricLaplace``, ``wrap(..., "pvu")`` and the ``bayesurl evaluate``
command. Every call either raises ``ValueError`` / ``TypeError`` / ``FileNotFoundError`` whose
message names the argument, or returns finite results that agree with a reference
(brute-force loops, scikit-learn, scipy). Example counts are set per test (``N_*`` below)
and add up to :data:`CASES`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from bayesurl.distributions import sample_vmf, vmf_log_normalizer, vmf_mean_resultant_length
from bayesurl.evaluation import evaluate

N_EVAL, N_VMF, N_SAMPLE, N_LAPLACE, N_PVU, N_CLI = 200, 200, 100, 40, 20, 60
#: examples run by this module (the issue's "case count")
CASES = N_EVAL + N_VMF + N_SAMPLE + N_LAPLACE + N_PVU + N_CLI
SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16}


def _names_one_of(exc: BaseException, names: tuple[str, ...]) -> bool:
    return any(f"`{n}" in str(exc) or n in str(exc) for n in names)


# ---------------------------------------------------------------------------------- evaluate


@st.composite
def _eval_inputs(draw):
    n = draw(st.integers(0, 24))
    d = draw(st.integers(1, 5))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    x = rng.normal(size=(n, d))
    pattern = draw(st.sampled_from(["random", "one_class", "distinct", "pairs"]))
    if pattern == "random":
        y = rng.integers(0, 3, size=n)
    elif pattern == "one_class":
        y = np.zeros(n, dtype=int)
    elif pattern == "distinct":
        y = np.arange(n)
    else:
        y = np.arange(n) // 2
    u = rng.random(n) if draw(st.booleans()) else None
    # corruptions
    bad = draw(st.sampled_from(["none", "none", "nan_x", "inf_x", "nan_u", "len_y", "len_u"]))
    if bad == "nan_x" and x.size:
        x.flat[draw(st.integers(0, x.size - 1))] = math.nan
    elif bad == "inf_x" and x.size:
        x.flat[draw(st.integers(0, x.size - 1))] = -math.inf
    elif bad == "nan_u" and u is not None and n:
        u[draw(st.integers(0, n - 1))] = math.nan
    elif bad == "len_y":
        y = y[:-1] if n else np.zeros(1, dtype=int)
    elif bad == "len_u" and u is not None:
        u = np.concatenate([u, [0.5]])
    return x, y, u, DTYPES[dtype]


def _reference_r1_bounds(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """R@1 by a brute-force loop; ties within 1e-5 make it an interval."""
    xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
    lo = hi = 0
    n = len(y)
    for i in range(n):
        sims = [float(xn[i] @ xn[j]) if j != i else -np.inf for j in range(n)]
        best = max(sims)
        tied = [j for j in range(n) if sims[j] >= best - 1e-5]
        lo += all(y[j] == y[i] for j in tied)
        hi += any(y[j] == y[i] for j in tied)
    return lo / n, hi / n


@settings(max_examples=N_EVAL, **SETTINGS)
@given(_eval_inputs())
def test_evaluate_raises_named_or_agrees_with_brute_force(inputs):
    from sklearn.metrics import roc_auc_score

    x, y, u, dtype = inputs
    xt = torch.tensor(x, dtype=dtype)
    ut = None if u is None else torch.tensor(u)
    try:
        res = evaluate(xt, torch.tensor(y), uncertainties=ut)
    except (ValueError, TypeError) as exc:
        assert _names_one_of(exc, ("embeddings", "labels", "uncertainties", "samples")), exc
        bad = (
            len(y) != len(x)
            or (u is not None and len(u) != len(x))
            or not np.isfinite(x).all()
            or (u is not None and not np.isfinite(u).all())
            or len(x) < 2
            or (dtype == torch.float16 and not np.isfinite(x.astype(np.float16)).all())
        )
        assert bad, f"valid input refused: {exc}"
        return
    assert np.isfinite(x).all() and len(x) >= 2 and len(y) == len(x)
    xf = xt.double().numpy()  # the values evaluate saw
    if (np.linalg.norm(xf, axis=1) == 0).any():
        return  # zero rows: no direction, r@1 only bounded by [0, 1]
    lo, hi = _reference_r1_bounds(xf, y)
    assert lo - 1e-12 <= res["r@1"] <= hi + 1e-12
    for key in ("r@1", "map@5", "r_auroc", "ausc", "ause"):
        v = res.get(key)
        assert v is None or math.isfinite(v), key
    if u is not None and res["r_auroc"] is not None and lo == hi:
        # R-AUROC: AUROC of u as a score for "R@1 is wrong" (sklearn reference)
        xn = xf / np.linalg.norm(xf, axis=1, keepdims=True)
        sims = xn @ xn.T
        np.fill_diagonal(sims, -np.inf)
        wrong = y[np.argmax(sims, axis=1)] != y
        if 0 < wrong.sum() < len(y):
            assert res["r_auroc"] == pytest.approx(roc_auc_score(wrong, u), abs=1e-9)


# ---------------------------------------------------------------------------------- vMF


@settings(max_examples=N_VMF, **SETTINGS)
@given(
    kappa=st.one_of(
        st.floats(0, 1e300),
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(-1e3, -1e-30),
    ),
    d=st.integers(0, 300),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_vmf_functions_raise_named_or_are_finite_and_correct(kappa, d, dtype):
    k = torch.tensor(kappa, dtype=torch.float64).to(dtype)
    kappa = float(k)  # the value in this dtype (-1e-225 is -0.0 in float32)
    try:
        lc = vmf_log_normalizer(k, d)
        a = vmf_mean_resultant_length(k, d)
    except ValueError as exc:
        assert _names_one_of(exc, ("kappa", "dim")), exc
        assert d < 2 or math.isnan(kappa) or kappa < 0
        return
    assert d >= 2 and not math.isnan(kappa) and kappa >= 0
    assert 0.0 <= float(a) <= 1.0
    if math.isinf(float(k)):
        assert float(lc) == math.inf and float(a) == 1.0
        return
    assert math.isfinite(float(lc))
    kv = float(k)
    v = d / 2 - 1
    if 1e-3 <= kv <= 1e4 and scipy.special.ive(d / 2, kv) > 1e-250:
        # scipy's exponentially scaled Bessel function as the reference, where it does not
        # underflow (I_99(0.06) does; the mpmath tests in distributions/ cover that range)
        ref = (
            v * math.log(kv)
            - d / 2 * math.log(2 * math.pi)
            - (math.log(scipy.special.ive(v, kv)) + kv)
        )
        tol = 1e-5 if dtype == torch.float32 else 1e-9
        assert float(lc) == pytest.approx(ref, rel=tol, abs=tol)
        ref_a = scipy.special.ive(d / 2, kv) / scipy.special.ive(v, kv)
        assert float(a) == pytest.approx(ref_a, rel=tol, abs=tol)


@settings(max_examples=N_SAMPLE, **SETTINGS)
@given(
    n=st.integers(0, 4),
    d=st.integers(1, 6),
    log_kappa=st.floats(-3, 30),
    corrupt=st.sampled_from(["none", "zero_row", "nan", "inf_kappa", "neg_kappa"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 1000),
)
def test_sample_vmf_raises_named_or_gives_unit_vectors(n, d, log_kappa, corrupt, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, d, generator=g, dtype=dtype)
    kappa = torch.full((n,), 10.0**log_kappa, dtype=dtype)
    if corrupt == "zero_row" and n:
        mu[0] = 0.0
    elif corrupt == "nan" and n:
        mu[-1, 0] = math.nan
    elif corrupt == "inf_kappa" and n:
        kappa[0] = math.inf
    elif corrupt == "neg_kappa" and n:
        kappa[0] = -1.0
    try:
        z = sample_vmf(mu, kappa, 3, generator=g)
    except ValueError as exc:
        assert _names_one_of(exc, ("mu", "kappa", "dim")), exc
        assert d < 2 or (n and corrupt in ("zero_row", "nan", "neg_kappa"))
        return
    assert z.shape == (3, n, d) and z.dtype == dtype
    assert torch.isfinite(z).all()
    if n:
        assert torch.allclose(z.norm(dim=-1), torch.ones((), dtype=dtype), atol=1e-5)
        if corrupt == "inf_kappa":
            assert torch.allclose(z[:, 0], torch.nn.functional.normalize(mu[:1], dim=1))


# ---------------------------------------------------------------------------------- Laplace


@settings(max_examples=N_LAPLACE, **SETTINGS)
@given(
    d=st.integers(1, 4),
    n=st.integers(2, 12),
    classes=st.integers(1, 4),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    nan_at=st.one_of(st.none(), st.integers(0, 10_000)),
)
def test_metric_laplace_raises_named_or_gives_finite_u(d, n, classes, dtype, nan_at):
    pytest.importorskip("pytorch_metric_learning")
    from bayesurl.laplace import MetricLaplace

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, d))
    x = torch.randn(n, 3, dtype=dtype)
    y = torch.arange(n) % classes
    if nan_at is not None:
        x.view(-1)[nan_at % x.numel()] = math.nan
    la = MetricLaplace(model)
    try:
        la.fit([(x, y)], progress=False)
        out = la.predictive(x)
    except ValueError as exc:
        assert _names_one_of(exc, ("x", "last_layer", "pair", "loader")), exc
        assert d == 1 or nan_at is not None or classes == 1 or "pair" in str(exc)
        return
    assert d >= 2 and nan_at is None
    assert torch.isfinite(out.uncertainty).all() and (out.uncertainty > 0).all()
    assert torch.allclose(out.embedding.norm(dim=1), torch.ones(()), atol=1e-5)


# ---------------------------------------------------------------------------------- post hoc


@settings(max_examples=N_PVU, **SETTINGS)
@given(
    batch=st.integers(1, 6),
    n_batches=st.integers(0, 3),
    classes=st.integers(1, 8),
    temperature=st.sampled_from([0.1, 1.0, 0.0, -1.0]),
)
def test_pvu_fit_trains_or_raises_named(batch, n_batches, classes, temperature):
    from bayesurl.posthoc import wrap

    torch.manual_seed(0)
    enc = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    loader = [
        (torch.randn(batch, 1, 2, 2), (torch.arange(batch) + i * batch) % classes)
        for i in range(n_batches)
    ]
    try:
        w = wrap(enc, "pvu", hidden=4, temperature=temperature)
        w.fit(loader, cached=False, progress=False)
    except ValueError as exc:
        assert _names_one_of(exc, ("temperature", "loader", "could not train")), exc
        return
    assert temperature > 0 and w.fitted and n_batches > 0
    with torch.no_grad():
        emb, u = w(torch.randn(5, 1, 2, 2))
    assert torch.isfinite(u).all() and u.shape == (5,)


# ---------------------------------------------------------------------------------- CLI


@settings(max_examples=N_CLI, **SETTINGS)
@given(
    device=st.one_of(
        st.sampled_from(["cpu", "cpu:0", "cuda", "cuda:7", "mps", "bogus", ""]),
        st.text("abcdpu:0-9", min_size=1, max_size=6),
    ),  # fmt: skip
    ks=st.lists(st.sampled_from(["1", "5", "0", "-2", "2.7", "x"]), min_size=1, max_size=3),
)
def test_cli_evaluate_exits_0_or_one_line_2(tmp_path_factory, device, ks):
    import contextlib
    import io

    from bayesurl.cli import main

    path = tmp_path_factory.mktemp("npz") / "x.npz"
    rng = np.random.default_rng(0)
    np.savez(path, embeddings=rng.normal(size=(12, 3)), labels=np.arange(12) % 3)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(["evaluate", str(path), "--device", device, "--ks", *ks])
        except SystemExit as exc:  # argparse: an unparsable value
            code = exc.code
    text = err.getvalue()
    if code == 0:
        assert text == "" and "r@1" in out.getvalue()
        assert torch.device(device).type == "cpu" and all(k in ("1", "5") for k in ks)
    else:
        assert code == 2 and text.count("\n") == 1 and "Traceback" not in text, text
        assert "--device" in text or "--ks" in text, text
