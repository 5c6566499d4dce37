"""AURC and AUGRC of the retrieval error against brute-force definitions (loops over the
coverages, and over every order of tied u), hypothesis properties, the bootstrap statistic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesurl.evaluation import evaluate
from bayesurl.evaluation import functional as Fm
from bayesurl.stats.intervals import weighted_risk_coverage


def curves_of_order(wrong: list[bool]) -> tuple[float, float]:
    """AURC and AUGRC of one order of the queries (most certain first), by loops."""
    n = len(wrong)
    risk, general = [], []
    for k in range(1, n + 1):
        errors = sum(1 for w in wrong[:k] if w)
        risk.append(errors / k)
        general.append(errors / n)
    return sum(risk) / n, sum(general) / n


def brute_force(u: list[float], correct: list[bool]) -> tuple[float, float]:
    """The mean over every order of the queries that sorts ``u`` ascending (ties: each order
    equally likely)."""
    n = len(u)
    total, count = np.zeros(2), 0
    for perm in itertools.permutations(range(n)):
        if all(u[perm[i]] <= u[perm[i + 1]] for i in range(n - 1)):
            total += curves_of_order([not correct[i] for i in perm])
            count += 1
    return float(total[0] / count), float(total[1] / count)


def expected_loop(u: list[float], correct: list[bool]) -> tuple[float, float]:
    """The same expectation by a loop over the coverages: the run of equal u at the boundary
    contributes its error share per position."""
    n = len(u)
    aurc = augrc = 0.0
    ranked = sorted(range(n), key=lambda i: u[i])
    for k in range(1, n + 1):
        t = u[ranked[k - 1]]
        below = [i for i in range(n) if u[i] < t]
        tied = [i for i in range(n) if u[i] == t]
        errors = sum(not correct[i] for i in below)
        errors += (k - len(below)) * sum(not correct[i] for i in tied) / len(tied)
        aurc += errors / k / n
        augrc += errors / n / n
    return aurc, augrc


@pytest.mark.parametrize("seed", range(6))
def test_equal_brute_force_over_the_orders_of_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 7
    u = rng.integers(0, 3, n).astype(float).tolist()  # many ties
    correct = (rng.random(n) < 0.5).tolist()
    got = (
        Fm.aurc(torch.tensor(u), torch.tensor(correct)),
        Fm.augrc(torch.tensor(u), torch.tensor(correct)),
    )
    ref = brute_force(u, correct)
    assert float(got[0]) == pytest.approx(ref[0], abs=1e-12)
    assert float(got[1]) == pytest.approx(ref[1], abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_equal_loop_definition(seed: int) -> None:
    rng = np.random.default_rng(10 + seed)
    n = 300
    u = (rng.integers(0, 40, n) if seed % 2 else rng.random(n)).astype(float)
    correct = rng.random(n) < 0.6
    ref = expected_loop(u.tolist(), correct.tolist())
    u_t, c_t = torch.tensor(u, dtype=torch.float64), torch.tensor(correct)
    assert float(Fm.aurc(u_t, c_t)) == pytest.approx(ref[0], abs=1e-12)
    assert float(Fm.augrc(u_t, c_t)) == pytest.approx(ref[1], abs=1e-12)


def test_constant_u_and_closed_forms() -> None:
    correct = torch.tensor([True, False, True, True, False, True, True, True])
    err = 2 / 8
    assert float(Fm.aurc(torch.zeros(8), correct)) == pytest.approx(err, abs=1e-15)
    assert float(Fm.augrc(torch.zeros(8), correct)) == pytest.approx(err * 9 / 16, abs=1e-15)
    # the oracle keeps the 6 right ones first: risk 0 up to coverage 6/8
    oracle = (~correct).double()
    assert float(Fm.aurc(oracle, correct)) == pytest.approx((1 / 7 + 2 / 8) / 8, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(
    u=st.lists(st.integers(-5, 5), min_size=2, max_size=40),
    data=st.data(),
)
def test_monotone_invariance_and_oracle_is_minimal(u: list[int], data) -> None:
    n = len(u)
    correct = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    ut = torch.tensor(u, dtype=torch.float64)
    a, g = Fm.aurc(ut, correct), Fm.augrc(ut, correct)
    for f in (lambda t: 3 * t + 1, torch.exp, lambda t: t**3):
        assert float(Fm.aurc(f(ut), correct)) == pytest.approx(float(a), abs=1e-12)
        assert float(Fm.augrc(f(ut), correct)) == pytest.approx(float(g), abs=1e-12)
    oracle = (~correct).double()
    assert float(Fm.aurc(oracle, correct)) <= float(a) + 1e-12
    assert float(Fm.augrc(oracle, correct)) <= float(g) + 1e-12
    # the reversed oracle is the worst order
    assert float(Fm.aurc(-oracle, correct)) >= float(a) - 1e-12


@settings(max_examples=40, deadline=None)
@given(
    u=st.lists(st.integers(0, 6), min_size=2, max_size=30),
    data=st.data(),
)
def test_bootstrap_statistic_equals_the_duplicated_queries(u: list[int], data) -> None:
    n = len(u)
    correct = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    w = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=float)
    if w.sum() < 1:
        w[0] = 1
    stat = weighted_risk_coverage(np.array(u, float), correct)(np.stack([w, np.ones(n)]))
    rep = np.repeat(np.arange(n), w.astype(int))
    ut, ct = torch.tensor(np.array(u, float)[rep]), torch.tensor(correct[rep])
    assert stat["aurc"][0] == pytest.approx(float(Fm.aurc(ut, ct)), abs=1e-12)
    assert stat["augrc"][0] == pytest.approx(float(Fm.augrc(ut, ct)), abs=1e-12)
    ones = torch.tensor(np.array(u, float)), torch.tensor(correct)
    assert stat["aurc"][1] == pytest.approx(float(Fm.aurc(*ones)), abs=1e-12)


def test_evaluator_gives_them_with_intervals_by_default() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 6, generator=g), torch.randint(0, 4, (200,), generator=g)
    u = torch.rand(200, generator=g)
    res = evaluate(x, y, uncertainties=u)
    correct = Fm.r_at_1(x, y)[1]
    assert res["aurc"] == pytest.approx(float(Fm.aurc(u, correct)), abs=1e-15)
    assert res["augrc"] == pytest.approx(float(Fm.augrc(u, correct)), abs=1e-15)
    for key in ("aurc", "augrc"):
        iv = res["intervals"][key]
        assert iv.method == "bootstrap" and iv.low <= res[key] <= iv.high
    without_u = evaluate(x, y)
    assert without_u["aurc"] is None and without_u["augrc"] is None


def test_the_block_bootstrap_is_within_1e5_of_the_exact_replicates() -> None:
    """Past the first RISK_EXACT queries the replicates sum blocks of whole runs: at N = 60k
    (ties included) every replicate's AURC / AUGRC is within 1e-5 of the exact one, and below
    RISK_EXACT + RISK_BLOCKS queries the two are the same."""
    from bayesurl.stats.intervals import RISK_BLOCKS, RISK_EXACT, poisson_weights

    rng = np.random.default_rng(0)
    for n in (60_000, RISK_EXACT + RISK_BLOCKS):
        u = rng.random(n).astype(np.float32)
        u = np.where(rng.random(n) < 0.05, np.round(u * 40) / 40, u)  # runs of tied u
        correct = rng.random(n) < 0.7
        w = next(poisson_weights(n, 40, seed=1, rows=40))
        exact = weighted_risk_coverage(u, correct, exact=True)(w)
        blocks = weighted_risk_coverage(u, correct)(w)
        for key in ("aurc", "augrc"):
            diff = np.abs(exact[key] - blocks[key]).max()
            assert diff < 1e-5 if n == 60_000 else diff == 0.0, (n, key, diff)
        if n == 60_000:
            assert np.abs(exact["aurc"] - blocks["aurc"]).max() > 0  # the blocks are in use
