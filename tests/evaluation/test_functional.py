"""Functional metrics against independent references (loops, sklearn, torchmetrics, PML, scipy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _reference import brute_knn, tie_data
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score, roc_auc_score
from torchmetrics.functional.classification import binary_auroc

from bayesurl.evaluation import functional as Fm


def labelled(n: int = 80, d: int = 6, classes: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, d, generator=g, dtype=torch.float64)
    x = centers[y] + 0.9 * torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, y


# ------------------------------------------------------------------ R@1, Recall@k, mAP@k
def brute_r1(x: torch.Tensor, y: torch.Tensor) -> list[bool]:
    nn = brute_knn(x, 1)
    return [bool(y[nn[i][0]] == y[i]) for i in range(len(y))]


def test_r_at_1_brute_force_with_ties_duplicates_singletons() -> None:
    x = tie_data(70, seed=4)
    y = torch.randint(0, 5, (70,), generator=torch.Generator().manual_seed(5))
    y[-1] = 99  # a singleton class: always wrong
    r1, correct = Fm.r_at_1(x, y)
    ref = brute_r1(x, y)
    assert correct.tolist() == ref
    assert not correct[-1]
    assert float(r1) == pytest.approx(sum(ref) / len(ref), abs=0)


def test_r_at_1_exact_duplicate_counts() -> None:
    # Item 2 duplicates item 0 with another label: 0's neighbour is 2 (wrong), not dropped;
    # item 1 ties between 0 and 2 and takes the lower index 0 (same label: correct).
    x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [1.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    _, correct = Fm.r_at_1(x, y)
    assert correct.tolist() == [False, True, False]


def test_r_at_1_matches_pml_precision_at_1() -> None:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    x, y = labelled(150, seed=1)
    calc = AccuracyCalculator(include=("precision_at_1",), device=torch.device("cpu"))
    xn = torch.nn.functional.normalize(x, dim=1).float()
    ref = calc.get_accuracy(xn, y, xn, y, ref_includes_query=True)["precision_at_1"]
    assert float(Fm.r_at_1(x, y)[0]) == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("k", [1, 4, 9])
def test_recall_and_map_at_k_brute_force(k: int) -> None:
    x, y = labelled(60, seed=2)
    nn = brute_knn(x, k)
    counts = {int(c): int((y == c).sum()) for c in y.unique()}
    rec, aps = [], []
    for i in range(len(y)):
        rel = [int(y[j] == y[i]) for j in nn[i]]
        rec.append(any(rel))
        n_rel = min(k, counts[int(y[i])] - 1)
        hits, s = 0, 0.0
        for pos, r in enumerate(rel, start=1):
            hits += r
            s += r * hits / pos
        aps.append(s / n_rel if n_rel > 0 else 0.0)
    assert float(Fm.recall_at_k(x, y, k)) == pytest.approx(np.mean(rec), abs=1e-12)
    assert float(Fm.map_at_k(x, y, k)) == pytest.approx(np.mean(aps), abs=1e-12)


def test_map_at_1_equals_r_at_1() -> None:
    x, y = labelled(50, seed=3)
    assert float(Fm.map_at_k(x, y, 1)) == pytest.approx(float(Fm.r_at_1(x, y)[0]))


# ------------------------------------------------------------------ AUROC / AP
@pytest.mark.parametrize("seed", range(5))
def test_auroc_and_ap_match_sklearn_and_torchmetrics(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 7, (120,), generator=g).double()  # many ties
    t = torch.rand(120, generator=g) < 0.35
    assert float(Fm.auroc(s, t)) == pytest.approx(roc_auc_score(t.numpy(), s.numpy()), abs=1e-12)
    assert float(Fm.auroc(s, t)) == pytest.approx(float(binary_auroc(s, t.long())), abs=1e-6)
    ap = average_precision_score(t.numpy(), s.numpy())
    assert float(Fm.average_precision(s, t)) == pytest.approx(ap, abs=1e-12)


def test_r_auroc_matches_torchmetrics() -> None:
    x, y = labelled(100, seed=6)
    _, correct = Fm.r_at_1(x, y)
    u = torch.rand(100, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = float(binary_auroc(u, (~correct).long()))
    assert float(Fm.r_auroc(u, correct)) == pytest.approx(ref, abs=1e-6)


def test_ood_metrics_match_sklearn() -> None:
    g = torch.Generator().manual_seed(7)
    u, v = torch.rand(50, generator=g), torch.rand(30, generator=g) + 0.3
    scores = np.concatenate([u.numpy(), v.numpy()])
    t = np.r_[np.zeros(50), np.ones(30)]
    assert float(Fm.ood_auroc(u, v)) == pytest.approx(roc_auc_score(t, scores), abs=1e-12)
    assert float(Fm.ood_auprc(u, v)) == pytest.approx(average_precision_score(t, scores), abs=1e-9)


correct_st = st.lists(st.booleans(), min_size=2, max_size=60).filter(lambda c: 0 < sum(c) < len(c))


@settings(max_examples=60, deadline=None)
@given(correct=correct_st, data=st.data())
def test_r_auroc_invariant_to_increasing_maps(correct: list[bool], data: st.DataObject) -> None:
    n = len(correct)
    u = torch.tensor(
        data.draw(st.lists(st.integers(-20, 20), min_size=n, max_size=n)), dtype=torch.float64
    )
    c = torch.tensor(correct)
    base = float(Fm.r_auroc(u, c))
    for f in (lambda z: torch.exp(z / 7), lambda z: z**3 + 2 * z, lambda z: torch.atan(z) - 5):
        assert float(Fm.r_auroc(f(u), c)) == pytest.approx(base, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(correct=correct_st, value=st.floats(-1e6, 1e6, allow_nan=False))
def test_r_auroc_constant_and_oracle(correct: list[bool], value: float) -> None:
    c = torch.tensor(correct)
    assert float(Fm.r_auroc(torch.full((len(c),), value), c)) == 0.5
    assert float(Fm.r_auroc(1.0 - c.double(), c)) == 1.0


def test_r_auroc_undefined_raises() -> None:
    with pytest.raises(ValueError, match="all 4 queries in `correct` are correct"):
        Fm.r_auroc(torch.rand(4), torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="wrong"):
        Fm.r_auroc(torch.rand(4), torch.zeros(4, dtype=torch.bool))


# ------------------------------------------------------------------ sparsification
def brute_curve(u: list[float], correct: list[bool]) -> list[float]:
    order = sorted(range(len(u)), key=lambda i: (u[i], i))  # most certain first
    out = []
    for j in range(100):
        kept = math.ceil((100 - j) / 100 * len(u) - 1e-9)
        out.append(sum(correct[i] for i in order[:kept]) / kept)
    return out


@pytest.mark.parametrize("n", [1, 7, 100, 257])
def test_sparsification_ausc_ause_brute_force(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    u = torch.randint(0, 5, (n,), generator=g).double()
    c = torch.rand(n, generator=g) < 0.6
    removed, curve = Fm.sparsification_curve(u, c)
    ref = brute_curve(u.tolist(), c.tolist())
    np.testing.assert_allclose(curve.numpy(), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(removed.numpy(), np.arange(100) / 100)
    assert float(Fm.ausc(u, c)) == pytest.approx(np.mean(ref), abs=1e-12)
    oracle = brute_curve((~c).double().tolist(), c.tolist())
    assert float(Fm.ause(u, c)) == pytest.approx(np.mean(oracle) - np.mean(ref), abs=1e-12)
    assert float(Fm.ause(1.0 - c.double(), c)) == pytest.approx(0.0, abs=1e-12)


def test_rank_correlation_matches_scipy() -> None:
    g = torch.Generator().manual_seed(8)
    u = torch.randint(0, 10, (40,), generator=g).double()
    r = u + torch.randn(40, generator=g, dtype=torch.float64) * 3
    ref = spearmanr(u.numpy(), r.numpy()).statistic
    assert float(Fm.rank_correlation(u, r)) == pytest.approx(ref, abs=1e-12)
    with pytest.raises(ValueError, match="reference"):
        Fm.rank_correlation(u, torch.ones(40))


# ------------------------------------------------------------------ samples
def test_kappa_and_mean_from_samples_loops() -> None:
    g = torch.Generator().manual_seed(9)
    s = torch.randn(5, 4, 3, generator=g, dtype=torch.float64) + 2
    d = 3
    mean = Fm.mean_from_samples(s)
    kappa = Fm.kappa_from_samples(s)
    u = Fm.uncertainty_from_samples(s)
    for i in range(4):
        acc = [0.0] * d
        for t in range(5):
            z = s[t, i] / s[t, i].norm()
            acc = [a + float(z[j]) / 5 for j, a in enumerate(acc)]
        r = math.sqrt(sum(a * a for a in acc))
        assert float(kappa[i]) == pytest.approx(r * (d - r * r) / (1 - r * r), rel=1e-10)
        assert float(u[i]) == pytest.approx((1 - r * r) / (r * (d - r * r)), rel=1e-10)
        np.testing.assert_allclose(mean[i].numpy(), np.array(acc) / r, atol=1e-12)


def test_identical_draws_give_zero_uncertainty() -> None:
    s = torch.randn(1, 3, 4).expand(6, 3, 4).double()
    assert torch.all(Fm.uncertainty_from_samples(s) < 1e-12)


# ------------------------------------------------------------------ bad input
NAN = float("nan")


@pytest.mark.parametrize(
    ("fn", "args", "match"),
    [
        (Fm.r_at_1, (torch.tensor([[NAN, 1.0], [1.0, 1.0]]), torch.tensor([0, 1])), "embeddings"),
        (Fm.r_at_1, (torch.randn(4), torch.tensor([0, 1, 0, 1])), "embeddings"),
        (Fm.r_at_1, (torch.randn(4, 2), torch.tensor([0, 1, 0])), "labels"),
        (Fm.r_at_1, (torch.randn(1, 2), torch.tensor([0])), "embeddings"),
        (Fm.recall_at_k, (torch.randn(4, 2), torch.tensor([0, 1, 0, 1]), 4), "k"),
        (Fm.map_at_k, (torch.randn(4, 2), torch.zeros(4, 2)), "labels"),
        (Fm.r_auroc, (torch.tensor([NAN, 1.0]), torch.tensor([True, False])), "uncertainties"),
        (Fm.r_auroc, (torch.rand(3), torch.tensor([True, False])), "length"),
        (Fm.r_auroc, (torch.rand(1), torch.tensor([True])), "uncertainties"),
        (Fm.r_auroc, (torch.rand(3), torch.tensor([True, True, True])), "correct"),
        (Fm.ausc, (torch.rand(3), torch.tensor([True, False])), "length"),
        (Fm.ausc, (torch.rand(3, 1), torch.tensor([True, False, True])), "uncertainties"),
        (Fm.ood_auroc, (torch.rand(3), torch.tensor([NAN])), "ood_uncertainties"),
        (Fm.ood_auprc, (torch.rand(3), torch.rand(2, 2)), "ood_uncertainties"),
        (Fm.rank_correlation, (torch.rand(3), torch.rand(4)), "length"),
        (Fm.auroc, (torch.rand(3), torch.tensor([2, 0, 1])), "positives"),
        (Fm.kappa_from_samples, (torch.rand(3, 4),), "samples"),
        (Fm.kappa_from_samples, (torch.tensor([[[NAN, 1.0]]]),), "samples"),
    ],
)
def test_bad_input_raises_naming_argument(fn, args, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fn(*args)
