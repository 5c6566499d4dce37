"""`evaluate` itself says what a person would misread: inverted / constant u, R@1 at chance.

The references are independent: scikit-learn's AUROC for the inversion's direction, a brute
force nearest-neighbour loop for the hits."""

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

import bayesurl


def _clusters(seed: int = 0, n_per: int = 60, noise: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=g, dtype=torch.float64) * 2
    y = torch.arange(4).repeat_interleave(n_per)
    x = centres[y] + noise * torch.randn(len(y), 8, generator=g, dtype=torch.float64)
    return x, y


def _hits(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    xn = (x / x.norm(dim=1, keepdim=True)).numpy()
    out = []
    for i in range(len(xn)):  # brute force: the most similar other point
        sims = [xn[i] @ xn[j] if j != i else -np.inf for j in range(len(xn))]
        out.append(y[int(np.argmax(sims))] == y[i])
    return np.array(out)


def test_inverted_u_is_noted_and_a_good_u_is_not():
    x, y = _clusters()
    hit = _hits(x, y)
    assert 0 < hit.sum() < len(hit)
    good = torch.tensor(np.where(hit, 0.0, 1.0) + 0.01 * np.arange(len(hit)) / len(hit))
    ood_good = torch.full((50,), 5.0) + torch.linspace(0, 1, 50)
    r = bayesurl.evaluate(x, y, uncertainties=good, ood_uncertainties=ood_good)
    assert roc_auc_score(~hit, good.numpy()) > 0.9
    assert not [n for n in r["notes"] if "invert" in n.lower() or "chance" in n.lower()]
    bad = -good
    r = bayesurl.evaluate(x, y, uncertainties=bad, ood_uncertainties=-ood_good)
    assert roc_auc_score(~hit, bad.numpy()) < 0.1
    text = " ".join(r["notes"])
    assert "R-AUROC" in text and "OOD AUROC" in text


def test_constant_u_and_chance_r1_are_noted():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (200,), generator=g)
    r = bayesurl.evaluate(x, y, uncertainties=torch.full((200,), 0.5))
    kinds = " ".join(r["notes"]).lower()
    assert "constant" in kinds and "chance" in kinds
