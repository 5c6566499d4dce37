"""One self-contained HTML page from a result folder (:func:`write_report`).

The page holds its CSS, its script and every image (``data:`` URIs): opened from disk it makes
no request to any host, and a Content-Security-Policy that allows ``data:`` images and inline
code only says so to the browser. It shows

- the results table (click a column title to sort; each title's arrow says which way is
  better) and the folder's plots; every metric is shown with the title and digits its
  :class:`~bayesurl.evaluation.table.Column` declares, the same as in the text tables, beside
  its 95 % interval (over the queries of one run, or over the runs / class splits of a
  protocol; hover a number for the interval's method and n, the footnote says it for the
  table); a column's best is bold only where a paired test separates it from the runner-up
  (:func:`bayesurl.sweeps.report.best_marks`), the footnote names the test;
- per estimator: the most and the least uncertain downstream queries, each beside the
  neighbour it retrieved (the R@1 search, docs/concepts/metrics.rst) with a right / wrong mark; the
  OOD images ranked by u, marked where u is above the 95th percentile of the held-out upstream
  images' u (the ones a threshold at that level would flag); u per class;
- for several estimators on the same queries: two of them side by side on the most uncertain
  queries of either;
- the notes of :mod:`bayesurl.evaluation.notes` (u nearly constant, an AUROC at chance or
  inverted by its interval, a model at chance), above the results and in each estimator's
  section, and a smoke-scale preset's warning above everything; u is printed with the digits
  (:func:`~bayesurl.evaluation.notes.u_digits`) that tell two cards apart, beside its
  percentile.

The data behind it are a JSON model (:func:`report_model`) that the page's script renders.
"""

from __future__ import annotations

import base64
import html
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bayesurl._checks import check_int
from bayesurl.evaluation.notes import AUROC_TITLES, NOTE_WORDS, Note, u_digits
from bayesurl.files import atomic_write
from bayesurl.report.images import THUMB_SIZE, ImageSource, image_source
from bayesurl.report.sources import RecordedRun, ReportSource, load_source, table_columns
from bayesurl.stats.intervals import Interval, read_interval

__all__ = [
    "LATER_IMAGES",
    "REPORT_FILE",
    "cell_state",
    "notes_lines",
    "run_notes",
    "print_notes",
    "render_report",
    "report_line",
    "report_model",
    "try_report",
    "write_report",
]

#: File name of the page inside the result folder.
REPORT_FILE = "report.html"
#: Level of the held-out upstream u above which an OOD image counts as flagged.
FLAG_QUANTILE = 0.95
_TEMPLATE = Path(__file__).with_name("page.html")


def _f(x: Any) -> float | None:
    x = float(x)
    return round(x, 6) if np.isfinite(x) else None


def _exact(x: Any) -> float | None:
    """A metric's value as it is (the page rounds it to its column's digits, as the text
    tables do: rounding here first could round it twice)."""
    x = float(x)
    return x if np.isfinite(x) else None


def _fu(x: Any) -> float | None:
    """A u value kept to 9 significant digits (not 6 decimals: u may be 1e-5 in size)."""
    x = float(x)
    return float(f"{x:.9g}") if np.isfinite(x) else None


def _ranked(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ids by increasing u (stable: ties keep the lower id first) and each id's percentile."""
    order = np.argsort(u, kind="stable")
    pct = np.empty(len(u))
    pct[order] = np.arange(len(u)) / max(len(u) - 1, 1)
    return order, pct


def _per_class(run: RecordedRun, names: dict[int, str]) -> list[dict[str, Any]]:
    rec = run.record
    rows = []
    for c in np.unique(rec.label):
        m = rec.label == c
        q = np.quantile(rec.u[m], [0.1, 0.25, 0.5, 0.75, 0.9])
        rows.append(
            {
                "label": int(c),
                "name": names.get(int(c), str(int(c))) if c >= 0 else "unlabelled",
                "n": int(m.sum()),
                "r1": _f(rec.hit[m].mean()) if rec.labelled else None,
                "mean": _fu(rec.u[m].mean()),
                "q": [_fu(v) for v in q],
            }
        )
    return rows


def _ood(run: RecordedRun, k: int) -> dict[str, Any] | None:
    rec = run.record
    if rec.ood_u.size == 0:
        return None
    ref = rec.id_u if rec.id_u.size else rec.u
    thr = float(np.quantile(ref, FLAG_QUANTILE))
    order = np.argsort(-rec.ood_u, kind="stable")
    item = lambda i: [int(i), _fu(rec.ood_u[i]), bool(rec.ood_u[i] > thr)]  # noqa: E731
    return {
        "threshold": _fu(thr),
        "reference": "held-out upstream images" if rec.id_u.size else "downstream queries",
        "flagged": _f((rec.ood_u > thr).mean()),
        "n": int(rec.ood_u.size),
        "top": [item(i) for i in order[:k]],
        "bottom": [item(i) for i in order[::-1][:k]],
    }


def _comparable(runs: list[RecordedRun]) -> bool:
    """Whether the runs' records describe the same queries (same count and classes)."""
    if len(runs) < 2:
        return False
    first = runs[0].record
    return all(
        r.record.u.shape == first.u.shape and np.array_equal(r.record.label, first.label)
        for r in runs[1:]
    )


def _estimator(
    run: RecordedRun,
    src: ImageSource,
    rank: tuple[np.ndarray, np.ndarray],
    shared: set[int],
    k: int,
    thumbs: dict[str, str],
) -> dict[str, Any]:
    """One estimator's part of the model; adds the thumbnails it shows to ``thumbs``."""
    rec = run.record
    notes = run_notes(run)
    order, pct = rank
    most = [int(i) for i in order[::-1][:k]]
    least = [int(i) for i in order[:k]]
    shown = sorted({*most, *least, *shared})
    pairs = [(i, int(rec.neighbour[i])) for i in shown]
    # the estimators of a benchmark share their queries: each image is encoded once
    keys = [f"q{x}" for x in sorted({x for pair in pairs for x in pair})]
    ood = _ood(run, k)
    keys += [f"o{i}" for i, *_ in ([] if ood is None else ood["top"] + ood["bottom"])]
    for key in keys:
        if key not in thumbs:
            uri = (src.query if key[0] == "q" else src.ood)(int(key[1:]))
            if uri is not None:
                thumbs[key] = uri
    return {
        "name": run.estimator,
        "seed": run.seed,
        "split": run.split,
        "n": int(rec.u.size),
        "labelled": rec.labelled,
        # the run's number of every table column (the page formats each as its column says)
        "metrics": {
            c.key: _exact(run.metrics[c.key])
            for c in table_columns()
            if isinstance(run.metrics.get(c.key), (int, float))
            and _exact(run.metrics[c.key]) is not None
        },
        "intervals": {
            c.key: [iv.low, iv.high, iv.describe()]
            for c in table_columns()
            if (iv := read_interval(run.metrics, c.key)) is not None
        },
        "most": most,
        "least": least,
        "q": {str(i): [_fu(rec.u[i]), _f(pct[i]), j, bool(rec.hit[i])] for i, j in pairs},
        "label": {str(x): int(rec.label[x]) for pair in pairs for x in pair},
        "paths": _paths(rec, pairs),
        "ood": ood,
        "per_class": _per_class(run, src.class_names),
        "u_digits": u_digits(np.concatenate([rec.u, rec.ood_u])),
        "notes": [n.text for n in notes],
        "briefs": [n.short for n in notes],
        # the galleries say beside them when their u is at chance or inverted
        "note_kinds": [n.kind for n in notes],
        # why the galleries have no pictures, in words (None: every image was found)
        "images": src.problem,
    }


#: Why a page written straight after a benchmark has no thumbnails (the data would have to
#: be built again).
LATER_IMAGES = "thumbnails are drawn by `bayesurl report DIR` (it builds the data again)"


def report_model(
    source: ReportSource,
    *,
    k: int = 12,
    compare_k: int = 8,
    size: int = THUMB_SIZE,
    images: bool = True,
) -> dict[str, Any]:
    """The JSON model the page renders (see the module docs).

    Parameters
    ----------
    source : ReportSource
        From :func:`bayesurl.report.sources.load_source`.
    k : int
        Images per gallery (most / least uncertain queries, OOD images).
    compare_k : int
        Most uncertain queries of each estimator offered to the side-by-side view.
    size : int
        Longest thumbnail side in pixels.
    images : bool
        Draw the thumbnails (a run's data are built again for them); without, the galleries
        say where they are drawn (:data:`LATER_IMAGES`).

    Raises
    ------
    ValueError
        If ``k`` or ``compare_k`` is below 1.
    """
    check_int(k, "k", low=1)
    check_int(compare_k, "compare_k", low=1)
    runs = source.runs
    compare = _comparable(runs)
    ranked = [_ranked(r.record.u) for r in runs]
    shared: set[int] = set()
    if compare:  # the side-by-side view needs every estimator's view of these queries
        for order, _ in ranked:
            shared.update(int(i) for i in order[::-1][:compare_k])
    shown = _galleries(runs, ranked, shared, k, size if images else None)
    return {
        "title": source.title,
        "kind": source.kind,
        "settings": source.settings,
        **_table(source),
        "notices": source.notices,
        "note_words": NOTE_WORDS,
        "plots": [{"name": p.name, "uri": png_data_uri_file(p)} for p in source.plots],
        "missing": source.missing,
        "estimators": shown.estimators,
        "compare": compare,
        "compare_k": int(compare_k),
        "classes": {str(c): n for c, n in shown.classes.items()},
        "thumbs": shown.thumbs,
        "sources": {key: shown.sources[key] for key in shown.thumbs if key in shown.sources},
        # why an image is not drawn (changed or missing since the run), per thumbnail key
        "why": shown.why,
    }


def _table(source: ReportSource) -> dict[str, Any]:
    """The results table of the model: its columns' declarations, rows, marks and the AUROC
    cells an interval puts at chance or below it."""
    return {
        # every table column's title, digits and direction (the metric table's declaration);
        # `columns`: the keys of the results table, in order
        "formats": {c.key: c.as_dict() for c in table_columns()},
        "columns": [c.key for c in source.columns],
        # per cell: value, interval bounds, the interval in words (None where there is none)
        "rows": [[row[0], *(list(c) for c in row[1:])] for row in source.rows],
        "marks": source.marks,
        # the AUROC cells whose interval holds 0.5 or lies below it (greyed / red)
        "states": {
            row[0]: {
                c.key: st
                for c, cell in zip(source.columns, row[1:])
                if (st := cell_state(c.key, cell[1], cell[2])) is not None
            }
            for row in source.rows
        },
        "legend": source.legend,
    }


class _Galleries(NamedTuple):
    """Every estimator's part of the model and what their galleries show."""

    estimators: list[dict[str, Any]]
    classes: dict[int, str]
    thumbs: dict[str, str]
    sources: dict[str, str]
    why: dict[str, str]


def _galleries(
    runs: list[RecordedRun],
    ranked: list[tuple[np.ndarray, np.ndarray]],
    shared: set[int],
    k: int,
    size: int | None,
) -> _Galleries:
    """Each run's part of the model (:func:`_estimator`) with its thumbnails at ``size``
    (``None``: none drawn, the galleries say where they are, :data:`LATER_IMAGES`)."""
    shown = _Galleries([], {}, {}, {}, {})
    data_cache: dict[str, Any] = {}
    for r, rank in zip(runs, ranked):
        if size is None:
            src = ImageSource(None, problem=LATER_IMAGES)
        else:
            src = image_source(r.record, data_cache, size)
        shown.classes.update(src.class_names)
        shown.estimators.append(_estimator(r, src, rank, shared, k, shown.thumbs))
        for key, name in src.names.items():
            shown.sources.setdefault(key, name)
        for key, reason in src.why.items():
            shown.why.setdefault(key, reason)
    return shown


def run_notes(run: RecordedRun) -> list[Note]:
    """The notes of one recorded run (:meth:`bayesurl.runs.queries.QueryRecord.notes`), its
    AUROCs read from the intervals its metrics hold where they hold one."""
    ivs: dict[str, Interval] = {}
    for key in AUROC_TITLES:
        iv = read_interval(run.metrics, key)
        if iv is not None:
            ivs[key] = iv
    estimates = {k: run.metrics[k] for k in AUROC_TITLES if k in run.metrics}
    return run.record.notes(ivs, estimates)


def notes_lines(source: ReportSource) -> list[str]:
    """The printable notes of each recorded run of ``source`` (the CLI tables): the same
    notes the report shows (:func:`run_notes`). One run: one line per note, in full; several:
    one line per estimator with each note in brief, and once what the brief words mean."""
    many = len(source.runs) > 1
    lines = []
    briefs = False
    for r in source.runs:
        notes = run_notes(r)
        if not many:
            lines += [f"note: {n.text}" for n in notes]
        elif notes:
            briefs = True
            said = "; ".join(n.short for n in notes)
            lines.append(f"note: {r.estimator} (seed {r.seed}): {said}")
    if briefs:
        lines.append(f"  ({NOTE_WORDS})")
    return lines


def cell_state(key: str, low: float | None, high: float | None) -> str | None:
    """``"inverted"`` / ``"chance"`` for an AUROC of
    :data:`~bayesurl.evaluation.notes.AUROC_TITLES` whose interval lies below / holds 0.5 (the
    rule of the notes, applied to the interval a table cell shows), else ``None``."""
    if key not in AUROC_TITLES or low is None or high is None:
        return None
    return "inverted" if high < 0.5 else "chance" if low <= 0.5 else None


def _paths(rec: Any, pairs: list[tuple[int, int]]) -> dict[str, str]:
    """File names of the shown folder images (empty for a data set)."""
    paths = rec.meta.get("paths")
    if not paths:
        return {}
    return {str(x): str(paths[x]) for pair in pairs for x in pair}


def png_data_uri_file(path: Path) -> str:
    """A PNG file as a ``data:`` URI, bytes unchanged (the plots keep their resolution)."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render_report(model: dict[str, Any]) -> str:
    """The page: the template with ``model`` embedded as JSON."""
    blob = json.dumps(model, separators=(",", ":"), allow_nan=False)
    # inside <script>, "</" and "<!--" must not appear; \u003c keeps the JSON valid
    blob = blob.replace("<", "\\u003c")
    page = _TEMPLATE.read_text(encoding="utf-8")
    return page.replace("__TITLE__", html.escape(model["title"])).replace("__MODEL__", blob)


def write_report(
    path: str | os.PathLike[str] | ReportSource,
    *,
    out: str | os.PathLike[str] | None = None,
    k: int = 12,
    compare_k: int = 8,
    size: int = THUMB_SIZE,
    images: bool = True,
) -> dict[str, Any]:
    """Write the report of the result folder ``path``.

    Parameters
    ----------
    path : path-like or ReportSource
        A run, benchmark or folder result (:func:`bayesurl.report.sources.load_source`), or
        what it holds as a command has just made it
        (:func:`bayesurl.report.sources.benchmark_source`).
    out : path-like, optional
        The HTML file (default ``path/report.html``).
    k, compare_k, size, images
        As for :func:`report_model`.

    Returns
    -------
    dict
        ``path`` (the page), ``bytes``, ``seconds`` (generation time), ``estimators`` (with
        galleries), ``missing`` (estimators without a per-query record), ``thumbnails``.
    """
    t0 = time.perf_counter()
    source = path if isinstance(path, ReportSource) else load_source(path)
    model = report_model(source, k=k, compare_k=compare_k, size=size, images=images)
    target = Path(out) if out is not None else source.folder / REPORT_FILE
    atomic_write(target, render_report(model).encode("utf-8"))
    return {
        "path": target,
        "bytes": target.stat().st_size,
        "seconds": time.perf_counter() - t0,
        "estimators": [e["name"] for e in model["estimators"]],
        "missing": list(source.missing),
        "thumbnails": len(model["thumbs"]),
    }


def report_line(info: dict[str, Any]) -> str:
    """One line about a report :func:`write_report` wrote (printed by the commands)."""
    line = (
        f"report {info['path']} ({info['bytes'] / 1e6:.2f} MB, {info['thumbnails']} thumbnails, "
        f"{info['seconds']:.1f} s)"
    )
    if info["missing"]:
        line += f"; no per-query record for {', '.join(info['missing'])}"
    return line


def print_notes(path: str | os.PathLike[str]) -> None:
    """Print :func:`notes_lines` of a result folder under a command's table (nothing when the
    folder holds no readable record: the report line then says why)."""
    try:
        source = load_source(path)
    except (ValueError, OSError, KeyError):
        return
    for line in notes_lines(source):
        print(line)


def try_report(path: str | os.PathLike[str] | ReportSource, **options: Any) -> str:
    """:func:`write_report` for a command that has just written its results: the line to print.

    A report that cannot be written (e.g. the data of the run are no longer where they were)
    does not fail the run that produced the results: the line says why instead.
    """
    try:
        return report_line(write_report(path, **options))
    except (ValueError, OSError, KeyError) as exc:
        where = path.folder if isinstance(path, ReportSource) else path
        return f"report not written: {exc} (bayesurl report {where} tries again)"
