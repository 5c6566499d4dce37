"""Plots of the evaluator's results (matplotlib, no pyplot state, Agg-safe).

Figures are built with :class:`matplotlib.figure.Figure` directly, so no global backend or
pyplot state is touched; pass ``path`` to save a PNG/PDF, or ``ax`` to draw into your own axes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

__all__ = [
    "plot_recall_vs_rauroc",
    "plot_reliability_diagram",
    "plot_roc",
    "plot_sparsification_curve",
]


def _axes(ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=(4.5, 4.0), layout="constrained")
    return fig, fig.add_subplot()


def _save(fig: Figure, path: str | Path | None) -> None:
    if path is not None:
        fig.savefig(path, dpi=120)


def _np(x: Tensor | Sequence[float]) -> Any:
    if isinstance(x, Tensor):
        return x.detach().cpu().double().numpy()
    return torch.as_tensor(x, dtype=torch.float64).numpy()


def plot_sparsification_curve(
    removed: Tensor | Sequence[float],
    recall: Tensor | Sequence[float],
    oracle: Tensor | Sequence[float] | None = None,
    *,
    label: str = "u",
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """R@1 of the kept queries against the removed fraction (LAM, Fig. 8; docs/concepts/metrics.rst,
    "Sparsification: AUSC and AUSE").

    Parameters
    ----------
    removed, recall : Tensor or sequence
        Curve from :func:`~bayesurl.evaluation.functional.sparsification_curve`.
    oracle : Tensor or sequence, optional
        Oracle curve (:func:`~bayesurl.evaluation.functional.oracle_curve`); the gap is AUSE.
    label : str
        Legend entry of the curve.
    ax : matplotlib Axes, optional
        Draw into these axes.
    path : str or Path, optional
        Save the figure there.

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = _axes(ax)
    r = _np(recall)
    ax.plot(_np(removed), r, label=f"{label} (AUSC {r.mean():.3f})")
    if oracle is not None:
        ax.plot(_np(removed), _np(oracle), "--", color="gray", label="oracle")
    ax.set_xlabel("fraction of most uncertain queries removed")
    ax.set_ylabel("R@1 of the kept queries")
    ax.legend(loc="lower right")
    _save(fig, path)
    return fig


def plot_reliability_diagram(
    bin_edges: Tensor | Sequence[float],
    bin_accuracy: Tensor | Sequence[float],
    bin_count: Tensor | Sequence[float] | None = None,
    *,
    ece: float | None = None,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Accuracy per confidence bin against the diagonal (LAM, Fig. 5).

    Parameters
    ----------
    bin_edges, bin_accuracy : Tensor or sequence
        From :class:`~bayesurl.evaluation.functional.ECEResult` (NaN accuracy = empty bin).
    bin_count : Tensor or sequence, optional
        Queries per bin, shown as bar transparency.
    ece : float, optional
        Shown in the title.
    ax : matplotlib Axes, optional
        Draw into these axes.
    path : str or Path, optional
        Save the figure there.

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = _axes(ax)
    edges, acc = _np(bin_edges), _np(bin_accuracy)
    width = edges[1:] - edges[:-1]
    filled = acc == acc  # not NaN
    ax.bar(edges[:-1][filled], acc[filled], width=width[filled], align="edge", edgecolor="k")
    ax.plot([0, 1], [0, 1], "--", color="gray")
    if bin_count is not None:
        cnt = _np(bin_count)
        for e, w, c in zip(edges[:-1], width, cnt):
            ax.text(e + w / 2, 0.02, f"{int(c)}", ha="center", fontsize=6, rotation=90)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence (fraction of draws agreeing)")
    ax.set_ylabel("accuracy of the modal neighbour label")
    if ece is not None:
        ax.set_title(f"ECE {ece:.4f}")
    _save(fig, path)
    return fig


def plot_roc(
    scores: Tensor,
    positives: Tensor,
    *,
    label: str = "u",
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """ROC curve of ``scores`` for ``positives`` (LAM, Fig. 6; R-AUROC or OOD AUROC).

    Parameters
    ----------
    scores : Tensor
        ``[N]`` scores (e.g. u).
    positives : Tensor
        ``[N]`` bool targets (R@1 wrong, or OOD).
    label : str
        Legend entry.
    ax : matplotlib Axes, optional
        Draw into these axes.
    path : str or Path, optional
        Save the figure there.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from bayesurl.evaluation.functional import auroc

    s = scores.detach().double().cpu()
    p = positives.detach().bool().cpu()
    uniq, inv = torch.unique(s, sorted=True, return_inverse=True)
    tp = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, p.double())
    fp = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, (~p).double())
    tpr = torch.cat([torch.zeros(1), tp.flip(0).cumsum(0) / max(int(p.sum()), 1)])
    fpr = torch.cat([torch.zeros(1), fp.flip(0).cumsum(0) / max(int((~p).sum()), 1)])
    fig, ax = _axes(ax)
    ax.plot(fpr.numpy(), tpr.numpy(), label=f"{label} (AUROC {float(auroc(s, p)):.3f})")
    ax.plot([0, 1], [0, 1], "--", color="gray")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.legend(loc="lower right")
    _save(fig, path)
    return fig


def _bar(iv: Any, value: float) -> list[list[float]] | None:
    """Error bar lengths of an interval around ``value`` (``None``: no interval)."""
    return None if iv is None else [[value - iv.low], [iv.high - value]]


def plot_recall_vs_rauroc(
    results: Mapping[str, Mapping[str, Any]],
    path: str | Path | None = None,
    *,
    ax: Axes | None = None,
) -> Figure:
    """R@1 against R-AUROC, one point per method (URL benchmark, Fig. 2), each with the 95 %
    intervals its result holds (``res["intervals"]``: over its queries) as error bars; the
    dashed line marks R-AUROC = 0.5, a u at chance.

    Parameters
    ----------
    results : mapping
        ``{method name: evaluate(...) result}``; methods without ``r_auroc`` are skipped.
    path : str or Path, optional
        Save the figure there.
    ax : matplotlib Axes, optional
        Draw into these axes.

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = _axes(ax)
    for name, res in results.items():
        r1, ra = res.get("r@1"), res.get("r_auroc")
        if r1 is None or ra is None:
            continue
        ivs = res.get("intervals") or {}
        xerr, yerr = _bar(ivs.get("r@1"), r1), _bar(ivs.get("r_auroc"), ra)
        ax.errorbar([r1], [ra], xerr=xerr, yerr=yerr, fmt="o", capsize=3)
        ax.annotate(name, (r1, ra), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("R@1")
    ax.set_ylabel("R-AUROC (bars: 95 % intervals over the queries)")
    _save(fig, path)
    return fig
