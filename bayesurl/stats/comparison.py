"""Statistics of repeated runs: a mean's interval, its tests against a value, Holm's
adjustment and the rank agreement of two halves.

The observations are plain numbers (one per run, class split or complementary pair of
splits); which runs they come from is the caller's business
(:mod:`bayesurl.sweeps.aggregate` makes them from a sweep's run records). URL (Kirchhof et
al., 2023, section 3) averages over downstream sets and seeds; the intervals and tests here
make the spread of those averages explicit:

* :func:`t_interval`: the mean and its **Student-t confidence interval**
  ``mean +- t_{n-1, (1+level)/2} * sd / sqrt(n)``;
* :func:`bootstrap_interval`: a percentile bootstrap interval of a mean;
* :func:`location_test`: the mean against a value, two-sided, by the **t-test**
  (:func:`scipy.stats.ttest_1samp`) and the **Wilcoxon signed-rank test**
  (:func:`scipy.stats.wilcoxon`); paired differences are tested against 0;
* :func:`holm` / :func:`holm_verdicts`: Holm-Bonferroni adjusted p-values over the rows
  compared, and the verdict word each row earns at a significance level;
* :func:`balanced_partitions` / :func:`halves_spearman`: the halvings of a set of units into
  two balanced halves, and the **Spearman** correlation of per-item means between two halves
  (:func:`scipy.stats.spearmanr`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "MAX_EXACT_PARTITIONS",
    "RANDOM_HALVINGS",
    "balanced_partitions",
    "bootstrap_interval",
    "check_level",
    "halves_spearman",
    "holm",
    "holm_verdicts",
    "location_test",
    "n_balanced_partitions",
    "spread",
    "t_interval",
]


def check_level(level: float, name: str = "level") -> None:
    """Refuse a confidence (or significance) level outside ``(0, 1)``, naming ``name``."""
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {level}")


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval ``mean +- t_{n-1} * sd / sqrt(n)``.

    Parameters
    ----------
    values : sequence of float
        Observations (finite).
    level : float
        Confidence level in (0, 1).

    Returns
    -------
    (mean, low, high) : tuple of float
        With ``n = 1`` the interval is ``(-inf, inf)``; with zero spread ``(mean, mean)``.

    Raises
    ------
    ValueError
        If ``values`` is empty or holds a non-finite number, or ``level`` is outside (0, 1).
    """
    from scipy import stats

    check_level(level)
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("`values` must be a non-empty 1-D sequence")
    if not np.isfinite(x).all():
        raise ValueError("`values` holds NaN or inf")
    m = float(x.mean())
    if x.size == 1:
        return m, -math.inf, math.inf
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


#: Resamples of :func:`bootstrap_interval`.
BOOTSTRAP_RESAMPLES = 5000


def bootstrap_interval(
    values: Sequence[float], level: float = 0.95, *, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (Efron & Tibshirani, 1993, section 13.3):
    :data:`BOOTSTRAP_RESAMPLES` resamples with replacement, seeded.

    Raises
    ------
    ValueError
        With no values or a level outside ``(0, 1)``.
    """
    check_level(level)
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("`values` is empty")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(BOOTSTRAP_RESAMPLES, x.size))].mean(axis=1)
    tail = (1.0 - float(level)) / 2.0
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


def location_test(
    values: Sequence[float], null: float = 0.0, level: float = 0.95
) -> dict[str, float | None]:
    """The mean of ``values`` with its t-interval, and two-sided tests against ``null``.

    Parameters
    ----------
    values : sequence of float
        Two or more finite observations (paired differences: tested against ``null = 0``).
    null : float
        The value the mean is tested against (e.g. 0.5, an AUROC at chance).
    level : float
        Confidence level of the interval.

    Returns
    -------
    dict
        ``{"mean", "low", "high", "t", "p_t", "p_wilcoxon"}``: :func:`t_interval`, the
        one-sample t-test (``t = +-inf, p = 0`` when every value is the same and not
        ``null``; ``t = 0, p = 1`` when every value is ``null``) and the Wilcoxon signed-rank
        test of ``values - null`` (``None`` when every difference is zero).

    Raises
    ------
    ValueError
        With fewer than two values, a non-finite one or a level outside (0, 1).
    """
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"`values` must hold two or more observations, got {x.size}")
    m, lo, hi = t_interval(x, level)
    dx = x - float(null)
    if np.all(dx == dx[0]):  # no spread: the t statistic is undefined
        t, p_t = (math.inf * np.sign(dx[0]), 0.0) if dx[0] != 0 else (0.0, 1.0)
    else:
        res = stats.ttest_1samp(x, float(null))
        t, p_t = float(res.statistic), float(res.pvalue)
    p_w = None if np.all(dx == 0) else float(stats.wilcoxon(dx).pvalue)
    return {"mean": m, "low": lo, "high": hi, "t": float(t), "p_t": p_t, "p_wilcoxon": p_w}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1).

    ``p_(i)`` sorted ascending becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError("`pvalues` must be 1-D")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError("`pvalues` must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return adj.tolist()


def holm_verdicts(
    rows: Mapping[str, dict[str, Any]],
    alpha: float,
    *,
    effect: str,
    words: tuple[str, str, str],
    centre: float = 0.0,
) -> None:
    """Holm-adjust the ``p_t`` and ``p_wilcoxon`` of ``rows`` over the rows that have one
    (``<key>_holm``, ``None`` for a row without), then give each row its ``verdict``, in place.

    The verdict is decided by the Holm-adjusted t-test: ``words[0]`` where it is below
    ``alpha`` and ``row[effect] > centre``, ``words[1]`` where it is below ``alpha``
    otherwise, ``words[2]`` where it is not, ``None`` for a row without a t-test.
    """
    for key in ("p_t", "p_wilcoxon"):
        have = [n for n, r in rows.items() if r[key] is not None]
        adj = holm([rows[n][key] for n in have]) if have else []
        for r in rows.values():
            r[f"{key}_holm"] = None
        for n, a in zip(have, adj):
            rows[n][f"{key}_holm"] = a
    for r in rows.values():
        p = r["p_t_holm"]
        if p is None:
            r["verdict"] = None
        elif p < alpha:
            r["verdict"] = words[0] if r[effect] > centre else words[1]
        else:
            r["verdict"] = words[2]


#: Balanced partitions enumerated exactly up to this many; beyond (e.g. 40 splits: 6.9e10
#: partitions) :data:`RANDOM_HALVINGS` distinct ones are drawn with a seeded generator.
MAX_EXACT_PARTITIONS = 5000
#: Distinct random halvings drawn where the partitions are too many to enumerate.
RANDOM_HALVINGS = 2000


def n_balanced_partitions(k: int) -> int:
    """How many unordered partitions of ``k`` units into halves of sizes ``floor(k/2)`` and
    ``ceil(k/2)`` there are."""
    return math.comb(k, k // 2) // (2 if k % 2 == 0 else 1)


def balanced_partitions(
    units: Sequence[int], *, seed: int = 0
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Splits of ``units`` into two halves of sizes ``floor(k/2)`` / ``ceil(k/2)``, each
    unordered partition once (the half holding the first unit is listed first when the
    halves are equal in size): all of them, or :data:`RANDOM_HALVINGS` distinct random ones
    (seeded) when there are more than :data:`MAX_EXACT_PARTITIONS`."""
    s = sorted(units)
    k = len(s)

    def canonical(a: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        a = tuple(sorted(a))
        b = tuple(x for x in s if x not in a)
        return (b, a) if k % 2 == 0 and s[0] not in a else (a, b)

    if n_balanced_partitions(k) <= MAX_EXACT_PARTITIONS:
        return list(dict.fromkeys(canonical(a) for a in itertools.combinations(s, k // 2)))
    rng = np.random.default_rng(seed)
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], None] = {}
    while len(seen) < RANDOM_HALVINGS:
        perm = rng.permutation(k)[: k // 2]
        seen.setdefault(canonical([s[i] for i in perm]), None)
    return list(seen)


def halves_spearman(
    per: Mapping[str, Mapping[int, Sequence[float]]],
    names: Sequence[str],
    a: Sequence[int],
    b: Sequence[int],
) -> float | None:
    """Spearman correlation of each item's mean over the units ``a`` against its mean over
    ``b`` (``per[name][unit]``: the item's values on that unit); ``None`` where the means of
    one half are all equal."""
    from scipy import stats

    xa = [float(np.mean([x for s in a for x in per[n][s]])) for n in names]
    xb = [float(np.mean([x for s in b for x in per[n][s]])) for n in names]
    if len(set(xa)) < 2 or len(set(xb)) < 2:
        return None
    return float(stats.spearmanr(xa, xb).statistic)


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """``{"mean", "min", "max", "median", "q05", "q95"}`` of ``values`` (``None`` each when
    there are none)."""
    if not values:
        return dict.fromkeys(("mean", "min", "max", "median", "q05", "q95"))
    return {
        "mean": float(np.mean(values)),
        "min": float(np.min(values)),
        "max": float(np.max(values)),
        "median": float(np.median(values)),
        "q05": float(np.quantile(values, 0.05)),
        "q95": float(np.quantile(values, 0.95)),
    }
