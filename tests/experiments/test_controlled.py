"""Tests of the MCInfoNCE controlled experiment (MCI section 5.1, appendix B).

References are independent of the code under test: scipy's Bessel functions for the vMF
normalisers, scipy.stats.spearmanr, brute-force double loops for the pairwise cosines, and
direct re-computation of the generator's kappa map.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from bayesurl.distributions.vmf import sample_vmf
from bayesurl.experiments.controlled import (
    ControlledConfig,
    EncoderTraining,
    ProbabilisticEncoder,
    VMFGenerator,
    lr_at,
    make_loss,
    pairwise_cosines,
    positive_probability,
    posterior_recovery_metrics,
    smoothness_loss,
    spearman,
    train_encoder,
)

ROOT = Path(__file__).resolve().parents[2]


def _losses_available() -> bool:
    return importlib.util.find_spec("bayesurl.losses") is not None


needs_losses = pytest.mark.skipif(not _losses_available(), reason="bayesurl.losses not merged")


def _log_c_scipy(kappa: float, d: int) -> float:
    """log C_D(kappa) from scipy's exponentially scaled Bessel function (float64)."""
    if kappa == 0.0:
        return math.lgamma(d / 2) - math.log(2.0) - (d / 2) * math.log(math.pi)
    v = d / 2 - 1
    return (
        v * math.log(kappa)
        - (d / 2) * math.log(2 * math.pi)
        - (math.log(special.ive(v, kappa)) + kappa)
    )


# ------------------------------------------------------------------------------ generator
@pytest.mark.parametrize("dim,kmin,kmax", [(2, 16.0, 32.0), (10, 16.0, 32.0), (5, 64.0, 128.0)])
def test_generator_kappa_range_calibrated_exactly(dim, kmin, kmax):
    g = torch.Generator().manual_seed(dim)
    gen = VMFGenerator(dim, kmin, kmax, generator=g, dtype=torch.float64)
    x = gen.x_calibration
    assert x.shape == (1000, dim) and float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    _, kappa = gen(x)
    assert float(kappa.min()) == pytest.approx(kmin, rel=1e-12)
    assert float(kappa.max()) == pytest.approx(kmax, rel=1e-12)
    # linear in log space: log kappa is an affine map of softplus(raw) fixed by the two ends
    s = F.softplus(gen.kappa_net(x).squeeze(-1))
    frac = (s - s.min()) / (s.max() - s.min())
    expected = math.log(kmin) + frac * (math.log(kmax) - math.log(kmin))
    torch.testing.assert_close(torch.log(kappa), expected, rtol=0, atol=1e-12)
    # fresh inputs stay positive and roughly in range (not calibrated exactly)
    _, k_new = gen(gen.sample_x(500, g))
    assert bool((k_new > 0).all())


def test_generator_reinitialises_collapsed_networks():
    g = torch.Generator().manual_seed(0)
    gen = VMFGenerator(3, generator=g, dtype=torch.float64)
    mu, _ = gen(gen.x_calibration)
    # brute force over all pairs of the 1,000 calibration means
    cos = mu @ mu.T
    assert float(cos.min()) <= 0.5
    assert gen.min_cosine == pytest.approx(float(cos.min()))
    # an impossible threshold exhausts the tries instead of returning a collapsed generator
    with pytest.raises(ValueError, match="min cosine"):
        VMFGenerator(3, max_min_cosine=-1.5, generator=g, max_tries=3)
    # mu is architecture D-10-10-D, kappa D-10-1, both frozen
    lin = [m for m in gen.mu_net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in lin] == [(3, 10), (10, 10), (10, 3)]
    lin_k = [m for m in gen.kappa_net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in lin_k] == [(3, 10), (10, 1)]
    assert not any(p.requires_grad for p in gen.parameters())


def test_generator_is_reproducible_from_its_generator():
    a = VMFGenerator(4, generator=torch.Generator().manual_seed(7))
    b = VMFGenerator(4, generator=torch.Generator().manual_seed(7))
    c = VMFGenerator(4, generator=torch.Generator().manual_seed(8))
    x = torch.rand(20, 4)
    torch.testing.assert_close(a(x)[0], b(x)[0])
    assert not torch.allclose(a(x)[0], c(x)[0])


# ------------------------------------------------------------------------------ pair sampling
def _positive_probability_mpmath(cos: float, kappa: float, d: int) -> float:
    """sigma(kappa cos + log C_D(kappa) - log C_D(0)) at 30 digits (the acceptance of
    eq. 53 with the uniform proposal), from mpmath's Bessel I and Gamma."""
    import mpmath

    with mpmath.workdps(30):
        k, v = mpmath.mpf(kappa), mpmath.mpf(d) / 2 - 1
        log_c = v * mpmath.log(k) - (v + 1) * mpmath.log(2 * mpmath.pi)
        log_c -= mpmath.log(mpmath.besseli(v, k))
        log_c0 = mpmath.loggamma(v + 1) - mpmath.log(2) - (v + 1) * mpmath.log(mpmath.pi)
        return float(1 / (1 + mpmath.exp(-(k * cos + log_c - log_c0))))


# the documented values (positive_probability's docstring: 0.99894 at cos 0.9, 0.2408 at 0.5,
# kappa 20, D 10) are checked against mpmath here, not copied into the expectation
@pytest.mark.parametrize("cos,documented", [(0.9, 0.99894), (0.5, 0.2408)])
def test_acceptance_probability_closed_form_values(cos, documented):
    want = _positive_probability_mpmath(cos, 20.0, 10)
    p = positive_probability(torch.tensor([cos], dtype=torch.float64), 20.0, 10)
    assert float(p) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(documented, abs=6e-5)


@pytest.mark.parametrize("dim", [2, 3, 10, 32])
def test_acceptance_probability_matches_scipy_normalisers(dim):
    cos = torch.linspace(-1, 1, 21, dtype=torch.float64)
    p = positive_probability(cos, 20.0, dim)
    log_ratio = _log_c_scipy(20.0, dim) - _log_c_scipy(0.0, dim)
    ref = [1.0 / (1.0 + math.exp(-(20.0 * float(c) + log_ratio))) for c in cos]
    np.testing.assert_allclose(p.numpy(), ref, rtol=1e-9, atol=1e-300)


def test_positives_are_rejection_samples_of_the_positive_distribution():
    """Accepted candidates must be close to the reference, and acceptance must follow eq. 53:
    the mean cosine of mu(x+) to z_ref matches the acceptance-weighted candidate average."""
    g = torch.Generator().manual_seed(1)
    gen = VMFGenerator(2, generator=g, dtype=torch.float64)
    z_ref = F.normalize(torch.randn(1, 2, dtype=torch.float64, generator=g), dim=-1)
    n = 600
    x_pos = gen.sample_positives(z_ref.expand(n, 2).contiguous(), generator=g)
    mu_pos, _ = gen(x_pos)
    got = float((mu_pos @ z_ref.T).mean())
    # independent estimate by importance weighting of plain candidates with eq. 53
    xc = gen.sample_x(20_000, g)
    zc = gen.sample_z(xc, g)
    cos = (zc @ z_ref.T).squeeze(-1)
    log_ratio = _log_c_scipy(20.0, 2) - _log_c_scipy(0.0, 2)
    w = torch.sigmoid(20.0 * cos + log_ratio)
    want = float((w * (gen(xc)[0] @ z_ref.T).squeeze(-1)).sum() / w.sum())
    assert got == pytest.approx(want, abs=0.05)
    # and far from what random inputs give
    assert got > float((gen(xc)[0] @ z_ref.T).mean()) + 0.3


def test_sample_triplets_shapes_and_uniform_negatives():
    g = torch.Generator().manual_seed(2)
    gen = VMFGenerator(3, generator=g)
    x, xp, xn = gen.sample_triplets(64, 5, generator=g)
    assert x.shape == (64, 3) and xp.shape == (64, 3) and xn.shape == (64, 5, 3)
    for t in (x, xp, xn):
        assert float(t.min()) >= 0.0 and float(t.max()) <= 1.0
    assert gen.sample_triplets(8, 0, generator=g)[2] is None
    with pytest.raises(ValueError, match="n_negatives"):
        gen.sample_triplets(8, -1)


def test_vmf_kappa_gradient_finite_in_2d_float32():
    """float32 Beta draws at w = +-1 must not give NaN kappa gradients in D = 2."""
    g = torch.Generator().manual_seed(0)
    mu = F.normalize(torch.randn(256, 2, generator=g), dim=-1).requires_grad_()
    kappa = torch.full((256,), 20.0, requires_grad=True)
    z = sample_vmf(mu, kappa, 256, generator=g)
    (z * torch.randn(z.shape, generator=g)).sum().backward()
    assert bool(torch.isfinite(kappa.grad).all()) and bool(torch.isfinite(mu.grad).all())


# ------------------------------------------------------------------------------ encoder
def test_encoder_architecture_and_kappa_initialised_to_range():
    g = torch.Generator().manual_seed(3)
    x_cal = torch.rand(1000, 4, generator=g, dtype=torch.float64)
    enc = ProbabilisticEncoder(4, x_cal, 16.0, 32.0, generator=g)
    lin = [m for m in enc.mu_net if isinstance(m, torch.nn.Linear)]
    widths = [lin[0].in_features] + [m.out_features for m in lin]
    assert widths == [4, 40, 200, 200, 200, 200, 200, 40, 4]
    lin_k = [m for m in enc.kappa_net if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in lin_k][-1] == 1 and len(lin_k) == 8
    with torch.no_grad():
        mu, kappa = enc(x_cal)
    torch.testing.assert_close(mu.norm(dim=-1), torch.ones(1000, dtype=torch.float64))
    assert float(kappa.min()) == pytest.approx(16.0, rel=1e-10)
    assert float(kappa.max()) == pytest.approx(32.0, rel=1e-10)
    with pytest.raises(ValueError, match="x_calibration"):
        ProbabilisticEncoder(3, x_cal)


# ------------------------------------------------------------------------------ metrics
def test_pairwise_cosines_match_brute_force():
    g = torch.Generator().manual_seed(4)
    mu = F.normalize(torch.randn(37, 5, dtype=torch.float64, generator=g), dim=-1)
    ref = [float(mu[i] @ mu[j]) for i in range(37) for j in range(i + 1, 37)]
    np.testing.assert_allclose(pairwise_cosines(mu, chunk=8).numpy(), ref, rtol=0, atol=1e-14)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-5, 5), min_size=3, max_size=60).flatmap(
        lambda a: st.tuples(
            st.just(a), st.lists(st.integers(-5, 5), min_size=len(a), max_size=len(a))
        )
    )
)
def test_spearman_matches_scipy_with_ties(ab):
    a, b = (torch.tensor(v, dtype=torch.float64) for v in ab)
    ref = stats.spearmanr(a.numpy(), b.numpy()).statistic
    got = spearman(a, b)
    if np.isnan(ref):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(ref, abs=1e-12)


def test_metrics_exact_for_rotated_locations_and_true_kappa():
    g = torch.Generator().manual_seed(5)
    n, d = 600, 10
    mu = F.normalize(torch.randn(n, d, dtype=torch.float64, generator=g), dim=-1)
    kappa = 16.0 + 16.0 * torch.rand(n, dtype=torch.float64, generator=g)
    q, r = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64, generator=g))
    rot = q * torch.sign(torch.diagonal(r))  # a uniformly random orthogonal matrix
    m = posterior_recovery_metrics(mu, kappa, mu @ rot.T, kappa.clone())
    assert m["location_mae"] == pytest.approx(0.0, abs=1e-14)
    assert m["location_spearman"] == pytest.approx(1.0, abs=1e-12)
    assert m["certainty_mae"] == 0.0 and m["certainty_spearman"] == pytest.approx(1.0)
    assert m["n_pairs"] == n * (n - 1) // 2
    # ... and they notice when it is not a rotation or kappa is off
    warp = rot + 0.3 * torch.randn(d, d, dtype=torch.float64, generator=g)
    bad = posterior_recovery_metrics(mu, kappa, F.normalize(mu @ warp.T, dim=-1), kappa + 2.0)
    assert bad["location_mae"] > 0.01 and bad["location_spearman"] < 0.999
    assert bad["certainty_mae"] == pytest.approx(2.0) and bad["certainty_spearman"] == 1.0
    ref_mae = float(np.mean(np.abs(kappa.numpy() - kappa.flip(0).numpy())))
    flip = posterior_recovery_metrics(mu, kappa, mu, kappa.flip(0))
    assert flip["certainty_mae"] == pytest.approx(ref_mae)
    assert flip["certainty_spearman"] == pytest.approx(
        stats.spearmanr(kappa.numpy(), kappa.flip(0).numpy()).statistic, abs=1e-12
    )
    sub = posterior_recovery_metrics(mu, kappa, mu @ rot.T, kappa, max_pairs=5000, generator=g)
    assert sub["n_pairs"] == 5000 and sub["location_mae"] < 1e-14


def test_metrics_reject_bad_input():
    mu = F.normalize(torch.randn(10, 3), dim=-1)
    k = torch.rand(10) + 1
    with pytest.raises(ValueError, match="kappa_pred"):
        posterior_recovery_metrics(mu, k, mu, k[:9])
    bad = k.clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="kappa_true"):
        posterior_recovery_metrics(mu, bad, mu, k)
    with pytest.raises(ValueError, match="mu_pred"):
        posterior_recovery_metrics(mu, k, mu[:, 0], k)


# ------------------------------------------------------------------------------ training
def test_lr_schedule_quarters():
    assert [lr_at(s, 8, 1.0, phasewise=False) for s in range(8)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    )
    r = 10**-0.5
    assert [lr_at(s, 8, 1.0, phasewise=True) for s in range(8)] == pytest.approx(
        [1, 1, 0.1, 0.1, r, r, 0.1 * r, 0.1 * r]
    )
    with pytest.raises(ValueError, match="step"):
        lr_at(8, 8, 1.0, phasewise=True)


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="dim"):
        VMFGenerator(1)
    with pytest.raises(ValueError, match="kappa_min"):
        VMFGenerator(2, 32.0, 16.0)
    with pytest.raises(ValueError, match="kappa_pos"):
        positive_probability(torch.zeros(1), 0.0, 3)
    with pytest.raises(ValueError, match="loss"):
        make_loss("infonce")


def test_phasewise_training_only_moves_the_active_network():
    """Phase 1 changes mu_hat only (rolled negatives), phase 2 kappa_hat only (M negatives)."""
    g = torch.Generator().manual_seed(6)
    gen = VMFGenerator(2, generator=g)
    enc = ProbabilisticEncoder(2, gen.x_calibration, generator=g)
    seen, snaps = [], []

    def flat(net):
        return torch.cat([p.detach().flatten() for p in net.parameters()]).clone()

    def toy_loss(mu_a, k_a, mu_p, k_p, mu_n, k_n, n_samples, generator):
        seen.append(None if mu_n is None else tuple(mu_n.shape))
        snaps.append((flat(enc.mu_net), flat(enc.kappa_net)))
        return -(mu_a * mu_p).sum(-1).mean() + (k_a.log() - 3.0).pow(2).mean()

    train_encoder(gen, enc, toy_loss, n_batches=6, batch_size=16, n_samples=2, n_negatives=3,
                  lr=1e-2, generator=g, progress=False)  # fmt: skip
    snaps.append((flat(enc.mu_net), flat(enc.kappa_net)))
    assert seen == [None] * 3 + [(16, 3, 2)] * 3
    for i in range(3):  # mu phase: mu moves, kappa does not
        assert not torch.equal(snaps[i][0], snaps[i + 1][0])
        assert torch.equal(snaps[i][1], snaps[i + 1][1])
    for i in range(3, 6):  # kappa phase: the reverse
        assert torch.equal(snaps[i][0], snaps[i + 1][0])
        assert not torch.equal(snaps[i][1], snaps[i + 1][1])
    assert all(p.requires_grad for p in enc.parameters())


def test_encoder_training_options_and_keywords_train_the_same_weights():
    """An EncoderTraining, the same settings as keywords, and an EncoderTraining with one
    field replaced by a keyword give bit-identical weights; bad settings are refused where
    they enter, naming the argument."""

    def train(*args, **kw):
        g = torch.Generator().manual_seed(4)
        gen = VMFGenerator(2, generator=g)
        enc = ProbabilisticEncoder(2, gen.x_calibration, generator=g)
        train_encoder(gen, enc, make_loss("mcinfonce"), *args, generator=g, **kw)
        return enc.state_dict()

    kw = dict(n_batches=4, batch_size=8, n_samples=2, n_negatives=2, kappa_lr=1e-3, progress=False)
    by_keywords = train(**kw)
    assert all(torch.isfinite(v).all() for v in by_keywords.values())
    for other in (
        train(EncoderTraining(**kw)),
        train(EncoderTraining(**{**kw, "batch_size": 32}), batch_size=8),
    ):
        for k, v in by_keywords.items():
            assert torch.equal(other[k], v), k
    cfg = ControlledConfig(n_batches=6, kappa_lr=0.5, mu_negatives=3)
    assert cfg.training(progress=False) == EncoderTraining(
        n_batches=6, kappa_lr=0.5, mu_negatives=3, progress=False
    )
    with pytest.raises(TypeError, match="n_batches"):
        train(batch_size=8)
    with pytest.raises(TypeError, match="'epochs'"):
        train(n_batches=4, epochs=2)
    with pytest.raises(TypeError, match="EncoderTraining"):
        train({"n_batches": 4})
    with pytest.raises(ValueError, match="n_batches"):
        EncoderTraining(n_batches=1)
    with pytest.raises(ValueError, match="negatives"):
        EncoderTraining(n_batches=4, mu_negatives=-1)


def test_select_mu_init_keeps_the_best_initial_weights_and_leaves_kappa():
    """The guard scores candidates by a warm-up's validation loss and loads the winner's
    *initial* mu weights (rebuilt here independently); kappa_net and the caller's generator
    are untouched, and a re-run gives the same losses."""
    from bayesurl.experiments.controlled import _reset_linear, select_mu_init

    g = torch.Generator().manual_seed(3)
    gen = VMFGenerator(2, generator=g)
    enc = ProbabilisticEncoder(2, gen.x_calibration, generator=g)
    mu0 = copy.deepcopy(enc.mu_net.state_dict())
    kappa0 = copy.deepcopy(enc.kappa_net.state_dict())
    g_state = g.get_state()

    def toy_loss(mu_a, k_a, mu_p, k_p, mu_n, k_n, n_samples, generator):
        assert mu_n is None  # rolled in-batch negatives, as the mu phase
        noise = torch.randn(mu_a.shape[0], generator=generator)  # fixed MC samples matter
        return -(mu_a * mu_p).sum(-1).mean() + 1e-3 * noise.mean()

    kw = dict(n_inits=3, warmup=3, batch_size=32, n_samples=2, lr=1e-2, seed=5, progress=False)
    sel = select_mu_init(gen, enc, toy_loss, **kw)
    assert len(sel["val_losses"]) == 3
    assert sel["chosen"] == int(np.argmin(sel["val_losses"]))
    expected = copy.deepcopy(enc.mu_net)
    expected.load_state_dict(mu0)
    if sel["chosen"] > 0:
        g_init = torch.Generator().manual_seed(5 + 40_000 + sel["chosen"])
        with torch.no_grad():
            for layer in expected:
                if isinstance(layer, torch.nn.Linear):
                    _reset_linear(layer, g_init)
    for k, v in expected.state_dict().items():
        assert torch.equal(enc.mu_net.state_dict()[k], v), k
    for k, v in kappa0.items():
        assert torch.equal(enc.kappa_net.state_dict()[k], v), k
    assert torch.equal(g.get_state(), g_state)
    enc.mu_net.load_state_dict(mu0)
    again = select_mu_init(gen, enc, toy_loss, **kw)
    assert again["val_losses"] == sel["val_losses"]
    assert select_mu_init(gen, enc, toy_loss, **{**kw, "n_inits": 1})["chosen"] == 0
    with pytest.raises(ValueError, match="n_inits"):
        select_mu_init(gen, enc, toy_loss, **{**kw, "n_inits": 0})


@needs_losses
def test_recipe_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "recipe_controlled", ROOT / "examples" / "controlled" / "mcinfonce.py"
    )
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    out = tmp_path / "res.json"
    for loss in ("mcinfonce", "elk", "hib"):
        res = recipe.main([
            "--dim", "2", "--loss", loss, "--seeds", "0", "1", "--batches", "4",
            "--batch-size", "32", "--samples", "4", "--negatives", "2", "--n-eval", "200",
            "--no-progress", "--out", str(out), "--mu-inits", "2", "--mu-warmup", "2",
        ])  # fmt: skip
        data = json.loads(out.read_text())
        assert data["settings"]["loss"] == loss and len(data["runs"]) == 2
        for key in ("location_mae", "location_spearman", "certainty_mae", "certainty_spearman"):
            assert math.isfinite(data["summary"][key]["mean"])
        assert res["runs"][0]["metrics"]["n_pairs"] == 200 * 199 // 2
    cfg = ControlledConfig()
    assert (cfg.dim, cfg.batch_size, cfg.n_samples, cfg.n_batches, cfg.kappa_pos) == (
        2,
        512,
        512,
        8192,
        20.0,
    )


def test_smoothness_loss_matches_loop() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, generator=g, dtype=torch.float64)
    mu = torch.nn.functional.normalize(torch.randn(6, 3, generator=g, dtype=torch.float64), dim=1)
    terms = []
    for i in range(6):
        for j in range(i, 6):
            dx = float((x[i] - x[j]).norm())
            dz = 1.0 - float(mu[i] @ mu[j]) / 2.0
            terms.append((dx - dz) ** 2 * (math.sqrt(2.0) - dz) ** 4)
    assert float(smoothness_loss(x, mu)) == pytest.approx(sum(terms) / len(terms), rel=1e-12)


def test_generator_smoothing_lowers_the_smoothness_loss() -> None:
    plain = VMFGenerator(2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    smooth = VMFGenerator(
        2, generator=torch.Generator().manual_seed(1), dtype=torch.float64, smooth_steps=100
    )
    x = torch.rand(256, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        before = float(smoothness_loss(x, plain(x)[0]))
        after = float(smoothness_loss(x, smooth(x)[0]))
    assert after < before
    assert not any(p.requires_grad for p in smooth.parameters())
    with pytest.raises(ValueError, match="smooth_steps"):
        VMFGenerator(2, smooth_steps=-1)


def _oracle_landscape():
    spec = importlib.util.spec_from_file_location(
        "oracle_landscape", ROOT / "examples" / "controlled" / "oracle_landscape.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.landscape


@pytest.mark.parametrize("seed", [0, 2])  # generator seed 1's landscape is flat below c = 1
def test_oracle_landscape_locates_the_bias(seed: int) -> None:
    # With the true mu and kappa_hat = c kappa (common random numbers across c):
    # eq. 7 as printed on exact vMF positives prefers c = 1 over 0.5 and 4; the reference
    # code's denominator with M = 32 prefers c = 4 over 1 (docs/controlled_experiment.rst).
    landscape = _oracle_landscape()
    kw = {"n_batches": 2, "batch_size": 256, "n_samples": 16, "seed": seed}
    exact = landscape(2, "vmf", True, 8, **kw)
    assert exact[1.0] < exact[0.5] and exact[1.0] < exact[4.0]
    code = landscape(2, "vmf", False, 32, **kw)
    assert code[4.0] < code[1.0]
    gen = VMFGenerator(2, generator=torch.Generator().manual_seed(0), acceptance="vmf")
    assert gen.acceptance == "vmf"
    with pytest.raises(ValueError, match="acceptance"):
        VMFGenerator(2, acceptance="uniform")


def test_rejection_sampler_reports_exhaustion():
    # exact vMF acceptance at D = 10 accepts about 1e-4 of uniform candidates: one round of
    # one candidate per row cannot match 64 rows, and the error says what to change
    g = torch.Generator().manual_seed(0)
    gen = VMFGenerator(10, generator=g, acceptance="vmf")
    z = gen.sample_z(gen.sample_x(64, g), g)
    with pytest.raises(RuntimeError, match="rows without a positive.*acceptance='vmf'"):
        gen.sample_positives(z, oversampling=1, max_rounds=1, generator=g)
