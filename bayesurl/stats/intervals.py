"""Intervals of one evaluation's metrics: how far each number could move with other queries.

Every metric of :func:`bayesurl.evaluation.evaluate` is an average over the queries (and, for
the OOD metrics, over the OOD inputs) of one run. Drawn again from the same population, those
would give another number; the interval says how far (docs/concepts/metrics.rst, "Intervals").
A metric declares its interval **once**, on its entry of the metric table
(:class:`bayesurl.evaluation.table.Metric`, ``interval=``), as one :class:`IntervalMethod`, and
its ``compute`` keeps the per-unit data the interval needs (:class:`Evidence`) under its key
(``ctx.keep(key, evidence)``). The estimators, all treating the units as independent draws:

- :attr:`IntervalMethod.WILSON` -- a proportion (R@1, recall@k, the crop test's share): the
  Wilson score interval (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it over the Wald
  interval for its coverage near 0 and 1). Evidence: :class:`Proportion`.
- :attr:`IntervalMethod.DELONG` -- an AUROC (R-AUROC, OOD AUROC, mixed R-AUROC): DeLong,
  DeLong & Clarke-Pearson (1988) variance of the Mann-Whitney statistic from its structural
  components, in the midrank form of Sun & Xu (2014, O(N log N)), the interval taken on the
  logit scale and mapped back (Pepe 2003, section 5.2.3), so it stays inside (0, 1) and keeps
  its coverage near the ends. Evidence: :class:`TwoSamples`.
- :attr:`IntervalMethod.FISHER_Z` -- a Spearman correlation: Fisher's z with the variance
  ``(1 + rho^2 / 2) / (n - 3)`` of Bonett & Wright (2000). Evidence: :class:`Correlation`.
- :attr:`IntervalMethod.LOGIT` -- an average precision (OOD AUPRC): Boyd, Eng & Page (2013)'s
  logit interval, ``logit(AP) +- z / sqrt(n AP (1 - AP))`` with ``n`` the positives.
  Evidence: :class:`Rate`.
- :attr:`IntervalMethod.BOOTSTRAP` -- anything else (AUSC / AUSE, mAP@k, the ECE):
  the percentile interval (Efron & Tibshirani 1993, section 13.3) of the Poisson bootstrap
  (Hanley & MacGibbon 2006; Chamandy et al. 2012): each replicate weighs every unit with a
  Poisson(1) count and recomputes the statistic from the **same** per-unit data -- the
  sparsification curve from one fixed sort as a weighted cumulative sum, the ECE from each
  query's fixed (confidence, correct) pair -- so a replicate costs O(N) and the sampling-aware
  ECE never searches again. Evidence: :class:`Resample`. A percentile bound on the wrong side
  of the estimate (a biased statistic such as the ECE) is moved to the estimate.

The replicates come from one seeded generator per unit count, so an evaluation is
deterministic, and a sharded one (every rank holds the gathered per-query data) gives every
rank the intervals of the single process. :func:`paired_bootstrap` compares two estimators on
the same queries (their errors differ, so DeLong's test of two AUROCs on one labelling does not
apply): it resamples the query indices jointly and recomputes both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from functools import partial
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_REPLICATES",
    "Correlation",
    "Evidence",
    "Interval",
    "IntervalMethod",
    "Proportion",
    "Rate",
    "Resample",
    "TwoSamples",
    "auroc_interval",
    "check_interval_options",
    "delong",
    "fisher_z_interval",
    "flat_intervals",
    "format_interval",
    "interval_lines",
    "intervals_of",
    "logit_interval",
    "paired_bootstrap",
    "percentile_interval",
    "poisson_weights",
    "read_interval",
    "weighted_auroc",
    "weighted_class_mean",
    "weighted_average_precision",
    "weighted_ece",
    "weighted_mean",
    "weighted_risk_coverage",
    "weighted_sparsification",
    "wilson_interval",
]

#: Confidence level of the intervals unless an evaluation asks for another.
DEFAULT_LEVEL = 0.95
#: Bootstrap replicates unless an evaluation asks for another number.
DEFAULT_REPLICATES = 1000
#: Weights held in one block of replicates (``[b, N]`` float32, b = this // N): about 16 MB.
BLOCK_WEIGHTS = 2**22


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + float(level) / 2.0)


class Interval(NamedTuple):
    """A ``level`` confidence interval of one metric (a named tuple: ``json.dumps`` writes it
    as the list ``[low, high, level, method, n, over]``; :func:`flat_intervals` as named
    fields).

    Attributes
    ----------
    low, high : float
        The bounds (``low <= estimate <= high``).
    level : float
        Its confidence level (0.95).
    method : str
        The estimator: ``"wilson"``, ``"delong"``, ``"fisher_z"``, ``"bootstrap"`` (over one
        run's units), or ``"t"`` (Student-t over runs, class splits or seeds).
    n : int
        The independent units it counts: queries (plus OOD inputs for the OOD metrics),
        crop images, pooled queries, or runs / splits for ``"t"``.
    over : str
        What those units are, in words (``"queries"``, ``"queries and OOD inputs"``).
    """

    low: float
    high: float
    level: float
    method: str
    n: int
    over: str = "queries"

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in ``[low, high]``."""
        return self.low <= float(value) <= self.high

    @property
    def half_width(self) -> float:
        """``(high - low) / 2``."""
        return (self.high - self.low) / 2.0

    def describe(self) -> str:
        """``"95 % Wilson interval over 1000 queries"``."""
        name = METHOD_NAMES.get(self.method, self.method)
        return f"{100 * self.level:g} % {name} interval over {self.n} {self.over}"

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON)."""
        return {
            "low": self.low,
            "high": self.high,
            "level": self.level,
            "method": self.method,
            "n": self.n,
            "over": self.over,
        }


#: The estimators' names in words (tables, footnotes, hovers).
METHOD_NAMES = {
    "wilson": "Wilson",
    "delong": "DeLong",
    "fisher_z": "Fisher-z",
    "logit": "logit (Boyd et al.)",
    "bootstrap": "bootstrap",
    "t": "Student-t",
}


# --------------------------------------------------------------------------- evidence
@dataclass(frozen=True)
class Proportion:
    """Per-unit success flags of a proportion (R@1: each query's nearest neighbour right)."""

    hits: np.ndarray
    over: str = "queries"


@dataclass(frozen=True)
class TwoSamples:
    """The scores of an AUROC's positives and negatives: ``AUROC = P(pos > neg) + P(=) / 2``."""

    pos: np.ndarray
    neg: np.ndarray
    over: str = "queries"


@dataclass(frozen=True)
class Correlation:
    """A correlation ``rho`` of ``n`` pairs."""

    rho: float
    n: int
    over: str = "queries"


@dataclass(frozen=True)
class Rate:
    """An average precision ``value`` over ``n`` positives among ``units`` units."""

    value: float
    n: int
    units: int
    over: str = "queries"


@dataclass(frozen=True, eq=False)
class Resample:
    """A statistic of ``n`` units recomputed under bootstrap weights.

    Attributes
    ----------
    n : int
        Units.
    statistic : callable
        ``weights [b, n] float64 -> {key: [b] values}`` (all-ones weights: the estimates); one
        statistic may serve several keys (AUSC and AUSE share their sort).
    over : str
        What the units are.
    """

    n: int
    statistic: Callable[[np.ndarray], Mapping[str, np.ndarray]]
    over: str = "queries"


#: What a metric's ``compute`` keeps for the interval of one key.
Evidence = Proportion | TwoSamples | Correlation | Rate | Resample


class IntervalMethod(str, Enum):
    """How a metric's interval is estimated (declared on its entry of the metric table)."""

    WILSON = "wilson"
    DELONG = "delong"
    FISHER_Z = "fisher_z"
    LOGIT = "logit"
    BOOTSTRAP = "bootstrap"

    @property
    def evidence(self) -> type:
        """The :class:`Evidence` type its metric keeps."""
        return {
            IntervalMethod.WILSON: Proportion,
            IntervalMethod.DELONG: TwoSamples,
            IntervalMethod.FISHER_Z: Correlation,
            IntervalMethod.LOGIT: Rate,
            IntervalMethod.BOOTSTRAP: Resample,
        }[self]

    @property
    def title(self) -> str:
        """Its name in words (``"Wilson"``)."""
        return METHOD_NAMES[self.value]


# --------------------------------------------------------------------------- estimators
def wilson_interval(successes: int, n: int, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Wilson (1927) score interval of a proportion ``successes / n``.

    ``(p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``; it holds its coverage
    near 0 and 1 where the Wald interval does not (Brown, Cai & DasGupta 2001).

    Raises
    ------
    ValueError
        For ``n < 1`` or ``successes`` outside ``[0, n]``.
    """
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"`successes` must lie in [0, n] with n >= 1, got {successes}, {n}")
    z = _z(level)
    p = successes / n
    den = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z / den * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # the bounds hold p exactly (at k = 0 or n the rounding of centre - half may not)
    return min(max(0.0, centre - half), p), max(min(1.0, centre + half), p)


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties at their average rank."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    start = np.flatnonzero(np.concatenate([[True], xs[1:] != xs[:-1]]))
    end = np.append(start[1:], x.size)
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat((start + end + 1) / 2.0, end - start)
    return ranks


def delong(pos: np.ndarray, neg: np.ndarray) -> tuple[float, float]:
    """AUROC ``P(pos > neg) + P(pos = neg) / 2`` and DeLong's variance of it.

    The structural components of DeLong, DeLong & Clarke-Pearson (1988) from midranks (Sun &
    Xu 2014): ``V10_i = (R_i - R^pos_i) / n_neg`` (the share of negatives below positive
    ``i``), ``V01_j = 1 - (R_j - R^neg_j) / n_pos``, and
    ``var = s^2(V10) / n_pos + s^2(V01) / n_neg`` (sample variances, ddof 1; a side with one
    element contributes 0).

    Raises
    ------
    ValueError
        If either side is empty.
    """
    p = np.asarray(pos, dtype=np.float64).reshape(-1)
    q = np.asarray(neg, dtype=np.float64).reshape(-1)
    m, n = p.size, q.size
    if m < 1 or n < 1:
        raise ValueError(f"an AUROC needs positives and negatives, got {m} and {n}")
    both = _midranks(np.concatenate([p, q]))
    v10 = (both[:m] - _midranks(p)) / n
    v01 = 1.0 - (both[m:] - _midranks(q)) / m
    auc = float(v10.mean())
    var = (v10.var(ddof=1) / m if m > 1 else 0.0) + (v01.var(ddof=1) / n if n > 1 else 0.0)
    return auc, float(var)


def auroc_interval(
    pos: np.ndarray, neg: np.ndarray, level: float = DEFAULT_LEVEL
) -> tuple[float, float, float]:
    """``(auroc, low, high)``: DeLong's variance (:func:`delong`) on the logit scale.

    ``logit(A) +- z se / (A (1 - A))`` mapped back (Pepe 2003, section 5.2.3): inside (0, 1)
    and asymmetric towards the nearer end. An AUROC of exactly 0 or 1 (perfect separation)
    has no logit: its interval reaches from the estimate by ``z se`` on the plain scale (0
    wide when DeLong's variance is 0).
    """
    auc, var = delong(pos, neg)
    z, se = _z(level), math.sqrt(max(var, 0.0))
    if 0.0 < auc < 1.0:
        lg, s = math.log(auc / (1 - auc)), se / (auc * (1 - auc))
        lo, hi = 1 / (1 + math.exp(-(lg - z * s))), 1 / (1 + math.exp(-(lg + z * s)))
    else:
        lo, hi = max(0.0, auc - z * se), min(1.0, auc + z * se)
    return auc, min(lo, auc), max(hi, auc)


def fisher_z_interval(rho: float, n: int, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Interval of a Spearman correlation of ``n`` pairs: ``tanh(atanh(rho) +- z se)`` with
    ``se^2 = (1 + rho^2 / 2) / (n - 3)`` (Bonett & Wright 2000); ``(-1, 1)`` for ``n <= 3``."""
    r = float(rho)
    if n <= 3:
        return -1.0, 1.0
    if abs(r) >= 1.0:
        return r, r
    se = math.sqrt((1.0 + r * r / 2.0) / (n - 3))
    z = _z(level)
    return math.tanh(math.atanh(r) - z * se), math.tanh(math.atanh(r) + z * se)


def _poisson_table() -> np.ndarray:
    """``[65536]`` uint8: a 16-bit uniform's Poisson(1) count by the inverse CDF (each
    probability within 2^-16 of Poisson(1)'s; counts above 7 have less than 2^-16 and are
    never drawn)."""
    k = np.arange(20)
    pmf = np.exp(-1.0) / np.array([math.factorial(int(i)) for i in k], dtype=np.float64)
    edges = np.round(np.cumsum(pmf) * 65536).astype(np.int64)
    return np.searchsorted(edges, np.arange(65536), side="right").astype(np.uint8)


_POISSON = _poisson_table().astype(np.float32)  # looked up straight into float32


def _block_rows(n: int, replicates: int) -> int:
    return int(min(max(BLOCK_WEIGHTS // max(n, 1), 1), replicates))


def logit_interval(value: float, n: int, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Boyd, Eng & Page (2013)'s logit interval of an average precision over ``n`` positives:
    ``expit(logit(AP) +- z / sqrt(n AP (1 - AP)))``; ``(AP, AP)`` at 0 or 1, ``(0, 1)``
    without positives."""
    a = float(value)
    if n < 1:
        return 0.0, 1.0
    if not 0.0 < a < 1.0:
        return a, a
    lg, s = math.log(a / (1 - a)), _z(level) / math.sqrt(n * a * (1 - a))
    return 1 / (1 + math.exp(-(lg - s))), 1 / (1 + math.exp(-(lg + s)))


def poisson_block(n: int, rows: int, seed: int, block: int, stream: int = 0) -> np.ndarray:
    """Block ``block`` of the Poisson(1) bootstrap weights of ``n`` units: ``[rows, n]``
    float32 from its own generator (PCG64 seeded with ``(seed, n, stream, block)``), so blocks
    can be drawn in any order, on any thread. Its 16-bit uniforms become Poisson(1) counts
    through a table of the inverse CDF (a tenth of the cost of drawing Poisson variates)."""
    rng = np.random.default_rng([int(seed), int(n), int(stream), int(block)])
    words = -(-rows * n // 4)  # 64-bit words holding rows * n 16-bit uniforms
    bits = rng.bit_generator.random_raw(words).view(np.uint16)[: rows * n]
    return _POISSON[bits].reshape(rows, n)


def poisson_weights(
    n: int, replicates: int, seed: int, stream: int = 0, rows: int | None = None
) -> Iterator[np.ndarray]:
    """The Poisson(1) bootstrap weights of ``n`` units (:func:`poisson_block`): ``replicates``
    rows in blocks of ``rows`` (default: about :data:`BLOCK_WEIGHTS` weights a block).
    The same ``(n, seed, stream, rows)`` give the same weights, so every metric of one call
    over the same units sees the same resamples."""
    rows = _block_rows(n, replicates) if rows is None else int(rows)
    for i, start in enumerate(range(0, replicates, rows)):
        yield poisson_block(n, min(rows, replicates - start), seed, i, stream)


def percentile_interval(
    values: np.ndarray, estimate: float, level: float = DEFAULT_LEVEL
) -> tuple[float, float]:
    """The ``level`` percentile interval of bootstrap ``values`` (NaN replicates dropped),
    widened to hold ``estimate`` (Efron & Tibshirani 1993, section 13.3)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float(estimate), float(estimate)
    tail = (1.0 - float(level)) / 2.0
    lo, hi = np.quantile(v, [tail, 1.0 - tail])
    return min(float(lo), float(estimate)), max(float(hi), float(estimate))


# --------------------------------------------------------------------------- weighted statistics
class _Mean:
    """``w -> sum(w v) / sum(w)`` per replicate; the bootstrap stacks every mean of one unit
    count into one matrix product."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, dtype=np.float64).reshape(-1)

    def __call__(self, w: np.ndarray) -> np.ndarray:
        v = self.values.astype(np.float32) if w.dtype == np.float32 else self.values
        with np.errstate(invalid="ignore", divide="ignore"):
            return (w @ v) / w.sum(axis=1, dtype=np.float64)


def weighted_mean(values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``w -> sum(w v) / sum(w)`` per replicate (the mean of per-unit values)."""
    return _Mean(values)


def _sparsification_levels(total: np.ndarray, n_levels: int) -> np.ndarray:
    """``ceil(r_j * total)`` for the retention levels ``r_j = (L - j) / L`` (integers)."""
    j = np.arange(n_levels)
    return ((n_levels - j)[None, :] * total[:, None] + n_levels - 1) // n_levels


#: Units per block of the blocked prefix sums (numpy's running sum is a sequential loop;
#: sums over short blocks and a running sum over the blocks cost a fraction of it).
_BLOCK = 64


def _prefix_at(x: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``[b, len(at)]`` running sums of the rows of ``[b, n]`` ``x`` at the units ``at``
    (inclusive): sums within blocks of :data:`_BLOCK` units plus the sum of the blocks before."""
    b, n = x.shape
    pad = -n % _BLOCK
    if pad:
        x = np.concatenate([x, np.zeros((b, pad), dtype=x.dtype)], axis=1)
    blocks = x.reshape(b, -1, _BLOCK)
    inner = np.cumsum(blocks, axis=2).reshape(b, -1)  # exact: integer weights below 2^24
    before = np.cumsum(blocks.sum(axis=2, dtype=np.float64), axis=1)
    before = np.concatenate([np.zeros((b, 1)), before[:, :-1]], axis=1)
    return before[:, at // _BLOCK] + np.take(inner, at, axis=1)


def weighted_sparsification(
    u: np.ndarray, correct: np.ndarray, n_levels: int = 100
) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
    """``w -> {"ausc", "ause"}`` of the weighted queries, from one fixed sort of ``u``.

    The replicate holds query ``i`` ``w_i`` times (integer weights). Sorted by ``u`` (stable,
    as :func:`~bayesurl.evaluation.functional.sparsification_curve`), the kept
    ``ceil(r W)`` copies of level ``r`` end in the block whose running weight reaches them
    and, inside it, at the unit whose does; its correct count is the weighted hits before
    it: O(N) per replicate, no re-sort. All-ones weights give
    :func:`~bayesurl.evaluation.functional.ausc` / ``ause`` exactly.
    """
    order = np.argsort(np.asarray(u, dtype=np.float64), kind="stable")
    c = np.asarray(correct, dtype=bool).reshape(-1)[order]
    n = c.size
    # the block search costs n / size per replicate, the search inside a block L * size
    size = 16 if n < 16_384 else _BLOCK
    nb = -(-n // size)
    # the sorted order padded to whole blocks (the padding's weights are set to 0)
    padded = np.concatenate([order, np.full(nb * size - n, order[-1])])
    cf = np.concatenate([c, np.zeros(nb * size - n, bool)]).astype(np.float32)
    cb = cf.reshape(nb, size)
    tail = n - (nb - 1) * size

    def stat(w: np.ndarray) -> dict[str, np.ndarray]:
        b = w.shape[0]
        wo = np.take(w, padded, axis=1).reshape(b, nb, size)
        wo[:, -1, tail:] = 0
        cw = np.cumsum(wo.sum(axis=2).astype(np.float64), axis=1)
        cc = np.cumsum(np.einsum("bns,ns->bn", wo, cb).astype(np.float64), axis=1)
        total = np.rint(cw[:, -1]).astype(np.int64)
        kept = _sparsification_levels(total, n_levels)  # [b, L] copies kept
        # the block whose running weight first reaches `kept`, and the weight before it
        j = np.stack([np.searchsorted(cw[r], kept[r], side="left") for r in range(b)])
        j = np.minimum(j, nb - 1)
        rows = np.arange(b)[:, None]
        w0 = np.where(j > 0, cw[rows, j - 1], 0.0)
        c0 = np.where(j > 0, cc[rows, j - 1], 0.0)
        # inside that block: the unit whose running weight first reaches `kept`
        lw = wo[rows, j]  # [b, L, size]
        lc = lw * cb[j]
        run_w = w0[..., None] + np.cumsum(lw, axis=2, dtype=np.float64)
        t = np.argmax(run_w >= kept[..., None], axis=2)[..., None]
        before_w = (
            np.take_along_axis(run_w, t, axis=2)[..., 0] - np.take_along_axis(lw, t, 2)[..., 0]
        )
        run_c = c0[..., None] + np.cumsum(lc, axis=2, dtype=np.float64)
        before_c = (
            np.take_along_axis(run_c, t, axis=2)[..., 0] - np.take_along_axis(lc, t, 2)[..., 0]
        )
        hit = cf[np.minimum(j * size + t[..., 0], nb * size - 1)]
        hits = before_c + (kept - before_w) * hit
        with np.errstate(invalid="ignore", divide="ignore"):
            curve = hits / kept
            oracle = np.minimum(kept, cc[:, -1][:, None]) / kept
        ausc = curve.mean(axis=1)
        ause = (oracle - curve).mean(axis=1)
        bad = total < 1
        ausc[bad] = np.nan
        ause[bad] = np.nan
        return {"ausc": ausc, "ause": ause}

    return stat


def _groups(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable ascending order of ``s`` and the start of each run of equal values in it."""
    order = np.argsort(s, kind="stable")
    ss = s[order]
    starts = np.flatnonzero(np.concatenate([[True], ss[1:] != ss[:-1]]))
    return order, starts


def weighted_auroc(scores: np.ndarray, positives: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``w -> AUROC`` of the weighted units (ties count 1/2), from one fixed sort.

    Per tie group ``g`` of the ascending scores: positive weight ``P_g``, negative weight
    ``N_g``, negative weight below ``B_g``; ``AUROC = sum_g P_g (B_g + N_g / 2) / (P N)``.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    pos = np.asarray(positives, dtype=bool).reshape(-1)
    order, starts = _groups(s)
    p = pos[order]

    def stat(w: np.ndarray) -> np.ndarray:
        wo = w[:, order].astype(np.float64)
        pg = np.add.reduceat(np.where(p, wo, 0.0), starts, axis=1)
        ng = np.add.reduceat(np.where(p, 0.0, wo), starts, axis=1)
        below = np.cumsum(ng, axis=1) - ng
        with np.errstate(invalid="ignore", divide="ignore"):
            return (pg * (below + ng / 2.0)).sum(axis=1) / (pg.sum(axis=1) * ng.sum(axis=1))

    return stat


def weighted_average_precision(
    scores: np.ndarray, positives: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    """``w -> average precision`` of the weighted units (tied scores enter together, as
    :func:`~bayesurl.evaluation.functional.average_precision`), from one fixed sort.

    In descending score order every positive ``i`` adds ``w_i / P`` times the precision at the
    end of its tie group, ``TP / count`` there: two cumulative sums per replicate.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    pos = np.asarray(positives, dtype=bool).reshape(-1)
    order, starts = _groups(-s)  # descending scores
    p = pos[order]
    ends = np.repeat(np.append(starts[1:], s.size) - 1, np.diff(np.append(starts, s.size)))
    at = np.flatnonzero(p)  # the positives, in sorted order
    end_of = ends[at]
    pf = p.astype(np.float32)

    def stat(w: np.ndarray) -> np.ndarray:
        wo = np.take(w, order, axis=1)
        cnt = _prefix_at(wo, end_of)
        tp_end = _prefix_at(wo * pf, end_of)
        total = tp_end[:, -1]  # the last positive's group end holds every positive
        with np.errstate(invalid="ignore", divide="ignore"):
            precision = np.where(cnt > 0, tp_end / cnt, 0.0)  # a group of weight 0 adds 0
            return (np.take(wo, at, axis=1) * precision).sum(axis=1) / total

    return stat


#: The risk-coverage bootstrap keeps the first this many sorted queries exact, then sums the
#: rest in about :data:`RISK_BLOCKS` blocks (see :func:`weighted_risk_coverage`).
RISK_EXACT = 1024
RISK_BLOCKS = 4096


def weighted_risk_coverage(
    u: np.ndarray, correct: np.ndarray, *, exact: bool = False
) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
    """``w -> {"aurc", "augrc"}`` of the weighted queries, from one fixed sort of ``u``.

    The replicate holds query ``i`` ``w_i`` times (integer weights). Per run ``g`` of equal
    ``u`` (weight ``W_g``, wrong weight ``e_g``, ``K`` / ``E`` the weights before it) the
    expected wrong count at position ``k`` of the run is ``E + (k - K) e_g / W_g``
    (:func:`~bayesurl.evaluation.functional.risk_coverage`), so its positions add
    ``(E - K e_g / W_g) (H(K + W_g) - H(K)) + e_g`` to ``sum_k E_k / k`` (``H``: harmonic
    numbers) and ``W_g E + e_g (W_g + 1) / 2`` to ``sum_k E_k``: O(N) per replicate. All-ones
    weights give :func:`~bayesurl.evaluation.functional.aurc` / ``augrc``.

    Unless ``exact``, the queries past the :data:`RISK_EXACT` most certain are summed in about
    :data:`RISK_BLOCKS` blocks of whole runs, each read as one run (its wrong weight spread
    evenly over its positions): a replicate then costs O(blocks) after one gather and one block
    sum, and differs from the exact one by the order inside a block, O((block / position)^2)
    of its terms (within 1e-5 of the exact replicate's AURC at N = 60k, an interval about
    1e-2 wide; ``tests/evaluation/test_risk_coverage.py``).
    The point estimate is always the exact :func:`~bayesurl.evaluation.functional.aurc`.
    """
    order, starts = _groups(np.asarray(u, dtype=np.float64).reshape(-1))
    n = order.size
    if not exact and n > RISK_EXACT + RISK_BLOCKS:
        # block boundaries at the run starts nearest above an even grid; runs never split
        grid = np.concatenate(
            [np.arange(RISK_EXACT), np.linspace(RISK_EXACT, n, RISK_BLOCKS, endpoint=False)]
        )
        at = np.searchsorted(starts, np.ceil(grid).astype(np.int64))
        starts = np.unique(starts[at[at < starts.size]])
    single = starts.size == n  # every run is one query
    # the weights are small integers: their running sums are exact in float32 below 2**24
    dtype = np.float32 if 8 * order.size < 2**24 else np.float64
    wrong = (~np.asarray(correct, dtype=bool).reshape(-1)[order]).astype(dtype)

    def stat(w: np.ndarray) -> dict[str, np.ndarray]:
        wo = np.take(w, order, axis=1).astype(dtype, copy=False)
        if single:
            size, bad = wo, wo * wrong
        else:
            size = np.add.reduceat(wo, starts, axis=1)
            bad = np.add.reduceat(wo * wrong, starts, axis=1)
        k_end = np.cumsum(size, axis=1)
        e_end = np.cumsum(bad, axis=1)
        k0, e0 = k_end - size, e_end - bad
        total = k_end[:, -1].astype(np.float64)
        m = int(total.max())
        harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, m + 1))])
        h = harmonic[k_end.astype(np.int64)]
        h -= harmonic[k0.astype(np.int64)]
        with np.errstate(invalid="ignore", divide="ignore"):
            if single:  # a run of one query: its wrong rate is its own flag (exact integers)
                lead = (e0 - k0 * wrong).astype(np.float64)
            else:
                rate = np.where(size > 0, bad / size.astype(np.float64), 0.0)
                lead = e0.astype(np.float64) - k0.astype(np.float64) * rate
            aurc = (np.einsum("ij,ij->i", lead, h) + bad.sum(axis=1, dtype=np.float64)) / total
            first = np.einsum("ij,ij->i", size.astype(np.float64), e0.astype(np.float64))
            augrc = (first + (bad * (size + 1)).sum(axis=1, dtype=np.float64) / 2) / total**2
        aurc[total < 1] = np.nan
        augrc[total < 1] = np.nan
        return {"aurc": aurc, "augrc": augrc}

    return stat


def weighted_class_mean(
    values: np.ndarray, classes: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    """``w -> mean over classes of each class's weighted mean of values`` (the bootstrap of
    pytorch-metric-learning's ``avg_of_avgs``); a class with no weight in a replicate is left
    out of it."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    order, starts = _groups(np.asarray(classes).reshape(-1))
    vo = v[order]

    def stat(w: np.ndarray) -> np.ndarray:
        wo = np.take(w, order, axis=1).astype(np.float64)
        num = np.add.reduceat(wo * vo, starts, axis=1)
        den = np.add.reduceat(wo, starts, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.nanmean(np.where(den > 0, num / den, np.nan), axis=1)

    return stat


def weighted_ece(
    confidence: np.ndarray, correct: np.ndarray, n_bins: int
) -> Callable[[np.ndarray], np.ndarray]:
    """``w -> ECE`` of the weighted queries: each query keeps its confidence bin
    ``(b/n, (b+1)/n]`` (:func:`~bayesurl.evaluation.functional.calibration_bins`), so the
    replicate is ``sum_b |sum_i w_i (c_i - conf_i) [i in b]| / sum_i w_i``."""
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    c = np.asarray(correct, dtype=np.float64).reshape(-1)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    b = np.searchsorted(edges[1:-1], conf, side="left")  # edges[b-1] < conf <= edges[b]
    gap = np.zeros((conf.size, n_bins))
    gap[np.arange(conf.size), b] = c - conf
    gap32 = gap.astype(np.float32)

    def stat(w: np.ndarray) -> np.ndarray:
        sums = w @ (gap32 if w.dtype == np.float32 else gap)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.abs(sums).sum(axis=1, dtype=np.float64) / w.sum(axis=1, dtype=np.float64)

    return stat


# --------------------------------------------------------------------------- one evaluation
def _value_of(stat: Mapping[str, np.ndarray] | np.ndarray, key: str) -> np.ndarray:
    return stat[key] if isinstance(stat, Mapping) else stat


def _stacked_means(stats: Sequence[Resample]) -> tuple[list[int], np.ndarray | None]:
    """The positions of the plain means among ``stats`` and their values as one matrix."""
    at = [j for j, ev in enumerate(stats) if isinstance(ev.statistic, _Mean)]
    if not at:
        return at, None
    cols = [stats[j].statistic.values for j in at]  # type: ignore[attr-defined]
    return at, np.stack(cols, axis=1).astype(np.float32)


def _bootstrap_block(
    i: int,
    *,
    n: int,
    rows: int,
    total: int,
    seed: int,
    stats: Sequence[Resample],
    means: tuple[list[int], np.ndarray | None],
) -> list[Any]:
    """Every statistic of ``stats`` on block ``i`` of the Poisson weights of ``n`` units."""
    w = poisson_block(n, min(rows, total - i * rows), seed, i)
    out: list[Any] = [None] * len(stats)
    at, values = means
    if values is not None:  # every mean of these units in one product
        with np.errstate(invalid="ignore", divide="ignore"):
            m = (w @ values) / w.sum(axis=1, dtype=np.float64)[:, None]
        for col, j in enumerate(at):
            out[j] = m[:, col]
    for j, ev in enumerate(stats):
        if out[j] is None:
            out[j] = ev.statistic(w)
    return out


def intervals_of(
    evidence: Mapping[str, Evidence],
    estimates: Mapping[str, float],
    *,
    level: float = DEFAULT_LEVEL,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    workers: int = 1,
) -> dict[str, Interval]:
    """The interval of every key of ``evidence`` with an estimate in ``estimates``.

    The closed forms come from their evidence; every :class:`Resample` of one unit count shares
    the same Poisson weights (:func:`poisson_weights`, seeded with ``seed``), each statistic
    evaluated once per block of replicates whatever number of keys it serves; ``workers``
    threads evaluate the blocks (the same intervals for any number).
    """
    out: dict[str, Interval] = {}
    boot: dict[int, list[tuple[str, Resample]]] = {}
    for key, ev in evidence.items():
        est = estimates.get(key)
        if est is None:
            continue
        if isinstance(ev, Proportion):
            h = np.asarray(ev.hits, dtype=bool).reshape(-1)
            lo, hi = wilson_interval(int(h.sum()), h.size, level)
            out[key] = Interval(lo, hi, level, "wilson", int(h.size), ev.over)
        elif isinstance(ev, TwoSamples):
            _, lo, hi = auroc_interval(ev.pos, ev.neg, level)
            n = int(np.size(ev.pos) + np.size(ev.neg))
            out[key] = Interval(min(lo, est), max(hi, est), level, "delong", n, ev.over)
        elif isinstance(ev, Rate):
            lo, hi = logit_interval(ev.value, ev.n, level)
            out[key] = Interval(min(lo, est), max(hi, est), level, "logit", int(ev.units), ev.over)
        elif isinstance(ev, Correlation):
            lo, hi = fisher_z_interval(ev.rho, ev.n, level)
            out[key] = Interval(min(lo, est), max(hi, est), level, "fisher_z", int(ev.n), ev.over)
        elif isinstance(ev, Resample):
            boot.setdefault(ev.n, []).append((key, ev))
        else:
            raise TypeError(f"no interval for evidence of type {type(ev).__name__} ({key!r})")
    for n, items in boot.items():
        stats = list({id(ev): ev for _, ev in items}.values())
        rows = _block_rows(n, replicates)

        one_block = partial(_bootstrap_block, n=n, rows=rows, total=replicates, seed=seed,
                            stats=stats, means=_stacked_means(stats))  # fmt: skip
        blocks = range(-(-replicates // rows))
        if workers > 1 and len(blocks) > 1:  # numpy's loops release the GIL
            with ThreadPoolExecutor(workers) as pool:
                done = list(pool.map(one_block, blocks))
        else:
            done = [one_block(i) for i in blocks]
        reps = {
            key: np.concatenate(
                [np.asarray(_value_of(vals[stats.index(ev)], key), np.float64) for vals in done]
            )
            for key, ev in items
        }
        for key, ev in items:
            est = float(estimates[key])
            lo, hi = percentile_interval(reps[key], est, level)
            out[key] = Interval(lo, hi, level, "bootstrap", int(n), ev.over)
    return out


def check_interval_options(level: object, replicates: object, seed: object) -> None:
    """Refuse a ``level`` outside (0, 1), fewer than 10 ``replicates`` or a negative ``seed``,
    naming the argument."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"`level` must be a number in (0, 1), got {level!r}")
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 10:
        raise ValueError(f"`replicates` must be an integer >= 10, got {replicates!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"`interval_seed` must be a non-negative integer, got {seed!r}")


# --------------------------------------------------------------------------- displays
def format_interval(value: float | None, interval: Interval | None, digits: int = 3) -> str:
    """``"0.581 [0.550, 0.611]"``: a value and its interval with ``digits`` decimals
    (``"n/a"`` without a value, the value alone without an interval)."""
    if value is None:
        return "n/a"
    s = f"{float(value):.{digits}f}"
    if interval is None:
        return s
    return f"{s} [{interval.low:.{digits}f}, {interval.high:.{digits}f}]"


def interval_lines(result: Mapping[str, Any], keys: Sequence[tuple[str, str, int]]) -> list[str]:
    """One aligned line per ``(key, title, digits)`` of one result: title, value, interval,
    and what the interval is (``"95 % DeLong interval over 1000 queries"``). ``result``
    holds ``intervals`` (an evaluation) or the flat fields of :func:`flat_intervals`.

    A metric whose value is ``None`` is shown as ``n/a`` with its reason when ``result`` has
    one in ``notes`` (``"r_auroc: R-AUROC is undefined: ..."``, as the evaluator writes it),
    and left out otherwise, so a missing R-AUROC is never silent where the reason is known."""
    why = _reasons(result.get("notes") or ())
    rows = []
    for key, title, digits in keys:
        if key not in result:
            continue
        if result.get(key) is None:
            if key in why:
                rows.append((title, "n/a", why[key]))
            continue
        iv = read_interval(result, key)
        rows.append(
            (
                title,
                format_interval(result.get(key), iv, digits),
                "" if iv is None else iv.describe(),
            )
        )
    if not rows:
        return []
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    return [f"{t:<{w0}}  {v:<{w1}}  {d}".rstrip() for t, v, d in rows]


def _reasons(notes: Iterable[str]) -> dict[str, str]:
    """``{key: reason}`` from the evaluator's ``notes`` (``"key1, key2: reason"``)."""
    out: dict[str, str] = {}
    for note in notes:
        keys, sep, reason = str(note).partition(": ")
        if sep:
            for key in keys.split(", "):
                out.setdefault(key.strip(), reason)
    return out


# --------------------------------------------------------------------------- records
def flat_intervals(intervals: Mapping[str, Interval]) -> dict[str, Any]:
    """The flat fields of a record (results.json, results.csv): ``<key>_low``, ``<key>_high``,
    ``<key>_interval`` (the method), ``<key>_n`` per key, and ``interval_level`` once."""
    out: dict[str, Any] = {}
    for key, iv in intervals.items():
        out[f"{key}_low"] = iv.low
        out[f"{key}_high"] = iv.high
        out[f"{key}_interval"] = iv.method
        out[f"{key}_n"] = iv.n
        out[f"{key}_over"] = iv.over
        out["interval_level"] = iv.level
    return out


def read_interval(record: Mapping[str, Any], key: str) -> Interval | None:
    """The :class:`Interval` of ``key`` from a flat record (:func:`flat_intervals`), from a
    record's ``intervals`` mapping, or ``None`` where it holds none."""
    nested = record.get("intervals")
    if isinstance(nested, Mapping) and key in nested:
        iv = nested[key]
        if isinstance(iv, Interval):
            return iv
        if isinstance(iv, Mapping) and iv.get("low") is not None and iv.get("high") is not None:
            return Interval(
                float(iv["low"]), float(iv["high"]), float(iv.get("level", DEFAULT_LEVEL)),
                str(iv.get("method", "")), int(iv.get("n", 0)), str(iv.get("over", "queries")),
            )  # fmt: skip
    lo, hi = record.get(f"{key}_low"), record.get(f"{key}_high")
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
        return None
    return Interval(
        float(lo), float(hi), float(record.get("interval_level") or DEFAULT_LEVEL),
        str(record.get(f"{key}_interval") or ""), int(record.get(f"{key}_n") or 0),
        str(record.get(f"{key}_over") or "queries"),
    )  # fmt: skip


# --------------------------------------------------------------------------- two estimators
def paired_bootstrap(
    a: Callable[[Sequence[np.ndarray]], np.ndarray],
    b: Callable[[Sequence[np.ndarray]], np.ndarray],
    sizes: Sequence[int],
    *,
    level: float = DEFAULT_LEVEL,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
) -> dict[str, float]:
    """``a - b`` over the same resampled units: a paired bootstrap of two estimators.

    Parameters
    ----------
    a, b : callable
        ``[w_1, ..., w_k] -> [r]`` values: each statistic of the weights of its unit groups
        (e.g. the queries, or the in-distribution and the OOD inputs).
    sizes : sequence of int
        The size of each unit group; both statistics see the same weights.
    level, replicates, seed
        Interval level, Poisson replicates, seed.

    Returns
    -------
    dict
        ``diff`` (at all-ones weights), ``low`` / ``high`` (percentile interval of the
        difference), ``p`` (two-sided: twice the smaller share of replicates on either side
        of 0, at least ``1 / replicates``), ``replicates``.
    """
    rows = _block_rows(sum(sizes), replicates)
    streams = [poisson_weights(n, replicates, seed, i, rows) for i, n in enumerate(sizes)]
    diffs = []
    for ws in zip(*streams):
        diffs.append(np.asarray(a(ws), dtype=np.float64) - np.asarray(b(ws), dtype=np.float64))
    ones = [np.ones((1, n), dtype=np.float32) for n in sizes]
    est = float(np.asarray(a(ones))[0] - np.asarray(b(ones))[0])
    d = np.concatenate(diffs)
    d = d[np.isfinite(d)]
    lo, hi = percentile_interval(d, est, level)
    if d.size == 0:
        p = 1.0
    else:
        p = min(1.0, max(2.0 * min(float((d <= 0).mean()), float((d >= 0).mean())), 1 / d.size))
    return {"diff": est, "low": lo, "high": hi, "p": p, "replicates": int(d.size)}
