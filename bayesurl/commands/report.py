"""Write one self-contained HTML page of a run, a benchmark or a folder of images.

``bayesurl report DIR`` reads a result folder -- ``bayesurl run`` (``result.json``),
``bayesurl benchmark`` (``results.json``) or ``bayesurl folder`` (``folder.json``) -- and
writes ``DIR/report.html``: the results table (click a title to sort), the folder's plots and,
for every estimator whose run kept its per-query record, the most and least uncertain queries
beside the neighbour each retrieved (right / wrong), the OOD images ranked by u and u per
class; for a benchmark, two estimators side by side on the same queries. Everything is inside
the page (CSS, script, images as ``data:`` URIs): it opens from disk and requests nothing from
any host. ``run`` and ``benchmark`` write it themselves when they have an output folder.

Examples::

    bayesurl benchmark --preset quick --out runs/benchmark      # writes runs/benchmark/report.html
    bayesurl report results/sweeps/standard --out /tmp/standard.html
"""

from __future__ import annotations

import argparse

HELP = "write one self-contained HTML report of a run, benchmark or image folder"
OUTPUT_FILES = ("out",)  # checked while parsing (bayesurl.cli)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bayesurl report``."""
    parser.add_argument("folder", metavar="DIR", help="a run, benchmark or folder result")
    parser.add_argument("--out", default=None, help="the HTML file (default DIR/report.html)")
    parser.add_argument("--k", type=int, default=12, help="images per gallery (default 12)")
    parser.add_argument(
        "--thumb-size", type=int, default=96, help="longest thumbnail side in pixels (default 96)"
    )


def run(args: argparse.Namespace) -> int:
    """Write the report; prints where, its size and how long it took. 0 on success."""
    from bayesurl.report import report_line, write_report

    if args.k < 1:
        raise ValueError(f"`--k` must be >= 1, got {args.k}")
    if args.thumb_size < 8:
        raise ValueError(f"`--thumb-size` must be >= 8, got {args.thumb_size}")
    print(report_line(write_report(args.folder, out=args.out, k=args.k, size=args.thumb_size)))
    return 0
