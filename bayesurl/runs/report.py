"""The report of a class-split sweep: ``results.json`` / ``results.csv`` and two plots.

:func:`write_results` writes every run's record, the per-estimator means with t-intervals
over the class splits, the paired comparison against CE and the split-half reproducibility
(:mod:`bayesurl.runs.aggregate`); :func:`plot_results` draws R@1 against R-AUROC with the
intervals (URL, Kirchhof et al., 2023, Fig. 2) and :func:`plot_training_curves` the training
loss and median ``u`` per epoch. A sweep on the standard split reports through
:class:`bayesurl.runs.results.SweepResults` instead (mean +- std over seeds).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bayesurl.data.class_splits import tuning_leaks
from bayesurl.files import atomic_open, write_json
from bayesurl.runs.aggregate import (
    chance_test,
    complementary_pairs,
    paired_comparison,
    split_half_reproducibility,
    summarize,
)

__all__ = [
    "FREE_BASELINES",
    "REPORT_METRICS",
    "REPRO_METRICS",
    "best_free_baseline",
    "jsonable",
    "plot_results",
    "plot_training_curves",
    "write_results",
]

#: Metrics reported per estimator (URL section 3 and LAM section 5: R@1, R-AUROC, AUSC, ECE,
#: OOD AUROC, mAP@k), the mixed in-distribution / downstream R-AUROC (URL App. C.5) and the
#: crop test's share (URL section 4.5: the share of crops with a higher ``u``; higher is
#: better).
REPORT_METRICS: tuple[str, ...] = (
    "r@1",
    "r_auroc",
    "ausc",
    "ece",
    "ood_auroc",
    "map@5",
    "mixed_r_auroc",
    "crop_share",
)

#: Metrics whose split-half reproducibility is reported.
REPRO_METRICS: tuple[str, ...] = ("r_auroc", "r@1", "ood_auroc")

#: The halvings of the split-half reproducibility (``split_half_reproducibility``).
HALVINGS: tuple[str, ...] = ("random", "pairs", "class")


def jsonable(obj: Any) -> Any:
    """``obj`` with non-finite floats as ``None`` and unknown objects as text (JSON-ready)."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (int, str, bool)):
        return obj
    try:
        f = float(obj)
        return f if math.isfinite(f) else None
    except (TypeError, ValueError):
        return str(obj)


#: Estimators that train nothing (the input representation's own score): the reference an
#: uncertainty estimator on pretrained features has to beat.
FREE_BASELINES: tuple[str, ...] = ("feature_norm", "feature_knn")


def best_free_baseline(
    summary: Mapping[str, Mapping[str, Any]],
    chance: Mapping[str, Mapping[str, Any]] | None = None,
) -> str | None:
    """The free baseline with the highest mean R-AUROC in ``summary`` (``None``: none ran).

    With ``chance`` (:func:`~bayesurl.runs.aggregate.chance_test` of R-AUROC) only a free
    baseline significantly above chance counts: one at or below chance is no bar to beat
    (``None`` when no free baseline is above chance).
    """
    have = {
        n: summary[n].get("r_auroc", {}).get("mean")
        for n in FREE_BASELINES
        if n in summary and summary[n].get("r_auroc", {}).get("mean") is not None
    }
    if chance is not None:
        have = {n: v for n, v in have.items() if (chance.get(n) or {}).get("verdict") == "above"}
    return max(have, key=lambda n: have[n]) if have else None


def write_results(
    records: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    settings: Mapping[str, Any],
    *,
    metrics: Sequence[str] = REPORT_METRICS,
    reference: str = "ce",
) -> dict[str, Path]:
    """Write ``results.json``, ``results.csv``, ``recall_vs_rauroc.png`` and
    ``training_curves.png`` (when the runs carry curves) to ``out``.

    ``results.json`` holds ``settings``, ``runs`` (every record), ``tuning_check``
    (:func:`~bayesurl.data.class_splits.tuning_leaks`: when a run's settings were tuned on one
    of its downstream classes, or a run does not say, ``verdict`` is that one line and every
    comparison's ``verdict`` word is withheld), ``summary`` (mean and 95 % t-interval over
    the splits' seed means, :func:`~bayesurl.runs.aggregate.summarize`),
    ``paired_vs_<reference>`` per metric (paired t / Wilcoxon over (split, seed), Holm,
    bootstrap interval), ``paired_vs_<reference>_pairs`` (the same with the complementary
    pair as the unit), ``vs_chance`` (R-AUROC against 0.5 per pair, Holm), the same against
    the best free baseline that is above chance (``best_free_baseline``,
    ``paired_vs_best_free_baseline[_pairs]``; :data:`FREE_BASELINES`; ``None`` when none is),
    ``reproducibility`` (split-half Spearman for R-AUROC, R@1, OOD AUROC over random
    halvings) and ``reproducibility_by`` (the other halvings of :data:`HALVINGS`:
    pair-preserving, class-held-out).
    """
    import csv

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    recs = [jsonable(dict(r)) for r in records]
    check = tuning_leaks(recs)
    summary = summarize(recs, metrics)
    names = {r.get("method", r.get("estimator")) for r in recs if r.get("error") is None}
    paired_units = {"": "run", "_pairs": "pair"} if _paired(recs) else {"": "run"}

    def compare(ref: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {suffix: {} for suffix in paired_units}
        for suffix, unit in paired_units.items():
            for m in metrics:
                try:
                    out[suffix][m] = paired_comparison(recs, m, reference=ref, unit=unit)
                except ValueError as exc:
                    out[suffix][m] = {"note": str(exc)}
        return out

    paired = compare(reference) if reference in names else {s: {} for s in paired_units}
    try:
        vs_chance: dict[str, Any] = chance_test(
            recs, "r_auroc", unit="pair" if "_pairs" in paired_units else "split"
        )
    except ValueError as exc:
        vs_chance = {"note": str(exc)}
    free = best_free_baseline(summary, vs_chance if "note" not in vs_chance else None)
    paired_free = compare(free) if free is not None else {s: {} for s in paired_units}
    repro: dict[str, Any] = {}
    repro_by: dict[str, dict[str, Any]] = {h: {} for h in HALVINGS if h != "random"}
    for m in REPRO_METRICS:
        for h in HALVINGS:
            try:
                r = split_half_reproducibility(recs, m, halving=h)
            except ValueError as exc:
                r = {"note": str(exc)}
            if h == "random":
                repro[m] = r
            else:
                repro_by[h][m] = r
    if not check["ok"]:  # the numbers stay, the words that would read as a verdict go
        for table in (*paired.values(), *paired_free.values()):
            for rows in table.values():
                for row in rows.values():
                    if isinstance(row, dict) and "verdict" in row:
                        row["verdict"] = None
    doc = {
        "settings": jsonable(dict(settings)),
        "tuning_check": check,
        "verdict": None if check["ok"] else check["line"],
        "runs": recs,
        "summary": jsonable(summary),
        **{f"paired_vs_{reference}{s}": jsonable(p) for s, p in paired.items()},
        "vs_chance": jsonable(vs_chance),
        "best_free_baseline": free,
        **{f"paired_vs_best_free_baseline{s}": jsonable(p) for s, p in paired_free.items()},
        "reproducibility": jsonable(repro),
        "reproducibility_by": jsonable(repro_by),
    }
    paths = {"json": folder / "results.json", "csv": folder / "results.csv"}
    write_json(paths["json"], doc)
    cols = ["method", "split", "seed", "error", *metrics]
    cols += sorted(
        {k for r in recs for k in r}
        - set(cols)
        - {"traceback", "upstream", "downstream", "overrides"}
    )
    with atomic_open(paths["csv"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in recs:
            w.writerow(
                {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()}
            )
    paths["png"] = plot_results(
        summary, folder / "recall_vs_rauroc.png", title=str(settings.get("preset", ""))
    )
    curves = plot_training_curves(
        recs, folder / "training_curves.png", title=str(settings.get("preset", ""))
    )
    if curves is not None:
        paths["curves"] = curves
    return paths


def _paired(recs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the splits come in complementary pairs (at least two of them)."""
    ok = [r for r in recs if r.get("error") is None and r.get("downstream")]
    if not ok:
        return False
    pair_of = complementary_pairs(ok)
    units = set(pair_of.values())
    return len(units) >= 2 and len(units) < len(pair_of)


def plot_results(
    summary: Mapping[str, Mapping[str, Any]], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """R@1 against R-AUROC per estimator with their 95 % t-intervals (URL Fig. 2 style).

    Intervals are drawn clipped to ``[0, 1]`` (both metrics live there; with 4 splits the
    t-interval's factor is 3.18 and can reach past the range); each estimator gets its own
    colour and marker, named in a legend beside the axes.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 6.0))
    markers = "osD^v<>phX*P"
    cmap = plt.get_cmap("tab20")
    xs: list[float] = []
    ys: list[float] = []
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
    ax.set_xlabel("R-AUROC (downstream, mean and 95 % t-interval over class splits)")
    ax.set_ylabel("R@1 (downstream)")
    ax.set_title(f"bayesurl benchmark {title}".strip())
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def plot_training_curves(
    records: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *, title: str = ""
) -> Path | None:
    """Per-epoch training loss and median ``u`` of a fixed training batch, per estimator.

    A convergence check (a vMF method's kappa may barely move in a short run): one line per
    (estimator, split), both curves divided by their first epoch's value so that
    estimators with different scales share the axes (``u`` of the vMF methods is ``1/kappa``).
    Returns ``None`` (and writes nothing) when no record carries a curve.
    """
    curves = [
        r for r in records if r.get("error") is None and (r.get("u_curve") or r.get("loss_curve"))
    ]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = sorted({str(r.get("method", r.get("estimator"))) for r in curves})
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(i % 20) for i, n in enumerate(names)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for key, ax, label in (
        ("loss_curve", axes[0], "training loss / epoch-1 loss"),
        ("u_curve", axes[1], "median u on a fixed training batch / epoch-1 value"),
    ):
        seen: set[str] = set()
        for r in curves:
            c = [float(v) for v in (r.get(key) or []) if v is not None]
            if len(c) < 1 or c[0] == 0 or not all(math.isfinite(v) for v in c):
                continue
            n = str(r.get("method", r.get("estimator")))
            ax.plot(
                range(1, len(c) + 1),
                [v / c[0] for v in c],
                color=colour[n],
                lw=1,
                alpha=0.8,
                label=None if n in seen else n,
            )
            seen.add(n)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[1].legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.suptitle(f"training curves {title}".strip())
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
