"""Plots of the evaluator's results (matplotlib, Agg-safe).

The per-run plots build a :class:`matplotlib.figure.Figure` directly, so no global backend or
pyplot state is touched; pass ``path`` to save a PNG/PDF, or ``ax`` to draw into your own axes.
The plots of a sweep's summary (:func:`plot_results`, URL Fig. 2 style, and
:func:`plot_training_curves`) write 256-colour PNGs through
:func:`bayesurl.files.save_figure`.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from bayesurl.evaluation.table import metric_column
from bayesurl.files import save_figure

__all__ = [
    "plot_recall_vs_rauroc",
    "plot_reliability_diagram",
    "plot_results",
    "plot_roc",
    "plot_sparsification_curve",
    "plot_training_curves",
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


def plot_results(
    summary: Mapping[str, Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    title: str = "",
    over: str = "class splits",
) -> Path:
    """R@1 against R-AUROC per estimator with their 95 % intervals (URL Fig. 2 style).

    Intervals (over ``over``: the class splits or the runs, or one run's queries) are drawn
    clipped to ``[0, 1]``
    (both metrics live there; with 4 splits the t-interval's factor is 3.18 and can reach
    past the range); one observation draws the point alone. Each estimator gets its own
    colour and marker, named in a legend beside the axes; the dashed line marks R-AUROC = 0.5
    (u carries no information).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 6.0))
    markers = "osD^v<>phX*P"
    cmap = plt.get_cmap("tab20")
    xs: list[float] = []
    ys: list[float] = []
    titles = {k: metric_column(k).title for k in ("r_auroc", "r@1")}
    for i, (name, row) in enumerate(summary.items()):
        r1, ra = row.get("r@1", {}), row.get("r_auroc", {})
        if r1.get("mean") is None or ra.get("mean") is None:
            continue

        def err(d: Mapping[str, Any]) -> tuple[list[list[float]], float, float]:
            lo, hi, m = d.get("low"), d.get("high"), float(d["mean"])
            if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
                return [[0.0], [0.0]], m, m
            lo, hi = max(float(lo), 0.0), min(float(hi), 1.0)
            return [[m - lo], [hi - m]], lo, hi

        ex, x0, x1 = err(ra)
        ey, y0, y1 = err(r1)
        xs += [x0, x1]
        ys += [y0, y1]
        ax.errorbar(
            ra["mean"],
            r1["mean"],
            xerr=ex,
            yerr=ey,
            fmt=markers[i % len(markers)],
            color=cmap(i % 20),
            capsize=3,
            ms=7,
            label=name,
        )
    ax.axvline(0.5, color="grey", lw=0.8, ls="--")
    if xs:
        pad = 0.02
        ax.set_xlim(max(min(xs) - pad, 0.0), min(max(xs) + pad, 1.0))
        ax.set_ylim(max(min(ys) - pad, 0.0), min(max(ys) + pad, 1.0))
    ax.set_xlabel(f"{titles['r_auroc']} (downstream, mean and 95 % interval over {over})")
    ax.set_ylabel(f"{titles['r@1']} (downstream)")
    ax.set_title(f"bayesurl benchmark {title}".strip())
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    p = save_figure(fig, path, dpi=120)
    plt.close(fig)
    return p


def plot_training_curves(
    records: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *, title: str = ""
) -> Path | None:
    """Per-epoch training loss and median ``u`` of a fixed training batch, per estimator
    (``records``: run rows with ``estimator``, ``error``, ``loss_curve`` and ``u_curve``).

    A convergence check (a vMF method's kappa may barely move in a short run). Each estimator
    gets its own pair of panels, the loss above its ``u``, each on its own y axis in its own
    units: a falling line is a falling loss whatever its sign (InfoNCE, MCInfoNCE and HIB
    losses lie below zero, and a ratio to the first epoch would climb as they improve). One
    line per run (estimator, split, seed); where an estimator has three or more, they are
    faint and their per-epoch median is drawn over them in black. ``u`` is drawn on a log
    axis where all of it is positive and spans more than two decades (``u`` of the vMF
    methods is ``1/kappa``; TaU's is a log temperature, linear). Returns ``None`` (and
    writes nothing) when no record carries a curve.
    """
    curves = [
        r for r in records if r.get("error") is None and (r.get("u_curve") or r.get("loss_curve"))
    ]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = sorted({str(r["estimator"]) for r in curves})
    per_name = {n: [r for r in curves if r["estimator"] == n] for n in names}
    ncols = min(len(names), 5)
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(
        2 * nrows, ncols, figsize=(2.9 * ncols, 3.6 * nrows + 0.6), squeeze=False
    )
    rows = (("loss_curve", "training loss", "tab:blue"), ("u_curve", "median u", "tab:orange"))
    for i, name in enumerate(names):
        for j, (key, label, colour) in enumerate(rows):
            ax = axes[2 * (i // ncols) + j, i % ncols]
            _curve_panel(ax, [_series(r, key) for r in per_name[name]], colour, last=j == 1)
            ax.set_title(f"{name}: {label}", fontsize=9)
    for k in range(len(names), nrows * ncols):  # the grid's empty cells
        for j in range(2):
            axes[2 * (k // ncols) + j, k % ncols].set_visible(False)
    note = (
        "each panel on its own y axis, in the loss's or u's own units (lower loss is "
        "better); one line per run"
        + (", black: their median" if any(len(v) >= 3 for v in per_name.values()) else "")
    )
    fig.suptitle(
        f"training curves {title}".strip() + "\n" + textwrap.fill(note, 40 * ncols),
        fontsize=10,
    )
    fig.tight_layout()
    p = save_figure(fig, path, dpi=100)
    plt.close(fig)
    return p


def _series(r: Mapping[str, Any], key: str) -> list[float] | None:
    """A run's curve ``key`` as floats (``None``: not recorded, or not finite throughout)."""
    c = [float(v) for v in (r.get(key) or []) if v is not None]
    return c if c and all(math.isfinite(v) for v in c) else None


def _curve_panel(ax: Any, series: Sequence[list[float] | None], colour: str, *, last: bool) -> None:
    """One panel of :func:`plot_training_curves`: a line per run (faint, with their median
    in black, from three runs on), a log axis where the values span more than two decades;
    ``last``: the panel at the bottom of its estimator's pair (it names the x axis)."""
    import numpy as np
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    got = [c for c in series if c is not None]
    thin = len(got) >= 3  # many runs: faint, their median drawn over them
    for c in got:
        ax.plot(
            range(1, len(c) + 1), c, color=colour, lw=0.8 if thin else 1.4,
            alpha=0.45 if thin else 1.0,
        )  # fmt: skip
    same = [c for c in got if len(c) == len(got[0])] if got else []
    if len(same) >= 3:
        ax.plot(
            range(1, len(same[0]) + 1), np.median(np.array(same), axis=0), color="black", lw=1.6
        )
    flat = [v for c in got for v in c]
    if flat and min(flat) > 0 and max(flat) > 100 * min(flat):
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:  # each tick in full: an offset or a "1e-5" above the axis meets the title
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if not got:
        ax.text(
            0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes,
            color="grey", fontsize=8,
        )  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
        return
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if last:
        ax.set_xlabel("epoch", fontsize=8)
