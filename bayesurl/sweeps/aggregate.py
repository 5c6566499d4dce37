"""Aggregation of a sweep's run records: means with confidence intervals, paired tests against
CE, and the split-half reproducibility of the estimators' ranking.

A run record is a mapping with the estimator's name (``"method"``, or ``"estimator"``), the
class ``"split"``, the training ``"seed"`` and metric values (``None``: not available for this
estimator, e.g. ECE without samples; a record with a non-``None`` ``"error"`` is a failed run
and is counted, not averaged). The statistics follow URL (Kirchhof et al., 2023, section 3:
results averaged over downstream sets and seeds) with the intervals and tests made explicit:

* :func:`summarize`: per estimator and metric the mean and a **Student-t confidence interval**
  (:func:`bayesurl.stats.comparison.t_interval`). By default (``unit="split"``) the seeds of a
  class split are averaged first and the interval is taken over the splits' means, because runs
  on the same split share its classes and are not independent; ``unit="run"`` treats every run
  as one observation.
* :func:`paired_comparison`: each estimator against a reference (CE) on the (split, seed)
  pairs both have, the mean difference with its t-interval and a percentile bootstrap
  interval, the **paired t-test** and the **Wilcoxon signed-rank test** of the differences,
  both two-sided, and Holm-adjusted p-values over the estimators compared;
  :func:`chance_test`: each estimator's metric against its value at chance, the same way.
* :func:`split_half_reproducibility`: the estimators' mean metric on one half of the class
  splits against the other half, as a **Spearman** correlation, for every balanced
  partition of the splits (the issue asks for >= 0.7 on R-AUROC; also reported for R@1 and
  OOD AUROC).

The statistics themselves (intervals, tests, Holm, halvings) are
:mod:`bayesurl.stats.comparison`; this module makes their observations from the records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from bayesurl._checks import check_int
from bayesurl.evaluation.table import metric_column
from bayesurl.stats.comparison import (
    balanced_partitions,
    bootstrap_interval,
    check_level,
    halves_spearman,
    holm_verdicts,
    location_test,
    n_balanced_partitions,
    spread,
    t_interval,
)
from bayesurl.sweeps.record import estimator_of

__all__ = [
    "chance_test",
    "complementary_pairs",
    "paired_comparison",
    "split_half_reproducibility",
    "summarize",
]


def _name(rec: Mapping[str, Any]) -> str:
    return estimator_of(rec)


def _int(rec: Mapping[str, Any], key: str) -> int:
    if key not in rec:
        raise ValueError(f"a record in `records` lacks {key!r}: {dict(rec)!r}")
    try:
        return check_int(rec[key], f"record field {key}")
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def _ok(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Records of successful runs (``error`` absent or ``None``), validated."""
    out = []
    seen: set[tuple[str, int, int]] = set()
    for rec in records:
        if not isinstance(rec, Mapping):
            raise ValueError(f"`records` must hold mappings, got {type(rec).__name__}")
        key = (_name(rec), _int(rec, "split"), _int(rec, "seed"))
        if rec.get("error") is not None:
            continue
        if key in seen:
            raise ValueError(f"`records` holds run {key} twice")
        seen.add(key)
        out.append(rec)
    return out


def _value(rec: Mapping[str, Any], metric: str) -> float | None:
    v = rec.get(metric)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise ValueError(f"metric {metric!r} of run {_name(rec)} must be a number, got {v!r}")
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(
            f"metric {metric!r} of run ({_name(rec)}, split {rec.get('split')}, seed "
            f"{rec.get('seed')}) is {f}; record None for 'not available'"
        )
    return f


def _by_split(recs: Iterable[Mapping[str, Any]], metric: str) -> dict[str, dict[int, list[float]]]:
    """``{estimator: {split: values}}`` of the runs with ``metric``."""
    per: dict[str, dict[int, list[float]]] = {}
    for r in recs:
        v = _value(r, metric)
        if v is not None:
            per.setdefault(_name(r), {}).setdefault(_int(r, "split"), []).append(v)
    return per


def _units(recs: Sequence[Mapping[str, Any]], metric: str, unit: str) -> dict[str, list[float]]:
    """Per estimator: the observations (per-split seed means, or per-run values)."""
    per = _by_split(recs, metric)
    if unit == "split":
        return {m: [float(np.mean(v)) for _, v in sorted(d.items())] for m, d in per.items()}
    return {m: [x for _, v in sorted(d.items()) for x in v] for m, d in per.items()}


def summarize(
    records: Iterable[Mapping[str, Any]],
    metrics: Sequence[str],
    *,
    level: float = 0.95,
    unit: str = "split",
) -> dict[str, dict[str, dict[str, Any]]]:
    """Mean and t-interval of every metric per estimator.

    Parameters
    ----------
    records : iterable of mapping
        Run records (see module docs).
    metrics : sequence of str
        Metric keys, e.g. ``["r@1", "r_auroc", "ood_auroc"]``.
    level : float
        Confidence level.
    unit : {"split", "run"}
        Observation unit of the interval: the per-split mean over seeds (default) or each run.

    Returns
    -------
    dict
        ``{estimator: {metric: {"mean", "low", "high", "sd", "n", "n_runs"}, "_runs": {...}}}``
        where ``n`` counts observations (splits or runs), ``n_runs`` the runs with a value,
        and ``"_runs"`` holds ``{"ok", "failed"}`` counts. A metric no run of an estimator
        has gets ``mean = None``.

    Raises
    ------
    ValueError
        On a malformed record, a duplicated run, a non-finite metric, an unknown ``unit`` or
        a ``level`` outside (0, 1).
    """
    if unit not in ("split", "run"):
        raise ValueError(f"`unit` must be 'split' or 'run', got {unit!r}")
    check_level(level)
    records = list(records)
    recs = _ok(records)
    names = list(dict.fromkeys(_name(r) for r in records))
    out: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in names}
    for n in names:
        failed = sum(1 for r in records if _name(r) == n and r.get("error") is not None)
        out[n]["_runs"] = {"ok": sum(1 for r in recs if _name(r) == n), "failed": failed}
    for metric in metrics:
        obs = _units(recs, metric, unit)
        n_runs: dict[str, int] = {}
        for r in recs:
            if _value(r, metric) is not None:
                n_runs[_name(r)] = n_runs.get(_name(r), 0) + 1
        for n in names:
            x = obs.get(n, [])
            if not x:
                out[n][metric] = {"mean": None, "low": None, "high": None, "sd": None, "n": 0}
                out[n][metric]["n_runs"] = 0
                continue
            m, lo, hi = t_interval(x, level)
            sd = float(np.std(x, ddof=1)) if len(x) > 1 else None
            out[n][metric] = {
                "mean": m,
                "low": lo,
                "high": hi,
                "sd": sd,
                "n": len(x),
                "n_runs": n_runs.get(n, 0),
            }
    return out


def paired_comparison(
    records: Iterable[Mapping[str, Any]],
    metric: str,
    *,
    reference: str = "ce",
    level: float = 0.95,
    alpha: float = 0.05,
    unit: str = "run",
    higher_is_better: bool | None = None,
) -> dict[str, dict[str, Any]]:
    """Each estimator against ``reference`` on the same (split, seed) pairs.

    Parameters
    ----------
    records : iterable of mapping
        Run records.
    metric : str
        The metric compared, e.g. ``"r_auroc"``.
    reference : str
        The baseline's name (CE; URL section 4.1).
    level : float
        Confidence level of the mean difference's interval.
    alpha : float
        Significance level of the verdict (Holm-adjusted paired t-test).
    unit : {"run", "pair"}
        The observation: each (split, seed) run pair, or each complementary pair of splits
        (:func:`complementary_pairs`; the differences of its runs averaged).
    higher_is_better : bool, optional
        The metric's direction; default: the one its column declares
        (:func:`bayesurl.evaluation.table.metric_column`).

    Returns
    -------
    dict
        ``{estimator: {"n", "mean_diff", "low", "high", "boot_low", "boot_high", "t", "p_t",
        "p_wilcoxon", "p_t_holm", "p_wilcoxon_holm", "verdict"}}`` with
        ``diff = estimator - reference`` (``boot_*``:
        :func:`~bayesurl.stats.comparison.bootstrap_interval`)
        (sign flipped for lower-is-better metrics such as ECE, so positive is always better);
        ``verdict`` is ``"better"``, ``"worse"`` or ``"no difference"`` at ``alpha`` by the
        Holm-adjusted t-test. Estimators with fewer than 2 pairs get ``n`` and ``None``
        statistics. The Wilcoxon p-value is ``None`` when every difference is zero.

    Raises
    ------
    ValueError
        If ``reference`` has no run with the metric, on malformed records, or for a metric
        without a column when ``higher_is_better`` is not given.
    """
    check_level(level)
    check_level(alpha, "alpha")
    if unit not in ("run", "pair"):
        raise ValueError(f"`unit` must be 'run' or 'pair', got {unit!r}")
    recs = _ok(records)
    pair_of = complementary_pairs(recs) if unit == "pair" else None
    if higher_is_better is None:
        try:
            higher_is_better = metric_column(metric).higher_is_better
        except ValueError as exc:
            raise ValueError(f"{exc}; pass `higher_is_better`") from None
    sign = 1.0 if higher_is_better else -1.0
    table = _by_run(recs, metric)
    if reference not in table:
        raise ValueError(
            f"`reference` {reference!r} has no run with metric {metric!r}; estimators with it: "
            f"{sorted(table)}"
        )
    out = {
        name: _paired_row(_differences(vals, table[reference], sign, pair_of), level)
        for name, vals in table.items()
        if name != reference
    }
    holm_verdicts(out, alpha, effect="mean_diff", words=("better", "worse", "no difference"))
    return out


def _by_run(
    recs: Iterable[Mapping[str, Any]], metric: str
) -> dict[str, dict[tuple[int, int], float]]:
    """``{estimator: {(split, seed): value}}`` of the runs with ``metric``."""
    table: dict[str, dict[tuple[int, int], float]] = {}
    for r in recs:
        v = _value(r, metric)
        if v is not None:
            table.setdefault(_name(r), {})[(_int(r, "split"), _int(r, "seed"))] = v
    return table


def _differences(
    vals: Mapping[tuple[int, int], float],
    ref: Mapping[tuple[int, int], float],
    sign: float,
    pair_of: Mapping[int, int] | None,
) -> np.ndarray:
    """``sign * (vals - ref)`` on the (split, seed) runs both have; with ``pair_of``
    (:func:`complementary_pairs`) one mean difference per complementary pair."""
    pairs = sorted(set(vals) & set(ref))
    d = np.array([sign * (vals[k] - ref[k]) for k in pairs], dtype=np.float64)
    if pair_of is None:
        return d
    groups: dict[int, list[float]] = {}
    for key, x in zip(pairs, d):
        groups.setdefault(pair_of[key[0]], []).append(float(x))
    return np.array([np.mean(groups[g]) for g in sorted(groups)], dtype=np.float64)


def _paired_row(d: np.ndarray, level: float) -> dict[str, Any]:
    """The statistics of one estimator's paired differences ``d`` (see
    :func:`paired_comparison`; ``None`` with fewer than two)."""
    row: dict[str, Any] = {"n": len(d)}
    if len(d) < 2:
        row.update(mean_diff=float(d.mean()) if len(d) else None, low=None, high=None)
        row.update(boot_low=None, boot_high=None, t=None, p_t=None, p_wilcoxon=None)
        return row
    row.update(zip(("boot_low", "boot_high"), bootstrap_interval(d, level)))
    test = location_test(d, 0.0, level)
    row.update(mean_diff=test.pop("mean"), **test)
    return row


def split_half_reproducibility(
    records: Iterable[Mapping[str, Any]],
    metric: str,
    *,
    max_partitions: int | None = None,
    halving: str = "random",
) -> dict[str, Any]:
    """Spearman correlation of the estimators' mean ``metric`` between two disjoint halves of
    the class splits, over every balanced partition of the splits (or, with many splits,
    :data:`~bayesurl.stats.comparison.RANDOM_HALVINGS` random ones: the distribution is
    reported, not one partition).

    Parameters
    ----------
    records : iterable of mapping
        Run records.
    metric : str
        E.g. ``"r_auroc"``, ``"r@1"``, ``"ood_auroc"``.
    max_partitions : int, optional
        Use only the first partitions (in :func:`itertools.combinations` order).
    halving : {"random", "pairs", "class"}
        ``"random"``: balanced partitions of the splits; ``"pairs"``: balanced partitions of
        the complementary pairs (:func:`complementary_pairs`), each pair's splits on one
        side; ``"class"``: for each class the splits with it downstream against the splits
        with it upstream (``per_class`` holds each class's Spearman; the statistics run over
        the classes).

    Returns
    -------
    dict
        ``{"metric", "estimators", "splits", "partitions": [{"a", "b", "spearman"}], "mean",
        "min", "max", "median", "q05", "q95", "exhaustive", "first"}``; ``first`` is the
        partition of the lower split ids against the upper ones (``a = splits[:k // 2]``);
        ``mean`` / ``min`` / ``max`` / ``median`` / quantiles run over all partitions used.
        Only estimators with a value on every split enter; a partition whose
        means are constant on one side gets ``spearman = None``.

    Raises
    ------
    ValueError
        With fewer than 2 splits or fewer than 3 estimators having the metric on all splits.
    """
    if halving not in ("random", "pairs", "class"):
        raise ValueError(f"`halving` must be 'random', 'pairs' or 'class', got {halving!r}")
    recs = _ok(records)
    per, splits, names = _on_every_split(recs, metric)
    if halving == "class":
        return {**_class_halvings(recs, per, names, metric), "splits": splits}
    lower = tuple(splits[: len(splits) // 2])
    parts, total = _halvings(recs, splits, halving)
    if max_partitions is not None:
        parts = parts[: int(max_partitions)]
    if halving == "random" and all(a != lower for a, _ in parts):
        parts.append((lower, tuple(splits[len(splits) // 2 :])))  # always reported
    rows = [{"a": list(a), "b": list(b), "spearman": halves_spearman(per, names, a, b)}
            for a, b in parts]  # fmt: skip
    vals = [r["spearman"] for r in rows if r["spearman"] is not None]
    first = next((r["spearman"] for r in rows if r["a"] == splits[: len(splits) // 2]), None)
    return {
        "metric": metric,
        "halving": halving,
        "estimators": names,
        "splits": splits,
        "partitions": rows,
        **spread(vals),
        "exhaustive": len(parts) >= total,
        "first": first,
    }


def _on_every_split(
    recs: Sequence[Mapping[str, Any]], metric: str
) -> tuple[dict[str, dict[int, list[float]]], list[int], list[str]]:
    """``{estimator: {split: values}}`` of ``metric``, the splits, and the estimators with a
    value on every split (two splits and three such estimators at least)."""
    per = _by_split(recs, metric)
    splits = sorted({s for d in per.values() for s in d})
    if len(splits) < 2:
        raise ValueError(f"split-half reproducibility needs >= 2 splits, got {splits}")
    names = [n for n, d in per.items() if all(s in d for s in splits)]
    if len(names) < 3:
        raise ValueError(
            f"split-half reproducibility needs >= 3 estimators with {metric!r} on every split "
            f"{splits}; have {names}"
        )
    return per, splits, names


def _halvings(
    recs: Sequence[Mapping[str, Any]], splits: list[int], halving: str
) -> tuple[list[tuple[tuple[int, ...], tuple[int, ...]]], int]:
    """The balanced partitions of ``splits`` (``"random"``) or of their complementary pairs
    (``"pairs"``, each pair's splits on one side), and how many there are in all."""
    if halving != "pairs":
        return balanced_partitions(splits), n_balanced_partitions(len(splits))
    pair_of = complementary_pairs(recs)
    units = sorted(set(pair_of[s] for s in splits))
    if len(units) < 2:
        raise ValueError("pair-preserving halvings need >= 2 complementary pairs")
    members = {u: [s for s in splits if pair_of[s] == u] for u in units}
    parts = [
        (
            tuple(sorted(s for u in a for s in members[u])),
            tuple(sorted(s for u in b for s in members[u])),
        )
        for a, b in balanced_partitions(units)
    ]
    return parts, n_balanced_partitions(len(units))


def complementary_pairs(records: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """``{split: pair id}``: splits that swap their classes share an id (the lower split's); a
    split without its complement is a unit of its own.

    Two splits swap their classes when each one's ``downstream`` is the other's ``upstream``
    less the classes upstream in both (validation classes kept upstream in every split, as
    the clipart protocol does); the two then share all their classes.

    Raises
    ------
    ValueError
        If a split's records disagree on its classes.
    """
    classes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for r in records:
        if not isinstance(r, Mapping):
            raise ValueError(f"`records` must hold mappings, got {type(r).__name__}")
        k = _int(r, "split")
        cl = (
            tuple(sorted(int(c) for c in r.get("upstream") or ())),
            tuple(sorted(int(c) for c in r.get("downstream") or ())),
        )
        if classes.setdefault(k, cl) != cl:
            raise ValueError(f"the records of split {k} disagree on its classes")

    sets = {k: (set(up), set(down)) for k, (up, down) in classes.items()}

    def swapped(a: int, b: int) -> bool:
        (up_a, down_a), (up_b, down_b) = sets[a], sets[b]
        both = up_a & up_b
        return bool(down_a) and down_a == up_b - both and down_b == up_a - both

    order = sorted(classes)
    out: dict[int, int] = {}
    for k in order:
        if k in out:
            continue
        out[k] = k
        twin = next((t for t in order if t not in out and swapped(k, t)), None)
        if twin is not None:
            out[twin] = k
    return out


def chance_test(
    records: Iterable[Mapping[str, Any]],
    metric: str = "r_auroc",
    *,
    chance: float = 0.5,
    unit: str = "pair",
    level: float = 0.95,
    alpha: float = 0.05,
) -> dict[str, dict[str, Any]]:
    """Each estimator's ``metric`` against ``chance`` (R-AUROC 0.5: u ranks the retrieval
    errors no better than a coin), two-sided, Holm over the estimators.

    Parameters
    ----------
    records : iterable of mapping
        Run records (with ``upstream`` / ``downstream`` for ``unit="pair"``).
    metric : str
        The metric tested.
    chance : float
        Its value without any signal.
    unit : {"pair", "split"}
        The observation: each complementary pair's mean (:func:`complementary_pairs`) or
        each split's mean over seeds.
    level, alpha : float
        Confidence level of the interval; significance level of the verdict.

    Returns
    -------
    dict
        ``{estimator: {"n", "mean", "low", "high", "t", "p_t", "p_wilcoxon", "p_t_holm",
        "p_wilcoxon_holm", "verdict"}}`` with ``verdict`` ``"above"``, ``"below"`` or ``"at
        chance"`` by the Holm-adjusted t-test (``None`` with fewer than 2 observations).

    Raises
    ------
    ValueError
        On an unknown ``unit``, a ``level`` / ``alpha`` outside (0, 1) or malformed records.
    """
    if unit not in ("pair", "split"):
        raise ValueError(f"`unit` must be 'pair' or 'split', got {unit!r}")
    check_level(level)
    check_level(alpha, "alpha")
    recs = _ok(records)
    pair_of = complementary_pairs(recs) if unit == "pair" else {}
    out: dict[str, dict[str, Any]] = {}
    for name, d in _by_split(recs, metric).items():
        groups: dict[int, list[float]] = {}
        for k, v in d.items():  # each split's mean over its seeds
            groups.setdefault(pair_of.get(k, k), []).append(float(np.mean(v)))
        x = np.array([np.mean(groups[g]) for g in sorted(groups)], dtype=np.float64)
        row: dict[str, Any] = {"n": int(x.size), "mean": float(x.mean())}
        if x.size < 2:
            row.update(low=None, high=None, t=None, p_t=None, p_wilcoxon=None)
        else:
            row.update(location_test(x, chance, level))
        out[name] = row
    holm_verdicts(out, alpha, effect="mean", centre=chance, words=("above", "below", "at chance"))
    return out


def _class_halvings(
    recs: Sequence[Mapping[str, Any]],
    per: Mapping[str, Mapping[int, list[float]]],
    names: Sequence[str],
    metric: str,
) -> dict[str, Any]:
    """For each class: the splits with it downstream against those with it upstream."""

    down: dict[int, set[int]] = {}
    up: dict[int, set[int]] = {}
    for r in recs:
        k = _int(r, "split")
        for c in r.get("downstream") or ():
            down.setdefault(int(c), set()).add(k)
        for c in r.get("upstream") or ():
            up.setdefault(int(c), set()).add(k)
    if not down:
        raise ValueError("class-held-out halvings need records with `downstream` classes")
    rows = []
    for c in sorted(set(down) | set(up)):
        a, b = sorted(down.get(c, ())), sorted(up.get(c, ()))
        if not a or not b:
            rows.append({"class": c, "a": a, "b": b, "spearman": None})
            continue
        rho = halves_spearman(per, names, a, b)
        rows.append({"class": c, "a": a, "b": b, "spearman": rho})
    vals = [r["spearman"] for r in rows if r["spearman"] is not None]
    return {
        "metric": metric,
        "halving": "class",
        "estimators": list(names),
        "partitions": rows,
        "per_class": {str(r["class"]): r["spearman"] for r in rows},
        **spread(vals),
    }
