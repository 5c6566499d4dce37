"""URL's crop test and mixed R-AUROC against brute-force loops, scipy and scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score

from bayesurl.evaluation.url_extra import (
    center_crop_resize,
    crop_consistency,
    crop_uncertainty_check,
    mixed_r_auroc,
)


def _bilinear_crop_reference(img: np.ndarray, area: float) -> np.ndarray:
    """Loop over output pixels: sample at the centre-scaled position, border clamped."""
    c_, h, w = img.shape
    s = math.sqrt(area)
    out = np.zeros_like(img)
    for r in range(h):
        for c in range(w):
            y = ((s * ((2 * r + 1) / h - 1) + 1) * h - 1) / 2
            x = ((s * ((2 * c + 1) / w - 1) + 1) * w - 1) / 2
            y = min(max(y, 0.0), h - 1.0)
            x = min(max(x, 0.0), w - 1.0)
            y0, x0 = math.floor(y), math.floor(x)
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            wy, wx = y - y0, x - x0
            for ch in range(c_):
                out[ch, r, c] = (
                    (1 - wy) * (1 - wx) * img[ch, y0, x0]
                    + (1 - wy) * wx * img[ch, y0, x1]
                    + wy * (1 - wx) * img[ch, y1, x0]
                    + wy * wx * img[ch, y1, x1]
                )
    return out


def test_center_crop_resize_matches_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 2, 5, 7, generator=g, dtype=torch.float64)
    area = torch.tensor([0.1, 0.25, 0.6], dtype=torch.float64)
    got = center_crop_resize(x, area)
    assert got.shape == x.shape and got.dtype == torch.float64
    for i in range(3):
        ref = _bilinear_crop_reference(x[i].numpy(), float(area[i]))
        np.testing.assert_allclose(got[i].numpy(), ref, atol=1e-12)
    torch.testing.assert_close(center_crop_resize(x, torch.ones(3, dtype=torch.float64)), x)
    # an exact 2x centre crop of an 8x8 image: inner pixels are averages of the 4x4 centre
    y = torch.arange(64, dtype=torch.float64).reshape(1, 1, 8, 8)
    z = center_crop_resize(y, torch.tensor([0.25]))
    assert float(z.min()) >= float(y[..., 1:7, 1:7].min()) - 1e-12
    assert float(z.max()) <= float(y[..., 1:7, 1:7].max()) + 1e-12


def test_center_crop_resize_rejects_bad_input():
    x = torch.rand(2, 1, 4, 4)
    with pytest.raises(ValueError, match="area"):
        center_crop_resize(x, torch.tensor([0.5, 0.0]))
    with pytest.raises(ValueError, match="area"):
        center_crop_resize(x, torch.tensor([0.5]))
    with pytest.raises(ValueError, match="images"):
        center_crop_resize(torch.rand(4, 4), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="images"):
        center_crop_resize(torch.zeros(1, 1, 4, 4, dtype=torch.uint8), torch.tensor([0.5]))


def test_crop_consistency_counts_strictly_higher():
    uf = torch.tensor([0.1, 0.5, 0.3, 0.3])
    uc = torch.tensor([0.2, 0.4, 0.3, 0.9])
    assert float(crop_consistency(uf, uc)) == pytest.approx(sum(b > a for a, b in zip(uf, uc)) / 4)
    with pytest.raises(ValueError, match="u_crop"):
        crop_consistency(uf, uc[:3])
    with pytest.raises(ValueError, match="u_full"):
        crop_consistency(torch.tensor([float("nan")]), torch.tensor([0.1]))


def test_crop_uncertainty_check_against_loops():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(11, 1, 6, 6, generator=g, dtype=torch.float64)

    def predict_u(batch):  # u = minus the image's contrast (crops blur and lose contrast)
        return -batch.flatten(1).std(dim=1)

    state = torch.random.get_rng_state()
    res = crop_uncertainty_check(predict_u, x, seed=3, batch_size=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    assert res.area.min() >= 0.1 and res.area.max() <= 0.75
    higher = 0
    u_crops = []
    for i in range(11):
        crop = torch.from_numpy(_bilinear_crop_reference(x[i].numpy(), float(res.area[i])))
        u_full = float(-x[i].flatten().std())
        u_crop = float(-crop.flatten().std())
        higher += u_crop > u_full
        u_crops.append(u_crop)
    assert float(res.share) == pytest.approx(higher / 11)
    rho = stats.spearmanr(u_crops, 1.0 - res.area.numpy()).statistic
    assert float(res.spearman) == pytest.approx(rho, abs=1e-10)
    again = crop_uncertainty_check(predict_u, x, seed=3, batch_size=5)
    assert torch.equal(again.area, res.area)
    other = crop_uncertainty_check(predict_u, x, seed=4)
    assert not torch.equal(other.area, res.area)


def test_crop_uncertainty_check_constant_u_and_errors():
    x = torch.rand(5, 1, 4, 4)
    res = crop_uncertainty_check(lambda b: torch.zeros(b.shape[0]), x)
    assert float(res.share) == 0.0 and res.spearman is None
    with pytest.raises(ValueError, match="area_range"):
        crop_uncertainty_check(lambda b: torch.zeros(b.shape[0]), x, area_range=(0.0, 0.5))
    with pytest.raises(ValueError, match="predict_u"):
        crop_uncertainty_check(lambda b: torch.zeros(b.shape[0] + 1), x)
    with pytest.raises(ValueError, match="predict_u"):
        crop_uncertainty_check(lambda b: torch.full((b.shape[0],), float("nan")), x)


def _mixed_reference(ea, ya, ua, eb, yb, ub, ia, ib):
    emb = np.concatenate([ea[ia], eb[ib]])
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    side = [0] * len(ia) + [1] * len(ib)
    lab = list(ya[ia]) + list(yb[ib])
    u = np.concatenate([ua[ia], ub[ib]])
    correct = []
    for i in range(len(emb)):
        best, best_j = -np.inf, None
        for j in range(len(emb)):
            if j == i:
                continue
            s = float(emb[i] @ emb[j])
            if s > best:  # strict: ties keep the lowest index
                best, best_j = s, j
        correct.append(side[best_j] == side[i] and lab[best_j] == lab[i])
    correct = np.array(correct)
    return roc_auc_score(~correct, u), correct.mean()


def test_mixed_r_auroc_against_loops():
    rng = np.random.default_rng(0)
    ea, eb = rng.normal(size=(40, 4)), rng.normal(size=(25, 4)) + 0.3
    ya, yb = rng.integers(0, 3, 40), rng.integers(0, 3, 25)  # overlapping label spaces
    ua, ub = rng.random(40), rng.random(25) + 0.2
    t = torch.from_numpy
    res = mixed_r_auroc(t(ea), t(ya), t(ua), t(eb), t(yb), t(ub), seed=5)
    assert res.n_per_side == 25
    ia, ib = res.index_a.numpy(), res.index_b.numpy()
    assert len(set(ia)) == 25 and len(set(ib)) == 25 and ia.max() < 40
    ref_auroc, ref_r1 = _mixed_reference(ea, ya, ua, eb, yb, ub, ia, ib)
    assert float(res.r_auroc) == pytest.approx(ref_auroc, abs=1e-12)
    assert float(res.r_at_1) == pytest.approx(ref_r1, abs=1e-12)
    res10 = mixed_r_auroc(t(ea), t(ya), t(ua), t(eb), t(yb), t(ub), n_per_side=10, seed=5)
    assert res10.n_per_side == 10 and len(res10.index_a) == 10
    ref_auroc, _ = _mixed_reference(ea, ya, ua, eb, yb, ub, res10.index_a, res10.index_b)
    assert float(res10.r_auroc) == pytest.approx(ref_auroc, abs=1e-12)


def test_mixed_r_auroc_keeps_sides_apart():
    # identical embeddings and labels on both sides: a neighbour from the other side is wrong
    e = torch.eye(4, dtype=torch.float64).repeat(2, 1)  # a[i] == a[i + 4]
    y = torch.arange(4).repeat(2)
    res = mixed_r_auroc(e, y, torch.rand(8), e, y, torch.rand(8), seed=0)
    # side a's queries find their same-side twin (lower index), side b's find side a's copy
    assert float(res.r_at_1) == 0.5


def test_mixed_r_auroc_rejects_bad_input():
    e, y, u = torch.rand(6, 3), torch.arange(6), torch.rand(6)
    with pytest.raises(ValueError, match="dimension"):
        mixed_r_auroc(e, y, u, torch.rand(6, 2), y, u)
    with pytest.raises(ValueError, match="u_b"):
        mixed_r_auroc(e, y, u, e, y, u[:5])
    with pytest.raises(ValueError, match="n_per_side"):
        mixed_r_auroc(e, y, u, e, y, u, n_per_side=7)
    with pytest.raises(ValueError, match="u_a"):
        mixed_r_auroc(e, y, torch.full((6,), float("inf")), e, y, u)
