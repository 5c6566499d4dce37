"""The estimator contract, the registry of estimator kinds and :func:`build_estimator`.

An :class:`Estimator` is built from a :class:`~bayesurl.runs.config.RunConfig` and has

- ``fit(data, ctx) -> dict``: train on the upstream data (:class:`~bayesurl.runs.data.RunData`)
  where and how the :class:`FitContext` says (device, base, checkpoint folder ...), return a
  fit report (``train_time`` ...);
- ``predict(x, n_samples) -> Output``: one batch of transformed inputs to an
  :class:`~bayesurl.types.Output`, with ``samples [S, N, D]`` when ``n_samples > 0``;
- ``has_distribution``: whether it defines an embedding distribution. The sampling rule is
  the runner's, the same for all: ``S = eval.samples`` draws where there is a distribution,
  none otherwise (:func:`bayesurl.runs.predict.n_samples_for`).

Each estimator class declares its kind and what the pipeline needs to know about it on
itself, with :data:`ESTIMATORS`' decorator::

    @ESTIMATORS.register("lam", distributed=True, tuning=Tuning.TRAINED)
    class LamEstimator(Estimator): ...

``distributed``: its ``fit`` runs under torchrun (DDP training, every rank together);
``tuning``: what a sweep's search varies for it (:class:`Tuning`). The kind is what a recipe's
``kind = "..."`` names; a file in this folder is imported on the first lookup, so a new kind
is one file here and one recipe line.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from bayesurl._checks import check_int, check_number
from bayesurl.registry import Registry
from bayesurl.runs.config import RunConfig
from bayesurl.runs.data import RunData
from bayesurl.types import Output

if TYPE_CHECKING:
    from bayesurl.training import FitOptions

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "FitContext",
    "Tuning",
    "build_estimator",
    "check_fit_values",
    "check_kwargs",
    "fit_options",
]


class Tuning(str, Enum):
    """What a sweep's hyper-parameter search varies for an estimator kind
    (:func:`bayesurl.sweeps.tuning.search_space`; URL appendix B)."""

    #: the training rate in URL's range, plus the keys of the table's own ``tune`` entry
    TRAINED = "trained"
    #: only the rate of its own fit (``estimator.fit.lr``), when its ``fit`` table sets one
    FIT_RATE = "fit_rate"
    #: nothing: it trains nothing of its own
    NONE = "none"


def _load_kinds() -> None:
    """Import every module of this folder, whose decorators register the kinds."""
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.name.startswith("_") and info.name != "base":
            importlib.import_module(f"{package}.{info.name}")


#: Estimator classes by ``kind``, each with its traits ``distributed`` and ``tuning``.
ESTIMATORS: Registry[type[Estimator]] = Registry("estimator kind", load=_load_kinds)


def _epochs(cfg: RunConfig) -> int:
    return max(1, round(cfg.train.epochs * cfg.train.epochs_mult))


def fit_options(cfg: RunConfig, world: int, **settings: Any) -> FitOptions:
    """The run's ``[train]`` table and seed as :class:`~bayesurl.training.FitOptions`, with
    ``settings`` replacing fields. Under torchrun the micro-batch is per process: the
    accumulation is divided by the ``world`` size so the aggregated batch stays (URL: about
    2048)."""
    from bayesurl.training import FitOptions

    t = cfg.train
    recipe = {
        "epochs": _epochs(cfg), "optimizer": t.optimizer, "lr": t.lr, "min_lr": t.min_lr,
        "weight_decay": t.weight_decay, "warmup_epochs": t.warmup_epochs,
        "grad_accum": max(1, round(t.grad_accum / world)), "amp": t.amp, "seed": cfg.seed,
    }  # fmt: skip
    return FitOptions(**{**recipe, **settings})


def check_kwargs(fn: Any, kwargs: dict[str, Any], where: str, skip: tuple[str, ...]) -> None:
    """Every key of ``kwargs`` is a parameter of ``fn`` (but ``skip``), else a ValueError
    naming ``<where>.<key>`` and the valid ones."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [k for k in params if k not in ("self", *skip)]
    unknown = [k for k in kwargs if k not in valid]
    if unknown:
        options = (
            f"valid: {', '.join(valid)}"
            if valid
            else f"{getattr(fn, '__qualname__', fn)} takes no further options"
        )
        raise ValueError(f"unknown key `{where}.{unknown[0]}`; {options}")


def check_fit_values(fit: dict[str, Any], where: str) -> None:
    """The numbers of a post-hoc ``fit`` table, checked with the recipe (before the base is
    trained): whole ``epochs`` / ``batch_size`` >= 1, ``lr`` > 0, ``weight_decay`` >= 0."""
    for key in ("epochs", "batch_size"):
        if key in fit:
            check_int(fit[key], f"{where}.{key}", low=1)
    if "lr" in fit:
        check_number(fit["lr"], f"{where}.lr", low=0.0, low_open=True)
    if "weight_decay" in fit:
        check_number(fit["weight_decay"], f"{where}.weight_decay", low=0.0)


@dataclass(frozen=True)
class FitContext:
    """Where and how an estimator fits, resolved once by the caller (the runner) and handed to
    every :meth:`Estimator.fit`.

    Attributes
    ----------
    device : torch.device
        Where to train.
    progress : bool
        Progress bars of the fit (the runner's runs train without them: a live bar changed
        the float results of CPU training).
    base : Estimator or None
        The fitted base of an estimator that has one (``base = "..."`` in its recipe table).
    out : Path or None
        Folder for the checkpoint(s); ``None``: nothing is written.
    resume : Path or None
        A training checkpoint (``last.pt``) to continue, for the kinds that train.
    keep_epoch_checkpoints : bool
        Keep a checkpoint per epoch beside ``last.pt`` (:func:`bayesurl.training.fit`).
    """

    device: torch.device
    progress: bool = False
    base: Estimator | None = None
    out: Path | None = None
    resume: Path | None = None
    keep_epoch_checkpoints: bool = False


class Estimator:
    """Base class (see module docstring); subclasses register with :data:`ESTIMATORS`."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.checkpoint: Path | None = None
        #: set by :func:`bayesurl.runs.runner.train`: this process is rank 0
        self.main_process = True

    @property
    def has_distribution(self) -> bool:
        """``predict(x, n_samples > 0)`` returns samples."""
        return False

    def fit(self, data: RunData, ctx: FitContext) -> dict[str, Any]:  # pragma: no cover
        """Train on ``data``'s upstream sets where and how ``ctx`` says; the fit report
        (``train_time`` in seconds, and what the kind measured)."""
        raise NotImplementedError

    def predict(self, x: Tensor, n_samples: int = 0) -> Output:  # pragma: no cover - abstract
        """One batch of transformed inputs to an :class:`~bayesurl.types.Output`, with
        ``samples [S, N, D]`` when ``n_samples > 0``."""
        raise NotImplementedError


def build_estimator(cfg: RunConfig) -> Estimator:
    """The (unfitted) estimator of ``cfg`` by its ``kind``; options are checked here.

    Raises
    ------
    ValueError
        For an unknown kind, method, wrapper, mode or option (naming the config key).
    """
    where = f"estimators.{cfg.estimator.name}.kind"
    return ESTIMATORS.get(cfg.estimator.kind, argument=where)(cfg)
