"""Sweeps of many runs: the one sweep engine of ``bayesurl benchmark``.

- :func:`run_sweep` ``(estimators, SweepOptions(dataset, preset, seeds, overrides, ...))
  -> SweepResults`` (the options also as keywords, :mod:`bayesurl.sweeps.options`): the
  preset's plan of class splits x seeds with each run's config resolved once
  (:mod:`bayesurl.sweeps.plan`), kept in memory or in a resumable storage
  (:mod:`bayesurl.sweeps.storage`, extra ``sweep``), optional tuning on validation classes
  (:mod:`bayesurl.sweeps.tuning`), one run function on the one run pipeline
  (:mod:`bayesurl.sweeps.pipeline` over :func:`bayesurl.runs.run`), and the one report
  (:mod:`bayesurl.sweeps.report` with the statistics of :mod:`bayesurl.sweeps.aggregate`;
  the standard split is one split);
- :class:`RunRecord` (:mod:`bayesurl.sweeps.record`): one run's record, made once by the run
  function and stored as a flat row (``estimator``, ``split``, ``seed``, ``error``, metrics);
- :class:`SweepResults` / :func:`merge_results` (:mod:`bayesurl.sweeps.results`): a finished
  sweep's runs, summary, tables and plots, and the merge of sweeps run apart;
  :func:`read_results` reads a written ``results.json`` with its side files back.

One run is :mod:`bayesurl.runs`, one layer below: this package imports it, never the other way.

Example::

    from bayesurl.sweeps import run_sweep
    res = run_sweep(["ce", "elk"], dataset="fashion_mnist", preset="smoke", seeds=[0])
    print(res.table())

Command line: ``bayesurl benchmark --preset smoke --methods ce,elk``.
"""

from __future__ import annotations

import importlib
from typing import Any

from bayesurl.sweeps.options import SweepOptions

#: the engine loads on first use: the command line builds ``bayesurl benchmark``'s parser from
#: :class:`SweepOptions` without the run pipeline
_LAZY = {
    "RunRecord": "record",
    "SweepResults": "results",
    "merge_results": "results",
    "read_results": "report",
    "run_sweep": "sweep",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"bayesurl.sweeps.{_LAZY[name]}"), name)
        globals()[name] = value  # later look-ups skip __getattr__
        return value
    raise AttributeError(f"module 'bayesurl.sweeps' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "RunRecord",
    "SweepOptions",
    "SweepResults",
    "merge_results",
    "read_results",
    "run_sweep",
]
