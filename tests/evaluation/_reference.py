"""Independent references shared by the evaluation tests (plain Python loops, float64)."""

from __future__ import annotations

import torch


def brute_knn(x: torch.Tensor, k: int, exclude_self: bool = True) -> list[list[int]]:
    """Python loops: cosine similarity, self excluded by index, ties to the lowest index."""
    x = x.double()
    n = x.shape[0]
    out = []
    for i in range(n):
        cands = []
        for j in range(n):
            if exclude_self and j == i:
                continue
            a, b = x[i], x[j]
            sim = float(a @ b / (a.norm() * b.norm()))
            cands.append((-sim, j))
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
