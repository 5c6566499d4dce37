"""The report of a sweep: ``results.json`` / ``results.csv``, two plots and the table.

One report for every sweep: the standard split is a sweep over K = 1 split. The intervals
are over the class splits (each split's mean over its seeds) when the runs span two or more
splits, otherwise over the runs (the seeds) -- :func:`observation_unit`.
:func:`write_results` writes every run's record, the per-estimator means with t-intervals,
the paired comparison against CE and the split-half reproducibility
(:mod:`bayesurl.sweeps.aggregate`); :func:`results_table` prints the table,
:func:`plot_results` draws R@1 against R-AUROC with the intervals (URL, Kirchhof et al.,
2023, Fig. 2) and :func:`plot_training_curves` the training loss and median ``u`` per epoch.

Every column (title, digits, direction) comes from the metric table
(:func:`bayesurl.evaluation.table.metric_columns`) and :data:`RUN_COLUMNS`: a registered
metric with a :class:`~bayesurl.evaluation.table.Column` appears in every table by itself.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bayesurl.data.class_splits import tuning_leaks
from bayesurl.evaluation.table import Column, metric_column, metric_columns
from bayesurl.files import atomic_open, format_of, write_json
from bayesurl.runs.config import DEFAULT_RECIPE_FILE
from bayesurl.sweeps.aggregate import (
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
    "RESULTS_FORMAT",
    "RUN_COLUMNS",
    "best_free_baseline",
    "format_stat",
    "jsonable",
    "observation_unit",
    "plot_results",
    "plot_title",
    "plot_training_curves",
    "report_columns",
    "results_table",
    "summarize_runs",
    "write_results",
]

#: Numbers a run records beside its metrics (:meth:`bayesurl.runs.runner.RunResult.record`).
RUN_COLUMNS: tuple[Column, ...] = (
    Column("train_time", "train [s]", digits=1, higher_is_better=False),
    Column("eval_time", "eval [s]", digits=1, higher_is_better=False, shown=False),
    Column("train_cpu_time", "train CPU [s]", digits=1, higher_is_better=False, shown=False),
    Column("final_loss", "final loss", higher_is_better=False, shown=False),
)


def report_columns(*, shown: bool | None = None, runs: bool = True) -> list[Column]:
    """The metric table's columns (:func:`~bayesurl.evaluation.table.metric_columns`), then
    :data:`RUN_COLUMNS` (``runs``); ``shown`` as there."""
    extra = [c for c in RUN_COLUMNS if shown is None or c.shown == shown] if runs else []
    return [*metric_columns(shown=shown), *extra]


#: The metrics compared per estimator by default: the table columns of the built-in metrics
#: (URL section 3 and LAM section 5: R@1, R-AUROC, AUSC, ECE, OOD AUROC, mAP@k, the mixed
#: in-distribution / downstream R-AUROC of URL App. C.5 and the crop test's share of URL
#: section 4.5). :func:`write_results` reads :func:`report_columns` when it is called, so a
#: metric registered later is compared too.
REPORT_METRICS: tuple[str, ...] = tuple(c.key for c in report_columns(shown=True, runs=False))

#: Metrics whose split-half reproducibility is reported.
REPRO_METRICS: tuple[str, ...] = ("r_auroc", "r@1", "ood_auroc")

#: The halvings of the split-half reproducibility (``split_half_reproducibility``).
HALVINGS: tuple[str, ...] = ("random", "pairs", "class")

#: What an interval is over, per :func:`observation_unit`.
UNIT_WORDS = {"split": "class splits", "run": "runs"}
#: The format of a benchmark's ``results.json`` (a reader refuses a newer one).
RESULTS_FORMAT = format_of("bayesurl.results", 1)


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
FREE_BASELINES: tuple[str, ...] = (
    "feature_norm",
    "feature_knn",
    "feature_mahalanobis",
    "feature_gmm",
    "feature_gmm_kmeans",
)


def best_free_baseline(
    summary: Mapping[str, Mapping[str, Any]],
    chance: Mapping[str, Mapping[str, Any]] | None = None,
) -> str | None:
    """The free baseline with the highest mean R-AUROC in ``summary`` (``None``: none ran).

    With ``chance`` (:func:`~bayesurl.sweeps.aggregate.chance_test` of R-AUROC) only a free
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


def _with_split(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """JSON-ready records; one without ``split`` ran on the standard split, split 0."""
    return [{**r, "split": r.get("split", 0)} for r in jsonable([dict(r) for r in records])]


def observation_unit(records: Sequence[Mapping[str, Any]]) -> str:
    """``"split"`` when the finished runs span two or more class splits, else ``"run"``.

    The standard split is one split (K = 1): its intervals are over the runs (the seeds).
    """
    splits = {r.get("split", 0) for r in records if r.get("error") is None}
    return "split" if len(splits) > 1 else "run"


def summarize_runs(
    records: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`~bayesurl.sweeps.aggregate.summarize` of every column of :func:`report_columns`
    (or ``keys``) over the :func:`observation_unit` of ``records``."""
    recs = _with_split(records)
    keys = [c.key for c in report_columns()] if keys is None else list(keys)
    return summarize(recs, keys, unit=observation_unit(recs))


def format_stat(stat: Mapping[str, Any], key: str | Column) -> str:
    """``"0.512 +- 0.010"``: mean +- sd with the column's digits (``"n/a"`` without a mean).

    ``key`` is a :class:`~bayesurl.evaluation.table.Column` or the key of one of
    :func:`report_columns` (3 digits for another key).
    """
    col = key if isinstance(key, Column) else _column(key)
    mean = stat.get("mean")
    if mean is None:
        return "n/a"
    spread = stat.get("sd", stat.get("std"))
    s = col.format(mean)
    return s if spread is None else f"{s} +- {col.format(spread)}"


def _column(key: str) -> Column:
    return next((c for c in report_columns() if c.key == key), Column(key, key))


def results_table(records: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> str:
    """The sweep's table: one row per estimator, mean +- sd of every shown column.

    Over the seeds on the standard split, over the class splits' seed means otherwise
    (:func:`observation_unit`); a column no estimator measured is left out; failed runs are
    counted in the row and listed below.
    """
    summ = summarize_runs(records)
    names = list(summ)
    unit = observation_unit(_with_split(records))
    cols = [
        c
        for c in report_columns(shown=True)
        if any(summ[n][c.key]["mean"] is not None for n in names)
    ]
    head = ["estimator", *(c.title for c in cols)]
    # the best mean of each column, in the direction its metric declares (one estimator: none)
    best = {c.key: c.best(summ[n][c.key]["mean"] for n in names) for c in cols}
    marked = len(names) > 1 and any(v is not None for v in best.values())
    rows = []
    for n in names:
        row = [n]
        for c in cols:
            cell = format_stat(summ[n][c.key], c)
            top = marked and best[c.key] is not None and summ[n][c.key]["mean"] == best[c.key]
            row.append(cell + (" *" if top else "  "))
        if summ[n]["_runs"]["failed"]:
            row[0] += f" ({summ[n]['_runs']['failed']} failed)"
        rows.append(row)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()

    s = settings
    seeds = ",".join(str(x) for x in s.get("seeds", []))
    splits = s.get("class_splits")
    lines = [
        f"bayesurl benchmark: preset {s.get('preset')}, data {s.get('dataset')}, "
        f"seeds {seeds}"
        + (f", {len(splits)} class splits" if isinstance(splits, list) else "")
        + f", device {s.get('device')}; mean +- sd over the {UNIT_WORDS[unit]}",
        fmt(head),
        fmt(["-" * w for w in widths]),
        *(fmt(r) for r in rows),
    ]
    if marked:
        lower = [c.title for c in cols if not c.higher_is_better]
        lines.append(
            "*: the best mean of the column (higher is better"
            + (f"; lower for {', '.join(lower)}" if lower else "")
            + ")"
        )
    if any(c.key == "ece" for c in cols) and any(summ[n]["ece"]["mean"] is None for n in names):
        lines.append(
            "ECE n/a: the estimator has only a scalar u (no distribution to sample; see the "
            "docs, Concepts > Metrics)."
        )
    free = best_free_baseline(summ)
    if free is not None:
        ref = summ[free]["r_auroc"]["mean"]
        above = [
            f"{m} {summ[m]['r_auroc']['mean']:.3f}"
            for m in names
            if m not in FREE_BASELINES
            and summ[m]["r_auroc"]["mean"] is not None
            and summ[m]["r_auroc"]["mean"] > ref
        ]
        lines.append(
            f"R-AUROC above the best free baseline ({free} {ref:.3f}): "
            f"{', '.join(above) or 'none'} (means; the paired tests are in results.json)"
        )
    lines += [
        f"FAILED {r.get('method', r.get('estimator'))} seed {r.get('seed')}: {r['error']}"
        for r in records
        if r.get("error")
    ]
    return "\n".join(lines)


def plot_title(settings: Mapping[str, Any]) -> str:
    """``"<preset>"``, with the data set where it is not FashionMNIST (``"pretrained
    (clipart)"``): two protocols of one preset on two data sets draw distinguishable plots."""
    preset = str(settings.get("preset", ""))
    dataset = settings.get("dataset")
    return f"{preset} ({dataset})" if dataset and dataset != DEFAULT_RECIPE_FILE else preset


def write_results(
    records: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    settings: Mapping[str, Any],
    *,
    metrics: Sequence[str] | None = None,
    reference: str = "ce",
) -> dict[str, Path]:
    """Write ``results.json``, ``results.csv``, ``recall_vs_rauroc.png`` and
    ``training_curves.png`` (when the runs carry curves) to ``out``.

    The report of every sweep, the standard split being one split (K = 1; a record without
    ``split`` is on split 0). ``results.json`` holds ``settings``, ``runs`` (every record),
    ``interval_over`` (:func:`observation_unit`), ``tuning_check``
    (:func:`~bayesurl.data.class_splits.tuning_leaks`: when a run's settings were tuned on one
    of its downstream classes, or a run does not say, ``verdict`` is that one line and every
    comparison's ``verdict`` word is withheld), ``summary`` (mean, sd and 95 % t-interval of
    every column of :func:`report_columns` over the splits' seed means, or over the runs on
    one split; :func:`~bayesurl.sweeps.aggregate.summarize`), ``paired_vs_<reference>`` per
    metric (paired t / Wilcoxon over (split, seed), Holm, bootstrap interval),
    ``paired_vs_<reference>_pairs`` (the same with the complementary pair as the unit),
    ``vs_chance`` (R-AUROC against 0.5 per pair, Holm), the same against the best free
    baseline that is above chance (``best_free_baseline``,
    ``paired_vs_best_free_baseline[_pairs]``; :data:`FREE_BASELINES`; ``None`` when none is),
    ``reproducibility`` (split-half Spearman for R-AUROC, R@1, OOD AUROC over random
    halvings) and ``reproducibility_by`` (the other halvings of :data:`HALVINGS`:
    pair-preserving, class-held-out). A comparison that needs more splits or runs than there
    are holds a ``note`` saying so. ``results.csv`` has one row per run.

    Parameters
    ----------
    metrics : sequence of str, optional
        The metrics compared (default: the shown metric columns of :func:`report_columns`).
    """
    import csv

    if metrics is None:
        metrics = [c.key for c in report_columns(shown=True, runs=False)]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    recs = _with_split(records)
    unit = observation_unit(recs)
    check = tuning_leaks(recs)
    keys = list(dict.fromkeys([*metrics, *(c.key for c in report_columns())]))
    summary = summarize_runs(recs, keys)
    names = {r.get("method", r.get("estimator")) for r in recs if r.get("error") is None}
    paired_units = {"": "run", "_pairs": "pair"} if _paired(recs) else {"": "run"}

    def compare(ref: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {suffix: {} for suffix in paired_units}
        for suffix, unit in paired_units.items():
            for m in metrics:
                try:
                    up = metric_column(m, report_columns()).higher_is_better
                    out[suffix][m] = paired_comparison(
                        recs, m, reference=ref, unit=unit, higher_is_better=up
                    )
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
        "format": RESULTS_FORMAT,
        "settings": jsonable(dict(settings)),
        "interval_over": UNIT_WORDS[unit],
        "tuning_check": check,
        "verdict": None if check["ok"] else check["line"],
        "runs": jsonable([dict(r) for r in records]),
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
    cols = ["method", "split", "seed", "error", *keys]
    cols += sorted(
        {k for r in recs for k in r}
        - set(cols)
        - {"traceback", "upstream", "downstream", "overrides"}
    )
    with atomic_open(paths["csv"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in recs:
            row = {**r, "method": r.get("method", r.get("estimator"))}
            w.writerow(
                {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in row.items()}
            )
    title = plot_title(settings)
    paths["png"] = plot_results(
        summary, folder / "recall_vs_rauroc.png", title=title, over=UNIT_WORDS[unit]
    )
    curves = plot_training_curves(recs, folder / "training_curves.png", title=title)
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
    summary: Mapping[str, Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    title: str = "",
    over: str = "class splits",
) -> Path:
    """R@1 against R-AUROC per estimator with their 95 % t-intervals (URL Fig. 2 style).

    Intervals (over ``over``: the class splits or the runs) are drawn clipped to ``[0, 1]``
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
    titles = {c.key: c.title for c in report_columns()}
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
    ax.set_xlabel(f"{titles['r_auroc']} (downstream, mean and 95 % t-interval over {over})")
    ax.set_ylabel(f"{titles['r@1']} (downstream)")
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
    import numpy as np
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    def series(r: Mapping[str, Any], key: str) -> list[float] | None:
        c = [float(v) for v in (r.get(key) or []) if v is not None]
        return c if c and all(math.isfinite(v) for v in c) else None

    names = sorted({str(r.get("method", r.get("estimator"))) for r in curves})
    per_name = {
        n: [r for r in curves if str(r.get("method", r.get("estimator"))) == n] for n in names
    }
    ncols = min(len(names), 5)
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(
        2 * nrows, ncols, figsize=(2.9 * ncols, 3.6 * nrows + 0.6), squeeze=False
    )
    rows = (("loss_curve", "training loss", "tab:blue"), ("u_curve", "median u", "tab:orange"))
    for i, name in enumerate(names):
        mine = per_name[name]
        for j, (key, label, colour) in enumerate(rows):
            ax = axes[2 * (i // ncols) + j, i % ncols]
            got = [c for c in (series(r, key) for r in mine) if c is not None]
            for c in got:
                thin = len(got) >= 3  # many runs: faint, their median drawn over them
                ax.plot(
                    range(1, len(c) + 1), c, color=colour, lw=0.8 if thin else 1.4,
                    alpha=0.45 if thin else 1.0,
                )  # fmt: skip
            same = [c for c in got if len(c) == len(got[0])] if got else []
            if len(same) >= 3:
                ax.plot(
                    range(1, len(same[0]) + 1),
                    np.median(np.array(same), axis=0),
                    color="black",
                    lw=1.6,
                )
            flat = [v for c in got for v in c]
            if flat and min(flat) > 0 and max(flat) > 100 * min(flat):
                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(NullFormatter())
            else:  # each tick in full: an offset or a "1e-5" above the axis meets the title
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
            if not got:
                ax.text(
                    0.5,
                    0.5,
                    "not recorded",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    color="grey",
                    fontsize=8,
                )
                ax.set_xticks([])
                ax.set_yticks([])
            ax.set_title(f"{name}: {label}", fontsize=9)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if got:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                if j == 1:
                    ax.set_xlabel("epoch", fontsize=8)
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
    p = Path(path)
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p
