"""LAM-code metric variants against independent numpy / scikit-learn re-statements."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import auc, precision_recall_curve, roc_auc_score

from bayesurl.evaluation import evaluate
from bayesurl.evaluation.lam_reference import (
    lam_ausc,
    lam_ece,
    lam_metrics,
    lam_ood_scores,
    lam_sigma,
)


def _nn_numpy(x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x), dtype=int)
    for i in range(len(x)):
        best, arg = np.inf, -1
        for j in range(len(x)):
            if j == i:
                continue
            d = float(np.sum((x[i] - x[j]) ** 2))
            if d < best:
                best, arg = d, j
        out[i] = arg
    return out


def _ausc_numpy(z: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> float:
    idx = _nn_numpy(z)
    correct = (y[idx] == y).astype(float)
    covar = (sigma + sigma[idx]).mean(axis=1)
    order = np.argsort(-covar, kind="stable")
    accs = []
    for i in range(100):
        n = int(len(order) * i / 100)
        accs.append(correct[order[n:]].mean())
    accs = np.array(accs[:-1])
    return float(np.sum((accs[1:] + accs[:-1]) / 2) / len(accs))


def _ece_numpy(samples: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    s_count, n, _ = samples.shape
    preds = np.stack([y[_nn_numpy(samples[k])] for k in range(s_count)])
    majority = np.array([np.bincount(preds[:, i]).argmax() for i in range(n)])
    conf = (preds == majority).mean(axis=0)
    _, lims = np.histogram(conf, range=(0.0, 1.0), bins=bins)
    real, pred, size = np.zeros(bins), np.zeros(bins), np.zeros(bins)
    for b in range(bins):
        m = (lims[b] <= conf) & (conf < lims[b + 1])
        size[b] = m.sum()
        if size[b]:
            real[b] = (majority[m] == y[m]).mean()
            pred[b] = conf[m].mean()
    if size.sum() == 0:
        return 0.0
    return float(np.sum(np.abs(real - pred) * size / size.sum()))


def _data(n: int = 40, d: int = 3, s: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    centers = torch.randn(4, d, generator=g, dtype=torch.float64)
    mu = centers[y] + 0.8 * torch.randn(n, d, generator=g, dtype=torch.float64)
    scale = torch.rand(n, 1, generator=g, dtype=torch.float64)
    samples = mu + scale * torch.randn(s, n, d, generator=g, dtype=torch.float64)
    return torch.nn.functional.normalize(samples, dim=-1), y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ausc_matches_numpy_loop(seed):
    s, y = _data(seed=seed)
    z, sigma = s.mean(0), s.std(0)
    want = _ausc_numpy(z.numpy(), sigma.numpy(), y.numpy())
    assert lam_ausc(z, sigma, y) == pytest.approx(want, abs=1e-12)


def test_ausc_uses_pair_uncertainty_not_own():
    # query 0 is certain, its neighbour 1 is very uncertain: the pair term ranks 0 high
    z = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 0.0], [5.1, 0.0]], dtype=torch.float64)
    sig = torch.tensor([[0.0, 0.0], [9.0, 9.0], [1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 2])
    want = _ausc_numpy(z.numpy(), sig.numpy(), y.numpy())
    assert lam_ausc(z, sig, y) == pytest.approx(want, abs=1e-12)
    # both wrong queries (0, 1) are the most uncertain pairs, removed first -> high AUSC
    assert lam_ausc(z, sig, y) > 0.5 * (1 - 1 / 99)


@pytest.mark.parametrize("seed", [0, 3])
def test_ece_matches_numpy_loop(seed):
    s, y = _data(seed=seed, s=7)
    want = _ece_numpy(s.numpy(), y.numpy())
    assert lam_ece(s, y) == pytest.approx(want, abs=1e-12)


def test_ece_drops_confidence_one_unlike_bayesurl():
    # identical draws: every confidence is 1.0, so the LAM-code ECE bins nothing (0.0)
    # although a third of the predictions are wrong; bayesurl's closed last bin counts them
    z = torch.tensor([[0.0, 1.0], [0.0, 1.1], [0.0, 1.2], [3.0, 0.0], [3.1, 0.0], [3.2, 0.0]])
    y = torch.tensor([0, 0, 1, 1, 1, 0])
    s = z.expand(4, -1, -1).clone()
    assert lam_ece(s, y) == 0.0
    assert _ece_numpy(s.numpy(), y.numpy()) == 0.0
    res = evaluate(None, y, samples=torch.nn.functional.normalize(s, dim=-1), reference="lam")
    assert res["lam_ece"] == 0.0
    assert res["ece"] > 0.1


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=30),
    st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=30),
)
def test_ood_scores_match_sklearn(a, b):
    sid = torch.tensor(a, dtype=torch.float64)[:, None].repeat(1, 2)
    sood = torch.tensor(b, dtype=torch.float64)[:, None].repeat(1, 2)
    got = lam_ood_scores(sid, sood)
    score = np.concatenate([sid.sum(1).numpy(), sood.sum(1).numpy()])
    target = np.concatenate([np.zeros(len(a)), np.ones(len(b))])
    assert got["auroc"] == pytest.approx(roc_auc_score(target, score), abs=1e-12)
    prec, rec, _ = precision_recall_curve(target, score)
    assert got["auprc"] == pytest.approx(auc(rec, prec), abs=1e-12)


def test_metrics_and_evaluate_hook_agree():
    s, y = _data(n=60, s=5, seed=4)
    ood = _data(n=20, s=5, seed=5)[0] * 1.0
    got = lam_metrics(s, y, ood_samples=ood)
    sigma = lam_sigma(s)
    assert got["lam_ausc"] == pytest.approx(lam_ausc(s.mean(0), sigma, y))
    assert got["lam_ece"] == pytest.approx(_ece_numpy(s.numpy(), y.numpy()), abs=1e-12)
    assert got["lam_ood_auroc"] == pytest.approx(lam_ood_scores(sigma, lam_sigma(ood))["auroc"])
    res = evaluate(None, y, samples=s, reference="lam")
    assert res["lam_ausc"] == pytest.approx(got["lam_ausc"])
    assert res["lam_ece"] == pytest.approx(got["lam_ece"])
    plain = evaluate(None, y, samples=s)
    assert "lam_ausc" not in plain and plain["ausc"] == res["ausc"]


def test_bad_input_named():
    s, y = _data()
    with pytest.raises(ValueError, match="reference"):
        evaluate(None, y, samples=s, reference="lamm")
    with pytest.raises(ValueError, match="samples"):
        lam_ece(s[:1], y)
    with pytest.raises(ValueError, match="labels"):
        lam_ece(s, y[:-1])
    with pytest.raises(ValueError, match="sigma"):
        lam_ausc(s.mean(0), s.std(0)[:, :2], y)
    bad = s.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="samples"):
        lam_sigma(bad)
    with pytest.raises(ValueError, match="sigma_ood"):
        lam_ood_scores(s.std(0), torch.empty(0, 3))
    res = evaluate(s.mean(0), y, uncertainties=torch.rand(len(y)), reference="lam")
    assert res["lam_ausc"] is None and any("lam_" in n for n in res["notes"])


def test_kdtree_and_brute_force_searches_agree(monkeypatch):
    """The k-d tree (low D) and the chunked matrix-product search find the same neighbours."""
    from bayesurl.evaluation import lam_reference as lr

    s, y = _data(n=300, s=4, seed=9)
    tree = [lr._nearest_other(s[k]) for k in range(4)]
    ece_tree = lam_ece(s, y)
    monkeypatch.setattr(lr, "_KDTREE_MAX_DIM", 0)
    for k in range(4):
        torch.testing.assert_close(lr._nearest_other(s[k], chunk=64), tree[k])
        torch.testing.assert_close(lr._nearest_other(s[k].float()), tree[k])
    assert lam_ece(s, y) == pytest.approx(ece_tree, abs=1e-12)
    dup = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])  # exact duplicate rows
    monkeypatch.undo()
    nn_idx = lr._nearest_other(dup)
    assert nn_idx.tolist()[:2] == [1, 0] and int(nn_idx[2]) in (0, 1)
