"""One run pipeline for every estimator: config -> data -> estimator -> predict -> evaluate.

Sweeps of many runs (plans, storages, tuning, the sweep report) are :mod:`bayesurl.sweeps`,
one layer above: a run knows nothing of the sweep it belongs to.

The API:

- :func:`load_recipe` ``(name, overrides=(), *, preset=None) -> RunConfig``: read
  ``"<dataset>/<estimator>"`` from the TOML recipe files (:mod:`bayesurl.runs.config`) with
  ``"section.key=value"`` overrides;
- :func:`run` ``(cfg, *, cache=None, out=None, ...) -> RunResult``: one run
  (:mod:`bayesurl.runs.runner`); ``RunResult.to_dict()`` has ``estimator``, ``dataset``,
  ``split``, ``seed``, ``metrics``, ``settings``, ``timings``;
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
from bayesurl.runs.runner import RunCache, RunResult, run

__all__ = [
    "BackboneConfig",
    "DataConfig",
    "Estimator",
    "EstimatorConfig",
    "EvalConfig",
    "RunCache",
    "RunConfig",
    "RunResult",
    "TrainConfig",
    "build_estimator",
    "list_recipes",
    "load_recipe",
    "n_samples_for",
    "run",
    "score",
]
