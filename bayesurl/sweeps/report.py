"""The report of a sweep: ``results.json`` / ``results.csv``, two plots and the table.

One report for every sweep: the standard split is a sweep over K = 1 split. The intervals
are over the class splits (each split's mean over its seeds) when the runs span two or more
splits, otherwise over the runs (the seeds) -- :func:`observation_unit`; an estimator with a
single run keeps that run's own intervals over its queries
(:mod:`bayesurl.stats.intervals`). A column's best is marked only where a paired test
separates it from the runner-up (:func:`best_marks`).
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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bayesurl.evaluation.plots import plot_results, plot_training_curves
from bayesurl.evaluation.table import Column, metric_column, metric_columns
from bayesurl.files import (
    atomic_open,
    atomic_write,
    check_format,
    format_of,
    jsonable,
    read_json_document,
    read_json_gz,
    write_json_gz,
)
from bayesurl.runs.config import DEFAULT_RECIPE_FILE
from bayesurl.runs.queries import PAIRED_KEYS, QueryRecord, paired_test, read_queries
from bayesurl.stats.intervals import DEFAULT_LEVEL, read_interval
from bayesurl.sweeps.aggregate import (
    chance_test,
    complementary_pairs,
    paired_comparison,
    split_half_reproducibility,
    summarize,
)
from bayesurl.sweeps.record import CURVES, RunRecord, estimator_of, run_rows
from bayesurl.sweeps.tuning import tuning_leaks

__all__ = [
    "BEST_ALPHA",
    "FREE_BASELINES",
    "REPORT_METRICS",
    "REPRO_METRICS",
    "CURVES_FILE",
    "REPRODUCIBILITY_FILE",
    "RESULTS_FORMAT",
    "RUN_COLUMNS",
    "best_free_baseline",
    "best_marks",
    "format_stat",
    "interval_caption",
    "mark_legend",
    "observation_unit",
    "plot_over",
    "plot_results",
    "plot_title",
    "plot_training_curves",
    "read_results",
    "report_columns",
    "results_document",
    "results_table",
    "run_table",
    "save_results",
    "summarize_runs",
    "table_runs",
    "write_document",
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
#: The format of a benchmark's ``results.json`` (a reader refuses a newer one). Version 3
#: writes the runs as a table (:func:`write_document`); 2 wrote each run as a mapping, 1 also
#: kept the curves and every halving in the one file.
RESULTS_FORMAT = format_of("bayesurl.results", 3)


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
    """JSON-ready rows of one shape (:func:`~bayesurl.sweeps.record.run_rows`); one without
    ``split`` ran on the standard split, split 0."""
    return jsonable(run_rows(records))


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
    (or ``keys``) over the :func:`observation_unit` of ``records``.

    Each entry also says which interval ``low`` / ``high`` are: ``interval`` (``"t"`` over
    the runs or splits, or the per-query method of an estimator's single run: ``"wilson"``,
    ``"delong"``, ``"bootstrap"``), ``interval_n`` (its units) and ``interval_over`` (what
    they are). A single run without its own interval (a time column, or a record written
    before runs kept one) has ``low = high = None``.
    """
    recs = _with_split(records)
    keys = [c.key for c in report_columns()] if keys is None else list(keys)
    unit = observation_unit(recs)
    summ = summarize(recs, keys, unit=unit)
    ok = [r for r in recs if r.get("error") is None]
    for name, row in summ.items():
        mine = [r for r in ok if r["estimator"] == name]
        for key in keys:
            st = row.get(key)
            if not isinstance(st, dict) or st.get("mean") is None:
                continue
            with_value = [r for r in mine if r.get(key) is not None]
            if len(with_value) == 1 and st["n"] == 1:
                iv = read_interval(with_value[0], key)
                st.update(low=None, high=None, interval=None, interval_n=None, interval_over=None)
                if iv is not None:
                    st.update(
                        low=iv.low, high=iv.high, interval=iv.method, interval_n=iv.n,
                        interval_over=iv.over, level=iv.level,
                    )  # fmt: skip
            else:
                st.update(
                    interval="t", interval_n=st["n"], interval_over=UNIT_WORDS[unit],
                    level=DEFAULT_LEVEL,
                )  # fmt: skip
    return summ


def format_stat(stat: Mapping[str, Any], key: str | Column) -> str:
    """``"0.512 +- 0.010"``: the mean and the half-width of its interval (the larger side of an
    asymmetric one), with the column's digits; the mean alone without a finite interval;
    ``"n/a"`` without a mean.

    ``key`` is a :class:`~bayesurl.evaluation.table.Column` or the key of one of
    :func:`report_columns` (3 digits for another key).
    """
    col = key if isinstance(key, Column) else _column(key)
    mean = stat.get("mean")
    if mean is None:
        return "n/a"
    half = _half_width(stat)
    s = col.format(mean)
    return s if half is None else f"{s} +- {col.format(half)}"


def _half_width(stat: Mapping[str, Any]) -> float | None:
    lo, hi, m = stat.get("low"), stat.get("high"), stat.get("mean")
    if lo is None or hi is None or m is None:
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return max(float(m) - float(lo), float(hi) - float(m))


def _column(key: str) -> Column:
    return next((c for c in report_columns() if c.key == key), Column(key, key))


def interval_caption(
    summary: Mapping[str, Mapping[str, Any]],
    columns: Sequence[Column] | None = None,
    lead: str = "mean +- half-width of its ",
) -> str:
    """What the intervals of ``summary`` are, in words, with their n (the tables' header),
    after ``lead``."""
    cols = list(report_columns(shown=True) if columns is None else columns)
    per_query: dict[str, set[int]] = {}
    t_units: dict[str, set[int]] = {}
    for row in summary.values():
        for c in cols:
            st = row.get(c.key)
            if not isinstance(st, Mapping) or st.get("interval") is None:
                continue
            if st["interval"] == "t":
                t_units.setdefault(str(st["interval_over"]), set()).add(int(st["interval_n"]))
            else:
                what = str(st.get("interval_over") or "queries")
                per_query.setdefault(what, set()).add(int(st["interval_n"]))
    parts = []
    if per_query:
        counts = "; ".join(f"{_ns(n)} {what}" for what, n in per_query.items())
        parts.append(
            "95 % interval over the queries of the one run (R@1: Wilson, AUROCs: DeLong, "
            f"AUSC / ECE / mAP: bootstrap; n = {counts})"
        )
    for what, n in t_units.items():
        parts.append(f"95 % Student-t interval over the {what} (n = {_ns(n)})")
    if not parts:
        return "no intervals (single runs without per-query intervals)"
    return lead + "; ".join(parts)


def _ns(values: set[int]) -> str:
    v = sorted(values)
    return str(v[0]) if len(v) == 1 else f"{v[0]}-{v[-1]}"


#: Significance level of the paired tests that decide a column's mark (two-sided).
BEST_ALPHA = 0.05


def _record_of(folder: Path | None, rec: Mapping[str, Any]) -> QueryRecord | None:
    """The per-query record of the run ``rec`` in ``folder`` (``<estimator>[_split<k>]_s<seed>
    .npz``), or ``None``."""
    if folder is None:
        return None
    name, seed, split = rec["estimator"], rec.get("seed"), rec.get("split")
    for stem in (f"{name}_split{split}_s{seed}", f"{name}_s{seed}"):
        p = Path(folder) / f"{stem}.npz"
        if p.is_file():
            try:
                return read_queries(p)
            except ValueError:
                return None
    return None


def best_marks(
    records: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Mapping[str, Any]] | None = None,
    queries: str | os.PathLike[str] | None = None,
    *,
    columns: Sequence[Column] | None = None,
    replicates: int = 1000,
) -> dict[str, dict[str, Any]]:
    """Per metric column: its best estimator, the runner-up, and whether a paired test
    separates them (time columns are never marked).

    - Both with two or more runs on the same (split, seed): the paired t-test of
      :func:`~bayesurl.sweeps.aggregate.paired_comparison` over those runs, separated at
      p < :data:`BEST_ALPHA` (two-sided).
    - Both with one run: a paired bootstrap over the same queries
      (:func:`bayesurl.runs.queries.paired_test` on their per-query records in ``queries``),
      separated where the 95 % interval of the difference excludes 0. Only the metrics a
      record gives (:data:`bayesurl.runs.queries.PAIRED_KEYS`) are tested.
    - Otherwise no test, no mark.

    Returns
    -------
    dict
        ``{key: {"best", "runner_up", "separated", "test" (words, ``None``: not tested),
        "diff", "low", "high", "p", "n"}}`` for every column with two estimators or more.
    """
    recs = [r for r in _with_split(records) if r.get("error") is None]
    summ = summarize_runs(recs) if summary is None else summary
    cols = list(report_columns(shown=True, runs=False) if columns is None else columns)
    folder = None if queries is None else Path(queries)
    out: dict[str, dict[str, Any]] = {}
    for c in cols:
        means = {
            n: row[c.key]["mean"]
            for n, row in summ.items()
            if isinstance(row.get(c.key), Mapping) and row[c.key].get("mean") is not None
        }
        if len(means) < 2:
            continue
        ranked = sorted(means, key=lambda n: means[n], reverse=c.higher_is_better)
        best, second = ranked[0], ranked[1]
        entry: dict[str, Any] = {
            "best": best, "runner_up": second, "separated": False, "test": None,
            "diff": None, "low": None, "high": None, "p": None, "n": None,
        }  # fmt: skip
        mine = [r for r in recs if r["estimator"] in (best, second)]
        runs = {n: [r for r in mine if r["estimator"] == n and r.get(c.key) is not None]
                for n in (best, second)}  # fmt: skip
        if min(len(v) for v in runs.values()) >= 2:
            try:
                row = paired_comparison(
                    mine, c.key, reference=second, higher_is_better=c.higher_is_better
                )[best]
            except ValueError:
                row = {}
            if row.get("p_t") is not None:
                entry.update(
                    test=f"paired t-test over {row['n']} runs", diff=row["mean_diff"],
                    low=row["low"], high=row["high"], p=row["p_t"], n=row["n"],
                    separated=bool(row["p_t"] < BEST_ALPHA and row["mean_diff"] > 0),
                )  # fmt: skip
        elif max(len(v) for v in runs.values()) == 1 and c.key in PAIRED_KEYS:
            a, b = (_record_of(folder, runs[n][0]) for n in (best, second))
            res = None if a is None or b is None else paired_test(
                a, b, c.key, replicates=replicates
            )  # fmt: skip
            if res is not None:
                sign = 1.0 if c.higher_is_better else -1.0
                lo, hi = sorted((sign * res["low"], sign * res["high"]))
                entry.update(
                    test=f"paired bootstrap over the same {res['n']} queries",
                    diff=sign * res["diff"], low=lo, high=hi, p=res["p"], n=res["n"],
                    separated=bool(lo > 0),
                )  # fmt: skip
        out[c.key] = entry
    return out


def results_table(
    records: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    *,
    queries: str | os.PathLike[str] | None = None,
    best: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The sweep's table: one row per estimator, each shown column's mean +- the half-width
    of its 95 % interval (:func:`summarize_runs`; the header says which interval and its n).

    A column's best is marked ``*`` only where a paired test separates it from the runner-up
    (``best``, else :func:`best_marks` with the per-query records in ``queries``); the
    legend names the test. A column no estimator measured is left out; failed runs are
    counted in the row and listed below.
    """
    summ = summarize_runs(records)
    names = list(summ)
    cols = [
        c
        for c in report_columns(shown=True)
        if any(summ[n][c.key]["mean"] is not None for n in names)
    ]
    marks = dict(best_marks(records, summ, queries) if best is None else best)
    head = ["estimator", *(c.title for c in cols)]
    rows = []
    for n in names:
        row = [n]
        for c in cols:
            cell = format_stat(summ[n][c.key], c)
            m = marks.get(c.key) or {}
            top = bool(m.get("separated")) and m.get("best") == n
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
        + f", device {s.get('device')}",
        interval_caption(summ, cols),
        fmt(head),
        fmt(["-" * w for w in widths]),
        *(fmt(r) for r in rows),
    ]
    if len(names) > 1:
        lines += mark_legend(marks, cols)
    if any(c.key == "ece" for c in cols) and any(summ[n]["ece"]["mean"] is None for n in names):
        lines.append(
            "ECE n/a: the estimator has only a scalar u (no distribution to sample; see the "
            "docs, Concepts > Metrics)."
        )
    free = best_free_baseline(summ)
    if free is not None:
        lines.append(_free_baseline_line(records, summ, free, queries))
    lines += [
        f"FAILED {r['estimator']} seed {r.get('seed')}: {r['error']}"
        for r in run_rows(records)
        if r.get("error")
    ]
    return "\n".join(lines)


def mark_legend(
    marks: Mapping[str, Mapping[str, Any]], cols: Sequence[Column], mark: str = "*"
) -> list[str]:
    """The lines saying what ``*`` (the report: bold) means, which test decided it, and where
    there is none (``marks``: :func:`best_marks`)."""
    title = {c.key: c.title for c in cols}
    tests = sorted({str(m["test"]) for m in marks.values() if m.get("test")})
    shown = [k for k in title if k in marks]
    if not shown:
        return []
    lower = [c.title for c in cols if not c.higher_is_better and c.key in marks]
    line = (
        f"{mark}: the best of the column (higher is better"
        + (f"; lower for {', '.join(lower)}" if lower else "")
        + "), ahead of the runner-up beyond noise"
        + (f" by a {' / '.join(tests)} (95 %)" if tests else "")
    )
    out = [line]
    tied = [title[k] for k in shown if marks[k].get("test") and not marks[k]["separated"]]
    untested = [title[k] for k in shown if not marks[k].get("test")]
    if tied:
        out.append(f"  no mark, the best not separated from the runner-up: {', '.join(tied)}")
    if untested:
        out.append(
            f"  no mark, no paired test (its per-query data are not kept): {', '.join(untested)}"
        )
    return out


def _free_baseline_line(
    records: Sequence[Mapping[str, Any]],
    summ: Mapping[str, Mapping[str, Any]],
    free: str,
    queries: str | os.PathLike[str] | None,
) -> str:
    """The estimators whose R-AUROC is above the best free baseline's, each said separated or
    not by the paired test of :func:`best_marks` (one pair at a time)."""
    ref = summ[free]["r_auroc"]["mean"]
    above = [
        m
        for m in summ
        if m not in FREE_BASELINES
        and summ[m]["r_auroc"]["mean"] is not None
        and summ[m]["r_auroc"]["mean"] > ref
    ]
    col = metric_column("r_auroc")
    said, tests = [], set()
    for m in above:
        pair = {k: v for k, v in summ.items() if k in (m, free)}
        mark = best_marks(records, pair, queries, columns=[col]).get("r_auroc", {})
        if mark.get("test"):
            tests.add(str(mark["test"]).split(" over ")[0])
            how = "separated" if mark["separated"] else "not separated"
        else:
            how = "not tested"
        said.append(f"{m} {summ[m]['r_auroc']['mean']:.3f} ({how})")
    by = f"; by a {' / '.join(sorted(tests))}, 95 %" if tests else ""
    return (
        f"R-AUROC above the best free baseline ({free} {ref:.3f}): {', '.join(said) or 'none'}{by}"
    )


def plot_title(settings: Mapping[str, Any]) -> str:
    """``"<preset>"``, with the data set where it is not FashionMNIST (``"pretrained
    (clipart)"``): two protocols of one preset on two data sets draw distinguishable plots."""
    preset = str(settings.get("preset", ""))
    dataset = settings.get("dataset")
    return f"{preset} ({dataset})" if dataset and dataset != DEFAULT_RECIPE_FILE else preset


def _summary_keys(metrics: Sequence[str]) -> list[str]:
    """The columns a report summarises: the compared metrics, then every report column."""
    return list(dict.fromkeys([*metrics, *(c.key for c in report_columns())]))


def _default_metrics(metrics: Sequence[str] | None) -> list[str]:
    return (
        [c.key for c in report_columns(shown=True, runs=False)] if metrics is None else [*metrics]
    )


def results_document(
    records: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    *,
    metrics: Sequence[str] | None = None,
    reference: str = "ce",
    queries: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The report of a sweep as one document, in full (the runs with their curves, every
    halving of the reproducibility); :func:`write_document` writes it.

    The standard split is one split (K = 1; a record without ``split`` is on split 0). The
    document holds ``settings``, ``runs`` (every record), ``interval_over``
    (:func:`observation_unit`), ``tuning_check``
    (:func:`~bayesurl.sweeps.tuning.tuning_leaks`: when a run's settings were tuned on one
    of its downstream classes, or a run does not say, ``verdict`` is that one line and every
    comparison's ``verdict`` word is withheld), ``summary`` (mean, sd and 95 % t-interval of
    every column of :func:`report_columns` over the splits' seed means, or over the runs on
    one split; :func:`~bayesurl.sweeps.aggregate.summarize`), ``best`` (:func:`best_marks`,
    on the per-query records in ``queries``), ``paired_vs_<reference>`` per metric (paired t
    / Wilcoxon over (split, seed), Holm, bootstrap interval), ``paired_vs_<reference>_pairs``
    (the same with the complementary pair as the unit), ``vs_chance`` (R-AUROC against 0.5
    per pair, Holm), the same against the best free baseline that is above chance
    (``best_free_baseline``, ``paired_vs_best_free_baseline[_pairs]``;
    :data:`FREE_BASELINES`; ``None`` when none is), ``reproducibility`` (split-half Spearman
    for R-AUROC, R@1, OOD AUROC over random halvings) and ``reproducibility_by`` (the other
    halvings of :data:`HALVINGS`: pair-preserving, class-held-out). A comparison that needs
    more splits or runs than there are holds a ``note`` saying so.

    Parameters
    ----------
    metrics : sequence of str, optional
        The metrics compared (default: the shown metric columns of :func:`report_columns`).
    """
    metrics = _default_metrics(metrics)
    recs = _with_split(records)
    unit = observation_unit(recs)
    check = tuning_leaks(recs)
    summary = summarize_runs(recs, _summary_keys(metrics))
    compared = _comparisons(recs, summary, metrics, reference)
    if not check["ok"]:  # the numbers stay, the words that would read as a verdict go
        _withhold_verdicts(v for k, v in compared.items() if k.startswith("paired_vs_"))
    repro, repro_by = _reproducibility(recs)
    return {
        "format": RESULTS_FORMAT,
        "settings": jsonable(dict(settings)),
        "interval_over": UNIT_WORDS[unit],
        "tuning_check": check,
        "verdict": None if check["ok"] else check["line"],
        "runs": recs,
        "summary": jsonable(summary),
        "intervals": interval_caption(summary),
        "best": jsonable(best_marks(recs, summary, queries)),
        **jsonable(compared),
        "reproducibility": jsonable(repro),
        "reproducibility_by": jsonable(repro_by),
    }


def _comparisons(
    recs: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Mapping[str, Any]],
    metrics: Sequence[str],
    reference: str,
) -> dict[str, Any]:
    """The paired comparisons against ``reference`` and the best free baseline above
    chance, and R-AUROC against chance, under their keys in the results document."""
    names = {r["estimator"] for r in recs if r.get("error") is None}
    units = {"": "run", "_pairs": "pair"} if _paired(recs) else {"": "run"}

    def compare(ref: str | None) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {suffix: {} for suffix in units}
        if ref is None:
            return out
        for suffix, unit in units.items():
            for m in metrics:
                try:
                    up = metric_column(m, report_columns()).higher_is_better
                    out[suffix][m] = paired_comparison(
                        recs, m, reference=ref, unit=unit, higher_is_better=up
                    )
                except ValueError as exc:
                    out[suffix][m] = {"note": str(exc)}
        return out

    paired = compare(reference if reference in names else None)
    try:
        vs_chance: dict[str, Any] = chance_test(
            recs, "r_auroc", unit="pair" if "_pairs" in units else "split"
        )
    except ValueError as exc:
        vs_chance = {"note": str(exc)}
    free = best_free_baseline(summary, vs_chance if "note" not in vs_chance else None)
    return {
        **{f"paired_vs_{reference}{s}": p for s, p in paired.items()},
        "vs_chance": vs_chance,
        "best_free_baseline": free,
        **{f"paired_vs_best_free_baseline{s}": p for s, p in compare(free).items()},
    }


def _withhold_verdicts(tables: Iterable[Mapping[str, Any]]) -> None:
    """Set every ``verdict`` word of the paired ``tables`` to ``None`` (in place)."""
    for table in tables:
        for rows in table.values():
            for row in rows.values():
                if isinstance(row, dict) and "verdict" in row:
                    row["verdict"] = None


def _reproducibility(
    recs: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Split-half reproducibility of :data:`REPRO_METRICS`: over random halvings, and over
    the other halvings of :data:`HALVINGS` (a ``note`` where there are too few splits)."""
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
    return repro, repro_by


#: Beside ``results.json``: each run's training curves (in the order of its ``runs``).
CURVES_FILE = "runs.json.gz"
#: Beside ``results.json``: every halving of the split-half reproducibility.
REPRODUCIBILITY_FILE = "reproducibility.json.gz"


def write_document(folder: str | os.PathLike[str], doc: Mapping[str, Any]) -> dict[str, Path]:
    """Write a results document (:func:`results_document`) into ``folder``: ``results.json``
    with the summary, the verdict tables and each run's metrics, and beside it, compressed,
    what only a plot or a detailed report reads: the runs' training curves
    (:data:`CURVES_FILE`) and every halving of the reproducibility
    (:data:`REPRODUCIBILITY_FILE`; ``results.json`` keeps each one's statistics and
    ``n_partitions``). :func:`read_results` puts the document together again.

    The runs are a table (:func:`run_table`): ``run_columns`` names, per set of fields the
    runs record, those fields and the values every such run shares (an interval's method,
    what it is over, its level, the settings every run repeats); each run in ``runs`` is one
    line, the index of its column set, then its own values.

    Each file is written atomically, the side files first: a ``results.json`` never names a
    file that is not there.
    """
    where = Path(folder)
    runs = [RunRecord.from_row(r) for r in doc["runs"]]
    curves = [r.curves() for r in runs]
    paths = {}
    if any(v is not None for c in curves for v in c.values()):
        side = {"format": RESULTS_FORMAT, "curves": curves}
        paths["curves"] = write_json_gz(where / CURVES_FILE, side)
    slim = {k: v for k, v in doc.items() if k != "runs"}
    slim["format"] = RESULTS_FORMAT
    slim["reproducibility"] = _without_partitions(doc.get("reproducibility"))
    slim["reproducibility_by"] = {
        h: _without_partitions(v) for h, v in (doc.get("reproducibility_by") or {}).items()
    }
    keys = ("reproducibility", "reproducibility_by")
    if any(slim[k] != doc.get(k) for k in keys):  # some halvings to keep beside
        detail = {k: doc.get(k) for k in keys}
        paths["reproducibility"] = write_json_gz(
            where / REPRODUCIBILITY_FILE, {"format": RESULTS_FORMAT, **detail}
        )
    slim["files"] = {k: p.name for k, p in paths.items()}
    columns, rows = run_table([r.to_row(curves=False) for r in runs])
    slim["run_columns"], slim["runs"] = "\0columns", "\0runs"
    text = json.dumps(slim, indent=1)
    for key, items in (("columns", columns), ("runs", rows)):
        lines = ",\n  ".join(json.dumps(x, separators=(",", ":")) for x in items)
        text = text.replace(f'"\\u0000{key}"', f"[\n  {lines}\n ]" if items else "[]", 1)
    return {"json": atomic_write(where / "results.json", text), **paths}


def run_table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    """``rows`` as a table: ``(columns, values)``.

    Rows that record the same fields in the same order share a column set
    ``{"keys": [...], "same": {...}}``; ``same`` holds the fields whose value is the same in
    every row of the set (compared as JSON: ``1`` and ``1.0`` differ), when the set has two
    rows or more. Each row becomes ``[column set, value, ...]``: its values of the other
    fields, in ``keys`` order. :func:`table_runs` gives the rows back, equal and in the same
    key order.
    """
    shapes: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        shapes.setdefault(tuple(r), []).append(r)
    columns, index = [], {}
    for keys, members in shapes.items():
        same = {
            k: members[0][k]
            for k in keys
            if len(members) > 1 and len({json.dumps(m[k]) for m in members}) == 1
        }
        index[keys] = len(columns)
        columns.append({"keys": list(keys), "same": same})
    values = []
    for r in rows:
        i = index[tuple(r)]
        same = columns[i]["same"]
        values.append([i, *(v for k, v in r.items() if k not in same)])
    return columns, values


def table_runs(columns: Any, values: Any, where: str) -> list[dict[str, Any]]:
    """The rows of a :func:`run_table` (``where`` names the file in an error).

    Raises
    ------
    ValueError
        If a row does not fit its column set.
    """
    out = []
    for i, row in enumerate(values):
        try:
            cols = columns[row[0]]
            keys, same = cols["keys"], cols["same"]
            own = [k for k in keys if k not in same]
            if len(row) - 1 != len(own):
                raise ValueError
        except (ValueError, TypeError, KeyError, IndexError):
            raise ValueError(f"{where}: runs[{i}] does not fit its run_columns") from None
        mine = dict(zip(own, row[1:]))
        out.append({k: same[k] if k in same else mine[k] for k in keys})
    return out


def _without_partitions(table: Any) -> Any:
    """A reproducibility table with each entry's ``partitions`` list as its count."""
    if not isinstance(table, Mapping):
        return table
    out = {}
    for metric, entry in table.items():
        if isinstance(entry, Mapping) and isinstance(entry.get("partitions"), list):
            entry = {k: v for k, v in entry.items() if k != "partitions"}
            entry["n_partitions"] = len(table[metric]["partitions"])
        out[metric] = entry
    return out


def read_results(path: str | os.PathLike[str], *, detail: bool = True) -> dict[str, Any]:
    """A benchmark's results document, as :func:`results_document` made it.

    Parameters
    ----------
    path : path-like
        ``results.json`` or the folder holding it; of this bayesurl's format or an earlier
        one (whose files held everything in ``results.json``).
    detail : bool
        Put the side files of :func:`write_document` back in (the runs' curves, every
        halving of the reproducibility); without them, or where they are missing, the runs
        carry no curves and each halving its ``n_partitions`` only.

    Returns
    -------
    dict
        The document; its ``runs`` as rows of one shape
        (:func:`~bayesurl.sweeps.record.run_rows`: ``estimator`` always set).

    Raises
    ------
    FileNotFoundError
        If there is no ``results.json``.
    ValueError
        If it (or a side file) is not a benchmark result this bayesurl reads (naming it).
    """
    p = Path(path)
    p = p / "results.json" if p.is_dir() else p
    doc = read_json_document(p, RESULTS_FORMAT)
    what = f"{str(p)!r} is not a bayesurl benchmark result"
    runs = doc.get("runs")
    if not isinstance(runs, list):
        raise ValueError(
            f"{what}: no 'runs' entry" if runs is None else f"{what}: 'runs' is no list"
        )
    if (check_format(doc, p, RESULTS_FORMAT) or 0) >= 3:
        runs = table_runs(doc.pop("run_columns", None), runs, what)
    for i, r in enumerate(runs):
        try:
            estimator_of(r)
        except (ValueError, AttributeError):
            raise ValueError(f"{what}: runs[{i}] has no 'estimator' name") from None
    doc["runs"] = run_rows(runs)
    files = doc.pop("files", None) or {}
    if not detail:
        return doc
    if "curves" in files and (p.parent / files["curves"]).is_file():
        side = _side(p.parent / files["curves"])
        curves = side.get("curves")
        if not isinstance(curves, list) or len(curves) != len(runs):
            raise ValueError(f"{files['curves']!r} does not match the runs of {str(p)!r}")
        for row, c in zip(doc["runs"], curves):
            row.update({k: v for k, v in c.items() if k in CURVES})
    if "reproducibility" in files and (p.parent / files["reproducibility"]).is_file():
        side = _side(p.parent / files["reproducibility"])
        doc.update({k: side.get(k) for k in ("reproducibility", "reproducibility_by")})
    return doc


def _side(path: Path) -> dict[str, Any]:
    doc = read_json_gz(path)
    check_format(doc, path, RESULTS_FORMAT)
    return doc


def save_results(
    records: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    settings: Mapping[str, Any],
    *,
    metrics: Sequence[str] | None = None,
    reference: str = "ce",
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Write the report of a sweep into ``out``; the results document (in full) and the
    paths written.

    :func:`results_document` (its best marks tested on the per-query records in
    ``out/queries``) written by :func:`write_document`; ``results.csv`` (one row per run,
    each metric beside its interval); ``recall_vs_rauroc.png`` (:func:`plot_results`) and
    ``training_curves.png`` (:func:`plot_training_curves`, when the runs carry curves).

    Parameters
    ----------
    records : sequence of mapping
        The runs' rows (:class:`~bayesurl.sweeps.record.RunRecord`).
    out : path-like
        The results folder.
    settings : mapping
        The sweep's settings.
    metrics : sequence of str, optional
        The metrics compared (default: the shown metric columns of :func:`report_columns`).
    reference : str
        The estimator every other one is compared with (``"ce"``).
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    metrics = _default_metrics(metrics)
    doc = results_document(
        records, settings, metrics=metrics, reference=reference, queries=folder / "queries"
    )
    paths = write_document(folder, doc)
    recs, summary = doc["runs"], doc["summary"]
    paths["csv"] = _write_csv(folder / "results.csv", recs, _summary_keys(metrics))
    title = plot_title(settings)
    over = plot_over(summary, observation_unit(recs))
    paths["png"] = plot_results(summary, folder / "recall_vs_rauroc.png", title=title, over=over)
    curves = plot_training_curves(run_rows(recs), folder / "training_curves.png", title=title)
    if curves is not None:
        paths["training_curves"] = curves
    return doc, paths


def write_results(
    records: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    settings: Mapping[str, Any],
    **options: Any,
) -> dict[str, Path]:
    """Write ``results.json`` (and its side files), ``results.csv``, ``recall_vs_rauroc.png``
    and ``training_curves.png`` (when the runs carry curves) to ``out``; the paths written
    (:func:`save_results`, whose keyword ``options`` these are: ``metrics``, ``reference``)."""
    return save_results(records, out, settings, **options)[1]


def _write_csv(path: Path, recs: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> Path:
    """``results.csv``: one row per run, each metric beside its interval (the flat fields of
    :mod:`bayesurl.stats.intervals`), then the run's other fields (curves and lists as
    JSON)."""
    import csv

    have = {k for r in recs for k in r}
    cols = ["estimator", "split", "seed", "error"]
    cols += [k + x for k in keys for x in _INTERVAL_FIELDS if not x or k + x in have]
    cols += sorted(have - set(cols) - {"traceback", "upstream", "downstream", "overrides"})
    with atomic_open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in recs:
            w.writerow(
                {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()}
            )
    return path


#: The suffixes of a metric's interval fields in a record (``""``: the metric itself).
_INTERVAL_FIELDS = ("", "_low", "_high", "_interval", "_n", "_over")


def _paired(recs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the splits come in complementary pairs (at least two of them)."""
    ok = [r for r in recs if r.get("error") is None and r.get("downstream")]
    if not ok:
        return False
    pair_of = complementary_pairs(ok)
    units = set(pair_of.values())
    return len(units) >= 2 and len(units) < len(pair_of)


def plot_over(summary: Mapping[str, Mapping[str, Any]], unit: str) -> str:
    """What the plot's R-AUROC intervals are over (``over`` of :func:`plot_results`)."""
    kinds = {
        (st.get("interval"), st.get("interval_n"))
        for row in summary.values()
        for st in [row.get("r_auroc")]
        if isinstance(st, Mapping) and st.get("interval") is not None
    }
    if kinds and all(k != "t" for k, _ in kinds):
        ns = sorted({int(n) for _, n in kinds})
        return f"the {ns[0] if len(ns) == 1 else f'{ns[0]}-{ns[-1]}'} queries, DeLong"
    return f"{UNIT_WORDS[unit]}, Student-t"
