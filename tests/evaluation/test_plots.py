"""Plot helpers write non-empty images and skip methods without R-AUROC."""

from __future__ import annotations

import pytest
import torch

from bayesurl.evaluation import evaluate, plots


def test_recall_vs_rauroc_and_curves(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (40,), generator=g)
    x = torch.randn(40, 4, generator=g)
    s = x + 0.5 * torch.randn(5, 40, 4, generator=g)
    res = {
        "a": evaluate(x, y, uncertainties=torch.rand(40, generator=g), return_curves=True),
        "b": evaluate(None, y, samples=s, return_curves=True),
        "no-u": evaluate(x, y),
    }
    fig = plots.plot_recall_vs_rauroc(res, tmp_path / "fig2.png")
    assert (tmp_path / "fig2.png").stat().st_size > 0
    ax = fig.axes[0]
    assert len(ax.containers) == 2  # "no-u" has no R-AUROC
    # each point's vertical bar spans its R-AUROC interval
    iv = res["a"]["intervals"]["r_auroc"]
    (seg,) = ax.containers[0].lines[2][1].get_segments()  # the y bars of the first point
    assert seg[:, 1] == pytest.approx([iv.low, iv.high])
    sp = res["a"]["sparsification"]
    plots.plot_sparsification_curve(sp["removed"], sp["r@1"], sp["oracle"], path=tmp_path / "s.png")
    rel = res["b"]["reliability"]
    plots.plot_reliability_diagram(
        rel["bin_edges"],
        rel["accuracy"],
        rel["count"],
        ece=res["b"]["ece"],
        path=tmp_path / "r.png",
    )
    assert (tmp_path / "s.png").stat().st_size > 0 and (tmp_path / "r.png").stat().st_size > 0
