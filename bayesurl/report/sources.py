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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bayesurl.evaluation.intervals import DEFAULT_LEVEL, METHOD_NAMES, read_interval
from bayesurl.evaluation.table import Column
from bayesurl.files import read_json_document
from bayesurl.runs.folder import FOLDER_FORMAT
from bayesurl.runs.queries import QUERIES_FILE, QueryRecord, read_queries
from bayesurl.runs.runner import RESULT_FORMAT
from bayesurl.sweeps.report import (
    RESULTS_FORMAT,
    best_marks,
    interval_caption,
    mark_legend,
    report_columns,
    summarize_runs,
)

__all__ = ["RecordedRun", "ReportSource", "load_source", "table_columns"]


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
    path = folder / "results.json"
    data = _read_json(path, RESULTS_FORMAT)
    summary, runs = data.get("summary"), data.get("runs")
    if not isinstance(summary, dict) or not isinstance(runs, list):
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
    s = data.get("settings", {})
    said = any(
        isinstance(st, dict) and "interval" in st
        for row in summary.values()
        if isinstance(row, dict)
        for st in row.values()
    )
    if not said and runs and all(isinstance(r, dict) for r in runs):
        # results written before each entry said its interval: summarised as now
        try:
            summary = {**summary, **summarize_runs(runs)}
        except ValueError:
            pass
    rows = [
        [name, *(_stat(stats.get(c.key)) for c in table_columns())]
        for name, stats in summary.items()
        if isinstance(stats, dict)
    ]
    seeds = ",".join(str(x) for x in s.get("seeds", []))
    splits = s.get("class_splits")
    settings = [
        f"preset {s.get('preset')}, data {s.get('dataset')}, seeds {seeds}"
        + (f", {len(splits)} class splits" if isinstance(splits, list) else "")
        + (f", device {s['device']}" if s.get("device") else ""),
        f"{len(runs)} runs, {len(rows)} estimators",
    ]
    recorded, missing = [], []
    for name, *_ in rows:
        found = _records_of(folder / "queries", name)
        if not found:
            missing.append(name)
            continue
        (split, seed), path = min(found.items())  # the first class split, the lowest seed
        metrics = next(
            (
                r
                for r in runs
                if r.get("estimator") == name
                and int(r.get("seed", -1)) == seed
                and (split is None or int(r.get("split", -1)) == split)
            ),
            {},
        )
        recorded.append(RecordedRun(name, seed, read_queries(path), dict(metrics), split))
    title = f"bayesurl benchmark: {s.get('dataset', '')} ({s.get('preset', '')})"
    cols, rows = _measured(rows)
    best = data.get("best")
    if not isinstance(best, dict):  # results written before the marks were: test them now
        try:
            best = best_marks(runs, summary, folder / "queries")
        except (ValueError, KeyError, TypeError):
            best = {}
    marks = {
        k: str(m["best"]) for k, m in best.items() if isinstance(m, dict) and m.get("separated")
    }
    legend = [interval_caption(summary, cols, "Each value with its ") + "."]
    if len(rows) > 1:
        legend += mark_legend({k: m for k, m in best.items() if isinstance(m, dict)}, cols, "bold")
    notices = [str(s["notice"])] if s.get("notice") else []
    return ReportSource(
        folder, "benchmark", title, settings, cols, rows, _plots(folder), recorded, missing,
        marks, legend, notices,
    )  # fmt: skip


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
