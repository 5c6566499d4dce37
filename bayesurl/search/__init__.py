"""How neighbours are found: the exact cosine k-nearest-neighbour search behind every
retrieval metric, in one process or sharded over ranks, and the sampling-aware per-draw 1-NN
search behind the retrieval ECE.

- :mod:`~bayesurl.search.exact`: the entry points (:func:`knn`, :func:`knn_query`,
  :func:`knn_sharded`) and the choice of pass;
- :mod:`~bayesurl.search.float32`, :mod:`~bayesurl.search.bf16`,
  :mod:`~bayesurl.search.fused`: the passes (float32 block products; a certified bfloat16
  candidate pass; a fused Triton product-and-select on a GPU), all giving the same neighbours
  and values bit for bit;
- :mod:`~bayesurl.search.backends`: search objects with pytorch-metric-learning's
  ``knn_func`` contract (:class:`ExactSearch`, :class:`FaissSearch`, any :class:`KnnFunc`);
- :mod:`~bayesurl.search.sampled`: the 1-NN of every query within each posterior draw.

Conventions (docs/concepts/metrics.rst, "Recall@1 and Recall@k"): cosine similarity of
L2-normalised rows, self excluded by index, ties to the lowest index.
"""

from bayesurl.search.backends import ExactSearch, FaissSearch, KnnFunc
from bayesurl.search.bf16 import low_precision, search_precision
from bayesurl.search.core import DEFAULT_MEMORY_BUDGET, normalize, rank_budget, search_stats
from bayesurl.search.exact import knn, knn_query, knn_sharded
from bayesurl.search.fused import fused_search
from bayesurl.search.sampled import DrawSearch, choose_shortlist, sampled_neighbors

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "DrawSearch",
    "ExactSearch",
    "FaissSearch",
    "KnnFunc",
    "choose_shortlist",
    "fused_search",
    "knn",
    "knn_query",
    "knn_sharded",
    "low_precision",
    "normalize",
    "rank_budget",
    "sampled_neighbors",
    "search_precision",
    "search_stats",
]
