"""The sampling-aware evaluator: exact chunked kNN, functional metrics, torchmetrics classes,
one entry point (:func:`evaluate`) and plots. Definitions: spec METRICS.md; papers: URL
benchmark (Kirchhof et al. 2023, section 3.1) and LAM (Warburg et al. 2023, section 5)."""

from typing import Any

from bayesurl.evaluation.evaluator import REQUIRED_KEYS, evaluate, evaluate_output
from bayesurl.evaluation.functional import (
    ECEResult,
    auroc,
    ausc,
    ause,
    average_precision,
    calibration_bins,
    choose_shortlist,
    kappa_from_samples,
    map_at_k,
    mean_from_samples,
    modal_labels,
    ood_auprc,
    ood_auroc,
    oracle_curve,
    r_at_1,
    r_auroc,
    rank_correlation,
    recall_at_k,
    retrieval_ece,
    sampled_neighbors,
    sparsification_curve,
    uncertainty_from_samples,
)
from bayesurl.evaluation.knn import DEFAULT_MEMORY_BUDGET, knn, knn_query, knn_sharded, normalize
from bayesurl.evaluation.metrics import (
    AUSC,
    AUSE,
    OODAUPRC,
    OODAUROC,
    RAUROC,
    MAPAtK,
    RecallAtK,
    RetrievalECE,
)

_PLOTS = {
    "plot_recall_vs_rauroc",
    "plot_reliability_diagram",
    "plot_roc",
    "plot_sparsification_curve",
}


def __getattr__(name: str) -> Any:
    # Plot helpers import matplotlib, so they load on first use.
    if name in _PLOTS:
        from bayesurl.evaluation import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'bayesurl.evaluation' has no attribute {name!r}")


__all__ = [
    "AUSC",
    "AUSE",
    "DEFAULT_MEMORY_BUDGET",
    "ECEResult",
    "MAPAtK",
    "OODAUPRC",
    "OODAUROC",
    "RAUROC",
    "REQUIRED_KEYS",
    "RecallAtK",
    "RetrievalECE",
    "auroc",
    "ause",
    "ausc",
    "average_precision",
    "calibration_bins",
    "choose_shortlist",
    "evaluate",
    "evaluate_output",
    "kappa_from_samples",
    "knn",
    "knn_query",
    "knn_sharded",
    "map_at_k",
    "mean_from_samples",
    "modal_labels",
    "normalize",
    "ood_auprc",
    "ood_auroc",
    "oracle_curve",
    "plot_recall_vs_rauroc",
    "plot_reliability_diagram",
    "plot_roc",
    "plot_sparsification_curve",
    "r_at_1",
    "r_auroc",
    "rank_correlation",
    "recall_at_k",
    "retrieval_ece",
    "sampled_neighbors",
    "sparsification_curve",
    "uncertainty_from_samples",
]
