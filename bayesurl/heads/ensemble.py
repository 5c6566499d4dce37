"""Shallow ensemble: several linear classifier heads on one shared embedding.

URL appendix B.10 (Lakshminarayanan et al. 2017; shared backbone as in Lee et al. 2015): ``K``
linear heads, their softmaxes averaged, the average trained under cross-entropy;
``u(x)`` is the entropy of the average or the Jensen-Shannon divergence between the heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_finite, check_floating, check_ndim

__all__ = ["EnsembleHeads", "average_log_probs"]


def average_log_probs(logits: Tensor) -> Tensor:
    """``log (1/K) sum_k softmax(logits_k)`` ``[N, C]`` of member logits ``[K, N, C]``.

    The pooled predictive of an ensemble (URL B.10) or of MC dropout passes (URL B.11),
    computed with ``logsumexp`` so that the cross-entropy of the average is stable.
    """
    check_ndim(logits, "logits", 3)
    check_floating(logits, "logits")
    if logits.shape[0] == 0:
        raise ValueError("`logits` has no members (K = 0)")
    return torch.logsumexp(F.log_softmax(logits, dim=-1), dim=0) - math.log(logits.shape[0])


class EnsembleHeads(nn.Module):
    """``K`` independent linear heads ``[N, D] -> [K, N, C]`` (URL appendix B.10).

    The heads are stored as one ``D -> K C`` linear layer (one matrix product for all heads);
    each head keeps PyTorch's default independent initialisation of a ``D -> C`` layer.

    Parameters
    ----------
    embed_dim : int
        Embedding dimension ``D``.
    num_classes : int
        Number of classes ``C``.
    num_heads : int
        Ensemble size ``K`` (10 in URL).

    Examples
    --------
    >>> import torch
    >>> heads = EnsembleHeads(8, 3, num_heads=4)
    >>> heads(torch.randn(5, 8)).shape
    torch.Size([4, 5, 3])
    """

    def __init__(self, embed_dim: int, num_classes: int, num_heads: int = 10) -> None:
        super().__init__()
        for name, val in (
            ("embed_dim", embed_dim),
            ("num_classes", num_classes),
            ("num_heads", num_heads),
        ):
            if int(val) != val or val < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {val}")
        self.embed_dim, self.num_classes = int(embed_dim), int(num_classes)
        self.num_heads = int(num_heads)
        self.linear = nn.Linear(self.embed_dim, self.num_heads * self.num_classes)

    def head(self, k: int) -> tuple[Tensor, Tensor]:
        """Weight ``[C, D]`` and bias ``[C]`` of head ``k``."""
        if not 0 <= k < self.num_heads:
            raise ValueError(f"`k` must be in [0, {self.num_heads}), got {k}")
        rows = slice(k * self.num_classes, (k + 1) * self.num_classes)
        return self.linear.weight[rows], self.linear.bias[rows]

    def forward(self, embedding: Tensor) -> Tensor:
        """Logits of every head ``[K, N, C]``."""
        check_ndim(embedding, "embedding", 2)
        if embedding.shape[1] != self.embed_dim:
            raise ValueError(
                f"`embedding` must have {self.embed_dim} columns, got {embedding.shape[1]}"
            )
        check_finite(embedding.detach(), "embedding")
        out = self.linear(embedding).reshape(-1, self.num_heads, self.num_classes)
        return out.transpose(0, 1)
