"""Laplacian metric learning (LAM) and last-layer Laplace for classifiers.

- :func:`ggn_diagonal` -- closed-form diagonal GGN of the contrastive loss (LAM eqs. 6-9)
- :class:`MetricLaplace` -- post-hoc and online last-layer Laplace for embeddings (LAM sec. 3)
- :mod:`bayesurl.laplace.lam` -- LAM's contrastive and online training through
  :func:`bayesurl.training.fit` (:func:`train_contrastive`, :func:`train_online`)
- :class:`ClassifierLaplace` -- laplace-torch last-layer fit with a closed-form predictive
- :mod:`bayesurl.laplace.kron` -- Kronecker-factored (EKFAC) contrastive GGN
  (``MetricLaplace(..., hessian_structure="kron")``); :class:`KronHeadLaplace` -- the same per
  layer of an MLP head (block-diagonal)
"""

from __future__ import annotations

from bayesurl.laplace.classifier import ClassifierLaplace, ClassifierPredictive
from bayesurl.laplace.curvature import (
    Approximation,
    Geometry,
    HessianStructure,
    clamped_fraction,
    ggn_diagonal,
    ggn_diagonal_linear,
    output_hessian_diagonals,
    split_pairs,
)
from bayesurl.laplace.kron_head import KronHeadLaplace
from bayesurl.laplace.lam import (
    ContrastiveEmbedding,
    OnlineLam,
    OnlineLaplaceUpdate,
    PriorPrecisionTuning,
    train_contrastive,
    train_online,
)
from bayesurl.laplace.metric import (
    LAPLACE_CLASSES,
    BaseMetricLaplace,
    DiagMetricLaplace,
    HessianMiner,
    HessianPairs,
    KronMetricLaplace,
    LaplaceMode,
    MetricLaplace,
    OnlineMetricLaplace,
    PosthocMetricLaplace,
    kappa_from_trace,
    loss_miner,
)

__all__ = [
    "LAPLACE_CLASSES",
    "Approximation",
    "BaseMetricLaplace",
    "DiagMetricLaplace",
    "KronMetricLaplace",
    "LaplaceMode",
    "ClassifierLaplace",
    "ClassifierPredictive",
    "ContrastiveEmbedding",
    "HessianMiner",
    "HessianPairs",
    "HessianStructure",
    "KronHeadLaplace",
    "MetricLaplace",
    "OnlineLam",
    "OnlineLaplaceUpdate",
    "OnlineMetricLaplace",
    "PriorPrecisionTuning",
    "PosthocMetricLaplace",
    "kappa_from_trace",
    "loss_miner",
    "train_contrastive",
    "train_online",
    "Geometry",
    "clamped_fraction",
    "ggn_diagonal",
    "ggn_diagonal_linear",
    "output_hessian_diagonals",
    "split_pairs",
]
