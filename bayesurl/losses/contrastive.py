"""The contrastive loss of LAM eq. 1 as a pytorch-metric-learning loss.

``0.5 ||u_i - u_j||^2`` for positive pairs and ``0.5 max(0, m - ||u_i - u_j||)^2`` for
negative pairs, on L2-normalised embeddings ``u``. PML's own ``ContrastiveLoss`` uses
``relu(d - pos_margin)`` and ``relu(neg_margin - d)`` without the square and the 0.5 (and
``LpDistance(power=2)`` would square the distance *inside* the hinge), so it is not this loss;
this subclass swaps the two per-pair terms and keeps PML's pair handling, miners
(``indices_tuple``) and reducers.
"""

from __future__ import annotations

from typing import Any

import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.losses import ContrastiveLoss as _PMLContrastiveLoss
from torch import Tensor

__all__ = ["ContrastiveLoss"]


class ContrastiveLoss(_PMLContrastiveLoss):
    """Squared-hinge contrastive loss on normalised embeddings (LAM eq. 1, section 3).

    Parameters
    ----------
    margin : float
        Negative margin ``m`` (the positive margin is 0).
    **kwargs
        Passed to PML's ``BaseMetricLossFunction`` (``reducer``, ``distance``, ...). The
        default distance is ``LpDistance(normalize_embeddings=True, p=2, power=1)`` and the
        default reducer is PML's ``AvgNonZeroReducer`` (mean over pairs with non-zero loss,
        positives and negatives averaged separately and summed); pass
        ``reducer=pytorch_metric_learning.reducers.SumReducer()`` for the summed loss whose
        Hessian :func:`bayesurl.laplace.ggn_diagonal` computes.

    Examples
    --------
    >>> import torch
    >>> loss = ContrastiveLoss(margin=0.5)
    >>> emb, labels = torch.randn(8, 4), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    >>> float(loss(emb, labels)) >= 0
    True
    """

    def __init__(self, margin: float = 0.2, **kwargs: Any) -> None:
        if not float(margin) > 0:
            raise ValueError(f"`margin` must be positive, got {margin}")
        kwargs.setdefault("distance", LpDistance(normalize_embeddings=True, p=2, power=1))
        super().__init__(pos_margin=0.0, neg_margin=float(margin), **kwargs)

    @property
    def margin(self) -> float:
        """The negative margin ``m``."""
        return float(self.neg_margin)

    def pos_calc(self, pos_pair_dist: Tensor, margin: float) -> Tensor:
        """``0.5 d^2`` for positive pairs (``margin`` is the positive margin, 0)."""
        return 0.5 * torch.nn.functional.relu(pos_pair_dist - margin) ** 2

    def neg_calc(self, neg_pair_dist: Tensor, margin: float) -> Tensor:
        """``0.5 max(0, m - d)^2`` for negative pairs."""
        return 0.5 * torch.nn.functional.relu(margin - neg_pair_dist) ** 2
