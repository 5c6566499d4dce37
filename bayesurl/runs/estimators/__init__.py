"""Estimators: every way of getting u(x) behind one small interface, a file per kind.

:mod:`~bayesurl.runs.estimators.base` holds the contract (:class:`Estimator`), the registry
of kinds (:data:`ESTIMATORS`: each class declares its kind, whether it trains under
torchrun and its tuning rule) and :func:`build_estimator`. The kinds:

- ``method`` (:class:`MethodEstimator`): a registry :class:`~bayesurl.methods.Method`
  trained by :func:`bayesurl.training.fit` (URL section 4, appendix B);
- ``posthoc`` (:class:`PosthocEstimator`): :func:`bayesurl.wrap` around a trained base
  method that the runner trains or reuses;
- ``lam`` (:class:`LamEstimator`): LAM post-hoc or online (LAM section 3, eqs. 4-5);
- ``baseline`` (:class:`BaselineEstimator`): a training-free score of the input
  representation;
- ``deep_ensemble`` (:class:`DeepEnsembleEstimator`): independently trained copies of a base
  method (LAM Table 2's "Deep Ensemble" row).

A new kind is one file in this folder (a class decorated with
``@ESTIMATORS.register("<kind>", distributed=..., tuning=...)`` whose ``fit(data, ctx)`` reads
where and how to fit from a :class:`FitContext`) and one recipe line
``kind = "<kind>"``: the folder's modules are imported on the registry's first lookup.
"""

from __future__ import annotations

# ``Estimator`` (importable here too) is documented on ``bayesurl.runs`` and in ``base``: a
# third listing in ``__all__`` would describe the class twice in the API pages
from bayesurl.runs.estimators.base import ESTIMATORS, FitContext, Tuning, build_estimator
from bayesurl.runs.estimators.base import Estimator as Estimator
from bayesurl.runs.estimators.baseline import BASELINE_WRAPPERS, BaselineEstimator, BaselineScore
from bayesurl.runs.estimators.deep_ensemble import DeepEnsembleEstimator
from bayesurl.runs.estimators.lam import LamEstimator
from bayesurl.runs.estimators.method import PROBE_IMAGES, MethodEstimator
from bayesurl.runs.estimators.posthoc import PosthocEstimator

__all__ = [
    "BASELINE_WRAPPERS",
    "ESTIMATORS",
    "PROBE_IMAGES",
    "BaselineEstimator",
    "BaselineScore",
    "DeepEnsembleEstimator",
    "FitContext",
    "LamEstimator",
    "MethodEstimator",
    "PosthocEstimator",
    "Tuning",
    "build_estimator",
]
