"""The metric table of :func:`bayesurl.evaluation.evaluate`: each metric declares what it needs.

In the spirit of pytorch-metric-learning's ``AccuracyCalculator`` (``requires_knn``,
``include`` / ``exclude``): a :class:`Metric` names the inputs it reads (:class:`Need`) and,
when it reads neighbour ids, how many neighbours of the one exact kNN search it wants. The
evaluator validates the inputs once, asks every selected metric for its neighbours, runs
**one** search with the largest request and then each metric in table order; a metric whose
input is missing reports ``None`` under its keys with a note saying why (docs/concepts/metrics.rst:
never a made-up number). A metric also declares how its numbers are shown (:class:`Column`: title,
digits, direction); every table of a run, a sweep report, the HTML report and the protocol
report is derived from those columns (:func:`metric_columns`). A metric declares its interval
here too (``interval=``: one :class:`~bayesurl.stats.intervals.IntervalMethod` for all
its keys, or one per key) and its ``compute`` keeps the per-query data that interval needs
(``ctx.keep(key, evidence)``); the evaluator computes every interval from them
(:mod:`bayesurl.stats.intervals`). Adding a metric is one :func:`register_metric` call.

Definitions: docs/concepts/metrics.rst; papers: URL benchmark (Kirchhof et al. 2023, section 3.1,
App. C.3 / C.5) and LAM (Warburg et al. 2023, section 5).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from bayesurl.distributed import Shards
from bayesurl.evaluation import functional as Fm
from bayesurl.evaluation.lam_reference import lam_ausc, lam_ece
from bayesurl.evaluation.url_extra import crop_uncertainty_check, mixed_r_auroc
from bayesurl.search import sampled as Sm
from bayesurl.stats.intervals import (
    Correlation,
    Evidence,
    IntervalMethod,
    Proportion,
    Rate,
    Resample,
    TwoSamples,
    weighted_class_mean,
    weighted_ece,
    weighted_mean,
    weighted_risk_coverage,
    weighted_sparsification,
)

__all__ = [
    "METRICS",
    "Column",
    "EvalContext",
    "Metric",
    "Need",
    "always_keys",
    "metric_column",
    "metric_columns",
    "register_metric",
    "select_metrics",
    "unregister_metric",
]


class Need(str, Enum):
    """An input a metric reads (besides the labels, which every metric has)."""

    #: neighbour ids of the queries from the one exact kNN search
    NEIGHBOURS = "neighbours"
    #: ``u`` of the queries (given, or 1/kappa_hat of the samples)
    UNCERTAINTY = "uncertainty"
    #: ``[S, N, D]`` posterior draws
    SAMPLES = "samples"
    #: ``u`` of out-of-distribution inputs
    OOD = "ood"
    #: a ground-truth uncertainty of the queries
    REFERENCE = "reference"
    #: a second, in-distribution set (held-out upstream images: embeddings, labels, ``u``)
    ID_SET = "id_set"
    #: an ``images -> u`` function and the images of URL's crop test
    CROP = "crop"


#: The note of a metric whose input is missing (``None``: an optional extra, silently absent).
MISSING: dict[Need, str | None] = {
    Need.NEIGHBOURS: None,
    Need.UNCERTAINTY: "no uncertainties (give `uncertainties` or `samples`)",
    Need.SAMPLES: "no samples (these metrics need posterior draws; docs: Concepts > Metrics)",
    Need.OOD: "no `ood_uncertainties`",
    Need.REFERENCE: None,
    Need.ID_SET: None,
    Need.CROP: None,
}


@dataclass
class EvalContext:
    """The validated inputs of one evaluation and what the one search found.

    Array attributes hold **this rank's rows** under a sharded evaluation (one process: all
    rows); ``u`` and ``labels_all`` are every rank's, gathered once.

    Attributes
    ----------
    x : Tensor
        ``[n_r, D]`` query embeddings (the samples' normalised mean when none were given).
    y : Tensor
        ``[n_r]`` labels.
    u : Tensor or None
        ``[N]`` uncertainties of every query (gathered).
    samples, resultant : Tensor or None
        ``[S, n_r, D]`` draws and their ``[n_r, D]`` mean resultant.
    ood_u, reference, id_x, id_y, id_u : Tensor or None
        The optional inputs of :func:`~bayesurl.evaluation.evaluate` (this rank's rows).
    predict_uncertainty : callable or None
        ``images -> u`` of URL's crop test; ``crop_images`` its ``[M, C, H, W]`` images (the
        same on every rank).
    shards : Shards
        Row layout of the queries.
    options : dict
        The evaluation's settings (``ks``, ``map_ks``, ``n_bins``, ``ece_mode``, ...).
    neighbors : Tensor or None
        ``[n_r, k]`` global neighbour ids of the one search (after the search).
    notes : list of str
        Why a metric is ``None``, and what the evaluation chose.
    evidence : dict
        What each key's interval is computed from (:meth:`keep`).
    """

    x: Tensor
    y: Tensor
    u: Tensor | None
    samples: Tensor | None
    resultant: Tensor | None
    ood_u: Tensor | None
    reference: Tensor | None
    id_x: Tensor | None
    id_y: Tensor | None
    id_u: Tensor | None
    predict_uncertainty: Callable[[Tensor], Tensor] | None
    crop_images: Tensor | None
    shards: Shards
    group: dist.ProcessGroup | None
    options: dict[str, Any]
    neighbors: Tensor | None = None
    notes: list[str] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)

    def keep(self, key: str, evidence: Evidence) -> None:
        """Keep what the interval of ``key`` is computed from (every rank the same: the
        gathered per-query data), as its metric's ``interval`` declares."""
        self.evidence[key] = evidence

    @property
    def n(self) -> int:
        """Number of queries over all ranks."""
        return self.shards.n

    def has(self, need: Need) -> bool:
        """Whether the input ``need`` is there."""
        present = {
            Need.NEIGHBOURS: True,
            Need.UNCERTAINTY: self.u is not None,
            Need.SAMPLES: self.samples is not None,
            Need.OOD: self.ood_u is not None,
            Need.REFERENCE: self.reference is not None,
            Need.ID_SET: self.id_x is not None,
            Need.CROP: self.crop_images is not None,
        }
        return present[need]

    @functools.cached_property
    def labels_all(self) -> Tensor:
        """``[N]`` labels of every row, on the embeddings' device (collective)."""
        return self.shards.gather(self.y.to(self.x.device))

    @functools.cached_property
    def hits(self) -> Tensor:
        """``[n_r, k]`` whether each neighbour of this rank's queries shares its label."""
        assert self.neighbors is not None
        labels = self.labels_all
        return labels[self.neighbors] == self.y.to(labels.device)[:, None]

    @functools.cached_property
    def correct(self) -> Tensor:
        """``[N]`` R@1 correctness of every query (gathered; collective)."""
        return self.shards.gather(self.hits[:, 0].contiguous())

    def gather_rows(self, local: Tensor | None) -> Tensor | None:
        """Every rank's rows of a per-rank input of its own length (collective)."""
        if local is None or not self.shards.active:
            return local
        return Shards.of(local.shape[0], local.device, self.group).gather(local)


#: ``ctx -> neighbours wanted from the one search`` (0: none)
NeighboursFn = Callable[[EvalContext], int]
#: ``ctx -> {key: value}``
ComputeFn = Callable[[EvalContext], dict[str, Any]]


@dataclass(frozen=True)
class Column:
    """How one result key of a metric is shown.

    Parameters
    ----------
    key : str
        The result key (``"r_auroc"``).
    title : str
        Its title in tables and plots (``"R-AUROC"``).
    digits : int
        Decimals shown.
    higher_is_better : bool
        The direction of the number (an ECE is better lower).
    shown : bool
        A column of the tables; otherwise only kept and aggregated (JSON / CSV).
    always : bool
        Present in every result of :func:`~bayesurl.evaluation.evaluate` (``None`` when not
        computed).
    """

    key: str
    title: str
    digits: int = 3
    higher_is_better: bool = True
    shown: bool = True
    always: bool = False

    def format(self, value: float | None) -> str:
        """``value`` with :attr:`digits` decimals (``"n/a"`` for ``None``)."""
        return "n/a" if value is None else f"{value:.{self.digits}f}"

    def best(self, values: Iterable[float | None]) -> float | None:
        """The best of ``values`` in the column's direction (``None``: no value)."""
        have = [v for v in values if v is not None]
        if not have:
            return None
        return max(have) if self.higher_is_better else min(have)

    def as_dict(self) -> dict[str, Any]:
        """The column as plain data (the HTML report's script formats with it)."""
        return {
            "key": self.key,
            "title": self.title,
            "digits": self.digits,
            "higher_is_better": self.higher_is_better,
        }


@dataclass(frozen=True)
class Metric:
    """One entry of the metric table.

    Parameters
    ----------
    name : str
        Name for ``include`` / ``exclude``.
    keys : callable
        ``options -> result keys`` the metric writes (all ``None`` when an input is missing).
    needs : tuple of Need
        Inputs it reads, in the order their absence is reported.
    compute : callable
        ``EvalContext -> {key: value}``; may append to ``ctx.notes``.
    neighbours : callable, optional
        ``EvalContext -> k``: neighbours it wants from the one search (only called when its
        inputs are there, before the search). Metrics reading ``ctx.neighbors`` need
        ``Need.NEIGHBOURS``.
    default : bool
        Selected when ``include`` is not given.
    columns : tuple of Column
        How its keys are shown (a key without a column is kept in results, not displayed).
    interval : IntervalMethod or mapping, optional
        How the interval of its keys is estimated: one
        :class:`~bayesurl.stats.intervals.IntervalMethod` for every key of ``keys``, or
        ``{key: IntervalMethod}``; ``None``: no interval. ``compute`` keeps the matching
        evidence for each key it gives a value (``ctx.keep(key, Proportion(hits))``).
    """

    name: str
    keys: Callable[[dict[str, Any]], tuple[str, ...]]
    needs: tuple[Need, ...]
    compute: ComputeFn
    neighbours: NeighboursFn | None = None
    default: bool = True
    columns: tuple[Column, ...] = ()
    interval: IntervalMethod | Mapping[str, IntervalMethod] | None = None

    def interval_for(self, key: str, options: dict[str, Any]) -> IntervalMethod | None:
        """The declared interval method of the result key ``key`` (``None``: none)."""
        if isinstance(self.interval, IntervalMethod):
            return self.interval if key in self.keys(options) else None
        if self.interval is None:
            return None
        return self.interval.get(key)


#: The metric table, in the order the metrics run and report.
METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric, *, replace: bool = False) -> Metric:
    """Add ``metric`` to the table (at the end); ``replace`` an entry of the same name.

    Raises
    ------
    ValueError
        If the name is taken and ``replace`` is false, or ``metric`` is not a :class:`Metric`.
    """
    if not isinstance(metric, Metric):
        raise ValueError(f"`metric` must be a Metric, got {type(metric).__name__}")
    if metric.name in METRICS and not replace:
        raise ValueError(f"a metric named {metric.name!r} is already registered")
    METRICS[metric.name] = metric
    return metric


def unregister_metric(name: str) -> Metric:
    """Remove and return the metric ``name``.

    Raises
    ------
    ValueError
        For an unknown name.
    """
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; registered: {', '.join(METRICS)}")
    return METRICS.pop(name)


def metric_columns(*, shown: bool | None = None) -> list[Column]:
    """The columns of every registered metric, in table order.

    Parameters
    ----------
    shown : bool, optional
        ``True``: only the table columns; ``False``: only the kept-not-shown ones; ``None``:
        all.
    """
    return [c for m in METRICS.values() for c in m.columns if shown is None or c.shown == shown]


def metric_column(key: str, columns: Iterable[Column] | None = None) -> Column:
    """The column of the result key ``key`` among ``columns`` (default: :func:`metric_columns`):
    its title, digits and direction, declared once with its metric.

    Raises
    ------
    ValueError
        If no column has that key (naming the keys that have one).
    """
    cols = metric_columns() if columns is None else list(columns)
    for c in cols:
        if c.key == key:
            return c
    known = ", ".join(c.key for c in cols)
    raise ValueError(f"no metric declares a column for {key!r}; keys with one: {known}")


def always_keys() -> tuple[str, ...]:
    """The keys present in every result of :func:`~bayesurl.evaluation.evaluate`."""
    return tuple(c.key for c in metric_columns() if c.always)


def select_metrics(
    include: Iterable[str] | None,
    exclude: Iterable[str],
    options: dict[str, Any],
    *,
    also: Iterable[str] = (),
) -> list[Metric]:
    """The metrics of ``include`` (default: every default metric) and ``also``, minus
    ``exclude``, in table order. A name is a metric's name or one of the keys it writes
    (``"ause"`` selects the sparsification metric).

    Raises
    ------
    ValueError
        Naming an unknown name and the valid ones.
    """

    def resolve(names: Iterable[str] | str, arg: str) -> set[str]:
        if isinstance(names, str):
            raise ValueError(
                f"`{arg}` must be a sequence of metric names, got the string {names!r}"
            )
        out = set()
        for name in names:
            hit = [m.name for m in METRICS.values() if name == m.name or name in m.keys(options)]
            if not hit:
                valid = ", ".join(METRICS)
                raise ValueError(f"`{arg}`: unknown metric {name!r}; valid names: {valid}")
            out.add(hit[0])
        return out

    asked = None if include is None else resolve(include, "include")
    extra = resolve(also, "also")
    dropped = resolve(exclude, "exclude")
    for name in [] if isinstance(exclude, str) else exclude:
        metric = next(m for m in METRICS.values() if name == m.name or name in m.keys(options))
        keys = metric.keys(options)
        if name != metric.name and len(keys) > 1:
            # excluding one key would silently drop its siblings too
            raise ValueError(
                f"`exclude`: {name!r} is one key of the metric {metric.name!r} "
                f"({', '.join(keys)}); exclude drops whole metrics: name {metric.name!r}, "
                "or choose the cut-offs with `ks` / `map_ks`"
            )
    both = sorted((asked or set()) & dropped)
    if both:
        raise ValueError(
            f"`include` and `exclude` both name {', '.join(both)}: a metric is either computed "
            "or not; drop it from one of them"
        )
    if extra & dropped:
        raise ValueError(
            f"`exclude` drops {', '.join(sorted(extra & dropped))}, which the other options "
            "select (reference='lam' selects lam_ausc and lam_ece)"
        )
    chosen = {m.name for m in METRICS.values() if m.default} if asked is None else asked
    chosen = (chosen | extra) - dropped
    if not chosen:
        raise ValueError(
            "`include` / `exclude` select no metric: nothing would be computed (name at least "
            f"one of {', '.join(METRICS)})"
        )
    return [m for m in METRICS.values() if m.name in chosen]


def _f(x: Tensor) -> float:
    return float(x.detach().cpu())


def _np(x: Tensor) -> Any:
    """A tensor as a numpy array (float64 for floating point) for the intervals."""
    t = x.detach().cpu()
    return (t.double() if t.is_floating_point() else t).numpy()


# --------------------------------------------------------------------------- retrieval
def _r_at_1(ctx: EvalContext) -> dict[str, Any]:
    ctx.keep("r@1", Proportion(_np(ctx.correct)))
    return {"r@1": _f(ctx.correct.double().mean())}


def _recall(ctx: EvalContext) -> dict[str, Any]:
    ks = ctx.options["ks"]
    ok = [k for k in ks if k <= ctx.n - 1]
    flags = ctx.shards.gather(
        torch.stack([ctx.hits[:, :k].any(dim=1) for k in ok], dim=1)
        if ok
        else ctx.hits.new_zeros(ctx.hits.shape[0], 0)
    )
    out: dict[str, Any] = {}
    for k in ks:
        if k in ok:
            hit = flags[:, ok.index(k)].contiguous()
            out[f"recall@{k}"] = _f(hit.double().mean())
            ctx.keep(f"recall@{k}", Proportion(_np(hit)))
        else:
            out[f"recall@{k}"] = None
            ctx.notes.append(f"recall@{k}: undefined with only {ctx.n} points")
    return out


def _map(ctx: EvalContext) -> dict[str, Any]:
    map_ks = ctx.options["map_ks"]
    ok = [k for k in map_ks if k <= ctx.n - 1]
    sh, hits = ctx.shards, ctx.hits
    mates = Fm.class_mates(ctx.labels_all)[sh.offset : sh.offset + hits.shape[0]]
    aps = sh.gather(
        torch.stack([Fm.ap_from_hits(hits, mates, k) for k in ok], dim=1)
        if ok
        else torch.empty(hits.shape[0], 0, dtype=torch.float64, device=hits.device)
    )
    out: dict[str, Any] = {}
    for k in map_ks:
        if k in ok:
            ap = aps[:, ok.index(k)].contiguous()
            out[f"map@{k}"] = _f(ap.mean())
            ctx.keep(f"map@{k}", Resample(ctx.n, weighted_mean(_np(ap))))
        else:
            out[f"map@{k}"] = None
            ctx.notes.append(f"map@{k}: undefined with only {ctx.n} points")
    return out


def _map_at_r_keys(options: dict[str, Any]) -> tuple[str, ...]:
    base = ("map@r", "r_precision")
    return (*base, *(f"{k}_class_avg" for k in base)) if options.get("avg_of_avgs") else base


def _map_at_r(ctx: EvalContext) -> dict[str, Any]:
    """MAP@R and R-precision (Musgrave et al. 2020): from the one search when it kept every
    query's ``R`` neighbours (classes no larger than its ``k + 1``), else from their own
    chunked ranking of every query's ``R`` nearest items
    (:func:`~bayesurl.evaluation.functional.precision_at_r`), ``R`` being a class size."""
    keys = _map_at_r_keys(ctx.options)
    sh = ctx.shards
    mates = Fm.class_mates(ctx.labels_all)
    nb = ctx.neighbors
    if nb is not None and nb.shape[1] >= int(mates.max()):
        mine = mates[sh.offset : sh.offset + nb.shape[0]].to(ctx.hits.device)
        ap, rp = (sh.gather(v) for v in Fm.precision_at_r_from_hits(ctx.hits, mine))
    elif sh.active:
        ctx.notes.append(
            f"{', '.join(keys)}: not computed in a sharded evaluation with classes larger than "
            f"the search's k + 1 = {0 if nb is None else nb.shape[1] + 1} (each query would "
            "rank every row; run it in one process)"
        )
        return dict.fromkeys(keys)
    else:
        ap, rp = Fm.precision_at_r(ctx.x, ctx.y, memory_budget=ctx.options["memory_budget"])
    defined = ~torch.isnan(ap)
    if not bool(defined.any()):
        ctx.notes.append(f"{', '.join(keys)}: undefined, every query is alone in its class")
        return dict.fromkeys(keys)
    lone = int((~defined).sum())
    if lone:
        ctx.notes.append(
            f"map@r, r_precision: {lone} queries alone in their class left out (R = 0)"
        )
    y = _np(ctx.labels_all)[_np(defined)]
    out: dict[str, Any] = {}
    for key, per_query in (("map@r", ap), ("r_precision", rp)):
        v = _np(per_query[defined])
        out[key] = float(v.mean())
        ctx.keep(key, Resample(v.size, weighted_mean(v)))
        if ctx.options["avg_of_avgs"]:
            out[f"{key}_class_avg"] = _f(Fm.class_average(per_query, ctx.labels_all))
            ctx.keep(f"{key}_class_avg", Resample(v.size, weighted_class_mean(v, y)))
    return out


# --------------------------------------------------------------------------- uncertainty
def _u(ctx: EvalContext) -> Tensor:
    assert ctx.u is not None
    return ctx.u.to(ctx.correct.device)


def _r_auroc(ctx: EvalContext) -> dict[str, Any]:
    try:
        value = _f(Fm.r_auroc(_u(ctx), ctx.correct))
    except ValueError as exc:  # all queries correct or all wrong
        ctx.notes.append(f"r_auroc: {exc}")
        return {"r_auroc": None}
    u, c = _np(_u(ctx)), _np(ctx.correct)
    ctx.keep("r_auroc", TwoSamples(u[~c], u[c]))
    return {"r_auroc": value}


def _sparsification(ctx: EvalContext) -> dict[str, Any]:
    correct = ctx.correct
    removed, curve = Fm.sparsification_curve(_u(ctx), correct)
    oracle = Fm.oracle_curve(correct)
    out: dict[str, Any] = {"ausc": _f(curve.mean()), "ause": _f((oracle - curve).mean())}
    boot = Resample(ctx.n, weighted_sparsification(_np(_u(ctx)), _np(correct), curve.numel()))
    ctx.keep("ausc", boot)
    ctx.keep("ause", boot)
    if ctx.options["return_curves"]:
        out["sparsification"] = {
            "removed": removed.tolist(),
            "r@1": curve.tolist(),
            "oracle": oracle.tolist(),
        }
    return out


def _risk_coverage(ctx: EvalContext) -> dict[str, Any]:
    """AURC (Geifman et al. 2019) and AUGRC (Traub et al. 2024) of the retrieval error."""
    u, correct = _u(ctx), ctx.correct
    boot = Resample(ctx.n, weighted_risk_coverage(_np(u), _np(correct)))
    ctx.keep("aurc", boot)
    ctx.keep("augrc", boot)
    return {"aurc": _f(Fm.aurc(u, correct)), "augrc": _f(Fm.augrc(u, correct))}


def _rank_correlation(ctx: EvalContext) -> dict[str, Any]:
    u = ctx.u
    assert u is not None and ctx.reference is not None
    ref = ctx.shards.gather(ctx.reference.to(u.device))
    rho = _f(Fm.rank_correlation(u, ref))
    ctx.keep("rank_correlation", Correlation(rho, ctx.n))
    return {"rank_correlation": rho}


def _ood(ctx: EvalContext) -> dict[str, Any]:
    """u(ood) against the in-distribution u: the id set's where given (docs/concepts/zero_shot.rst),
    else the queries'."""
    assert ctx.u is not None and ctx.ood_u is not None
    if ctx.id_x is not None and ctx.id_u is None:
        ctx.notes.append("ood_auroc, ood_auprc: the in-distribution set has no `id_uncertainties`")
        return {"ood_auroc": None, "ood_auprc": None}
    inside = ctx.u if ctx.id_u is None else ctx.gather_rows(ctx.id_u)
    assert inside is not None
    v = ctx.gather_rows(ctx.ood_u.to(inside.device))
    assert v is not None
    if v.numel() == 0:
        raise ValueError("`ood_uncertainties` is empty on every rank")
    inside = inside.to(v.device)
    over = "queries and OOD inputs" if ctx.id_u is None else "held-out and OOD inputs"
    a, b = _np(inside), _np(v)
    ctx.keep("ood_auroc", TwoSamples(b, a, over))
    auprc = _f(Fm.ood_auprc(inside, v))
    ctx.keep("ood_auprc", Rate(auprc, b.size, a.size + b.size, over))
    return {"ood_auroc": _f(Fm.ood_auroc(inside, v)), "ood_auprc": auprc}


# --------------------------------------------------------------------------- ECE
def _ece_neighbours(ctx: EvalContext) -> int:
    """The ECE's shortlist, served by the one search when the queries are the samples' mean
    (:func:`~bayesurl.search.choose_shortlist` picks its length from a pilot)."""
    o, s, res_s = ctx.options, ctx.samples, ctx.resultant
    assert s is not None and res_s is not None
    Fm.check_n_bins(o["n_bins"])  # before the search, not after it
    plan = {"mode": o["ece_mode"], "shortlist": o["shortlist"], "info": {}}
    ctx.shared["ece"] = plan
    share = o["ece_mode"] == "shortlist" and o["x_is_mean"]
    if share and plan["shortlist"] is None:
        tol = o["tolerance"]
        plan["shortlist"], plan["info"] = Sm.choose_shortlist(
            s, tolerance=tol, memory_budget=o["memory_budget"], resultant=res_s,
            shards=ctx.shards,
        )  # fmt: skip
        if plan["info"]["miss_rate"] > tol:
            # no affordable shortlist keeps the per-draw neighbours exact enough: search each
            # draw exactly rather than report an ECE from wrong neighbours
            ctx.notes.append(_exact_fallback_note(plan["shortlist"], plan["info"], tol))
            plan.update(mode="exact", shortlist=None, info={})
            share = False
    plan["share"] = share
    return int(plan["shortlist"] or 0) if share else 0


def _exact_fallback_note(shortlist: int, pilot: dict[str, float], tol: float) -> str:
    """The note of an ECE whose shortlist missed more than ``tol`` of the pilot's per-draw
    neighbours and that searched every draw exactly instead (``ece_shortlist*`` absent)."""
    return (
        f"ece: the largest shortlist ({shortlist}) misses an estimated {pilot['miss_rate']:.2%} "
        f"of per-draw neighbours (> tolerance {tol}); searched every draw exactly"
    )


def _ece(ctx: EvalContext) -> dict[str, Any]:
    s, o, sh = ctx.samples, ctx.options, ctx.shards
    assert s is not None
    plan = ctx.shared["ece"]
    info = plan["info"]
    search = Sm.DrawSearch(
        mode=plan["mode"], shortlist=plan["shortlist"], tolerance=o["tolerance"],
        margin=info.get("margin") if plan["share"] else None, memory_budget=o["memory_budget"],
        progress=o["progress"],
    )  # fmt: skip
    nb_draws = Sm.neighbors_per_draw(
        s, search, candidates=ctx.neighbors if plan["share"] else None, info=info,
        resultant=ctx.resultant, shards=sh,
    )  # fmt: skip
    nb_draws = sh.gather(nb_draws.T.contiguous()).T  # [S, N] global ids
    ece = Fm.ece_from_neighbors(nb_draws, ctx.labels_all.to(s.device), s.shape[0], o["n_bins"])
    out: dict[str, Any] = {"ece": _f(ece.ece)}
    # the bootstrap reweighs each query's (confidence, correct) pair: no draw is searched again
    stat = weighted_ece(_np(ece.confidence), _np(ece.correct), o["n_bins"])
    ctx.keep("ece", Resample(ctx.n, stat))
    if info.get("fallback_exact"):
        # the search's own pilot (queries other than the mean embedding) found no shortlist
        # within the tolerance and searched every draw exactly: report the exact pass, not the
        # rejected shortlist and its miss rate
        ctx.notes.append(
            _exact_fallback_note(int(info["rejected_shortlist"]), info, o["tolerance"])
        )
    elif plan["mode"] == "shortlist":
        out["ece_shortlist"] = int(info["shortlist"])
        if "miss_rate" in info:
            out["ece_shortlist_miss_rate"] = info["miss_rate"]
        if "kept_per_query" in info:
            out["ece_candidates_per_query"] = info["kept_per_query"]
    if o["return_curves"]:
        out["reliability"] = {
            "bin_edges": ece.bin_edges.tolist(),
            "confidence": ece.bin_confidence.tolist(),
            "accuracy": ece.bin_accuracy.tolist(),
            "count": ece.bin_count.tolist(),
        }
    return out


# --------------------------------------------------------------------------- LAM-code variants
def _lam_ausc(ctx: EvalContext) -> dict[str, Any]:
    s = ctx.samples
    assert s is not None
    return {"lam_ausc": lam_ausc(s.mean(dim=0), s.std(dim=0), ctx.y.to(s.device))}


def _lam_ece(ctx: EvalContext) -> dict[str, Any]:
    s = ctx.samples
    assert s is not None
    return {"lam_ece": lam_ece(s, ctx.y.to(s.device), ctx.options["n_bins"])}


# --------------------------------------------------------------------------- URL extras
def _mixed(ctx: EvalContext) -> dict[str, Any]:
    """URL App. C.5: the held-out upstream set is side ``a``, the queries side ``b``."""
    keys = ("mixed_r_auroc", "mixed_r@1")
    if ctx.id_u is None:
        ctx.notes.append(
            "mixed_r_auroc, mixed_r@1: the in-distribution set has no `id_uncertainties`"
        )
        return dict.fromkeys(keys)
    ea, ya, ua = (ctx.gather_rows(t) for t in (ctx.id_x, ctx.id_y, ctx.id_u))
    eb, yb = ctx.shards.gather(ctx.x), ctx.shards.gather(ctx.y.to(ctx.x.device))
    assert ea is not None and ya is not None and ua is not None and ctx.u is not None
    try:
        res = mixed_r_auroc(ea, ya, ua, eb, yb, ctx.u, seed=ctx.options["seed"])
    except ValueError as exc:  # R-AUROC undefined on the pooled queries
        ctx.notes.append(f"mixed_r_auroc: {exc}")
        return dict.fromkeys(keys)
    u, c = _np(res.u), _np(res.correct)
    ctx.keep("mixed_r_auroc", TwoSamples(u[~c], u[c], "pooled queries"))
    ctx.keep("mixed_r@1", Proportion(c, "pooled queries"))
    return {"mixed_r_auroc": _f(res.r_auroc), "mixed_r@1": _f(res.r_at_1)}


def _crop(ctx: EvalContext) -> dict[str, Any]:
    """URL section 4.5 / App. C.3 on ``crop_images`` (the same on every rank)."""
    assert ctx.predict_uncertainty is not None and ctx.crop_images is not None
    try:
        with torch.no_grad():
            res = crop_uncertainty_check(
                ctx.predict_uncertainty, ctx.crop_images, seed=ctx.options["seed"]
            )
    except ValueError as exc:  # e.g. an estimator with u only from its draws
        ctx.notes.append(f"crop_share, crop_spearman: {exc}")
        return {"crop_share": None, "crop_spearman": None}
    spear = None if res.spearman is None else _f(res.spearman)
    m = int(res.u_full.numel())
    ctx.keep("crop_share", Proportion(_np(res.u_crop > res.u_full), "crop images"))
    if spear is not None:
        ctx.keep("crop_spearman", Correlation(spear, m, "crop images"))
    return {"crop_share": _f(res.share), "crop_spearman": spear}


def _keys(*keys: str) -> Callable[[dict[str, Any]], tuple[str, ...]]:
    return lambda options: keys


def _register_builtin(entries: Sequence[Metric]) -> None:
    for metric in entries:
        register_metric(metric)


N, U, S = Need.NEIGHBOURS, Need.UNCERTAINTY, Need.SAMPLES
C = Column
W, D, Z, B = (
    IntervalMethod.WILSON, IntervalMethod.DELONG, IntervalMethod.FISHER_Z,
    IntervalMethod.BOOTSTRAP,
)  # fmt: skip
_register_builtin(
    [
        Metric(
            "r@1", _keys("r@1"), (N,), _r_at_1, lambda ctx: 1,
            columns=(C("r@1", "R@1", always=True),), interval=W,
        ),
        Metric(
            "recall@k",
            lambda o: tuple(f"recall@{k}" for k in o["ks"]),
            (N,),
            _recall,
            lambda ctx: max(ctx.options["ks"]),
            interval=W,
        ),
        Metric(
            "r_auroc", _keys("r_auroc"), (N, U), _r_auroc, lambda ctx: 1,
            columns=(C("r_auroc", "R-AUROC", always=True),), interval=D,
        ),
        Metric(
            "ausc", _keys("ausc", "ause"), (N, U), _sparsification, lambda ctx: 1,
            columns=(
                C("ausc", "AUSC", always=True),
                C("ause", "AUSE", higher_is_better=False, shown=False, always=True),
            ),
            interval=B,
        ),
        Metric(
            "aurc", _keys("aurc", "augrc"), (N, U), _risk_coverage, lambda ctx: 1,
            columns=(
                C("aurc", "AURC", higher_is_better=False, shown=False),
                C("augrc", "AUGRC", higher_is_better=False, shown=False),
            ),
            interval=B,
        ),
        Metric(
            "rank_correlation", _keys("rank_correlation"), (Need.REFERENCE, U), _rank_correlation,
            interval=Z,
        ),
        Metric(
            "ece", _keys("ece"), (S,), _ece, _ece_neighbours,
            columns=(C("ece", "ECE", higher_is_better=False, always=True),), interval=B,
        ),
        Metric(
            "ood_auroc", _keys("ood_auroc", "ood_auprc"), (Need.OOD, U), _ood,
            columns=(
                C("ood_auroc", "OOD AUROC", always=True),
                C("ood_auprc", "OOD AUPRC", shown=False, always=True),
            ),
            interval={"ood_auroc": D, "ood_auprc": IntervalMethod.LOGIT},
        ),
        Metric(
            "map@k",
            lambda o: tuple(f"map@{k}" for k in o["map_ks"]),
            (N,),
            _map,
            lambda ctx: max(ctx.options["map_ks"]),
            columns=(C("map@5", "mAP@5", always=True),),
            interval=B,
        ),
        # its own ranking of R neighbours per query costs about one more search: asked for
        Metric(
            "map@r", _map_at_r_keys, (), _map_at_r, default=False,
            columns=(
                C("map@r", "MAP@R", shown=False),
                C("r_precision", "R-precision", shown=False),
            ),
            interval=B,
        ),
        # the LAM authors' code as it computes them, kept for comparison: no interval
        Metric("lam_ausc", _keys("lam_ausc"), (S,), _lam_ausc, default=False),
        Metric("lam_ece", _keys("lam_ece"), (S,), _lam_ece, default=False),
        Metric(
            "mixed_r_auroc", _keys("mixed_r_auroc", "mixed_r@1"), (Need.ID_SET, U), _mixed,
            columns=(C("mixed_r_auroc", "mixed R-AUROC"),),
            interval={"mixed_r_auroc": D, "mixed_r@1": W},
        ),
        Metric(
            "crop_share", _keys("crop_share", "crop_spearman"), (Need.CROP, U), _crop,
            columns=(C("crop_share", "crop share"),),
            interval={"crop_share": W, "crop_spearman": Z},
        ),
    ]
)  # fmt: skip
del N, U, S, C, W, D, Z, B
