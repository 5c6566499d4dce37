"""Uncertainty metrics as the LAM authors' code computes them (named variants, not defaults).

Warburg, Jørgensen, Civera & Hauberg (2023), "Bayesian Metric Learning for Uncertainty
Quantification in Image Retrieval" (LAM), section 5 and Table 2; the published numbers come
from the evaluation code of github.com/FrederikWarburg/bayesian-metric-learning
(``src/evaluate/ausc.py``, ``ece.py``, ``ood.py``). These functions re-state what that code
does, so a table made with bayesurl can be put beside the paper's; they are written from the
description below, not copied.

Differences from bayesurl's own definitions (:mod:`bayesurl.evaluation.functional`, the
defaults, kept because they are the better-defined ones):

- **uncertainty.** LAM summarises ``S`` posterior draws by the per-dimension standard
  deviation ``sigma = std_s(z_s)`` (unbiased, ``[N, D]``) and never forms a scalar ``u``
  except as sums/means of ``sigma``. bayesurl uses ``u = 1 / kappa_hat`` of a vMF fitted to
  the draws (Sra's approximation; docs/concepts/uncertainty.rst, "Samples"), which is invariant to
  rotations of the embedding space and defined for point-estimate methods too.
- **AUSC** (:func:`lam_ausc`). LAM ranks queries by the *pair* uncertainty
  ``mean_d(sigma_q + sigma_nn(q))`` of the query and its nearest neighbour (Euclidean, on the
  mean embeddings, self excluded), removes the most uncertain ``0, 1, ..., 98 %`` of queries
  (``int(N * i / 100)`` of them), and integrates the 99 accuracies of the rest with the
  trapezoid rule at spacing ``1/99``. bayesurl ranks by the query's own ``u``, uses every
  removal count ``0 .. N - 1`` and averages (the exact area), so no level is dropped and the
  value does not depend on the 99-level grid.
- **ECE** (:func:`lam_ece`). Per draw, the label of the draw's nearest neighbour (self
  excluded); prediction = the most frequent of those labels (ties: the smallest label);
  confidence = the fraction of draws that agree with it; accuracy = prediction equals the
  query's label. Ten bins ``[lo, hi)`` from ``numpy.histogram`` edges on ``[0, 1]``: a
  confidence of exactly 1.0 (every draw agrees, the most common case for a confident model)
  falls in **no** bin, and the bin weights are renormalised over the binned queries only.
  bayesurl's ECE closes the last bin (``[0.9, 1.0]``) and so counts every query.
- **OOD** (:func:`lam_ood_scores`). Score = ``sum_d sigma_d``; AUROC as usual, AUPRC as the
  trapezoidal area under the precision-recall curve (torchmetrics' ``AUC(reorder=True)`` of
  ``PrecisionRecallCurve``), not average precision.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bayesurl._checks import check_finite, check_int, check_same_length, check_tensor

__all__ = [
    "lam_ausc",
    "lam_ece",
    "lam_metrics",
    "lam_ood_scores",
    "lam_sigma",
]


def _check_samples(samples: Tensor, name: str = "samples") -> Tensor:
    s = check_tensor(samples, name, ndim=3, finite=False)
    if s.shape[0] < 2:
        raise ValueError(f"`{name}` needs at least 2 draws (a standard deviation), got 1")
    if s.shape[1] < 2:
        raise ValueError(f"`{name}` needs at least 2 inputs (a nearest neighbour)")
    check_finite(s, name)
    return s


#: up to this embedding dimension the 1-NN searches use a k-d tree (LAM's FashionMNIST
#: embeddings are 3-d); above it, chunked brute force
_KDTREE_MAX_DIM = 16


def _nearest_other(x: Tensor, chunk: int = 2048) -> Tensor:
    """Index of each row's nearest other row (Euclidean), chunked over queries.

    ``argmin_j ||x_i - x_j||^2 = argmin_j (||x_j||^2 - 2 x_i^T x_j)``: one matrix product per
    chunk, in the input's floating dtype (float64 inputs give exact float64 ranks).
    """
    n = x.shape[0]
    x = x if x.is_floating_point() else x.double()
    if x.shape[1] <= _KDTREE_MAX_DIM:
        return _nearest_other_kdtree(x)
    sq = (x * x).sum(1)
    out = torch.empty(n, dtype=torch.long, device=x.device)
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        d = torch.addmm(sq[None, :], x[lo:hi], x.T, alpha=-2.0)
        rows = torch.arange(hi - lo, device=x.device)
        d[rows, rows + lo] = float("inf")
        out[lo:hi] = d.argmin(1)
    return out


def _nearest_other_kdtree(x: Tensor) -> Tensor:
    """Exact Euclidean nearest other row with a k-d tree (low dimensions; O(N log N))."""
    from scipy.spatial import cKDTree

    xs = x.detach().double().cpu().numpy()
    _, idx = cKDTree(xs).query(xs, k=2)
    idx_t = torch.from_numpy(idx).long()
    own = torch.arange(x.shape[0])
    # self is normally first; with an exact duplicate it may come second
    return torch.where(idx_t[:, 0] == own, idx_t[:, 1], idx_t[:, 0]).to(x.device)


def lam_sigma(samples: Tensor) -> Tensor:
    """Per-dimension standard deviation of the draws (LAM's ``z_sigma``), ``[N, D]``.

    Parameters
    ----------
    samples : Tensor
        ``[S, N, D]`` posterior draws of the (normalised) embeddings, ``S >= 2``.
    """
    return _check_samples(samples).std(dim=0)


def lam_ausc(embeddings: Tensor, sigma: Tensor, labels: Tensor) -> float:
    """AUSC as in the LAM code: pair uncertainty, 99 removal levels, trapezoid rule.

    Parameters
    ----------
    embeddings : Tensor
        ``[N, D]`` mean embeddings (LAM: the mean of the normalised draws, not renormalised).
    sigma : Tensor
        ``[N, D]`` per-dimension standard deviations (:func:`lam_sigma`).
    labels : Tensor
        ``[N]`` class labels.

    Returns
    -------
    float
        ``trapz(acc_0 .. acc_98, dx=1/99)`` with ``acc_i`` the top-1 accuracy after removing
        the ``int(N i / 100)`` queries of highest ``mean_d(sigma_q + sigma_nn)``.
    """
    x = check_tensor(embeddings, "embeddings", ndim=2)
    sig = check_tensor(sigma, "sigma", ndim=2)
    y = check_tensor(labels, "labels", ndim=1)
    check_same_length(("embeddings", x), ("sigma", sig), ("labels", y))
    if sig.shape != x.shape:
        raise ValueError(f"`sigma` {tuple(sig.shape)} must match `embeddings` {tuple(x.shape)}")
    if x.shape[0] < 2:
        raise ValueError("`embeddings` needs at least 2 rows (a nearest neighbour)")
    nn_idx = _nearest_other(x)
    y = y.to(x.device)
    correct = (y[nn_idx] == y).double()
    pair = (sig + sig[nn_idx]).double().mean(dim=1)
    order = torch.sort(-pair, stable=True).indices
    n = x.shape[0]
    acc = torch.stack([correct[order[int(n * i / 100) :]].mean() for i in range(99)])
    dx = 1.0 / 99
    return float(((acc[1:] + acc[:-1]) * 0.5 * dx).sum())


def lam_ece(samples: Tensor, labels: Tensor, n_bins: int = 10) -> float:
    """Retrieval ECE as in the LAM code: majority vote of per-draw 1-NN, bins ``[lo, hi)``.

    Parameters
    ----------
    samples : Tensor
        ``[S, N, D]`` posterior draws; each draw is searched on its own (Euclidean 1-NN,
        self excluded).
    labels : Tensor
        ``[N]`` class labels.
    n_bins : int
        Equal-width bins on ``[0, 1]``, each ``[lo, hi)`` (a confidence of 1.0 is in none).

    Returns
    -------
    float
        ``sum_b w_b |acc_b - conf_b|`` with ``w_b`` the share of the *binned* queries; 0.0
        if no query falls in a bin (every confidence is 1.0).
    """
    s = _check_samples(samples)
    y = check_tensor(labels, "labels", ndim=1)
    if y.shape[0] != s.shape[1]:
        raise ValueError(f"`labels` has {y.shape[0]} entries, `samples` has {s.shape[1]} inputs")
    check_int(n_bins, "n_bins", low=1)
    y = y.to(s.device).long()
    if bool((y < 0).any()):
        raise ValueError("`labels` must be non-negative integers")
    preds = torch.stack([y[_nearest_other(s[i])] for i in range(s.shape[0])])  # [S, N]
    n_cls = int(y.max()) + 1
    counts = torch.zeros(n_cls, y.shape[0], dtype=torch.long, device=y.device)
    counts.scatter_add_(0, preds, torch.ones_like(preds))
    majority = counts.argmax(dim=0)  # first maximum: the smallest label on ties
    conf = (preds == majority).double().mean(dim=0)
    hit = (majority == y).double()
    edges = torch.linspace(0.0, 1.0, int(n_bins) + 1, dtype=torch.float64)
    total, err = 0, 0.0
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist()):
        m = (conf >= lo) & (conf < hi)
        k = int(m.sum())
        if k:
            total += k
            err += k * abs(float(hit[m].mean()) - float(conf[m].mean()))
    return err / total if total else 0.0


def lam_ood_scores(sigma_id: Tensor, sigma_ood: Tensor) -> dict[str, float]:
    """OOD AUROC / AUPRC as in the LAM code, from ``sum_d sigma_d`` (OOD is the positive).

    Parameters
    ----------
    sigma_id, sigma_ood : Tensor
        ``[N, D]`` and ``[M, D]`` per-dimension standard deviations (:func:`lam_sigma`).

    Returns
    -------
    dict
        ``auroc`` (ties count one half) and ``auprc`` (trapezoidal area under the
        precision-recall curve over the distinct thresholds, starting at recall 0,
        precision 1).
    """
    a = check_tensor(sigma_id, "sigma_id", ndim=2)
    b = check_tensor(sigma_ood, "sigma_ood", ndim=2)
    if a.shape[0] == 0 or b.shape[0] == 0:
        raise ValueError("`sigma_id` and `sigma_ood` must both be non-empty")
    score = torch.cat([a.double().sum(1), b.double().sum(1).to(a.device)])
    target = torch.cat(
        [torch.zeros(a.shape[0], device=a.device), torch.ones(b.shape[0], device=a.device)]
    ).double()
    order = torch.sort(score, descending=True, stable=True).indices
    s_sorted, t_sorted = score[order], target[order]
    tp = torch.cumsum(t_sorted, 0)
    fp = torch.cumsum(1.0 - t_sorted, 0)
    # keep the last index of each run of equal scores (one point per threshold)
    last = torch.ones_like(s_sorted, dtype=torch.bool)
    last[:-1] = s_sorted[1:] != s_sorted[:-1]
    tp, fp = tp[last], fp[last]
    p, n = float(b.shape[0]), float(a.shape[0])
    tpr = torch.cat([tp.new_zeros(1), tp / p])
    fpr = torch.cat([fp.new_zeros(1), fp / n])
    auroc = float(torch.trapezoid(tpr, fpr))
    recall = torch.cat([tp.new_zeros(1), tp / p])
    precision = torch.cat([tp.new_ones(1), tp / (tp + fp)])
    auprc = float(torch.trapezoid(precision, recall))
    return {"auroc": auroc, "auprc": auprc}


def lam_metrics(
    samples: Tensor,
    labels: Tensor,
    *,
    ood_samples: Tensor | None = None,
    n_bins: int = 10,
) -> dict[str, float | None]:
    """The LAM-code AUSC, ECE and (with ``ood_samples``) OOD AUROC / AUPRC of one model.

    Mean embedding = mean of the draws (not renormalised), ``sigma`` = :func:`lam_sigma`.

    Returns
    -------
    dict
        ``lam_ausc``, ``lam_ece``, ``lam_ood_auroc``, ``lam_ood_auprc`` (``None`` without
        ``ood_samples``).
    """
    s = _check_samples(samples)
    sigma = s.std(dim=0)
    out: dict[str, float | None] = {
        "lam_ausc": lam_ausc(s.mean(dim=0), sigma, labels),
        "lam_ece": lam_ece(s, labels, n_bins),
        "lam_ood_auroc": None,
        "lam_ood_auprc": None,
    }
    if ood_samples is not None:
        ood = lam_ood_scores(sigma, lam_sigma(ood_samples))
        out["lam_ood_auroc"], out["lam_ood_auprc"] = ood["auroc"], ood["auprc"]
    return out
