"""Cross-domain report: does the estimators' ranking on one downstream domain hold on another?

URL (Kirchhof et al., 2023, section 3) evaluates on several downstream data sets and compares
the rankings across them. This script reads two finished protocols' ``results.json`` (e.g.
the clipart protocol and the FashionMNIST one, both on frozen EfficientNet-Lite0 features)
and writes, for R-AUROC, R@1 and OOD AUROC:

* each estimator's mean over the class splits on each domain and its rank there (1 = best);
* the Spearman correlation of the two domains' rankings (scipy) over the estimators both ran,
  with its p-value;
* beside it, each domain's own split-half Spearman (random halvings: median, 5 %, minimum;
  class-held-out halvings: median, minimum), so a cross-domain correlation can be read
  against how well each ranking reproduces within its own domain.

    python tools/cross_domain_report.py results/clipart/protocol \\
        results/pretrained/crossfit/default --labels clipart FashionMNIST \\
        --out results/clipart/cross_domain.json --docs docs/concepts/_cross_domain.inc
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from scipy import stats

from bayesurl.files import atomic_write, write_json

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
        out["metrics"][key] = {
            "estimators": both,
            "mean": {lab: {n: means[lab][n] for n in both} for lab in docs},
            "rank": ranks,
            "spearman": float(res.statistic),
            "p": float(res.pvalue),
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
        ".. list-table:: Spearman correlation of the two domains' rankings, beside each "
        "domain's own split-half Spearman (random halvings: median / 5 % / minimum; "
        "class-held-out halvings: median / minimum)",
        "   :header-rows: 1",
        "",
        "   * - metric",
        f"     - Spearman {la} vs {lb} (p)",
        f"     - {la} split-half, random",
        f"     - {la} split-half, class-held-out",
        f"     - {lb} split-half, random",
        f"     - {lb} split-half, class-held-out",
    ]
    for key, title in METRICS:
        m = res["metrics"][key]
        if "spearman" not in m:
            continue
        cells = [f"{m['spearman']:+.2f} ({m['p']:.2g})"]
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
    docs = {lab: json.loads((f / "results.json").read_text()) for lab, f in folders.items()}
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
