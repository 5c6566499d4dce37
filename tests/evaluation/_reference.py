"""Independent references shared by the evaluation tests (plain Python loops, float64)."""

from __future__ import annotations

import math

import torch


def brute_knn(x: torch.Tensor, k: int, exclude_self: bool = True) -> list[list[int]]:
    """Python loops: cosine similarity, self excluded by index, ties to the lowest index."""
    rows = x.double().tolist()
    norms = [math.sqrt(sum(v * v for v in r)) for r in rows]
    unit = [[v / nr for v in r] if nr > 0 else r for r, nr in zip(rows, norms)]
    out = []
    for i, a in enumerate(unit):
        cands = []
        for j, b in enumerate(unit):
            if exclude_self and j == i:
                continue
            cands.append((-sum(p * q for p, q in zip(a, b)), j))
        cands.sort()
        out.append([j for _, j in cands[:k]])
    return out


def tie_data(n: int = 60, seed: int = 0) -> torch.Tensor:
    """Vectors in {-1, 1}^4 (norm 2) and +-e_i (norm 1): normalised entries are exact binary
    fractions, so every cosine is exact and ties are real ties on any BLAS path."""
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n, 4), generator=g).double() * 2 - 1
    onehot = torch.eye(4, dtype=torch.float64)[torch.randint(0, 4, (n,), generator=g)]
    pick = torch.rand(n, 1, generator=g) < 0.3
    return torch.where(pick, onehot * signs, signs)
