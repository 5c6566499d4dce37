"""One entry point that evaluates any method's output (URL benchmark section 3.1, LAM section 5).

:class:`Evaluator` holds the settings (checked once) and is called on plain tensors, in the
shape of pytorch-metric-learning's ``AccuracyCalculator``; :func:`evaluate` is the one-call
front (settings and tensors together), :func:`evaluate_output` takes an
:class:`~bayesurl.Output`. All return a dict with every selected metric of the metric table
(:mod:`bayesurl.evaluation.table`, served by one kNN search). The keys ``r@1``,
``r_auroc``, ``ausc``, ``ause``, ``ece``, ``ood_auroc``, ``ood_auprc`` and ``map@5`` are always
present; a metric that is not defined for the input is ``None`` and ``notes`` says why:

- no uncertainties and no samples: ``r_auroc``, ``ausc``, ``ause`` are ``None``;
- no samples: ``ece`` is ``None`` (never a made-up number from a scalar u;
  docs/concepts/metrics.rst, "Calibration: ECE for retrieval");
- no ``ood_uncertainties``: ``ood_auroc`` / ``ood_auprc`` are ``None``;
- all queries R@1-correct or all wrong (e.g. a single class): ``r_auroc`` is ``None``
  (:func:`~bayesurl.evaluation.functional.r_auroc` itself raises).

Bad input (NaN/inf, wrong dims, length mismatch, fewer than 2 points, an all-zero embedding
row, ``ood_uncertainties`` or ``reference_uncertainties`` without the uncertainties they are
compared with) raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from bayesurl._checks import (
    check_choice,
    check_int,
    check_integer,
    check_ints,
    check_nonzero_rows,
    check_number,
    check_tensor,
)
from bayesurl.distributed import Shards, raise_if_any
from bayesurl.evaluation import functional as Fm
from bayesurl.evaluation.notes import Note, result_notes
from bayesurl.evaluation.table import (
    MISSING,
    EvalContext,
    Metric,
    Need,
    always_keys,
    metric_columns,
    select_metrics,
)
from bayesurl.search import sampled as Sm
from bayesurl.search.backends import (
    ExactSearch,
    FaissSearch,
    KnnFunc,
    checked_ids,
    resolve_search,
)
from bayesurl.search.core import DEFAULT_MEMORY_BUDGET, rank_budget
from bayesurl.search.exact import knn, search_shards
from bayesurl.stats.intervals import (
    DEFAULT_LEVEL,
    DEFAULT_REPLICATES,
    Interval,
    check_interval_options,
    format_interval,
    intervals_of,
)
from bayesurl.types import Output

__all__ = ["REQUIRED_KEYS", "EvaluationResult", "Evaluator", "evaluate", "evaluate_output"]

#: Keys present in every result (``None`` when undefined for the input): the columns of the
#: built-in metrics marked ``always`` (:func:`~bayesurl.evaluation.table.always_keys`, which
#: also counts metrics registered later).
REQUIRED_KEYS = always_keys()


#: Seed of the draws of the mixed R-AUROC's queries and of the crop test's areas.
EXTRA_SEED = 0


class EvaluationResult(dict):  # type: ignore[type-arg]
    """The result of :func:`evaluate`: a dict of the metrics, with the notes a person reads.

    A plain ``dict`` for every key (``res["r_auroc"]``, ``res["intervals"]``,
    ``res["notes"]``: why a metric is ``None``), so two results compare equal as dicts (a
    sharded evaluation and the single process); ``caveats`` holds the
    :class:`~bayesurl.evaluation.notes.Note` s of :func:`~bayesurl.evaluation.notes.result_notes`
    (u nearly constant, an AUROC at chance or inverted by its interval, R@1 at chance).
    """

    caveats: list[Note]

    def __init__(self, *args: Any, caveats: Sequence[Note] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.caveats = list(caveats)

    @property
    def intervals(self) -> dict[str, Interval]:
        """``res["intervals"]``: the interval of every metric that has one."""
        return self.get("intervals") or {}

    def describe(self, keys: Sequence[str] | None = None, *, notes: bool = True) -> str:
        """``"R@1 0.877 [0.856, 0.896], R-AUROC 0.581 [0.550, 0.611], ..."``: each metric of
        ``keys`` (default: the table columns with a value) with its interval, titles and
        digits from the metric table, then (``notes``) one ``note:`` line per caveat.

        Examples
        --------
        >>> import torch
        >>> x, y = torch.randn(60, 8), torch.arange(60) % 3
        >>> res = evaluate(x, y, uncertainties=torch.rand(60))
        >>> print(res.describe(["r@1"], notes=False))  # doctest: +ELLIPSIS
        R@1 ... [..., ...]
        """
        cols = {c.key: c for c in metric_columns()}
        if keys is None:
            keys = [k for k, c in cols.items() if c.shown and self.get(k) is not None]
        parts = []
        for key in keys:
            c = cols.get(key)
            digits, title = (3, key) if c is None else (c.digits, c.title)
            parts.append(
                f"{title} {format_interval(self.get(key), self.intervals.get(key), digits)}"
            )
        lines = [", ".join(parts)]
        if notes:
            lines += [f"note: {n.text}" for n in self.caveats]
        return "\n".join(lines)


def _at_least_float32(t: Tensor) -> Tensor:
    """Half / bfloat16 inputs are evaluated in float32 (the sparse and BLAS kernels of the
    search have no half-precision CPU path, and 1/kappa_hat needs the precision)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _validate(
    embeddings: object | None,
    labels: object,
    uncertainties: object | None,
    samples: object | None,
    ood_uncertainties: object | None,
    local: bool = False,
) -> tuple[Tensor | None, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Checked inputs; ``local``: this rank's rows of a sharded evaluation (any count, even 0;
    the global count is checked once the shard sizes are known)."""
    s = None
    if samples is not None:
        s = check_tensor(samples, "samples", ndim=3, finite=False)  # checked with the mean
        if s.shape[0] < 1:
            raise ValueError("`samples` needs at least 1 draw, got 0")
        if not s.is_floating_point():
            raise ValueError(f"`samples` must be floating point, got {s.dtype}")
        s = _at_least_float32(s)
    x = None
    if embeddings is not None:
        x = check_tensor(embeddings, "embeddings", ndim=2, min_points=0 if local else 2)
        if not x.is_floating_point():
            raise ValueError(f"`embeddings` must be floating point, got {x.dtype}")
        x = _at_least_float32(x)
        check_nonzero_rows(x, "embeddings")
    elif s is None:
        raise ValueError("`embeddings` is required (or give `samples` to use their mean)")
    n = x.shape[0] if x is not None else s.shape[1]
    if n < 2 and not local:
        raise ValueError(f"`samples` needs at least 2 points, got {n}")
    y = check_tensor(labels, "labels", ndim=1)
    if y.shape[0] != n:
        raise ValueError(f"length mismatch: `labels` has {y.shape[0]} entries, expected {n}")
    if s is not None:
        if s.shape[1] != n:
            raise ValueError(f"length mismatch: `samples` has {s.shape[1]} points, expected {n}")
        if x is not None and s.shape[2] != x.shape[1]:
            raise ValueError(
                f"`samples` has dimension {s.shape[2]} but `embeddings` has {x.shape[1]}"
            )
    u = None
    if uncertainties is not None:
        u = check_tensor(uncertainties, "uncertainties", ndim=1)
        if u.shape[0] != n:
            raise ValueError(
                f"length mismatch: `uncertainties` has {u.shape[0]} entries, expected {n}"
            )
    v = None
    if ood_uncertainties is not None:
        v = check_tensor(
            ood_uncertainties, "ood_uncertainties", ndim=1, min_points=0 if local else 1
        )
    return x, y, u, s, v


def _prepare(
    embeddings: object | None,
    labels: object,
    uncertainties: object | None,
    samples: object | None,
    ood_uncertainties: object | None,
    local: bool,
) -> tuple[
    Tensor | None, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None, str | None
]:
    """Validated inputs plus the draws' mean resultant and the uncertainty (and its source).

    One pass over the draws: their mean resultant (and finiteness check) serves the mean
    embedding, 1/kappa_hat, the shortlist pilot and the ECE.
    """
    x, y, u, s, v = _validate(embeddings, labels, uncertainties, samples, ood_uncertainties, local)
    res_s = None if s is None else Sm.checked_resultant(s)
    u_source = "given" if u is not None else None
    if u is None and s is not None:
        assert res_s is not None
        u = Fm.u_from_length(Fm.resultant_length(res_s), s.shape[-1])
        u_source = "1/kappa_hat from samples (Sra)"
        if not bool(torch.isfinite(u).all()):
            raise ValueError("`samples` give a non-finite 1/kappa_hat (mean resultant length 0)")
    return x, y, u, s, v, res_s, u_source


def _check_needs(
    u: Tensor | None,
    x: Tensor | None,
    res_s: Tensor | None,
    reference_uncertainties: object | None,
    ood_uncertainties: object | None,
) -> Tensor | None:
    """Refuse an option given without the input it is compared with; returns the checked
    ``reference_uncertainties``. Also refuses all-zero mean embeddings of ``samples`` (their
    direction, hence the cosine of the point search, is undefined)."""
    if x is None and res_s is not None:
        check_nonzero_rows(res_s, "samples (their mean)")
    if u is None:
        for name, value in (
            ("reference_uncertainties", reference_uncertainties),
            ("ood_uncertainties", ood_uncertainties),
        ):
            if value is not None:
                raise ValueError(
                    f"`{name}` is compared with the in-distribution uncertainties: give "
                    "`uncertainties` (or `samples`) too"
                )
    if reference_uncertainties is None:
        return None
    ref = check_tensor(reference_uncertainties, "reference_uncertainties", ndim=1)
    if u is not None and ref.shape[0] != u.shape[0]:
        raise ValueError(
            f"length mismatch: `reference_uncertainties` has {ref.shape[0]} entries, "
            f"`uncertainties` {u.shape[0]}"
        )
    return ref


def _validate_extras(
    d: int,
    id_embeddings: object | None,
    id_labels: object | None,
    id_uncertainties: object | None,
    predict_uncertainty: Callable[[Tensor], Tensor] | None,
    crop_images: object | None,
    local: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """The in-distribution set (URL App. C.5) and the crop test's images (URL App. C.3)."""
    ix = iy = iu = None
    if id_embeddings is not None:
        ix = check_tensor(id_embeddings, "id_embeddings", ndim=2, min_points=0 if local else 1)
        if not ix.is_floating_point():
            raise ValueError(f"`id_embeddings` must be floating point, got {ix.dtype}")
        if ix.shape[1] != d:
            raise ValueError(f"`id_embeddings` has dimension {ix.shape[1]} but `embeddings` {d}")
        if id_labels is None:
            raise ValueError("`id_labels` is required with `id_embeddings`")
        iy = check_tensor(id_labels, "id_labels", ndim=1)
        if iy.shape[0] != ix.shape[0]:
            raise ValueError(
                f"length mismatch: `id_labels` has {iy.shape[0]} entries, expected {ix.shape[0]}"
            )
    elif id_labels is not None:
        raise ValueError("`id_labels` needs `id_embeddings`")
    if id_uncertainties is not None:
        iu = check_tensor(id_uncertainties, "id_uncertainties", ndim=1, min_points=0)
        if ix is not None and iu.shape[0] != ix.shape[0]:
            raise ValueError(
                f"length mismatch: `id_uncertainties` has {iu.shape[0]} entries, "
                f"expected {ix.shape[0]}"
            )
    if (predict_uncertainty is None) != (crop_images is None):
        raise ValueError("`predict_uncertainty` and `crop_images` go together (URL's crop test)")
    if predict_uncertainty is not None and not callable(predict_uncertainty):
        raise TypeError("`predict_uncertainty` must be callable: images -> u")
    images = None
    if crop_images is not None:
        images = check_tensor(crop_images, "crop_images", ndim=4, min_points=1)
        if not images.is_floating_point():
            raise ValueError(f"`crop_images` must be floating point, got {images.dtype}")
    return ix, iy, iu, images


def _options(ev: Evaluator) -> dict[str, Any]:
    """The checked settings every metric reads (``ctx.options``), from ``ev``'s fields."""
    ks, map_ks, n_bins, ece_mode = ev.ks, ev.map_ks, ev.n_bins, ev.ece_mode
    shortlist, tolerance, level = ev.shortlist, ev.tolerance, ev.level
    replicates, interval_seed = ev.replicates, ev.interval_seed
    return_curves, progress, intervals, avg_of_avgs = (
        ev.return_curves, ev.progress, ev.intervals, ev.avg_of_avgs
    )  # fmt: skip
    # integers only: ks=(2.7,) would otherwise report recall@2
    ks = check_ints(ks, "ks", low=1)
    mks = sorted({*ks, 5} if map_ks is None else {*check_ints(map_ks, "map_ks", low=1), 5})
    check_choice(ece_mode, "ece_mode", ("shortlist", "exact"))
    Fm.check_n_bins(n_bins)
    check_number(tolerance, "tolerance", low=0.0, high=1.0)
    check_interval_options(level, replicates, interval_seed)
    for name, flag in (
        ("return_curves", return_curves), ("progress", progress), ("intervals", intervals),
        ("avg_of_avgs", avg_of_avgs),
    ):  # fmt: skip
        if not isinstance(flag, bool):
            raise ValueError(f"`{name}` must be True or False, got {flag!r}")
    if shortlist is not None:
        shortlist = check_int(shortlist, "shortlist", low=1)
    return {
        "ks": ks,
        "map_ks": tuple(mks),
        "n_bins": n_bins,
        "ece_mode": ece_mode,
        "shortlist": shortlist,
        "tolerance": tolerance,
        "return_curves": return_curves,
        "progress": progress,
        "seed": EXTRA_SEED,
        "intervals": intervals,
        "level": float(level),
        "replicates": replicates,
        "interval_seed": interval_seed,
        "avg_of_avgs": avg_of_avgs,
    }


def _check_call(
    reference: str | None,
    copy: object,
    distributed: bool,
    group: dist.ProcessGroup | None,
    backend: str,
    memory_budget: int,
) -> None:
    """The settings of the search and of a sharded evaluation."""
    if reference not in (None, "lam"):
        raise ValueError(f"`reference` must be None or 'lam', got {reference!r}")
    for name, flag in (("copy", copy), ("distributed", distributed)):
        if not isinstance(flag, bool):
            raise ValueError(f"`{name}` must be True or False, got {flag!r}")
    check_choice(backend, "backend", ("torch", "faiss"))
    check_int(memory_budget, "memory_budget", low=1)
    if reference is not None and distributed:
        raise ValueError("`reference='lam'` needs every draw on one process; not with distributed")
    if distributed and not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "`distributed=True` needs an initialised torch.distributed process group "
            "(run under torchrun, or call bayesurl.distributed.init_from_env())"
        )
    if group is not None and not distributed:
        raise ValueError("`group` is only used with `distributed=True`")
    if distributed and backend != "torch":
        raise ValueError(f"`distributed=True` needs backend='torch', got {backend!r}")


def _missing(metric: Metric, ctx: EvalContext) -> Need | None:
    return next((need for need in metric.needs if not ctx.has(need)), None)


def _note_missing(
    notes: list[str], grouped: dict[Need, int], need: Need, keys: Sequence[str]
) -> None:
    """One note per missing input, naming every metric key it leaves undefined."""
    reason = MISSING[need]
    if reason is None or not keys:
        return
    if need in grouped:
        at = grouped[need]
        named, _ = notes[at].split(": ", 1)
        notes[at] = f"{named}, {', '.join(keys)}: {reason}"
    else:
        grouped[need] = len(notes)
        notes.append(f"{', '.join(keys)}: {reason}")


class _Checked(NamedTuple):
    """One call's validated inputs (``x`` is ``None`` when the samples' mean stands in)."""

    x: Tensor | None
    y: Tensor
    u: Tensor | None
    s: Tensor | None
    v: Tensor | None
    res_s: Tensor | None
    u_source: str | None
    ref: Tensor | None
    ix: Tensor | None
    iy: Tensor | None
    iu: Tensor | None
    images: Tensor | None


def _check_inputs(
    embeddings: object | None,
    labels: object,
    uncertainties: object | None,
    samples: object | None,
    ood_uncertainties: object | None,
    reference_uncertainties: object | None,
    id_embeddings: object | None,
    id_labels: object | None,
    id_uncertainties: object | None,
    predict_uncertainty: Callable[[Tensor], Tensor] | None,
    crop_images: object | None,
    local: bool,
) -> _Checked:
    """Every input of a call checked (``local``: this rank's rows of a sharded evaluation)."""
    x, y, u, s, v, res_s, u_source = _prepare(
        embeddings, labels, uncertainties, samples, ood_uncertainties, local=local
    )
    d = (x if x is not None else s).shape[-1]  # type: ignore[union-attr]
    ix, iy, iu, images = _validate_extras(
        d, id_embeddings, id_labels, id_uncertainties, predict_uncertainty, crop_images, local
    )
    ref = _check_needs(u, x, res_s, reference_uncertainties, ood_uncertainties)
    return _Checked(x, y, u, s, v, res_s, u_source, ref, ix, iy, iu, images)


@dataclass(frozen=True, kw_only=True)
class Evaluator:
    """The evaluation settings, checked once; call it on a method's tensors.

    In the shape of pytorch-metric-learning's ``AccuracyCalculator``: the options go to the
    constructor, the inputs to the call, and each metric of the metric table
    (:mod:`bayesurl.evaluation.table`) declares the inputs it needs and how many neighbours it
    wants, so one exact kNN search with the largest request serves all of them. A metric
    whose input is missing is ``None`` and ``notes`` says why. :func:`evaluate` is the same
    as ``Evaluator(**options)(**inputs)``.

    With ``distributed=True`` (under an initialised ``torch.distributed`` process group, e.g.
    ``torchrun``) the evaluation is sharded: every array argument of the call holds **this
    rank's rows** (contiguous shards in rank order, e.g.
    :func:`bayesurl.distributed.shard_range`; a rank may hold none), each rank searches its
    queries over every rank's rows passed by in bounded chunks
    (:func:`~bayesurl.search.knn_sharded`; no rank holds all ``N x D``), the
    sampling-aware ECE shards its pilot, threshold pass and per-draw products the same way,
    and the per-query results (neighbour ids, labels, u) are gathered, so every rank returns
    the metrics of the single-process evaluation of the concatenated rows, ties included. One
    process is the ``W = 1`` case of the same code.

    Parameters
    ----------
    ks : sequence of int
        Cut-offs of ``recall@k``; one kNN search with ``max(ks)`` neighbours serves all.
    map_ks : sequence of int, optional
        Cut-offs of ``map@k`` (default: ``ks``); ``map@5`` is always computed.
    n_bins : int
        ECE bins.
    ece_mode : {"shortlist", "exact"}
        Per-draw 1-NN search of the ECE, see
        :class:`~bayesurl.search.DrawSearch`.
    shortlist : int, optional
        Shortlist length L of the sampling-aware search; ``None`` chooses it from a pilot so
        the estimated miss rate is at most ``tolerance``
        (:func:`~bayesurl.search.choose_shortlist`).
    tolerance : float
        Miss-rate target of the adaptive shortlist.
    memory_budget : int
        Bytes per similarity chunk of one process; with ``distributed`` each of the ``W``
        ranks uses ``memory_budget // W`` (:func:`~bayesurl.search.rank_budget`).
    backend : {"torch", "faiss"}
        kNN backend of the deterministic pass, by name (``search`` is its general form).
    return_curves : bool
        Also return ``sparsification`` (removed fraction, R@1 curve, oracle curve) and
        ``reliability`` (bin edges, confidence, accuracy, count) as lists.
    progress : bool
        Show tqdm bars over the ECE draws.
    distributed : bool
        Shard over the ranks of ``group`` (collective: every rank must call). Needs
        ``backend="torch"``; ``ood_uncertainties``, ``reference_uncertainties`` and the
        in-distribution set are per-rank shards too.
    group : ProcessGroup, optional
        Process group of ``distributed`` (default: the default group).
    reference : {None, "lam"}
        ``"lam"`` selects the LAM-code metrics ``lam_ausc`` and ``lam_ece`` too (the same as
        naming them in ``include``): the AUSC and ECE as the LAM authors' code computes them
        (:mod:`bayesurl.evaluation.lam_reference`: pair uncertainty from the per-dimension
        std of the draws, 99 trapezoid levels; ECE bins ``[lo, hi)`` that drop confidence
        1.0; ``samples`` required, else ``None`` with a note). bayesurl's own ``ausc`` /
        ``ece`` are unchanged.
    copy : bool
        ``False`` lets the search L2-normalise ``embeddings`` in place instead of a normalised
        copy (scikit-learn's ``copy=False``): one ``[N, D]`` tensor (this rank's ``[n_r, D]``)
        less at the peak, for a caller that owns the array and does not need it afterwards --
        ``bayesurl evaluate INPUT.npz`` passes it. The values of ``embeddings`` are
        overwritten (float32 and float64 inputs; other dtypes are converted, so never
        overwritten); the metrics are the same bit for bit.
    include : iterable of str, optional
        Metrics to compute (default: every default metric of the table); a metric's name or
        one of its keys (``"ause"``). The names: :data:`bayesurl.evaluation.table.METRICS`.
    exclude : iterable of str
        Metrics not to compute.
    return_neighbors : bool
        Also return the search's neighbour ids under ``"neighbors"`` (``[n_r, k]`` Tensor of
        global row ids, self excluded, this rank's queries; ``None`` when no selected metric
        searched), so a caller that needs them (the per-query record) does not search again.
    intervals : bool
        Give every metric that declares one its ``level`` interval over the queries (and OOD
        inputs) under ``res["intervals"]`` (:mod:`bayesurl.stats.intervals`: Wilson for
        R@1 / recall@k, DeLong for the AUROCs, a Poisson bootstrap for AUSC / AUSE, mAP@k and
        the ECE, Boyd et al.'s logit interval for OOD AUPRC, Fisher-z for a Spearman
        correlation). ``False``: none (the note on R-AUROC then from DeLong's interval alone).
    level : float
        Confidence level of the intervals, in (0, 1).
    replicates : int
        Bootstrap replicates (at least 10); the cost grows with ``replicates x N``.
    interval_seed : int
        Seed of the bootstrap weights (the same seed, the same intervals; a sharded evaluation
        gives every rank those of one process).
    avg_of_avgs : bool
        Also give ``map@r`` and ``r_precision`` averaged per class first, then over the classes
        (``map@r_class_avg``, ``r_precision_class_avg``; pytorch-metric-learning's
        ``avg_of_avgs``), when ``map@r`` is selected.
    search : str or KnnFunc, optional
        The neighbour search of the one pass: ``"torch"`` / ``"faiss"``
        (:class:`~bayesurl.search.ExactSearch` /
        :class:`~bayesurl.search.FaissSearch`) or any object with
        pytorch-metric-learning's ``knn_func`` contract, ``search(query, k, reference,
        ref_includes_query) -> (distances, indices)`` (:class:`~bayesurl.search.KnnFunc`;
        e.g. PML's ``CustomKNN``). It is called once as ``search(x, k, x, True)``; its ids are
        checked (shape ``[N, k]``, in range, no query its own neighbour) and every metric reads
        them. Default: ``backend``. ``distributed`` needs the exact torch search.

    Raises
    ------
    ValueError
        On bad settings (naming the argument), an unknown metric name in ``include`` /
        ``exclude``, a metric named in both (or excluded while ``reference`` selects it), or
        a selection of no metric.

    Examples
    --------
    >>> import torch
    >>> evaluator = Evaluator(include=["r@1", "recall@k"], ks=(1, 2))
    >>> x, y = torch.randn(50, 8), torch.arange(50) % 5
    >>> [k for k in evaluator(x, y) if k.startswith("recall@")]
    ['recall@1', 'recall@2']
    """

    ks: Sequence[int] = (1, 5, 10)
    map_ks: Sequence[int] | None = None
    n_bins: int = 10
    ece_mode: str = "shortlist"
    shortlist: int | None = None
    tolerance: float = 1e-3
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    backend: str = "torch"
    return_curves: bool = False
    progress: bool = False
    distributed: bool = False
    group: dist.ProcessGroup | None = None
    reference: str | None = None
    copy: bool = True
    include: Iterable[str] | None = None
    exclude: Iterable[str] = ()
    return_neighbors: bool = False
    intervals: bool = True
    level: float = DEFAULT_LEVEL
    replicates: int = DEFAULT_REPLICATES
    interval_seed: int = 0
    avg_of_avgs: bool = False
    search: str | KnnFunc | None = None
    #: the checked settings every metric reads (``ctx.options``; each call adds its own)
    options: dict[str, Any] = field(init=False, repr=False, compare=False)
    #: the selected metrics, in table order
    metrics: tuple[Metric, ...] = field(init=False, repr=False, compare=False)
    #: the search object of ``search`` (or of ``backend``)
    knn_func: KnnFunc = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_call(
            self.reference, self.copy, self.distributed, self.group, self.backend,
            self.memory_budget,
        )  # fmt: skip
        options = _options(self)
        lam = ("lam_ausc", "lam_ece") if self.reference == "lam" else ()
        metrics = select_metrics(self.include, self.exclude, options, also=lam)
        if not isinstance(self.return_neighbors, bool):
            raise ValueError(
                f"`return_neighbors` must be True or False, got {self.return_neighbors!r}"
            )
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "metrics", tuple(metrics))
        object.__setattr__(self, "knn_func", _knn_func(self.search, self.backend, self.distributed))

    def __call__(
        self,
        embeddings: Tensor | None,
        labels: Tensor,
        *,
        uncertainties: Tensor | None = None,
        samples: Tensor | None = None,
        ood_uncertainties: Tensor | None = None,
        reference_uncertainties: Tensor | None = None,
        id_embeddings: Tensor | None = None,
        id_labels: Tensor | None = None,
        id_uncertainties: Tensor | None = None,
        predict_uncertainty: Callable[[Tensor], Tensor] | None = None,
        crop_images: Tensor | None = None,
        neighbors: Tensor | None = None,
    ) -> EvaluationResult:
        """Every selected metric defined for these inputs, from one kNN search.

        Parameters
        ----------
        embeddings : Tensor or None
            ``[N, D]`` point embeddings (cosine similarity); ``None`` with ``samples``: the
            normalised mean of the normalised samples.
        labels : Tensor
            ``[N]`` class labels.
        uncertainties : Tensor, optional
            ``[N]`` u (higher = less certain); default with ``samples``: ``1 / kappa_hat``
            (Sra's approximation).
        samples : Tensor, optional
            ``[S, N, D]`` posterior draws; enable the retrieval ECE (LAM, section 5).
        ood_uncertainties, reference_uncertainties : Tensor, optional
            ``[M]`` u of out-of-distribution inputs (OOD AUROC / AUPRC, OOD = positive, against
            ``id_uncertainties`` when given, else ``uncertainties``); ``[N]`` ground-truth
            uncertainty (``rank_correlation``, Spearman, URL App. C.3). Both need
            ``uncertainties`` or ``samples``.
        id_embeddings, id_labels, id_uncertainties : Tensor, optional
            ``[M, D]``, ``[M]``, ``[M]``: held-out images of the training classes; enable
            ``mixed_r_auroc`` / ``mixed_r@1`` (URL App. C.5,
            :func:`~bayesurl.evaluation.url_extra.mixed_r_auroc`, seed 0).
        predict_uncertainty, crop_images : callable and Tensor, optional
            ``images -> u`` of the evaluated model and ``[M, C, H, W]`` images transformed as
            it expects (the same on every rank): URL's crop test, ``crop_share`` and
            ``crop_spearman`` (URL section 4.5 / App. C.3, seed 0).
        neighbors : Tensor, optional
            ``[n_r, k']`` neighbour ids of these very ``embeddings`` from an earlier search
            (``return_neighbors``, :class:`~bayesurl.evaluation.NeighborMemo`; nearest first,
            self excluded, ties to the lowest index, not checked): their first columns replace
            the search when ``k'`` is enough, else ignored. Single process only.

        Returns
        -------
        dict
            As :func:`evaluate`; ``ValueError`` naming the argument on bad input.
        """
        check = partial(
            _check_inputs, embeddings, labels, uncertainties, samples, ood_uncertainties,
            reference_uncertainties, id_embeddings, id_labels, id_uncertainties,
            predict_uncertainty, crop_images, local=self.distributed,
        )  # fmt: skip
        c = _on_every_rank(check, self.distributed, self.group)
        ctx = self._context(c, predict_uncertainty)
        n = ctx.shards.n
        res = {**dict.fromkeys(always_keys()), "n": n, "uncertainty_source": c.u_source}
        given = _given_neighbors(neighbors, n, self.distributed)
        # copy=False: the given embeddings are not read after the search (the samples' mean
        # is read again by the ECE), normalise them in place
        self._search_once(ctx, given, inplace=not self.copy and embeddings is not None)
        res.update(_compute(self.metrics, ctx))
        res["intervals"] = _intervals(ctx, res)
        res["notes"] = ctx.notes
        if self.return_neighbors:
            res["neighbors"] = ctx.neighbors
        return EvaluationResult(res, caveats=_caveats(ctx, res))

    def _context(
        self, c: _Checked, predict_uncertainty: Callable[[Tensor], Tensor] | None
    ) -> EvalContext:
        """What every metric reads: the inputs over the shards, this call's options."""
        x = c.x if c.x is not None else Fm.normalize(c.res_s)  # type: ignore[arg-type]
        sh = _shards(x, c.s, self.distributed, self.group)
        # each of the W ranks holds 1/W of one process's similarity blocks
        budget = rank_budget(self.memory_budget, sh)
        options = {**self.options, "x_is_mean": c.x is None, "memory_budget": budget}
        return EvalContext(
            x=x, y=c.y, u=None if c.u is None else sh.gather(c.u.to(x.device)), samples=c.s,
            resultant=c.res_s, ood_u=c.v, reference=c.ref, id_x=c.ix, id_y=c.iy, id_u=c.iu,
            predict_uncertainty=predict_uncertainty, crop_images=c.images, shards=sh,
            group=self.group, options=options,
        )  # fmt: skip

    def _search_once(self, ctx: EvalContext, given: Tensor | None, inplace: bool) -> None:
        """``ctx.neighbors``: the one search, with the largest request of the runnable
        metrics (the first columns of ``given`` when it has enough)."""
        runnable = [m for m in self.metrics if _missing(m, ctx) is None]
        wanted = [m.neighbours(ctx) for m in runnable if m.neighbours is not None]
        if not any(wanted):
            return
        k = min(max(wanted), ctx.shards.n - 1)
        if given is not None and given.shape[1] >= k:
            ctx.neighbors = given[:, :k].to(ctx.x.device)
        else:
            budget = ctx.options["memory_budget"]
            ctx.neighbors = _search(ctx.x, k, ctx.shards, budget, self.knn_func, inplace)


def _on_every_rank(
    check: Callable[[], _Checked], distributed: bool, group: dist.ProcessGroup | None
) -> _Checked:
    """``check()`` on this rank's input; under torch.distributed every rank learns of any
    rank's error (collective), so no rank waits in a collective another has left."""
    try:
        checked = check()
        error = None
    except ValueError as exc:
        if not distributed:
            raise
        error = exc
    if distributed:
        raise_if_any(error, group)
    return checked


def _intervals(ctx: EvalContext, res: dict[str, Any]) -> dict[str, Interval]:
    """Each computed metric's interval from the evidence its ``compute`` kept (none when the
    options say so)."""
    o = ctx.options
    if not o["intervals"]:
        return {}
    return intervals_of(
        ctx.evidence, res, level=o["level"], replicates=o["replicates"],
        seed=o["interval_seed"], workers=torch.get_num_threads(),
    )  # fmt: skip


def _shards(x: Tensor, s: Tensor | None, distributed: bool, group: Any) -> Shards:
    """The row layout of the evaluation; the shards must describe one data set."""
    n_loc = x.shape[0]
    sh = Shards.of(n_loc, x.device, group) if distributed else Shards.local(n_loc)
    if sh.n < 2:
        raise ValueError(f"`embeddings` needs at least 2 points over all ranks, got {sh.n}")
    if sh.active:
        dims = torch.tensor([[x.shape[1], 0 if s is None else s.shape[0]]], device=x.device)
        every = sh.gather(dims)
        if bool((every != every[:1]).any()):
            raise ValueError(
                "the ranks disagree on the embedding dimension / number of draws (rank: [D, S]):"
                f" {every.tolist()}"
            )
    return sh


def _caveats(ctx: EvalContext, res: dict[str, Any]) -> list[Note]:
    """The notes of :func:`~bayesurl.evaluation.notes.result_notes` on the gathered queries
    (every rank the same)."""
    if ctx.u is None:
        return []
    hit = ctx.correct if ctx.neighbors is not None else None
    return result_notes(
        ctx.u,
        hit=None if hit is None else hit.cpu(),
        labels=None if hit is None else ctx.labels_all.cpu().numpy(),
        intervals=res["intervals"],
        estimates=res,
        level=ctx.options["level"],
    )


def _check_evidence(metric: Metric, values: dict[str, Any], ctx: EvalContext) -> None:
    """Every key with a value and a declared interval has the evidence that interval reads."""
    for key, value in values.items():
        method = metric.interval_for(key, ctx.options)
        if method is None or value is None:
            continue
        ev = ctx.evidence.get(key)
        if not isinstance(ev, method.evidence):
            got = "nothing" if ev is None else type(ev).__name__
            raise TypeError(
                f"metric {metric.name!r} declares a {method.value} interval for {key!r}, whose "
                f"compute must keep a {method.evidence.__name__} (ctx.keep), but it kept {got}"
            )


def _compute(metrics: Sequence[Metric], ctx: EvalContext) -> dict[str, Any]:
    """Each metric's keys: its values, or ``None`` with one note per missing input."""
    res: dict[str, Any] = {}
    grouped: dict[Need, int] = {}
    for metric in metrics:
        need = _missing(metric, ctx)
        if need is None:
            values = metric.compute(ctx)
            _check_evidence(metric, values, ctx)
            res.update(values)
        else:
            keys = metric.keys(ctx.options)
            res.update(dict.fromkeys(keys))
            _note_missing(ctx.notes, grouped, need, keys)
    return res


def evaluate(embeddings: Tensor | None, labels: Tensor, **options: Any) -> EvaluationResult:
    """Every selected retrieval and uncertainty metric defined for the input, from one kNN
    search: ``Evaluator(**settings)(embeddings, labels, **inputs)``.

    To evaluate several models with the same settings, build one :class:`Evaluator` and call
    it on each.

    Parameters
    ----------
    embeddings, labels
        As :meth:`Evaluator.__call__`.
    **options
        The further inputs of :meth:`Evaluator.__call__` (``uncertainties``, ``samples``,
        ``ood_uncertainties``, ..., ``neighbors``) and the settings of :class:`Evaluator`
        (``ks``, ``include``, ``intervals``, ``distributed``, ``search``, ...), each by its
        name there: their docs list them with their defaults, and they check them.

    Returns
    -------
    EvaluationResult
        A dict: ``r@1``, ``r_auroc``, ``ausc``, ``ause``, ``ece``, ``ood_auroc``, ``ood_auprc``,
        ``map@5`` (float or None; present even when not selected), the keys of every selected
        metric (``recall@k`` and ``map@k`` for the requested cut-offs, ``rank_correlation``,
        ``mixed_r_auroc``, ``mixed_r@1``, ``crop_share``, ``crop_spearman``, ...), ``n``,
        ``uncertainty_source``, ``notes`` (list of str: why a metric is ``None``),
        ``intervals`` (``{key: Interval}``, :class:`~bayesurl.stats.intervals.Interval`,
        every metric with a value and a declared interval; empty with ``intervals=False``)
        and, with ``return_neighbors``, ``neighbors``; its ``caveats`` attribute holds the
        notes of :mod:`bayesurl.evaluation.notes` (an AUROC at chance or inverted by its
        interval, u nearly constant, R@1 at chance). A shortlist ECE adds ``ece_shortlist`` (L),
        ``ece_shortlist_miss_rate``
        (the pilot's estimated fraction of per-draw neighbours not kept, at most ``tolerance``:
        above it every draw is searched exactly, these fields are left out and ``notes`` says
        so) and ``ece_candidates_per_query`` (docs: concepts/metrics, "The shortlist fields").

    Raises
    ------
    TypeError
        For a keyword that is neither an input nor a setting of :class:`Evaluator` (naming it
        and the valid ones).
    ValueError
        On bad input (naming the argument), an unknown metric name in ``include`` /
        ``exclude``, or bad settings.

    Examples
    --------
    >>> import torch
    >>> x, y = torch.randn(50, 8), torch.arange(50) % 5
    >>> res = evaluate(x, y, uncertainties=torch.rand(50))
    >>> sorted(k for k in res if k in REQUIRED_KEYS) == sorted(REQUIRED_KEYS)
    True
    >>> res = evaluate(x, y, include=["r@1", "recall@k"], ks=(1, 2))
    >>> [k for k in res if k.startswith("recall@")]
    ['recall@1', 'recall@2']
    """
    unknown = [k for k in options if k not in _SETTINGS and k not in _INPUTS]
    if unknown:
        raise TypeError(
            f"evaluate() got an unknown keyword `{unknown[0]}`; the inputs: "
            f"{', '.join(_INPUTS)}; the settings (of Evaluator): {', '.join(_SETTINGS)}"
        )
    settings = {k: v for k, v in options.items() if k in _SETTINGS}
    inputs = {k: v for k, v in options.items() if k in _INPUTS}
    return Evaluator(**settings)(embeddings, labels, **inputs)


#: the settings of :class:`Evaluator` and the keyword inputs of its call: what :func:`evaluate`
#: passes on
_SETTINGS = tuple(f.name for f in fields(Evaluator) if f.init)
_CALL = list(inspect.signature(Evaluator.__call__).parameters.values())[1:]
_INPUTS = tuple(p.name for p in _CALL if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _signature() -> inspect.Signature:
    """:func:`evaluate`'s signature spelt out from :meth:`Evaluator.__call__`'s inputs and
    :class:`Evaluator`'s fields (for ``help`` and editors), so the three cannot drift apart."""
    settings = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
        for f in fields(Evaluator)
        if f.init
    ]
    return inspect.signature(evaluate).replace(parameters=[*_CALL, *settings])


evaluate.__signature__ = _signature()  # type: ignore[attr-defined]


def _given_neighbors(neighbors: object | None, n: int, distributed: bool) -> Tensor | None:
    """The checked ``neighbors`` argument: ``[n, k']`` integer ids in ``[0, n)``."""
    if neighbors is None:
        return None
    if distributed:  # a bad shard on one rank would leave the others waiting in the search
        raise ValueError("`neighbors` is for a single-process evaluation, not `distributed`")
    nb = check_tensor(neighbors, "neighbors", ndim=2, finite=False)
    check_integer(nb, "neighbors", "integer ids")
    if nb.shape[0] != n:
        raise ValueError(f"length mismatch: `neighbors` has {nb.shape[0]} rows, expected {n}")
    if nb.numel() and (int(nb.min()) < 0 or int(nb.max()) >= n):
        raise ValueError(f"`neighbors` holds ids outside [0, {n})")
    nb = nb.long()
    if bool((nb == torch.arange(n, device=nb.device)[:, None]).any()):
        raise ValueError("`neighbors` lists a query as its own neighbour (self is excluded)")
    return nb


def _knn_func(search: object, backend: str, distributed: bool) -> KnnFunc:
    """The search object of the evaluation: ``search``, else the one ``backend`` names."""
    if search is None:
        return resolve_search(backend, "backend")
    if backend != "torch":
        raise ValueError(
            f"give the search as `search` or `backend`, not both (backend={backend!r})"
        )
    found = resolve_search(search)
    if distributed and type(found) is not ExactSearch:
        raise ValueError(f"`distributed=True` needs the exact torch search, got search={search!r}")
    return found


def _search(
    x: Tensor, k: int, sh: Shards, memory_budget: int, knn_func: KnnFunc, inplace: bool
) -> Tensor:
    """Neighbour ids ``[n_r, k]`` (global) of this rank's queries over every rank's rows."""
    if type(knn_func) is ExactSearch:
        return search_shards(x, k, sh, memory_budget, None, inplace=inplace, exact_values=False)[1]
    if type(knn_func) is FaissSearch:
        return knn(x, k, memory_budget=memory_budget, backend="faiss")[1]
    try:
        found = knn_func(x, k, x, True)
    except TypeError as exc:  # not the knn_func signature
        raise ValueError(
            "`search` must be callable as search(query, k, reference, ref_includes_query) "
            f"-> (distances, indices): {exc}"
        ) from exc
    return checked_ids(found, x.shape[0], k).to(x.device)


def evaluate_output(
    output: Output,
    labels: Tensor,
    ood_output: Output | None = None,
    *,
    n_samples: int = 32,
    seed: int = 0,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`evaluate` on a method's :class:`~bayesurl.Output`.

    Uses ``output.embedding``, ``output.uncertainty`` and ``output.samples``. A method that
    predicts a vMF concentration (``output.kappa``) but returns no samples gets ``n_samples``
    vMF draws from a fixed generator (``seed``) so its ECE is defined (docs/concepts/metrics.rst,
    "Calibration: ECE for retrieval").

    Parameters
    ----------
    output : Output
        In-distribution output.
    labels : Tensor
        ``[N]`` class labels.
    ood_output : Output, optional
        Output on OOD inputs; its ``uncertainty`` feeds ``ood_auroc`` / ``ood_auprc``.
    n_samples : int
        Draws taken from ``kappa`` when ``output.samples`` is None (0 disables).
    seed : int
        Seed of the fixed generator for those draws.
    **kwargs
        Passed on to :func:`evaluate`.

    Returns
    -------
    dict
        As :func:`evaluate`.
    """
    if not isinstance(output, Output):
        raise ValueError(f"`output` must be a bayesurl.Output, got {type(output).__name__}")
    if ood_output is not None and not isinstance(ood_output, Output):
        raise ValueError(f"`ood_output` must be a bayesurl.Output, got {type(ood_output).__name__}")
    out = output.detach()
    samples = out.samples
    if samples is None and out.kappa is not None and n_samples > 0:
        from bayesurl.distributions import sample_vmf

        emb = check_tensor(out.embedding, "output.embedding", ndim=2)
        kappa = check_tensor(out.kappa, "output.kappa", ndim=1)
        gen = torch.Generator(device=emb.device).manual_seed(seed)
        samples = sample_vmf(emb, kappa, n_samples, generator=gen)
    return evaluate(
        out.embedding,
        labels,
        uncertainties=out.uncertainty,
        samples=samples,
        ood_uncertainties=None if ood_output is None else ood_output.detach().uncertainty,
        **kwargs,
    )
