"""The folder's post-hoc methods: what each fits its u on, and what its u means.

:data:`FIT_PLANS` says, per :class:`FolderMethod`, how the folder fits the method's wrapper of
:func:`bayesurl.posthoc.wrap` on cached features (the positive pairs, or the other folds);
:data:`U_MEANING` and :data:`U_MEASURED` are what the companion page says of its u.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import nn

__all__ = [
    "CROSSFIT_FOLDS",
    "FIT_PLANS",
    "FOLDER_COMPONENTS",
    "FOLDER_K",
    "FitPlan",
    "FolderMethod",
    "U_MEANING",
    "U_MEASURED",
]


class FolderMethod(str, Enum):
    """Post-hoc u fitted on a folder's features."""

    TAU = "tau"
    PVU = "pvu"
    LAPLACE = "laplace"
    KNN = "knn"
    MAHALANOBIS = "mahalanobis"
    GMM = "gmm"


def _identity_readout(dim: int) -> nn.Linear:
    lin = nn.Linear(dim, dim)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(dim))
        lin.bias.zero_()
    return lin


@dataclass(frozen=True)
class FitPlan:
    """How the folder fits one wrapper of :func:`~bayesurl.posthoc.wrap` on cached views.

    ``encoder`` builds the frozen module the wrapper sees from the feature width (the
    features are already embeddings); ``options`` gives ``wrap``'s options for that module;
    ``pairs`` feeds the two views as ``(x1, x2)`` (TaU's SimCLR pair) rather than stacked with
    each image its own class; ``augmented`` pairs two augmented views of each image (encoded
    for it) rather than each image with its nearest neighbour; ``trains`` passes ``epochs``
    and ``lr`` to ``fit`` (a trained head); ``fit_max`` is the default size of the fit
    sample, set by what a fit image costs; ``fit`` holds the other keywords of ``fit``;
    ``crossfit`` fits the wrapper on the fit sample's features of the other folds
    (:func:`crossfit`) instead of on pairs.
    """

    encoder: Callable[[int], nn.Module]
    options: Callable[[nn.Module, int], dict[str, Any]]
    pairs: bool
    augmented: bool
    trains: bool
    fit_max: int
    fit: dict[str, Any] = field(default_factory=dict)
    crossfit: bool = False


#: The wrapper behind each folder method (tau, pvu, laplace: labels unused, the views are the
#: positives; knn, mahalanobis, gmm: nothing trained, fitted on the other folds).
FIT_PLANS = {
    FolderMethod.TAU: FitPlan(
        lambda d: nn.Identity(),
        lambda e, d: {"embed_dim": d},
        pairs=True,
        augmented=True,
        trains=True,
        # two encodings more per fit image; on two folders of 1,000 images a sample of 500
        # gave the same u as all of them (Spearman 0.999 / 0.997, R-AUROC within 0.003)
        fit_max=500,
    ),
    FolderMethod.PVU: FitPlan(
        lambda d: nn.Identity(),
        lambda e, d: {"task": "supcon", "embed_dim": d},
        pairs=False,
        augmented=False,
        trains=True,
        fit_max=5000,  # a fit image costs no encoding
        fit={"cached": False},
    ),
    # an identity read-out as the last layer: the embedding is the feature, bit for bit
    FolderMethod.LAPLACE: FitPlan(
        _identity_readout,
        lambda e, d: {"last_layer": e},
        pairs=False,
        augmented=False,
        trains=False,
        fit_max=5000,
    ),
    **{
        m: FitPlan(
            lambda d: nn.Identity(),
            lambda e, d: {},
            pairs=False,
            augmented=False,
            trains=False,
            fit_max=5000,  # a fit image costs no encoding
            crossfit=True,
        )
        for m in (FolderMethod.KNN, FolderMethod.MAHALANOBIS, FolderMethod.GMM)
    },
}


#: Folds of the methods fitted on the other folds (each image's u comes from the other 4/5)
CROSSFIT_FOLDS = 5
#: Neighbours of ``knn`` (fewer when a fold's reference holds fewer images)
FOLDER_K = 10
#: k-means components of ``gmm`` in a folder without classes
FOLDER_COMPONENTS = 10


#: What u is, per method (as :doc:`/concepts/uncertainty` defines it).
U_MEANING = {
    "tau": "the learned temperature on a log scale, log(tau / 0.1) = log(1 + e^-s) >= 0 "
    "(post-hoc TaU, TaU section 4)",
    "pvu": "the PVU head's score, trained to rank the images by their contrastive loss: "
    "only its order means something (thesis section 5.3)",
    "laplace": "1 / kappa of the last-layer Laplace predictive of the embedding (LAM "
    "section 3): the spread of the embedding under the posterior",
    "knn": "the mean cosine distance 1 - cos to the 10 nearest images of the other folds "
    "(Sun et al. 2022): how far the image lies from the rest of the folder",
    "mahalanobis": "the squared Mahalanobis distance of the feature to the nearest class mean "
    "of the other folds, one shared Ledoit-Wolf covariance (Lee et al. 2018)",
    "gmm": "-log density of the feature under a Gaussian mixture of the other folds' features, "
    "one component per class (DDU, Mukhoti et al. 2023), or 10 k-means components in a folder "
    "without classes (in nats: negative where the density exceeds 1)",
}


#: What u did on labelled folders where it was measured, for a method whose u misled there: the
#: companion page says it even when the folder has no labels to check it against.
U_MEASURED = {
    "laplace": "Measured on two labelled folders of 1,000 images (Open Clip Art drawings, "
    "FashionMNIST test images) this u was inverted on both -- R-AUROC 0.32 and 0.38, higher u "
    "on the images whose neighbour is right -- and stayed so with every Hessian pair set tried "
    "(docs: Concepts > Laplacian metric learning, 'Which pairs enter the Hessian'). Do not "
    "rank images by it unless labelled images of your own show R-AUROC above 0.5.",
}
