"""A report a person wants to look at: one self-contained HTML page per result folder.

- :func:`write_report` -- the page of a run, a benchmark or a folder of images
  (:mod:`bayesurl.report.page`)
- :func:`load_source` -- what a result folder holds (:mod:`bayesurl.report.sources`);
  :func:`benchmark_source` -- the same from a benchmark's results in memory
- :func:`png_data_uri` -- thumbnails as ``data:`` URIs (:mod:`bayesurl.report.images`)

The per-query record the galleries are drawn from is written by the runs
(:mod:`bayesurl.runs.queries`).
"""

from __future__ import annotations

from bayesurl.report.images import png_data_uri
from bayesurl.report.page import (
    REPORT_FILE,
    notes_lines,
    print_notes,
    render_report,
    report_line,
    report_model,
    try_report,
    write_report,
)
from bayesurl.report.sources import ReportSource, benchmark_source, load_source

__all__ = [
    "REPORT_FILE",
    "ReportSource",
    "benchmark_source",
    "load_source",
    "notes_lines",
    "png_data_uri",
    "print_notes",
    "render_report",
    "report_line",
    "report_model",
    "try_report",
    "write_report",
]
