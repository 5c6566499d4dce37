"""One run pipeline for every estimator: config -> data -> estimator -> predict -> evaluate.

The API:

- :func:`load_recipe` ``(name, overrides=(), *, preset=None) -> RunConfig``: read
  ``"<dataset>/<estimator>"`` from the TOML recipe files (:mod:`bayesurl.runs.config`) with
  ``"section.key=value"`` overrides;
- :func:`run` ``(cfg, *, cache=None, out=None, ...) -> RunResult``: one run
  (:mod:`bayesurl.runs.runner`); ``RunResult.to_dict()`` has ``estimator``, ``dataset``,
  ``split``, ``seed``, ``metrics``, ``settings``, ``timings``;
- :func:`run_sweep` ``(estimators, SweepOptions(dataset, preset, seeds, overrides, ...))
  -> SweepResults`` (the options also as keywords): the one sweep engine of
  ``bayesurl benchmark`` (:mod:`bayesurl.runs.sweep`): the preset's plan of class splits x
  seeds, each run's config resolved once (:mod:`bayesurl.runs.plan`), kept in memory or in a
  resumable storage (:mod:`bayesurl.runs.storage`, extra ``sweep``), optional tuning
  (:mod:`bayesurl.runs.tuning`), one run function on the one pipeline
  (:mod:`bayesurl.runs.pipeline`), and the one report (:mod:`bayesurl.runs.report` with
  :mod:`bayesurl.runs.aggregate`; the standard split is one split);
- :func:`build_estimator` and the :class:`Estimator` interface (``fit`` /
  ``predict(x, n_samples) -> Output``, :mod:`bayesurl.runs.estimators`);
- :func:`bayesurl.runs.predict.predict` / :func:`score` / :func:`n_samples_for`: the one
  embedding loop and sampling rule (:mod:`bayesurl.runs.predict`).


Example::

    from bayesurl.runs import load_recipe, run
    cfg = load_recipe("fashion_mnist/elk", ["train.epochs=2"], preset="smoke")
    print(run(cfg).metrics["r_auroc"])

Command line: ``bayesurl run fashion_mnist/elk --preset smoke --set train.epochs=2``.
"""

from __future__ import annotations

from bayesurl.runs.config import (
    BackboneConfig,
    DataConfig,
    EstimatorConfig,
    EvalConfig,
    RunConfig,
    TrainConfig,
    list_recipes,
    load_recipe,
)
from bayesurl.runs.estimators import Estimator, build_estimator
from bayesurl.runs.predict import n_samples_for, score
from bayesurl.runs.results import SweepResults, merge_results
from bayesurl.runs.runner import RunCache, RunResult, run
from bayesurl.runs.sweep import SweepOptions, run_sweep

__all__ = [
    "BackboneConfig",
    "DataConfig",
    "Estimator",
    "EstimatorConfig",
    "EvalConfig",
    "RunCache",
    "RunConfig",
    "RunResult",
    "SweepOptions",
    "SweepResults",
    "TrainConfig",
    "build_estimator",
    "list_recipes",
    "load_recipe",
    "merge_results",
    "n_samples_for",
    "run",
    "run_sweep",
    "score",
]
