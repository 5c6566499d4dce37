"""Write a scored folder (step 5 of :mod:`bayesurl.folder`): ``uncertainty.csv``, its
companion page ``README.md``, ``queries.npz`` and ``folder.json``.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np

from bayesurl.data.folder import (
    folder_summary,
)
from bayesurl.evaluation.notes import u_digits
from bayesurl.files import atomic_open, format_of, jsonable, write_json
from bayesurl.folder.encode import Encoded, Features
from bayesurl.folder.methods import FIT_PLANS, U_MEANING, U_MEASURED, FolderMethod
from bayesurl.folder.options import FolderOptions
from bayesurl.runs.queries import QUERIES_FILE, QueryRecord
from bayesurl.stats.intervals import flat_intervals, interval_lines

__all__ = [
    "CSV_FILE",
    "FOLDER_FILE",
    "FOLDER_FORMAT",
    "README_FILE",
    "folder_info",
    "write_outputs",
]


#: The result record of a folder (read by :mod:`bayesurl.report`).
FOLDER_FILE = "folder.json"
#: Its format (a reader refuses a newer one).
FOLDER_FORMAT = format_of("bayesurl.folder", 1)


#: The per-image table.
CSV_FILE = "uncertainty.csv"
#: Its companion page: what u is, the columns, the notes.
README_FILE = "README.md"


def folder_info(
    enc: Encoded,
    opts: FolderOptions,
    metrics: dict[str, Any] | None,
    skipped: list[tuple[str, str]],
    fit_report: dict[str, Any],
    fit_images: int,
) -> dict[str, Any]:
    """The record of ``folder.json``: settings, sizes, metrics, skipped files (no timings)."""
    scan, fx, method = enc.scan, enc.fx, opts.method
    pairs = (
        f"{opts.views} augmented views" if FIT_PLANS[method].augmented else "its nearest neighbour"
    )
    fitted = f"each paired with {pairs}, labels unused"
    if FIT_PLANS[method].crossfit:
        extra = ""
        if "k" in fit_report:
            extra = f" (u: the {fit_report['k']} nearest)"
        elif "kmeans_components" in fit_report:
            extra = f" ({fit_report['kmeans_components']} k-means components)"
        fitted = (
            f"each image scored by the fit on the other {fit_report['folds'] - 1} of "
            f"{fit_report['folds']} folds"
            + (", their labels used" if fit_report["labels_used"] else ", labels unused")
            + extra
        )
    return {
        "format": FOLDER_FORMAT,
        "title": f"bayesurl folder: {scan.root}",
        "estimator": method.value,
        "seed": opts.seed,
        "metrics": {}
        if metrics is None
        else {
            **{k: v for k, v in metrics.items() if k not in ("notes", "intervals")},
            **flat_intervals(metrics.get("intervals") or {}),
        },
        "describe": [
            f"{len(scan.paths)} image files in {scan.root}"
            + (f", {len(scan.classes)} classes" if scan.labels is not None else ", no labels")
            + f"; {len(skipped)} unreadable (skipped, listed in {CSV_FILE})"
            + (f"; {len(scan.ignored)} other files ignored" if scan.ignored else "")
            + (
                "; one class only: R@1 and R-AUROC need two or more, so none are computed"
                if scan.labels is not None and len(scan.classes) < 2
                else ""
            ),
            f"backbone {opts.backbone}"
            + (" (ImageNet weights)" if opts.pretrained else " (random weights)")
            + f", {enc.size} px; post-hoc {method.value} fitted on {fit_images} images, "
            + fitted,
        ],
        "settings": {
            "images": str(scan.root), "backbone": opts.backbone, "pretrained": opts.pretrained,
            "image_size": enc.size, "views": opts.views, "fit_max": opts.fit_max,
            "epochs": opts.epochs, "lr": opts.lr, "batch_size": opts.batch_size,
            "seed": opts.seed, "device": str(enc.device),
            "wrapper_options": dict(opts.wrapper_options),
        },
        "sizes": {**folder_summary(scan), "readable": int(fx.feats.shape[0]),
                  "unreadable": len(skipped), "fit_images": fit_images},
        "skipped": [{"path": p, "error": e} for p, e in skipped],
        "ignored": scan.ignored,
        "fit": {k: v for k, v in fit_report.items() if isinstance(v, (int, float, list, str))},
    }  # fmt: skip


def write_outputs(
    out: str | os.PathLike[str],
    enc: Encoded,
    method: FolderMethod,
    info: dict[str, Any],
    rec: QueryRecord,
    metrics: dict[str, Any] | None,
) -> dict[str, Path]:
    """Write ``uncertainty.csv``, its ``README.md``, ``queries.npz`` and ``folder.json``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": folder / CSV_FILE,
        "queries": folder / QUERIES_FILE,
        "json": folder / FOLDER_FILE,
        "readme": folder / README_FILE,
    }
    _write_csv(paths["csv"], enc.scan, enc.fx, rec)
    _write_readme(paths["readme"], method, info, rec, metrics)
    rec.save(paths["queries"])
    write_json(paths["json"], jsonable(info), indent=1)
    return paths


def _write_csv(path: Path, scan: Any, fx: Features, rec: QueryRecord) -> None:
    """Every file of the folder: readable images ranked by u first, then the unreadable."""
    cls = (lambda i: scan.classes[scan.labels[i]]) if scan.labels is not None else (lambda i: "")
    ids = fx.ids.tolist()
    rank = np.empty(len(ids), np.int64)
    rank[np.argsort(-rec.u, kind="stable")] = np.arange(1, len(ids) + 1)
    digits = max(6, u_digits(rec.u))
    with atomic_open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "path",
                "class",
                "u",
                "u_rank",
                "neighbour",
                "neighbour_class",
                "neighbour_right",
                "error",
            ]
        )
        for row in np.argsort(rank, kind="stable"):
            i, j = ids[row], ids[int(rec.neighbour[row])]
            right = "" if scan.labels is None else int(bool(rec.hit[row]))
            w.writerow(
                [
                    scan.paths[i],
                    cls(i),
                    f"{rec.u[row]:.{digits}g}",
                    int(rank[row]),
                    scan.paths[j],
                    cls(j),
                    right,
                    "",
                ]
            )
        for i, err in fx.skipped:
            w.writerow([scan.paths[i], cls(i), "", "", "", "", "", err])


def _write_readme(
    path: Path,
    method: FolderMethod,
    info: dict[str, Any],
    rec: QueryRecord,
    metrics: dict[str, Any] | None,
) -> None:
    """The companion page of ``uncertainty.csv``: what u is, the columns, the notes."""
    d = u_digits(rec.u)
    lo, med, hi = np.quantile(rec.u, [0.0, 0.5, 1.0]) if rec.u.size else (np.nan,) * 3
    ivs = {} if metrics is None else dict(metrics.get("intervals") or {})
    est = {} if metrics is None else {k: metrics.get(k) for k in ivs}
    notes = rec.notes(ivs, est)
    shown = [("r@1", "R@1", 3), ("r_auroc", "R-AUROC", 3), ("ausc", "AUSC", 3)]
    table = [] if metrics is None else interval_lines(metrics, shown)
    lines = [
        f"# {info['title']}",
        "",
        *info["describe"],
        "",
        *(
            []
            if not table
            else [
                "Metrics, each with its 95 % interval over the labelled images (the queries; "
                "Wilson for R@1, DeLong for R-AUROC, a Poisson bootstrap for AUSC):",
                "",
                *(f"    {line}" for line in table),
                "",
            ]
        ),
        f"## What u is ({method.value})",
        "",
        f"u = {U_MEANING[method.value]}. Higher u = less certain.",
        *(
            ["", f"**Caution.** {U_MEASURED[method.value]}", ""]
            if method.value in U_MEASURED
            else []
        ),  # fmt: skip
        f"Over the {rec.u.size} readable images u runs from {lo:.{d}g} (median {med:.{d}g}) "
        f"to {hi:.{d}g}; `u_rank` 1 is the most uncertain image.",
        "",
        f"## Columns of {CSV_FILE}",
        "",
        "- `path`, `class`: the image and its class sub-folder (empty without sub-folders)",
        "- `u`, `u_rank`: its uncertainty and rank (1 = highest u)",
        "- `neighbour`, `neighbour_class`, `neighbour_right`: its nearest other image (cosine "
        "of the embeddings) and, with classes, whether that shares its class (1) or not (0)",
        "- `error`: why an unreadable file was skipped",
        "",
        "## Notes",
        "",
    ]
    lines += [f"- {n.text}" for n in notes] or [
        "None: the checks for u nearly constant, R-AUROC at chance or inverted (its 95 % "
        "interval holding 0.5, or below it) and R@1 at chance found nothing."
    ]
    with atomic_open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
