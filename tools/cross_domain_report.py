"""Cross-domain report: does the estimators' ranking on one downstream domain hold on another?

URL (Kirchhof et al., 2023, section 3) evaluates on several downstream data sets and compares
the rankings across them. This script reads two finished protocols' ``results.json`` (e.g.
the clipart protocol and the FashionMNIST one, both on frozen EfficientNet-Lite0 features)
and writes, for R-AUROC, R@1 and OOD AUROC:

* each estimator's mean over the class splits on each domain and its rank there (1 = best);
* the Spearman correlation of the two domains' rankings (scipy) over the estimators both ran,
  with its p-value;
* its 95 % interval over the estimators (Fisher's z with the variance 1.06 / (n - 3) of
  Fieller, Hartley & Pearson, 1957, for Spearman's rho: the estimators as the sample, what
  scipy's p-value assumes) and a second one over the class splits (the complementary pairs
  of each domain resampled with replacement, 2,000 seeded draws: how far the correlation of
  these estimators moves with other class splits);
* beside it, each domain's own split-half Spearman (random halvings: median, 5 %, minimum;
  class-held-out halvings: median, minimum), so a cross-domain correlation can be read
  against how well each ranking reproduces within its own domain.

    python tools/cross_domain_report.py results/clipart/protocol \\
        results/pretrained/crossfit/default --labels clipart FashionMNIST \\
        --out results/clipart/cross_domain.json --docs docs/concepts/_cross_domain.inc
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from bayesurl.files import atomic_write, write_json
from bayesurl.sweeps.aggregate import complementary_pairs
from bayesurl.sweeps.report import read_results

METRICS = (("r_auroc", "R-AUROC"), ("r@1", "R@1"), ("ood_auroc", "OOD AUROC"))


def _ranks(means: dict[str, float]) -> dict[str, float]:
    names = list(means)
    r = stats.rankdata([-means[n] for n in names])  # 1 = highest mean, ties averaged
    return {n: float(v) for n, v in zip(names, r, strict=True)}


def _halvings(doc: dict[str, Any], metric: str) -> dict[str, Any]:
    # the random halvings are the top-level "reproducibility" where "reproducibility_by" lists
    # only the other kinds
    by = dict(doc.get("reproducibility_by") or {})
    by.setdefault("random", doc.get("reproducibility") or {})
    out = {}
    for h in ("random", "class"):
        r = (by.get(h) or {}).get(metric) or {}
        out[h] = {k: r.get(k) for k in ("median", "q05", "min")}
    return out


def spearman_interval(rho: float, n: int, level: float = 0.95) -> tuple[float, float] | None:
    """Interval of Spearman's ``rho`` over ``n`` items: Fisher's z with the variance
    1.06 / (n - 3) (Fieller, Hartley & Pearson, 1957); ``None`` below four items."""
    if n < 4:
        return None
    z = math.atanh(max(min(rho, 1 - 1e-12), -1 + 1e-12))
    half = float(stats.norm.ppf(0.5 + level / 2)) * math.sqrt(1.06 / (n - 3))
    return math.tanh(z - half), math.tanh(z + half)


def _pair_means(doc: dict[str, Any], key: str, names: list[str]) -> np.ndarray | None:
    """``names`` x complementary pairs: each estimator's mean ``key`` per pair (pairs where
    one of them lacks it dropped); ``None`` when the runs do not carry it."""
    runs = [
        r
        for r in doc.get("runs") or []
        if r.get("error") is None and r.get(key) is not None and "split" in r
    ]
    if not runs:
        return None
    pair_of = complementary_pairs(runs)
    cells: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        cells.setdefault((r["estimator"], pair_of[int(r["split"])]), []).append(float(r[key]))
    pairs = sorted(set(pair_of.values()))
    table = np.array(
        [[np.mean(cells.get((n, p), [np.nan])) for p in pairs] for n in names], dtype=np.float64
    )
    table = table[:, ~np.isnan(table).any(axis=0)]
    return table if table.shape[1] >= 2 else None


def pair_bootstrap(
    a: np.ndarray, b: np.ndarray, draws: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the Spearman correlation of the row means of ``a`` and ``b``
    (estimators x pairs, one per domain) when each domain's pairs are resampled with
    replacement."""
    rng = np.random.default_rng(seed)
    out = np.empty(draws)
    for i in range(draws):
        ma = a[:, rng.integers(0, a.shape[1], a.shape[1])].mean(axis=1)
        mb = b[:, rng.integers(0, b.shape[1], b.shape[1])].mean(axis=1)
        out[i] = stats.spearmanr(ma, mb).statistic
    out = out[np.isfinite(out)]
    q = (1 - level) / 2
    return float(np.quantile(out, q)), float(np.quantile(out, 1 - q))


def cross_domain(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ranks, the Spearman of the rankings and each domain's split-half figures."""
    (la, a), (lb, b) = docs.items()
    common = sorted(set(a["summary"]) & set(b["summary"]))
    out: dict[str, Any] = {"domains": [la, lb], "estimators": common, "metrics": {}}
    for key, _ in METRICS:
        means = {}
        for label, d in docs.items():
            m = {n: (d["summary"][n].get(key) or {}).get("mean") for n in common}
            means[label] = {n: v for n, v in m.items() if v is not None}
        both = [n for n in common if all(n in means[lab] for lab in docs)]
        if len(both) < 3:
            out["metrics"][key] = {"note": "fewer than three estimators have it on both"}
            continue
        ranks = {lab: _ranks({n: means[lab][n] for n in both}) for lab in docs}
        res = stats.spearmanr([means[la][n] for n in both], [means[lb][n] for n in both])
        ci = spearman_interval(float(res.statistic), len(both))
        tables = [_pair_means(d, key, both) for d in docs.values()]
        boot = None if any(t is None for t in tables) else pair_bootstrap(*tables)
        out["metrics"][key] = {
            "estimators": both,
            "mean": {lab: {n: means[lab][n] for n in both} for lab in docs},
            "rank": ranks,
            "spearman": float(res.statistic),
            "p": float(res.pvalue),
            "n": len(both),
            "low": None if ci is None else ci[0],
            "high": None if ci is None else ci[1],
            "splits_low": None if boot is None else boot[0],
            "splits_high": None if boot is None else boot[1],
            "split_half": {lab: _halvings(d, key) for lab, d in docs.items()},
            "splits": {lab: len({r["split"] for r in docs[lab]["runs"]}) for lab in docs},
        }
    return out


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def rst(res: dict[str, Any], sources: dict[str, str]) -> str:
    """The report as reStructuredText list tables."""
    la, lb = res["domains"]
    parts = []
    r = res["metrics"]["r_auroc"]
    order = sorted(r["estimators"], key=lambda n: r["rank"][la][n])
    lines = [
        f".. list-table:: Mean R-AUROC and rank (1 = best) of each estimator on each domain "
        f"({la}: {r['splits'][la]} class splits, {lb}: {r['splits'][lb]})",
        "   :header-rows: 1",
        "",
        "   * - estimator",
        f"     - {la} R-AUROC",
        f"     - {la} rank",
        f"     - {lb} R-AUROC",
        f"     - {lb} rank",
    ]
    for n in order:
        lines += [
            f"   * - {n}",
            f"     - {r['mean'][la][n]:.3f}",
            f"     - {r['rank'][la][n]:g}",
            f"     - {r['mean'][lb][n]:.3f}",
            f"     - {r['rank'][lb][n]:g}",
        ]
    parts.append("\n".join(lines))
    lines = [
        ".. list-table:: Spearman correlation of the two domains' rankings over the n "
        "estimators both ran, with its p-value and two 95 % intervals: over the estimators "
        "(Fisher's z) and over the class splits (each domain's complementary pairs "
        "resampled, 2,000 draws); beside it each domain's own split-half Spearman (random "
        "halvings: median / 5 % / minimum; class-held-out halvings: median / minimum)",
        "   :header-rows: 1",
        "",
        "   * - metric",
        f"     - Spearman {la} vs {lb} [over estimators] (p, n)",
        "     - over class splits",
        f"     - {la} split-half, random",
        f"     - {la} split-half, class-held-out",
        f"     - {lb} split-half, random",
        f"     - {lb} split-half, class-held-out",
    ]
    for key, title in METRICS:
        m = res["metrics"][key]
        if "spearman" not in m:
            continue
        ci = "" if m.get("low") is None else f" [{m['low']:+.2f}, {m['high']:+.2f}]"
        cells = [
            f"{m['spearman']:+.2f}{ci} (p {m['p']:.2g}, n {m['n']})",
            "n/a"
            if m.get("splits_low") is None
            else f"[{m['splits_low']:+.2f}, {m['splits_high']:+.2f}]",
        ]
        for lab in (la, lb):
            h = m["split_half"][lab]
            cells.append(
                f"{_f(h['random']['median'])} / {_f(h['random']['q05'])} / {_f(h['random']['min'])}"
            )
            cells.append(f"{_f(h['class']['median'])} / {_f(h['class']['min'])}")
        lines += [f"   * - {title}", *(f"     - {c}" for c in cells)]
    parts.append("\n".join(lines))
    head = (
        ".. generated by tools/cross_domain_report.py from "
        + " and ".join(f"{v}/results.json" for v in sources.values())
        + "; do not edit"
    )
    return head + "\n\n" + "\n\n".join(parts) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path, help="folder of the first protocol's results.json")
    ap.add_argument("second", type=Path, help="folder of the second protocol's results.json")
    ap.add_argument("--labels", nargs=2, default=None, help="names of the two domains")
    ap.add_argument("--out", type=Path, default=None, help="JSON of the report")
    ap.add_argument("--docs", type=Path, default=None, help="reStructuredText include to write")
    args = ap.parse_args()
    labels = args.labels or [args.first.name, args.second.name]
    folders = dict(zip(labels, (args.first, args.second), strict=True))
    # the halvings' statistics are in results.json itself: its side files are not needed
    docs = {lab: read_results(f, detail=False) for lab, f in folders.items()}
    res = cross_domain(docs)
    res["sources"] = {lab: str(f) for lab, f in folders.items()}
    text = rst(res, res["sources"])
    print(text)
    if args.out is not None:
        write_json(args.out, res)
    if args.docs is not None:
        atomic_write(args.docs, text)


if __name__ == "__main__":
    main()
