"""What a report is made of, read from a result folder.

Three kinds of folder are recognised by their files:

- a run (``bayesurl run``): ``result.json`` and ``queries.npz``;
- a benchmark (``bayesurl benchmark``): ``results.json`` (a sweep's or the stored protocol's)
  and ``queries/<estimator>_s<seed>.npz``;
- a folder of one's own images (``bayesurl folder``): ``folder.json`` and ``queries.npz``.

Every ``*.png`` of the folder is a plot the report embeds. A benchmark whose runs kept no
per-query record (results written before the record existed) still gives the table and plots.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bayesurl.evaluation.table import Column
from bayesurl.files import read_json_document
from bayesurl.folder import FOLDER_FORMAT
from bayesurl.runs.queries import QUERIES_FILE, QueryRecord, read_queries
from bayesurl.runs.runner import RESULT_FORMAT
from bayesurl.stats.intervals import DEFAULT_LEVEL, METHOD_NAMES, read_interval
from bayesurl.sweeps.record import run_rows
from bayesurl.sweeps.report import (
    RESULTS_FORMAT,
    best_marks,
    interval_caption,
    mark_legend,
    read_results,
    report_columns,
    summarize_runs,
)

__all__ = ["RecordedRun", "ReportSource", "benchmark_source", "load_source", "table_columns"]


def table_columns() -> list[Column]:
    """The columns of the results table: the shown columns of the sweep report
    (:func:`bayesurl.sweeps.report.report_columns`, from the metric table)."""
    return report_columns(shown=True)


@dataclass
class RecordedRun:
    """One estimator's run with its per-query record."""

    estimator: str
    seed: int
    record: QueryRecord
    metrics: dict[str, Any] = field(default_factory=dict)
    split: int | None = None


@dataclass
class ReportSource:
    """Everything a report shows.

    Attributes
    ----------
    folder : Path
    kind : str
        ``"run"``, ``"benchmark"`` or ``"folder"``.
    title : str
    settings : list of str
        Lines describing the settings (preset, data, seeds, device).
    columns : list of Column
        The table's metric columns (title, digits, direction), after the estimator's name.
    rows : list of list
        One row per estimator: name, then per column ``(mean, low, high, how)``: the value,
        its interval's bounds and what the interval is in words (``"95 % DeLong interval
        over 1000 queries"``); ``None`` where undefined or without an interval.
    plots : list of Path
        PNG files of the folder.
    runs : list of RecordedRun
        Runs with a per-query record, one per estimator (its first class split, lowest seed).
    missing : list of str
        Estimators of the table without a record (said on the page).
    marks : dict
        ``{column key: estimator}``: the column's best, where a paired test separates it from
        the runner-up (:func:`bayesurl.sweeps.report.best_marks`).
    legend : list of str
        What the intervals are (with their n) and what a mark means, under the table.
    notices : list of str
        Lines above everything (a smoke-scale preset's warning).
    """

    folder: Path
    kind: str
    title: str
    settings: list[str]
    columns: list[Column]
    rows: list[list[Any]]
    plots: list[Path]
    runs: list[RecordedRun]
    missing: list[str] = field(default_factory=list)
    marks: dict[str, str] = field(default_factory=dict)
    legend: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _how(method: Any, n: Any, over: Any, level: Any) -> str | None:
    """``"95 % DeLong interval over 1000 queries"`` (``None`` without a method)."""
    if not method:
        return None
    lv = _num(level) or DEFAULT_LEVEL
    return f"{100 * lv:g} % {METHOD_NAMES.get(str(method), method)} interval over {n} {over}"


def _stat(entry: Any) -> tuple[float | None, float | None, float | None, str | None]:
    """``(mean, low, high, how)`` of a summary entry (an interval's bounds where finite)."""
    if not isinstance(entry, dict):
        return _num(entry), None, None, None
    lo, hi = _num(entry.get("low")), _num(entry.get("high"))
    if lo is None or hi is None:
        return _num(entry.get("mean")), None, None, None
    method = entry.get("interval", "t")  # results written before the field: Student-t
    n = entry.get("interval_n", entry.get("n"))
    how = _how(method, n, entry.get("interval_over") or "runs", entry.get("level"))
    return _num(entry.get("mean")), lo, hi, how


def _metric(metrics: dict[str, Any], key: str) -> tuple[Any, ...]:
    """``(value, low, high, how)`` of one run's metric and its interval (flat fields)."""
    iv = read_interval(metrics, key)
    if iv is None:
        return _num(metrics.get(key)), None, None, None
    return _num(metrics.get(key)), iv.low, iv.high, _how(iv.method, iv.n, iv.over, iv.level)


def _read_json(path: Path, expected: str) -> dict[str, Any]:
    """The document at ``path`` if it is of the ``expected`` format (or older, or from before
    result files carried a format); one line naming the file otherwise."""
    return read_json_document(path, expected)


def _measured(rows: list[list[Any]]) -> tuple[list[Column], list[list[Any]]]:
    """The columns some row has a value in, and the rows cut to them (a metric no run
    measured, such as the crop test on a folder, is left out rather than shown as a column of
    n/a); every column when none has a value (an unlabelled folder: each metric says n/a)."""
    cols = table_columns()
    keep = [i for i in range(len(cols)) if any(r[i + 1][0] is not None for r in rows)]
    keep = keep or list(range(len(cols)))
    return [cols[i] for i in keep], [[r[0], *(r[i + 1] for i in keep)] for r in rows]


def _benchmark(folder: Path) -> ReportSource:
    """The source of a benchmark folder: its ``results.json`` read back (from disk: the
    report of a folder written earlier, ``bayesurl report DIR``)."""
    path = folder / "results.json"
    try:
        data = read_results(path, detail=False)
    except ValueError as exc:
        raise ValueError(f"{exc} (this bayesurl reads {RESULTS_FORMAT})") from None
    summary = data.get("summary")
    if not isinstance(summary, dict):
        raise ValueError(
            f"{str(path)!r} is not a bayesurl benchmark result (no 'summary' and 'runs'; this "
            f"bayesurl reads {RESULTS_FORMAT})"
        )
    keys = {c.key for c in table_columns()}
    if summary and not any(
        isinstance(stats, dict) and keys & set(stats) for stats in summary.values()
    ):
        # a results file of another layout: its numbers would all show as n/a
        raise ValueError(
            f"{str(path)!r} holds a summary in another layout (none of its estimators has "
            f"{', '.join(sorted(keys)[:4])} ...; this bayesurl reads {RESULTS_FORMAT})"
        )
    return benchmark_source(
        folder, data["runs"], data.get("settings", {}), summary, data.get("best")
    )


def benchmark_source(
    folder: str | os.PathLike[str],
    runs: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    summary: Mapping[str, Any],
    best: Mapping[str, Any] | None = None,
) -> ReportSource:
    """What the report of a benchmark shows, from its results as they are (in memory, as a
    sweep has just made them, or as read back from its folder).

    Parameters
    ----------
    folder : path-like
        The results folder (its plots and ``queries/`` are read from there).
    runs : sequence of mapping
        The runs' rows (:class:`~bayesurl.sweeps.record.RunRecord`).
    settings : mapping
        The sweep's settings.
    summary : mapping
        :func:`~bayesurl.sweeps.report.summarize_runs` of ``runs``; one written before each
        entry said its interval is summarised again.
    best : mapping, optional
        :func:`~bayesurl.sweeps.report.best_marks` (tested now when not given).
    """
    folder = Path(folder)
    runs = run_rows(runs)
    summary = _with_intervals(summary, runs)
    rows = [
        [name, *(_stat(stats.get(c.key)) for c in table_columns())]
        for name, stats in summary.items()
        if isinstance(stats, dict)
    ]
    s = settings
    recorded, missing = _recorded_runs(folder, [row[0] for row in rows], runs)
    cols, rows = _measured(rows)
    if not isinstance(best, Mapping):  # results written before the marks were: test them now
        try:
            best = best_marks(runs, summary, folder / "queries")
        except (ValueError, KeyError, TypeError):
            best = {}
    tested = {k: m for k, m in best.items() if isinstance(m, Mapping)}
    legend = [interval_caption(summary, cols, "Each value with its ") + "."]
    if len(rows) > 1:
        legend += mark_legend(tested, cols, "bold")
    return ReportSource(
        folder,
        "benchmark",
        f"bayesurl benchmark: {s.get('dataset', '')} ({s.get('preset', '')})",
        _benchmark_settings(s, len(runs), len(rows)),
        cols,
        rows,
        _plots(folder),
        recorded,
        missing,
        {k: str(m["best"]) for k, m in tested.items() if m.get("separated")},
        legend,
        [str(s["notice"])] if s.get("notice") else [],
    )


def _with_intervals(
    summary: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """``summary``; one written before each entry said its interval, summarised again from
    the runs as now."""
    said = any(
        isinstance(st, dict) and "interval" in st
        for row in summary.values()
        if isinstance(row, dict)
        for st in row.values()
    )
    if said or not runs:
        return dict(summary)
    try:
        return {**summary, **summarize_runs(runs)}
    except ValueError:
        return dict(summary)


def _benchmark_settings(s: Mapping[str, Any], n_runs: int, n_estimators: int) -> list[str]:
    seeds = ",".join(str(x) for x in s.get("seeds", []))
    splits = s.get("class_splits")
    return [
        f"preset {s.get('preset')}, data {s.get('dataset')}, seeds {seeds}"
        + (f", {len(splits)} class splits" if isinstance(splits, list) else "")
        + (f", device {s['device']}" if s.get("device") else ""),
        f"{n_runs} runs, {n_estimators} estimators",
    ]


def _recorded_runs(
    folder: Path, names: Sequence[str], runs: Sequence[Mapping[str, Any]]
) -> tuple[list[RecordedRun], list[str]]:
    """Per estimator its first class split's lowest seed with a per-query record, and the
    estimators without one."""
    recorded, missing = [], []
    for name in names:
        found = _records_of(folder / "queries", name)
        if not found:
            missing.append(name)
            continue
        (split, seed), path = min(found.items())  # the first class split, the lowest seed
        metrics = next(
            (
                r
                for r in runs
                if r["estimator"] == name
                and int(r.get("seed", -1)) == seed
                and (split is None or int(r.get("split", -1)) == split)
            ),
            {},
        )
        recorded.append(RecordedRun(name, seed, read_queries(path), dict(metrics), split))
    return recorded, missing


def _records_of(folder: Path, name: str) -> dict[tuple[int | None, int], Path]:
    """``{(class split or None, seed): file}`` of an estimator's records
    (``<estimator>_s<seed>.npz``, or ``<estimator>_split<k>_s<seed>.npz`` over class splits)."""
    pattern = re.compile(rf"{re.escape(name)}(?:_split(\d+))?_s(\d+)")
    out = {}
    for p in folder.glob(f"{name}_*.npz"):
        m = pattern.fullmatch(p.stem)
        if m:
            split = None if m.group(1) is None else int(m.group(1))
            out[(split, int(m.group(2)))] = p
    return out


def _single(folder: Path, name: str, kind: str) -> ReportSource:
    path = folder / name
    data = _read_json(path, FOLDER_FORMAT if kind == "folder" else RESULT_FORMAT)
    if not isinstance(data.get("metrics", {}), dict) or (
        "estimator" not in data and "title" not in data
    ):
        raise ValueError(
            f"{str(path)!r} is not a bayesurl {kind} result (no 'estimator' and 'metrics'; "
            f"this bayesurl reads {FOLDER_FORMAT if kind == 'folder' else RESULT_FORMAT})"
        )
    metrics = dict(data.get("metrics") or {})
    metrics.update({k: v for k, v in (data.get("timings") or {}).items() if k == "train_time"})
    estimator = str(data.get("estimator", folder.name))
    row = [estimator, *(_metric(metrics, c.key) for c in table_columns())]
    q = folder / QUERIES_FILE
    runs = []
    if q.is_file():
        runs.append(RecordedRun(estimator, int(data.get("seed") or 0), read_queries(q), metrics))
    skipped = [f"unreadable, skipped: {s['path']} ({s['error']})" for s in data.get("skipped", [])]
    settings = [str(line) for line in data.get("describe", [])] + skipped or [
        f"data {data.get('dataset')}, seed {data.get('seed')}, preset {data.get('preset')}"
    ]
    title = str(data.get("title") or f"bayesurl run: {data.get('dataset')}/{estimator}")
    hows = sorted({cell[3] for cell in row[1:] if cell[3]})
    legend = (
        ["Each value with its interval over this run's queries: " + "; ".join(hows) + "."]
        if hows
        else []
    )
    return ReportSource(
        folder, kind, title, settings, *_measured([row]), _plots(folder), runs,
        [] if runs else [estimator], {}, legend,
    )  # fmt: skip


def _plots(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.png") if p.is_file())


def load_source(path: str | os.PathLike[str]) -> ReportSource:
    """Read a run, benchmark or folder result (see the module docs).

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a folder.
    ValueError
        If it holds none of ``results.json``, ``result.json``, ``folder.json``, or a file
        is not what its name says (naming it).
    """
    folder = Path(path)
    if folder.is_file() and folder.name in ("results.json", "result.json", "folder.json"):
        raise ValueError(
            f"`path` {str(folder)!r} is a results file: give the folder holding it "
            f"({str(folder.parent)!r})"
        )
    if not folder.is_dir():
        raise FileNotFoundError(f"`path` {str(folder)!r} is not a folder")
    if (folder / "folder.json").is_file():
        return _single(folder, "folder.json", "folder")
    if (folder / "results.json").is_file():
        return _benchmark(folder)
    if (folder / "result.json").is_file():
        return _single(folder, "result.json", "run")
    raise ValueError(
        f"`path` {str(folder)!r} holds no results.json (benchmark), result.json (run) or "
        "folder.json (bayesurl folder)"
    )
