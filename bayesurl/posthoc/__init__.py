"""Post-hoc uncertainty for any trained encoder.

- :func:`wrap` -- ``wrap(encoder, method="pvu" | "tau" | "laplace" | "knn" | "mahalanobis" |
  "gmm", **options)``
- :class:`PVU`, :class:`PVUHead`, :func:`ranking_loss` -- pretrained visual uncertainties on
  cached embeddings (thesis chapter 5)
- :class:`EmbeddingCache` -- PVU's pass cache in the one on-disk embedding store
  (:mod:`bayesurl.features.store`, also home of the frozen-feature store)
- :class:`PosthocTaU` -- post-hoc Temperature as Uncertainty (TaU section 4)
- :class:`LaplaceWrapper` -- last-layer Laplace (LAM section 3)
- :class:`KNNWrapper`, :class:`MahalanobisWrapper`, :class:`GMMWrapper` -- scores that train
  nothing: the kNN distance (Sun et al., 2022), the Mahalanobis distance to class Gaussians
  (Lee et al., 2018) and a Gaussian-mixture density (DDU, Mukhoti et al., 2023) of the
  reference set's embeddings
- :func:`retrieve`, :func:`credible_threshold` -- credible image intervals (MCI section 5.2)
- :func:`load` -- rebuild a saved wrapper around its encoder
"""

from __future__ import annotations

from bayesurl.features.store import EmbeddingCache, encoder_fingerprint
from bayesurl.posthoc.base import PosthocOutput, PosthocWrapper, load
from bayesurl.posthoc.credible import (
    credible_mask,
    credible_threshold,
    retrieve,
    vmf_cosine_quantile,
)
from bayesurl.posthoc.laplace import LaplaceWrapper
from bayesurl.posthoc.pvu import (
    PVU,
    PVUHead,
    check_head_trainable,
    classifier_task_loss,
    mse_loss,
    ranking_loss,
    supcon_task_loss,
)
from bayesurl.posthoc.reference import (
    GMMWrapper,
    KNNWrapper,
    MahalanobisWrapper,
    ReferenceWrapper,
)
from bayesurl.posthoc.tau import PosthocTaU
from bayesurl.posthoc.wrap import MethodEncoder, as_encoder, wrap

__all__ = [
    "PVU",
    "EmbeddingCache",
    "GMMWrapper",
    "KNNWrapper",
    "LaplaceWrapper",
    "MahalanobisWrapper",
    "MethodEncoder",
    "PVUHead",
    "PosthocOutput",
    "PosthocTaU",
    "PosthocWrapper",
    "ReferenceWrapper",
    "as_encoder",
    "check_head_trainable",
    "classifier_task_loss",
    "credible_mask",
    "credible_threshold",
    "encoder_fingerprint",
    "load",
    "mse_loss",
    "ranking_loss",
    "retrieve",
    "supcon_task_loss",
    "vmf_cosine_quantile",
    "wrap",
]
