"""Functional retrieval and uncertainty metrics on plain tensors.

Every definition follows docs/concepts/metrics.rst, which fixes the choices the papers leave open:

- R@1 / Recall@k (URL benchmark, Kirchhof et al. 2023, section 3.1): cosine 1-NN, self
  excluded by index, ties to the lowest index, singletons count as wrong.
- R-AUROC (URL, section 3.1): AUROC of ``u`` for the positive class "R@1 wrong", ties 1/2.
- AUSC / AUSE (LAM, Warburg et al. 2023, section 5; torch-uncertainty's AUSE): sparsification
  over 100 retention levels.
- ECE for retrieval (LAM, section 5 and its evaluation code): modal 1-NN label over posterior
  draws, 10 equal-width confidence bins.
- MAP@R and R-precision (Musgrave et al. 2020, "A Metric Learning Reality Check"), as
  pytorch-metric-learning's ``AccuracyCalculator``; AURC (Geifman et al. 2019) and AUGRC
  (Traub et al. 2024) of the retrieval error ``1 - R@1``.
- OOD AUROC / AUPRC (LAM, section 5), mAP@k (LAM, section 5), Spearman rank correlation
  (URL, App. C.3), Sra's kappa approximation (docs/concepts/uncertainty.rst, "Samples").

AUROC and average precision are implemented here from ranks (Mann-Whitney U with average
ranks for ties); the tests check them against scikit-learn and torchmetrics.
All scalars are returned as 0-d float64 tensors on the device of the inputs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from bayesurl._checks import check_int, check_same_length, check_tensor
from bayesurl.search.core import DEFAULT_MEMORY_BUDGET, normalize, stable_topk
from bayesurl.search.exact import neighbor_ids
from bayesurl.search.sampled import (  # the search behind the ECE (re-exported)
    DrawSearch,
    checked_samples,
    choose_shortlist,
    neighbors_per_draw,
    resultant,
    sampled_neighbors,
)

__all__ = [
    "ECEResult",
    "augrc",
    "aurc",
    "auroc",
    "ause",
    "ausc",
    "average_precision",
    "calibration_bins",
    "class_average",
    "choose_shortlist",
    "kappa_from_samples",
    "map_at_k",
    "map_at_r",
    "mean_from_samples",
    "modal_labels",
    "ood_auprc",
    "ood_auroc",
    "oracle_curve",
    "precision_at_r",
    "precision_at_r_from_hits",
    "r_at_1",
    "r_auroc",
    "r_precision",
    "rank_correlation",
    "recall_at_k",
    "retrieval_ece",
    "risk_coverage",
    "sampled_neighbors",
    "sparsification_curve",
    "uncertainty_from_samples",
]

N_LEVELS = 100


# --------------------------------------------------------------------------- validation
def _labels(labels: object, n: int | None = None, name: str = "labels") -> Tensor:
    y = check_tensor(labels, name, ndim=1)
    if n is not None and y.shape[0] != n:
        raise ValueError(f"length mismatch: `{name}` has {y.shape[0]} entries, expected {n}")
    return y


def _embeddings(x: object, name: str = "embeddings") -> Tensor:
    t = check_tensor(x, name, ndim=2, min_points=2)
    if not t.is_floating_point():
        raise ValueError(f"`{name}` must be floating point, got {t.dtype}")
    return t


def _scores(x: object, name: str, min_points: int = 1) -> Tensor:
    t = check_tensor(x, name, ndim=1, min_points=min_points)
    return t.to(torch.float64)


def _bool(x: object, name: str) -> Tensor:
    t = check_tensor(x, name, ndim=1)
    if t.dtype != torch.bool:
        vals = torch.unique(t)
        if not bool(((vals == 0) | (vals == 1)).all()):
            raise ValueError(f"`{name}` must be boolean (or 0/1), got values {vals[:5].tolist()}")
        t = t.bool()
    return t


def _neighbors(embeddings: Tensor, k: int, neighbors: Tensor | None, memory_budget: int) -> Tensor:
    if neighbors is None:
        return neighbor_ids(embeddings, k, memory_budget)
    nb = check_tensor(neighbors, "neighbors", ndim=2)
    check_same_length(("embeddings", embeddings), ("neighbors", nb))
    if nb.shape[1] < k:
        raise ValueError(f"`neighbors` has {nb.shape[1]} columns, need at least k={k}")
    return nb[:, :k].long()


# --------------------------------------------------------------------------- ranks
def _average_ranks(x: Tensor) -> Tensor:
    """1-based ranks of ``x`` with ties given their average rank (float64)."""
    _, inv, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).to(torch.float64)
    avg = ends - (counts.to(torch.float64) - 1.0) / 2.0
    return avg[inv]


def auroc(scores: Tensor, positives: Tensor) -> Tensor:
    """Area under the ROC curve of ``scores`` for the positive class, ties counted 1/2.

    Computed as the Mann-Whitney U statistic from average ranks,
    ``AUROC = (sum_{i in pos} rank_i - P (P + 1) / 2) / (P * Q)``.

    Parameters
    ----------
    scores : Tensor
        ``[N]`` scores, higher means "more likely positive".
    positives : Tensor
        ``[N]`` boolean (or 0/1) targets.

    Returns
    -------
    Tensor
        0-d float64 AUROC.

    Raises
    ------
    ValueError
        If only one class is present, on NaN, or on a length mismatch.
    """
    s = _scores(scores, "scores")
    p = _bool(positives, "positives")
    check_same_length(("scores", s), ("positives", p))
    n_pos = int(p.sum())
    n_neg = p.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"AUROC is undefined with a single class in `positives` ({n_pos} positive, "
            f"{n_neg} negative)"
        )
    r = _average_ranks(s)
    u = r[p].sum() - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def average_precision(scores: Tensor, positives: Tensor) -> Tensor:
    """Average precision (area under the step precision-recall curve), scikit-learn style.

    ``AP = sum_n (R_n - R_{n-1}) P_n`` over the distinct score thresholds in descending
    order; tied scores enter together.

    Parameters
    ----------
    scores : Tensor
        ``[N]`` scores, higher means "more likely positive".
    positives : Tensor
        ``[N]`` boolean (or 0/1) targets; at least one positive.

    Returns
    -------
    Tensor
        0-d float64 AP.
    """
    s = _scores(scores, "scores")
    p = _bool(positives, "positives")
    check_same_length(("scores", s), ("positives", p))
    n_pos = int(p.sum())
    if n_pos == 0:
        raise ValueError("average precision is undefined without positives in `positives`")
    uniq, inv = torch.unique(s, sorted=True, return_inverse=True)
    # Per distinct threshold (descending): true and false positives at that score.
    n_u = uniq.numel()
    tp = torch.zeros(n_u, dtype=torch.float64, device=s.device).index_add_(0, inv, p.double())
    cnt = torch.zeros(n_u, dtype=torch.float64, device=s.device).index_add_(
        0, inv, torch.ones_like(s)
    )
    tp, cnt = tp.flip(0).cumsum(0), cnt.flip(0).cumsum(0)
    precision = tp / cnt
    recall = tp / n_pos
    d_recall = torch.diff(recall, prepend=recall.new_zeros(1))
    return (d_recall * precision).sum()


# --------------------------------------------------------------------------- retrieval
def r_at_1(
    embeddings: Tensor,
    labels: Tensor,
    *,
    neighbors: Tensor | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> tuple[Tensor, Tensor]:
    """Recall@1 and the per-query correctness (URL benchmark, section 3.1;
    docs/concepts/metrics.rst, "Recall@1 and Recall@k").

    Parameters
    ----------
    embeddings : Tensor
        ``[N, D]`` embeddings, compared by cosine similarity.
    labels : Tensor
        ``[N]`` class labels.
    neighbors : Tensor, optional
        ``[N, >=1]`` precomputed neighbour indices from :func:`~bayesurl.search.knn`.
    memory_budget : int
        Bytes per similarity chunk of the kNN search.

    Returns
    -------
    r1 : Tensor
        0-d float64 R@1.
    correct : Tensor
        ``[N]`` bool, ``label[nn(i)] == label[i]``; a singleton query is wrong.
    """
    x = _embeddings(embeddings)
    y = _labels(labels, x.shape[0])
    nb = _neighbors(x, 1, neighbors, memory_budget)
    correct = y[nb[:, 0]] == y
    return correct.double().mean(), correct


def recall_at_k(
    embeddings: Tensor,
    labels: Tensor,
    k: int = 1,
    *,
    neighbors: Tensor | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """Recall@k: fraction of queries with a same-label item among their k nearest neighbours.

    URL benchmark (section 3.1) and LAM (section 5); conventions of docs/concepts/metrics.rst (self
    excluded by index, ties to the lowest index).

    Parameters
    ----------
    embeddings, labels : Tensor
        ``[N, D]`` and ``[N]``.
    k : int
        Number of neighbours, ``1 <= k <= N - 1``.
    neighbors : Tensor, optional
        ``[N, >=k]`` precomputed neighbour indices.
    memory_budget : int
        Bytes per similarity chunk of the kNN search.

    Returns
    -------
    Tensor
        0-d float64 Recall@k.
    """
    x = _embeddings(embeddings)
    y = _labels(labels, x.shape[0])
    return recall_from_neighbors(y, _neighbors(x, k, neighbors, memory_budget), k)


def recall_from_neighbors(y: Tensor, nb: Tensor, k: int) -> Tensor:
    """:func:`recall_at_k` from labels ``[N]`` and neighbour ids ``[N, >=k]``."""
    return (y[nb[:, :k]] == y[:, None]).any(dim=1).double().mean()


def map_at_k(
    embeddings: Tensor,
    labels: Tensor,
    k: int = 5,
    *,
    neighbors: Tensor | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """Mean average precision among the k nearest neighbours (LAM, section 5, "mAP@k").

    For query ``i`` with ``n_i`` other items of its class and relevance ``rel_ij`` of its
    j-th neighbour::

        AP@k_i = sum_{j <= k} rel_ij * precision@j_i / min(k, n_i)

    and ``AP@k_i = 0`` for a singleton (``n_i = 0``), consistent with R@1. This normalisation
    makes a perfect ranking score 1 and gives ``mAP@1 == R@1``.

    Parameters
    ----------
    embeddings, labels : Tensor
        ``[N, D]`` and ``[N]``.
    k : int
        Cut-off, ``1 <= k <= N - 1``.
    neighbors : Tensor, optional
        ``[N, >=k]`` precomputed neighbour indices.
    memory_budget : int
        Bytes per similarity chunk of the kNN search.

    Returns
    -------
    Tensor
        0-d float64 mAP@k.
    """
    x = _embeddings(embeddings)
    y = _labels(labels, x.shape[0])
    return map_from_neighbors(y, _neighbors(x, k, neighbors, memory_budget), k)


def map_from_neighbors(y: Tensor, nb: Tensor, k: int) -> Tensor:
    """:func:`map_at_k` from labels ``[N]`` and neighbour ids ``[N, >=k]``."""
    return ap_from_hits(y[nb[:, :k]] == y[:, None], class_mates(y), k).mean()


def class_mates(y: Tensor) -> Tensor:
    """``[N]`` number of other items with item i's label."""
    _, inv, counts = torch.unique(y, return_inverse=True, return_counts=True)
    return counts[inv] - 1


def ap_from_hits(hit: Tensor, mates: Tensor, k: int) -> Tensor:
    """``[M]`` AP@k of each query from the relevance ``hit`` ``[M, >=k]`` of its ranked
    neighbours and its number of class-mates ``mates`` ``[M]`` (:func:`map_at_k`)."""
    rel = hit[:, :k].double()
    prec = rel.cumsum(dim=1) / torch.arange(1, k + 1, device=rel.device, dtype=torch.float64)
    n_rel = mates.clamp(max=k).double()
    ap = (rel * prec).sum(dim=1) / n_rel.clamp(min=1.0)
    return torch.where(n_rel > 0, ap, torch.zeros_like(ap))


def precision_at_r(
    embeddings: Tensor, labels: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> tuple[Tensor, Tensor]:
    """Per-query AP@R and R-precision (Musgrave et al. 2020, "A Metric Learning Reality
    Check", section 3.2), ``R`` being the number of other items of the query's class.

    Every query is ranked against all other items (self excluded by index) by the cosine
    similarity its block product gives, ties to the lowest index, and each query gets all of
    its ``R`` nearest neighbours: there is no cut-off, so the value never depends on a search
    depth. Queries are processed in chunks whose ``[B, N]`` similarity block and ``[B, R]``
    ranking fit ``memory_budget``; nothing of size ``N x R`` is kept.

    ``AP@R_i = sum_{j <= R_i} rel_ij * precision@j_i / R_i`` and
    ``R-precision_i = sum_{j <= R_i} rel_ij / R_i``.

    Parameters
    ----------
    embeddings, labels : Tensor
        ``[N, D]`` and ``[N]``.
    memory_budget : int
        Bytes for one chunk's similarity block and ranking.

    Returns
    -------
    ap, r_precision : Tensor
        ``[N]`` float64 each; ``nan`` for a query alone in its class (``R = 0``), which
        pytorch-metric-learning's ``AccuracyCalculator`` leaves out too.

    Notes
    -----
    Items are ordered by the similarities of the chunk's matrix product in the embeddings'
    dtype, so two items whose similarities to a query differ by less than its rounding (about
    ``1e-6`` in float32, exact duplicates included) may come in either order; that changes
    AP@R only when they differ in relevance (duplicates with different labels): pass
    float64 embeddings for such data.
    """
    x = _embeddings(embeddings)
    n = x.shape[0]
    y = _labels(labels, n)
    check_int(memory_budget, "memory_budget", low=1)
    qn = normalize(x)
    y = y.to(qn.device)
    r = class_mates(y)
    ap = torch.full((n,), torch.nan, dtype=torch.float64, device=qn.device)
    rp = ap.clone()
    r_max = int(r.max())
    if r_max == 0:
        return ap, rp
    item = qn.element_size()
    # one similarity row, its top-R values and ids, the relevance and its running count
    per_row = n * item + r_max * (item + 8 + 1 + 8)
    b = max(1, int(memory_budget // per_row))
    for a in range(0, n, b):
        e = min(n, a + b)
        rows = torch.arange(e - a, device=qn.device)
        ri = r[a:e]
        k = int(ri.max())
        if k == 0:
            continue
        sims = qn[a:e] @ qn.T
        sims[rows, rows + a] = -torch.inf  # self, by index
        _, idx = stable_topk(sims, k)
        del sims
        ap[a:e], rp[a:e] = precision_at_r_from_hits(y[idx] == y[a:e, None], ri)
    return ap, rp


def precision_at_r_from_hits(hit: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """Per-query AP@R and R-precision (:func:`precision_at_r`) from the relevance ``hit``
    ``[M, >= max r]`` of each query's ranked neighbours and its ``R`` ``[M]``; ``nan`` where
    ``R = 0``."""
    k = int(r.max()) if r.numel() else 0
    if hit.shape[1] < k:
        raise ValueError(f"`hit` has {hit.shape[1]} columns, fewer than the largest R ({k})")
    pos = torch.arange(1, k + 1, device=hit.device)
    rel = hit[:, :k] & (pos[None, :] <= r[:, None])
    hits = rel.cumsum(dim=1)
    denom = r.clamp(min=1).double()
    ap = (hits.double() / pos.double() * rel).sum(dim=1) / denom
    rp = (hits[:, -1].double() if k else torch.zeros_like(denom)) / denom
    lone = r == 0
    ap[lone] = torch.nan
    rp[lone] = torch.nan
    return ap, rp


def class_average(values: Tensor, labels: Tensor) -> Tensor:
    """The mean over classes of each class's mean of ``values`` (pytorch-metric-learning's
    ``avg_of_avgs``); ``nan`` values (queries alone in their class) are left out.

    Parameters
    ----------
    values : Tensor
        ``[N]`` per-query values.
    labels : Tensor
        ``[N]`` class labels.

    Returns
    -------
    Tensor
        0-d float64 (``nan`` when no value is defined).
    """
    v = check_tensor(values, "values", ndim=1, finite=False).to(torch.float64)
    y = _labels(labels, v.shape[0]).to(v.device)
    keep = ~torch.isnan(v)
    _, inv = torch.unique(y[keep], return_inverse=True)
    if inv.numel() == 0:
        return v.new_tensor(torch.nan)
    sums = torch.zeros(int(inv.max()) + 1, dtype=torch.float64, device=v.device)
    sums.index_add_(0, inv, v[keep])
    counts = torch.bincount(inv).double()
    return (sums / counts).mean()


def map_at_r(
    embeddings: Tensor,
    labels: Tensor,
    *,
    avg_of_avgs: bool = False,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """MAP@R: mean over queries of AP@R (Musgrave et al. 2020, "A Metric Learning Reality
    Check"; pytorch-metric-learning's ``mean_average_precision_at_r``).

    Parameters
    ----------
    embeddings, labels : Tensor
        ``[N, D]`` and ``[N]``.
    avg_of_avgs : bool
        Average per class first, then over the classes.
    memory_budget : int
        Bytes per chunk (:func:`precision_at_r`).

    Returns
    -------
    Tensor
        0-d float64 in [0, 1]; ``nan`` when every query is alone in its class.
    """
    ap, _ = precision_at_r(embeddings, labels, memory_budget=memory_budget)
    return class_average(ap, labels) if avg_of_avgs else ap.nanmean()


def r_precision(
    embeddings: Tensor,
    labels: Tensor,
    *,
    avg_of_avgs: bool = False,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """R-precision: the share of relevant items among each query's ``R`` nearest, averaged
    (Musgrave et al. 2020; arguments and result as :func:`map_at_r`)."""
    _, rp = precision_at_r(embeddings, labels, memory_budget=memory_budget)
    return class_average(rp, labels) if avg_of_avgs else rp.nanmean()


# --------------------------------------------------------------------------- uncertainty
def r_auroc(uncertainties: Tensor, correct: Tensor) -> Tensor:
    """R-AUROC: AUROC of ``u`` for the positive class "R@1 wrong" (URL, section 3.1).

    Parameters
    ----------
    uncertainties : Tensor
        ``[N]`` u (higher = less certain).
    correct : Tensor
        ``[N]`` bool R@1 correctness, e.g. from :func:`r_at_1`.

    Returns
    -------
    Tensor
        0-d float64; 0.5 for a constant ``u``, 1.0 for the oracle ``u = 1 - correct``.

    Raises
    ------
    ValueError
        When all queries are correct or all wrong (undefined; docs/concepts/metrics.rst, "R-AUROC").
    """
    u = _scores(uncertainties, "uncertainties", min_points=2)
    c = _bool(correct, "correct")
    check_same_length(("uncertainties", u), ("correct", c))
    n_wrong = int((~c).sum())
    if n_wrong == 0 or n_wrong == c.numel():
        state = "correct" if n_wrong == 0 else "wrong"
        raise ValueError(f"R-AUROC is undefined: all {c.numel()} queries in `correct` are {state}")
    return auroc(u, ~c)


def _levels(n: int, n_levels: int, device: torch.device) -> Tensor:
    # kept(j) = ceil(r_j * n) with r_j = (n_levels - j) / n_levels, in exact integers.
    j = torch.arange(n_levels, device=device)
    return ((n_levels - j) * n + n_levels - 1) // n_levels


def _curve_for_order(correct: Tensor, order: Tensor, n_levels: int) -> Tensor:
    c = correct[order].double()
    cs = torch.cat([c.new_zeros(1), c.cumsum(0)])
    kept = _levels(c.numel(), n_levels, c.device)
    return cs[kept] / kept.double()


def sparsification_curve(
    uncertainties: Tensor, correct: Tensor, n_levels: int = N_LEVELS
) -> tuple[Tensor, Tensor]:
    """R@1 of the most certain queries as the most uncertain ones are removed.

    For retention ``r in {1.00, 0.99, ..., 0.01}`` the ``ceil(r N)`` queries with the lowest
    ``u`` are kept (ties in ``u`` keep the lower index first) and R@1 is averaged over them;
    neighbours were searched in the full gallery (LAM, section 5 and Fig. 8;
    docs/concepts/metrics.rst, "Sparsification: AUSC and AUSE").

    Parameters
    ----------
    uncertainties : Tensor
        ``[N]`` u.
    correct : Tensor
        ``[N]`` bool R@1 correctness.
    n_levels : int
        Number of retention levels (100, docs/concepts/metrics.rst).

    Returns
    -------
    removed : Tensor
        ``[n_levels]`` removed fractions ``0, 0.01, ..., 0.99`` (float64).
    recall : Tensor
        ``[n_levels]`` R@1 over the kept queries.
    """
    u = _scores(uncertainties, "uncertainties")
    c = _bool(correct, "correct")
    check_same_length(("uncertainties", u), ("correct", c))
    if n_levels < 1:
        raise ValueError(f"`n_levels` must be positive, got {n_levels}")
    order = torch.argsort(u, stable=True)
    removed = torch.arange(n_levels, dtype=torch.float64, device=u.device) / n_levels
    return removed, _curve_for_order(c, order, n_levels)


def ausc(uncertainties: Tensor, correct: Tensor, n_levels: int = N_LEVELS) -> Tensor:
    """Area under the sparsification curve: its mean over the levels (LAM, section 5).

    Parameters
    ----------
    uncertainties, correct : Tensor
        ``[N]`` u and R@1 correctness.
    n_levels : int
        Number of retention levels.

    Returns
    -------
    Tensor
        0-d float64 in [0, 1]; higher is better.
    """
    return sparsification_curve(uncertainties, correct, n_levels)[1].mean()


def oracle_curve(correct: Tensor, n_levels: int = N_LEVELS) -> Tensor:
    """Sparsification curve of the oracle that removes wrong queries first."""
    c = _bool(correct, "correct")
    if c.numel() == 0:  # every level's R@1 would be 0 / 0
        raise ValueError("`correct` is empty: the oracle curve needs at least one query")
    order = torch.argsort((~c).to(torch.uint8), stable=True)
    return _curve_for_order(c, order, n_levels)


def ause(uncertainties: Tensor, correct: Tensor, n_levels: int = N_LEVELS) -> Tensor:
    """Area between the error sparsification curve of ``u`` and the oracle's.

    ``AUSE = mean_r [err_u(r) - err_oracle(r)]`` with ``err = 1 - R@1`` over the kept queries
    and the oracle sorting by the error itself (torch-uncertainty's AUSE),
    normalised like :func:`ausc`, so ``AUSE = AUSC_oracle - AUSC_u >= 0``.

    Parameters
    ----------
    uncertainties, correct : Tensor
        ``[N]`` u and R@1 correctness.
    n_levels : int
        Number of retention levels.

    Returns
    -------
    Tensor
        0-d float64; lower is better, 0 for an oracle.
    """
    _, curve = sparsification_curve(uncertainties, correct, n_levels)
    return (oracle_curve(correct, n_levels) - curve).mean()


def risk_coverage(uncertainties: Tensor, correct: Tensor) -> Tensor:
    """Expected number of wrong queries among the ``k`` most certain, ``k = 1 .. N``.

    Queries are kept in ascending ``u``; within a run of equal ``u`` every order is equally
    likely, so the wrong queries of the run are spread evenly over its positions (the
    expectation over the orders). A constant ``u`` therefore gives the overall error rate at
    every coverage.

    Parameters
    ----------
    uncertainties : Tensor
        ``[N]`` u (higher = less certain).
    correct : Tensor
        ``[N]`` bool R@1 correctness.

    Returns
    -------
    Tensor
        ``[N]`` float64 ``E_k``; the selective risk at coverage ``k / N`` is ``E_k / k``,
        the generalised risk ``E_k / N``.
    """
    u = _scores(uncertainties, "uncertainties")
    c = _bool(correct, "correct").to(u.device)
    check_same_length(("uncertainties", u), ("correct", c))
    n = u.numel()
    us, order = torch.sort(u, stable=True)
    err = (~c[order]).double()
    start = torch.ones(n, dtype=torch.bool, device=u.device)
    start[1:] = us[1:] != us[:-1]
    gid = start.long().cumsum(0) - 1
    size = torch.bincount(gid).double()
    wrong = torch.bincount(gid, weights=err)
    k_before = size.cumsum(0) - size
    e_before = wrong.cumsum(0) - wrong
    k = torch.arange(1, n + 1, dtype=torch.float64, device=u.device)
    return e_before[gid] + (k - k_before[gid]) * (wrong / size)[gid]


def aurc(uncertainties: Tensor, correct: Tensor) -> Tensor:
    """Area under the risk-coverage curve: the mean over the coverages ``k / N`` of the
    selective risk (error rate of the ``k`` most certain queries; Geifman et al. 2019,
    "Bias-Reduced Uncertainty Estimation for Deep Neural Classifiers", ICLR; torch-uncertainty's
    ``AURC``). The risk here is the retrieval error ``1 - R@1``; ties in ``u`` as
    :func:`risk_coverage`.

    Parameters
    ----------
    uncertainties, correct : Tensor
        ``[N]`` u and R@1 correctness.

    Returns
    -------
    Tensor
        0-d float64 in [0, 1]; lower is better. A constant ``u`` gives the error rate.
    """
    e = risk_coverage(uncertainties, correct)
    k = torch.arange(1, e.numel() + 1, dtype=torch.float64, device=e.device)
    return (e / k).mean()


def augrc(uncertainties: Tensor, correct: Tensor) -> Tensor:
    """Area under the generalised risk-coverage curve (Traub et al. 2024, "Overcoming Common
    Flaws in the Evaluation of Selective Classification Systems", NeurIPS; torch-uncertainty's
    ``AUGRC``): the mean over the coverages ``k / N`` of the generalised risk, the share of
    all queries that are kept **and** wrong (``E_k / N``, :func:`risk_coverage`).

    Parameters
    ----------
    uncertainties, correct : Tensor
        ``[N]`` u and R@1 correctness.

    Returns
    -------
    Tensor
        0-d float64 in [0, 1]; lower is better. A constant ``u`` gives
        ``error rate * (N + 1) / (2 N)``.
    """
    e = risk_coverage(uncertainties, correct)
    return e.mean() / e.numel()


def ood_auroc(uncertainties: Tensor, ood_uncertainties: Tensor) -> Tensor:
    """AUROC of ``u`` for the positive class "out of distribution" (LAM, section 5).

    Parameters
    ----------
    uncertainties : Tensor
        ``[N]`` u of in-distribution inputs.
    ood_uncertainties : Tensor
        ``[M]`` u of out-of-distribution inputs.

    Returns
    -------
    Tensor
        0-d float64.
    """
    return auroc(*_ood(uncertainties, ood_uncertainties))


def ood_auprc(uncertainties: Tensor, ood_uncertainties: Tensor) -> Tensor:
    """Average precision of ``u`` for the positive class "out of distribution" (LAM, sec. 5).

    Parameters
    ----------
    uncertainties : Tensor
        ``[N]`` u of in-distribution inputs.
    ood_uncertainties : Tensor
        ``[M]`` u of out-of-distribution inputs.

    Returns
    -------
    Tensor
        0-d float64.
    """
    return average_precision(*_ood(uncertainties, ood_uncertainties))


def _ood(uncertainties: Tensor, ood_uncertainties: Tensor) -> tuple[Tensor, Tensor]:
    """The checked u of both sets pooled (in-distribution first) and the positives, "OOD"."""
    u = _scores(uncertainties, "uncertainties")
    v = _scores(ood_uncertainties, "ood_uncertainties")
    if v.device != u.device:
        raise ValueError(f"`ood_uncertainties` is on {v.device}, `uncertainties` on {u.device}")
    ood = torch.cat([torch.zeros_like(u, dtype=torch.bool), torch.ones_like(v, dtype=torch.bool)])
    return torch.cat([u, v]), ood


def rank_correlation(uncertainties: Tensor, reference: Tensor) -> Tensor:
    """Spearman rank correlation of ``u`` with a reference uncertainty (URL, App. C.3).

    Pearson correlation of the average ranks (ties share their mean rank, as in
    :func:`scipy.stats.spearmanr`).

    Parameters
    ----------
    uncertainties : Tensor
        ``[N]`` u.
    reference : Tensor
        ``[N]`` ground-truth uncertainty (label entropy, true ``1/kappa``, crop amount).

    Returns
    -------
    Tensor
        0-d float64 in [-1, 1].
    """
    u = _scores(uncertainties, "uncertainties", min_points=2)
    r = _scores(reference, "reference", min_points=2)
    check_same_length(("uncertainties", u), ("reference", r))
    a, b = _average_ranks(u), _average_ranks(r)
    a, b = a - a.mean(), b - b.mean()
    den = a.norm() * b.norm()
    if float(den) == 0.0:
        which = "uncertainties" if float(a.norm()) == 0.0 else "reference"
        raise ValueError(f"rank correlation is undefined: `{which}` is constant")
    return (a * b).sum() / den


# --------------------------------------------------------------------------- samples
def mean_from_samples(samples: Tensor) -> Tensor:
    """Point embedding from draws: the normalised mean of the normalised samples.

    docs/concepts/uncertainty.rst, "Samples". Loops over draws so no normalised copy of the
    whole ``[S, N, D]`` tensor is made.

    Parameters
    ----------
    samples : Tensor
        ``[S, N, D]`` draws.

    Returns
    -------
    Tensor
        ``[N, D]`` unit vectors (zero where the mean resultant vanishes).
    """
    return normalize(resultant(checked_samples(samples)))


def _mean_length(samples: Tensor) -> tuple[Tensor, int]:
    s = checked_samples(samples)
    return resultant_length(resultant(s)), s.shape[-1]


def resultant_length(mean_resultant: Tensor) -> Tensor:
    """Mean resultant lengths ``R`` in float64, clamped to [0, 1]."""
    return mean_resultant.norm(dim=-1).to(torch.float64).clamp(0.0, 1.0)


def kappa_from_samples(samples: Tensor) -> Tensor:
    """vMF concentration from draws by Sra's approximation (Sra 2012; docs/concepts/uncertainty.rst,
    "Samples").

    ``kappa_hat = R (D - R^2) / (1 - R^2)`` with ``R = ||mean_s z_s||`` of the normalised
    draws ``z_s``.

    Parameters
    ----------
    samples : Tensor
        ``[S, N, D]`` draws.

    Returns
    -------
    Tensor
        ``[N]`` float64 ``kappa_hat`` (``inf`` where all draws coincide).
    """
    r, d = _mean_length(samples)
    return r * (d - r**2) / (1.0 - r**2)


def uncertainty_from_samples(samples: Tensor) -> Tensor:
    """Default uncertainty of sampled embeddings, ``u = 1 / kappa_hat``
    (docs/concepts/uncertainty.rst, "Samples").

    Computed as ``(1 - R^2) / (R (D - R^2))`` so identical draws give ``u = 0`` exactly.

    Parameters
    ----------
    samples : Tensor
        ``[S, N, D]`` draws.

    Returns
    -------
    Tensor
        ``[N]`` float64 u.
    """
    r, d = _mean_length(samples)
    return u_from_length(r, d)


def u_from_length(r: Tensor, d: int) -> Tensor:
    """``1 / kappa_hat = (1 - R^2) / (R (D - R^2))`` (Sra) from float64 lengths ``R``."""
    return (1.0 - r**2) / (r * (d - r**2))


def modal_labels(neighbor_labels: Tensor) -> tuple[Tensor, Tensor]:
    """Modal label over draws and its vote count, ties to the smallest label.

    Parameters
    ----------
    neighbor_labels : Tensor
        ``[S, N]`` integer labels of the 1-NN in each draw.

    Returns
    -------
    mode : Tensor
        ``[N]`` modal label.
    count : Tensor
        ``[N]`` number of draws that voted for it.
    """
    lab = check_tensor(neighbor_labels, "neighbor_labels", ndim=2)
    n_draws, n = lab.shape
    if n_draws == 0:
        raise ValueError("`neighbor_labels` has no draws (rows): no label to vote for")
    uniq, inv = torch.unique(lab, return_inverse=True)
    c = uniq.numel()
    col = torch.arange(n, device=lab.device).expand(n_draws, n)
    keys, counts = torch.unique(col * c + inv, return_counts=True)  # sorted: col, then label
    kcol = keys // c
    best = torch.zeros(n, dtype=counts.dtype, device=lab.device).scatter_reduce(
        0, kcol, counts, reduce="amax"
    )
    winner = torch.where(counts == best[kcol], keys, torch.full_like(keys, n * c))
    first = torch.full((n,), n * c, dtype=keys.dtype, device=lab.device).scatter_reduce(
        0, kcol, winner, reduce="amin"
    )
    return uniq[first % c], best


class ECEResult(NamedTuple):
    """Retrieval ECE with the reliability-diagram data (LAM, section 5 and Fig. 5).

    Attributes
    ----------
    ece : Tensor
        0-d float64 expected calibration error.
    bin_edges : Tensor
        ``[n_bins + 1]`` equal-width edges on [0, 1].
    bin_confidence, bin_accuracy : Tensor
        ``[n_bins]`` mean confidence and accuracy per bin (NaN for an empty bin).
    bin_count : Tensor
        ``[n_bins]`` queries per bin.
    confidence : Tensor
        ``[N]`` fraction of draws agreeing with the modal label.
    correct : Tensor
        ``[N]`` bool, modal label == true label.
    neighbors : Tensor or None
        ``[S, N]`` per-draw 1-NN indices (from :func:`retrieval_ece`).
    """

    ece: Tensor
    bin_edges: Tensor
    bin_confidence: Tensor
    bin_accuracy: Tensor
    bin_count: Tensor
    confidence: Tensor
    correct: Tensor
    neighbors: Tensor | None = None


def check_n_bins(n_bins: object) -> None:
    check_int(n_bins, "n_bins", low=1)


def calibration_bins(confidence: Tensor, correct: Tensor, n_bins: int = 10) -> ECEResult:
    """ECE over ``n_bins`` equal-width bins ``(b/n, (b+1)/n]`` weighted by bin counts.

    Parameters
    ----------
    confidence : Tensor
        ``[N]`` confidences in [0, 1].
    correct : Tensor
        ``[N]`` bool correctness.
    n_bins : int
        Number of bins (10 in docs/concepts/metrics.rst).

    Returns
    -------
    ECEResult
    """
    conf = _scores(confidence, "confidence")
    c = _bool(correct, "correct")
    check_same_length(("confidence", conf), ("correct", c))
    check_n_bins(n_bins)
    if bool(((conf < 0) | (conf > 1)).any()):
        raise ValueError("`confidence` must lie in [0, 1]")
    edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64, device=conf.device)
    b = torch.bucketize(conf, edges[1:-1], right=False)  # edges[b-1] < conf <= edges[b]
    zeros = torch.zeros(n_bins, dtype=torch.float64, device=conf.device)
    count = zeros.index_add(0, b, torch.ones_like(conf))
    s_conf = zeros.index_add(0, b, conf)
    s_acc = zeros.index_add(0, b, c.double())
    ece = (s_acc - s_conf).abs().sum() / conf.numel()
    return ECEResult(ece, edges, s_conf / count, s_acc / count, count, conf, c)


def retrieval_ece(
    samples: Tensor,
    labels: Tensor,
    *,
    n_bins: int = 10,
    candidates: Tensor | None = None,
    info: dict[str, float] | None = None,
    **search: Any,
) -> ECEResult:
    """Expected calibration error of sampled retrieval (LAM, section 5; docs/concepts/metrics.rst,
    "Calibration: ECE for retrieval").

    For every draw s the 1-NN of each query among draw s of the gallery is found (self excluded
    by index); the prediction is the modal neighbour label over draws, the confidence the
    fraction of draws agreeing with it, and ``correct = mode == label``. ECE is the
    count-weighted mean ``|accuracy - confidence|`` over ``n_bins`` equal-width bins.

    Parameters
    ----------
    samples : Tensor
        ``[S, N, D]`` draws.
    labels : Tensor
        ``[N]`` class labels.
    n_bins : int
        Number of confidence bins.
    candidates, info
        See :func:`~bayesurl.search.sampled_neighbors`.
    **search
        The per-draw search's settings, the fields of :class:`~bayesurl.search.DrawSearch`
        (``mode``, ``shortlist``, ``tolerance``, ``margin``, ``memory_budget``, ``progress``,
        ``block``, ``cluster_iters``); an unknown name raises ``TypeError``.

    Returns
    -------
    ECEResult
        ECE and the reliability-diagram data.
    """
    settings = DrawSearch(**search)
    s = checked_samples(samples, check_values=settings.mode == "exact")
    y = _labels(labels, s.shape[1])
    if s.shape[1] < 2:
        raise ValueError(f"`samples` needs at least 2 points, got {s.shape[1]}")
    nb = neighbors_per_draw(s, settings, candidates=candidates, info=info)
    return ece_from_neighbors(nb, y, s.shape[0], n_bins)


def ece_from_neighbors(nb: Tensor, y: Tensor, n_draws: int, n_bins: int) -> ECEResult:
    """:func:`retrieval_ece` from the ``[S, N]`` per-draw neighbours ``nb``."""
    mode_label, votes = modal_labels(y[nb])
    conf = votes.double() / n_draws
    return calibration_bins(conf, mode_label == y, n_bins)._replace(neighbors=nb)
