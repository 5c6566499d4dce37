"""bayesurl: uncertainty-aware representation learning and Bayesian metric learning.

Public API (imported lazily so ``import bayesurl`` stays cheap):

- :class:`bayesurl.Output` -- the embedding / uncertainty record every method returns
- :func:`bayesurl.evaluate` -- the sampling-aware evaluator (:mod:`bayesurl.evaluation`)
- :mod:`bayesurl.methods` -- the eleven URL methods and their registry
- :class:`bayesurl.MetricLaplace` -- Laplacian metric learning (:mod:`bayesurl.laplace`)
- :func:`bayesurl.wrap` -- post-hoc uncertainty for any trained encoder (:mod:`bayesurl.posthoc`)
"""

from __future__ import annotations

import importlib
from typing import Any

from bayesurl.types import Output

__version__ = "0.1.0"

_LAZY = {
    "evaluate": ("bayesurl.evaluation", "evaluate"),
    "MetricLaplace": ("bayesurl.laplace", "MetricLaplace"),
    "wrap": ("bayesurl.posthoc", "wrap"),
}
_SUBMODULES = {
    "data",
    "distributions",
    "evaluation",
    "heads",
    "laplace",
    "losses",
    "methods",
    "posthoc",
    "search",
    "stats",
    "training",
}

__all__ = ["Output", "__version__", *_LAZY, *sorted(_SUBMODULES)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    if name in _SUBMODULES:
        return importlib.import_module(f"bayesurl.{name}")
    raise AttributeError(f"module 'bayesurl' has no attribute {name!r}")
