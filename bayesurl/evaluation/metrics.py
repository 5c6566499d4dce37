"""torchmetrics ``Metric`` classes for the evaluator's metrics.

Retrieval metrics need the whole evaluation set (each query searches every gallery item). The
retrieval classes and :class:`RetrievalECE` keep this rank's batches and compute through the
sharded search of the evaluator: under ``torch.distributed`` (a process group of
more than one rank) each rank searches its own rows over every rank's rows passed by in
chunks (:func:`~bayesurl.search.knn_sharded`, the sampled search of
:mod:`bayesurl.search.sampled`), and only the per-query results (neighbour ids, labels, u)
are gathered -- never the embeddings or draws -- so no rank holds all ``N x D``. Rows count in
rank order; results equal the single-process functional value on the rank-order
concatenation (what torchmetrics' ``cat`` gather gave before). Their ``sync_on_compute`` is
therefore off; every rank must call :meth:`compute` (collective) after at least one
``update``. The OOD classes hold only scalars per input and keep torchmetrics' gather.

Each class has ``plot()`` drawing the matching figure of :mod:`bayesurl.evaluation.plots`
(sparsification curve, reliability diagram or ROC) and returning ``(fig, ax)``.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from bayesurl._checks import check_same_length, check_tensor
from bayesurl.distributed import Shards, is_distributed, raise_if_any
from bayesurl.evaluation import functional as Fm
from bayesurl.evaluation.table import metric_column
from bayesurl.search import sampled as Sm
from bayesurl.search.core import DEFAULT_MEMORY_BUDGET, rank_budget
from bayesurl.search.exact import knn, search_shards

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "AUSC",
    "AUSE",
    "MAPAtK",
    "OODAUPRC",
    "OODAUROC",
    "RAUROC",
    "RecallAtK",
    "RetrievalECE",
]


def _empty(state: list[Tensor] | Tensor) -> bool:
    # A list state turns into one tensor after a distributed sync.
    return isinstance(state, list) and len(state) == 0


def _sharded_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The search is sharded, so torchmetrics must not gather the embeddings first."""
    if kwargs.get("sync_on_compute"):
        raise ValueError(
            "`sync_on_compute=True` would gather every embedding to every rank; the retrieval "
            "metrics compute through the sharded search instead"
        )
    return {**kwargs, "sync_on_compute": False}


def _check_updated(metric: Metric, state: list[Tensor] | Tensor) -> bool | None:
    """Raise (on every rank when distributed) if some rank saw no batch; True when sharded."""
    sharded = is_distributed(metric.process_group)
    error = None
    if _empty(state):
        where = " on this rank" if sharded else ""
        error = ValueError(f"{type(metric).__name__}: compute() called before update(){where}")
    if sharded:
        raise_if_any(error, metric.process_group)
        return True
    if error is not None:
        raise error
    return None


def _direction(key: str) -> bool:
    """torchmetrics' ``higher_is_better`` of a class: the direction its metric's column declares
    (:class:`~bayesurl.evaluation.table.Column`), not a second statement of it."""
    return metric_column(key).higher_is_better


def _plots() -> ModuleType:
    # Lazy import keeps `import bayesurl.evaluation` free of matplotlib.
    from bayesurl.evaluation import plots

    return plots


class _RetrievalMetric(Metric):
    """Accumulates embeddings, labels (and optionally u) of every batch."""

    is_differentiable = False
    full_state_update = False
    needs_uncertainty = False

    def __init__(self, memory_budget: int = DEFAULT_MEMORY_BUDGET, **kwargs: Any) -> None:
        super().__init__(**_sharded_kwargs(kwargs))
        self.memory_budget = memory_budget
        self.add_state("embeddings", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")
        if self.needs_uncertainty:
            self.add_state("uncertainties", default=[], dist_reduce_fx="cat")

    def update(
        self, embeddings: Tensor, labels: Tensor, uncertainties: Tensor | None = None
    ) -> None:
        """Add a batch: ``embeddings [B, D]``, ``labels [B]`` (and ``uncertainties [B]``)."""
        x = check_tensor(embeddings, "embeddings", ndim=2)
        y = check_tensor(labels, "labels", ndim=1)
        check_same_length(("embeddings", x), ("labels", y))
        self.embeddings.append(x.detach())
        self.labels.append(y.detach())
        if self.needs_uncertainty:
            if uncertainties is None:
                raise ValueError(f"{type(self).__name__}.update needs `uncertainties`")
            u = check_tensor(uncertainties, "uncertainties", ndim=1)
            check_same_length(("embeddings", x), ("uncertainties", u))
            self.uncertainties.append(u.detach())

    def search(self, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Neighbour ids ``[N, k]``, labels ``[N]`` and u ``[N]`` of every rank's rows."""
        sh = _check_updated(self, self.embeddings)
        x, y = dim_zero_cat(self.embeddings), dim_zero_cat(self.labels)
        u = dim_zero_cat(self.uncertainties) if self.needs_uncertainty else None
        if sh is None:
            _, nb = knn(x, k, memory_budget=self.memory_budget)
            return nb, y, u
        sh = Shards.of(x.shape[0], x.device, self.process_group)
        budget = rank_budget(self.memory_budget, sh)
        _, nb = search_shards(x, k, sh, budget, None, exact_values=False)
        return sh.gather(nb), sh.gather(y), None if u is None else sh.gather(u)

    def _correct(self) -> Tensor:
        nb, y, _ = self.search(1)
        return y[nb[:, 0]] == y

    def _u_correct(self) -> tuple[Tensor, Tensor]:
        nb, y, u = self.search(1)
        assert u is not None
        return u, y[nb[:, 0]] == y


class _AtKMetric(_RetrievalMetric):
    """A retrieval score with a cut-off k, plotted as one bar (shared by Recall@k and mAP@k)."""

    _label = ""

    def __init__(self, k: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = k

    @staticmethod
    def _score(y: Tensor, nb: Tensor, k: int) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def compute(self) -> Tensor:
        """The score of every rank's rows (collective under torch.distributed)."""
        nb, y, _ = self.search(self.k)
        return self._score(y, nb, self.k)

    def plot(self, ax: Axes | None = None) -> tuple[Figure, Axes]:
        """Bar of the score."""
        fig, ax = _plots()._axes(ax)
        ax.bar([f"{self._label}@{self.k}"], [float(self.compute())])
        ax.set_ylim(0, 1)
        return fig, ax


class RecallAtK(_AtKMetric):
    """Recall@k over everything seen (URL section 3.1; docs/concepts/metrics.rst, "Recall@1 and
    Recall@k").

    Parameters
    ----------
    k : int
        Cut-off.
    memory_budget : int
        Bytes per kNN similarity chunk.
    """

    _label = "R"
    higher_is_better = _direction("r@1")  # every cut-off k goes the way R@1 does

    def __init__(self, k: int = 1, **kwargs: Any) -> None:
        super().__init__(k, **kwargs)

    @staticmethod
    def _score(y: Tensor, nb: Tensor, k: int) -> Tensor:
        return Fm.recall_from_neighbors(y, nb, k)


class MAPAtK(_AtKMetric):
    """mAP@k over everything seen (LAM section 5; see :func:`~.functional.map_at_k`).

    Parameters
    ----------
    k : int
        Cut-off.
    memory_budget : int
        Bytes per kNN similarity chunk.
    """

    _label = "mAP"
    higher_is_better = _direction("map@5")

    def __init__(self, k: int = 5, **kwargs: Any) -> None:
        super().__init__(k, **kwargs)

    @staticmethod
    def _score(y: Tensor, nb: Tensor, k: int) -> Tensor:
        return Fm.map_from_neighbors(y, nb, k)


class RAUROC(_RetrievalMetric):
    """R-AUROC: AUROC of u for "R@1 wrong" (URL section 3.1). ``update(emb, labels, u)``."""

    higher_is_better = _direction("r_auroc")
    needs_uncertainty = True

    def compute(self) -> Tensor:
        """R-AUROC of every rank's rows (raises when all R@1-correct or all wrong)."""
        return Fm.r_auroc(*self._u_correct())

    def plot(self, ax: Axes | None = None) -> tuple[Figure, Axes]:
        """ROC curve of u for "R@1 wrong"."""
        u, correct = self._u_correct()
        fig = _plots().plot_roc(u, ~correct, ax=ax)
        return fig, ax or fig.axes[0]


class _Sparsification(_RetrievalMetric):
    needs_uncertainty = True

    def __init__(self, n_levels: int = 100, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n_levels = n_levels

    def curves(self) -> tuple[Tensor, Tensor, Tensor]:
        """Removed fraction, sparsification curve of u, oracle curve."""
        u, correct = self._u_correct()
        removed, curve = Fm.sparsification_curve(u, correct, self.n_levels)
        return removed, curve, Fm.oracle_curve(correct, self.n_levels)

    def plot(self, ax: Axes | None = None) -> tuple[Figure, Axes]:
        """Sparsification curve with the oracle."""
        fig = _plots().plot_sparsification_curve(*self.curves(), ax=ax)
        return fig, ax or fig.axes[0]


class AUSC(_Sparsification):
    """Area under the sparsification curve (LAM section 5). ``update(emb, labels, u)``."""

    higher_is_better = _direction("ausc")

    def compute(self) -> Tensor:
        """AUSC of the gathered set."""
        return self.curves()[1].mean()


class AUSE(_Sparsification):
    """Area between the sparsification curve and the oracle's (torch-uncertainty's AUSE)."""

    higher_is_better = _direction("ause")

    def compute(self) -> Tensor:
        """AUSE of the gathered set."""
        _, curve, oracle = self.curves()
        return (oracle - curve).mean()


class RetrievalECE(Metric):
    """Sampled retrieval ECE (LAM section 5; docs/concepts/metrics.rst, "Calibration: ECE for
    retrieval"). ``update(samples [S,B,D], labels)``.

    Samples are stored as ``[B, S, D]`` so the ``cat`` gather concatenates along the points.

    Parameters
    ----------
    n_bins : int
        Confidence bins.
    mode : {"shortlist", "exact"}
        Per-draw search (:class:`~bayesurl.search.DrawSearch`).
    shortlist : int, optional
        Shortlist length L (``None``: adaptive, see
        :func:`~bayesurl.search.choose_shortlist`).
    memory_budget : int
        Bytes per chunk.
    """

    is_differentiable = False
    higher_is_better = _direction("ece")
    full_state_update = False

    def __init__(
        self,
        n_bins: int = 10,
        mode: str = "shortlist",
        shortlist: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        **kwargs: Any,
    ) -> None:
        super().__init__(**_sharded_kwargs(kwargs))
        self.n_bins, self.mode, self.shortlist = n_bins, mode, shortlist
        self.memory_budget = memory_budget
        self.add_state("samples", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")

    def update(self, samples: Tensor, labels: Tensor) -> None:
        """Add a batch of draws ``[S, B, D]`` with labels ``[B]``."""
        s = check_tensor(samples, "samples", ndim=3)
        y = check_tensor(labels, "labels", ndim=1)
        if s.shape[1] != y.shape[0]:
            raise ValueError(
                f"length mismatch: `samples` has {s.shape[1]} points, `labels` {y.shape[0]}"
            )
        self.samples.append(s.detach().transpose(0, 1))
        self.labels.append(y.detach())

    def result(self) -> Fm.ECEResult:
        """ECE with the reliability-diagram data of every rank's rows (collective)."""
        sharded = _check_updated(self, self.samples)
        s = dim_zero_cat(self.samples).transpose(0, 1)
        y = dim_zero_cat(self.labels)
        if sharded is None:
            return Fm.retrieval_ece(
                s, y, n_bins=self.n_bins, mode=self.mode, shortlist=self.shortlist,
                memory_budget=self.memory_budget,
            )  # fmt: skip
        Fm.check_n_bins(self.n_bins)
        sh = Shards.of(s.shape[1], s.device, self.process_group)
        search = Sm.DrawSearch(
            mode=self.mode, shortlist=self.shortlist,
            memory_budget=rank_budget(self.memory_budget, sh),
        )  # fmt: skip
        checked = Sm.checked_samples(s, check_values=self.mode == "exact")
        nb = Sm.neighbors_per_draw(checked, search, shards=sh)
        nb = sh.gather(nb.T.contiguous()).T
        return Fm.ece_from_neighbors(nb, sh.gather(y), s.shape[0], self.n_bins)

    def compute(self) -> Tensor:
        """ECE of every rank's rows."""
        return self.result().ece

    def plot(self, ax: Axes | None = None) -> tuple[Figure, Axes]:
        """Reliability diagram."""
        r = self.result()
        fig = _plots().plot_reliability_diagram(
            r.bin_edges, r.bin_accuracy, r.bin_count, ece=float(r.ece), ax=ax
        )
        return fig, ax or fig.axes[0]


class _OOD(Metric):
    is_differentiable = False
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("uncertainties", default=[], dist_reduce_fx="cat")
        self.add_state("is_ood", default=[], dist_reduce_fx="cat")

    def update(self, uncertainties: Tensor, is_ood: Tensor | bool) -> None:
        """Add u ``[B]`` with OOD flags ``[B]`` (or one bool for the whole batch)."""
        u = check_tensor(uncertainties, "uncertainties", ndim=1)
        o = torch.as_tensor(is_ood, device=u.device)
        o = o.expand(u.shape[0]) if o.ndim == 0 else o
        o = check_tensor(o, "is_ood", ndim=1).bool()
        check_same_length(("uncertainties", u), ("is_ood", o))
        self.uncertainties.append(u.detach())
        self.is_ood.append(o)

    def _data(self) -> tuple[Tensor, Tensor]:
        if _empty(self.uncertainties):
            raise ValueError(f"{type(self).__name__}: compute() called before update()")
        return dim_zero_cat(self.uncertainties), dim_zero_cat(self.is_ood)

    def plot(self, ax: Axes | None = None) -> tuple[Figure, Axes]:
        """ROC curve of u for "OOD"."""
        fig = _plots().plot_roc(*self._data(), ax=ax)
        return fig, ax or fig.axes[0]


class OODAUROC(_OOD):
    """AUROC of u for "out of distribution" (LAM section 5)."""

    higher_is_better = _direction("ood_auroc")

    def compute(self) -> Tensor:
        """OOD AUROC of the gathered set."""
        u, o = self._data()
        return Fm.auroc(u, o)


class OODAUPRC(_OOD):
    """Average precision of u for "out of distribution" (LAM section 5)."""

    higher_is_better = _direction("ood_auprc")

    def compute(self) -> Tensor:
        """OOD AUPRC of the gathered set."""
        u, o = self._data()
        return Fm.average_precision(u, o)
