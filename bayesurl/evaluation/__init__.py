"""The sampling-aware evaluator: functional metrics, the metric table, torchmetrics classes,
one entry point (:func:`evaluate`), notes and plots. Definitions: docs/concepts/metrics.rst;
papers: URL benchmark (Kirchhof et al. 2023, section 3.1) and LAM (Warburg et al. 2023,
section 5). The neighbour search it runs lives in :mod:`bayesurl.search`, the intervals of its
numbers in :mod:`bayesurl.stats`; their public names are re-exported here (the classes stay
importable from here, and are documented in their own packages).

The torchmetrics classes (:mod:`bayesurl.evaluation.metrics`, which imports torchmetrics and,
through it, torchvision and scipy) and the plot helpers (matplotlib) load on first use of one
of their names, so ``bayesurl evaluate`` and the functional API start without them (about
1 s and 280 MB of resident memory per process under torchrun).
"""

import importlib
from typing import TYPE_CHECKING, Any

from bayesurl.evaluation.evaluator import (
    REQUIRED_KEYS,
    EvaluationResult,
    Evaluator,
    evaluate,
    evaluate_output,
)
from bayesurl.evaluation.functional import (
    ECEResult,
    augrc,
    aurc,
    auroc,
    ausc,
    ause,
    average_precision,
    calibration_bins,
    choose_shortlist,
    kappa_from_samples,
    map_at_k,
    map_at_r,
    mean_from_samples,
    modal_labels,
    ood_auprc,
    ood_auroc,
    oracle_curve,
    r_at_1,
    r_auroc,
    r_precision,
    rank_correlation,
    recall_at_k,
    retrieval_ece,
    sampled_neighbors,
    sparsification_curve,
    uncertainty_from_samples,
)
from bayesurl.evaluation.memo import NeighborMemo

# the classes below are importable from here as before, but documented once, in their own
# packages: they are not in __all__ (the functions are)
from bayesurl.search import (  # noqa: F401
    DEFAULT_MEMORY_BUDGET,
    DrawSearch,
    ExactSearch,
    FaissSearch,
    KnnFunc,
    fused_search,
    knn,
    knn_query,
    knn_sharded,
    low_precision,
    normalize,
    rank_budget,
    search_precision,
    search_stats,
)
from bayesurl.stats import Interval, IntervalMethod  # noqa: F401

if TYPE_CHECKING:  # loaded lazily at run time (see the module docstring)
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
    from bayesurl.evaluation.plots import (
        plot_recall_vs_rauroc,
        plot_reliability_diagram,
        plot_roc,
        plot_sparsification_curve,
    )

#: name -> submodule of the names loaded on first use
_LAZY = {
    **dict.fromkeys(
        ("AUSC", "AUSE", "OODAUPRC", "OODAUROC", "RAUROC", "MAPAtK", "RecallAtK", "RetrievalECE"),
        "metrics",
    ),
    **dict.fromkeys(
        (
            "plot_recall_vs_rauroc",
            "plot_reliability_diagram",
            "plot_roc",
            "plot_sparsification_curve",
        ),
        "plots",
    ),
}


def __getattr__(name: str) -> Any:
    # torchmetrics classes and plot helpers load on first use (heavy third-party imports).
    if name in _LAZY:
        module = importlib.import_module(f"bayesurl.evaluation.{_LAZY[name]}")
        value = getattr(module, name)
        globals()[name] = value  # later look-ups skip __getattr__
        return value
    raise AttributeError(f"module 'bayesurl.evaluation' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "AUSC",
    "AUSE",
    "DEFAULT_MEMORY_BUDGET",
    "ECEResult",
    "EvaluationResult",
    "Evaluator",
    "MAPAtK",
    "NeighborMemo",
    "OODAUPRC",
    "OODAUROC",
    "RAUROC",
    "REQUIRED_KEYS",
    "RecallAtK",
    "RetrievalECE",
    "augrc",
    "aurc",
    "auroc",
    "ause",
    "ausc",
    "average_precision",
    "calibration_bins",
    "choose_shortlist",
    "evaluate",
    "evaluate_output",
    "fused_search",
    "kappa_from_samples",
    "knn",
    "knn_query",
    "knn_sharded",
    "low_precision",
    "map_at_k",
    "map_at_r",
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
    "r_precision",
    "rank_budget",
    "rank_correlation",
    "recall_at_k",
    "retrieval_ece",
    "sampled_neighbors",
    "search_precision",
    "search_stats",
    "sparsification_curve",
    "uncertainty_from_samples",
]
