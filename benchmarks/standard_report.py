"""Tables of a finished protocol sweep, for the docs and the closing note (issue 13).

Reads ``results.json`` written by ``bayesurl benchmark --preset standard`` and writes

* ``docs/concepts/_standard_results.inc`` (reStructuredText included by
  ``docs/concepts/which_method.rst``): the per-estimator means with 95 % t-intervals over the
  class splits, the paired comparison against CE (Holm-adjusted), the split-half
  reproducibility, URL's crop share and mixed R-AUROC, and the training curves' last-epoch
  changes;
* copies of ``results.json``, ``results.csv`` and the two plots under
  ``docs/_static/benchmark/standard/``;

and prints the same tables as plain text. Usage (repository root)::

    python benchmarks/standard_report.py results/benchmark/standard
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

METRICS = (
    ("r@1", "R@1"),
    ("r_auroc", "R-AUROC"),
    ("ausc", "AUSC"),
    ("ece", "ECE"),
    ("ood_auroc", "OOD AUROC"),
    ("map@5", "mAP@5"),
    ("mixed_r_auroc", "mixed R-AUROC"),
    ("crop_share", "crop share"),
)


def _cell(d: dict[str, Any] | None) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    m, lo, hi = d["mean"], d.get("low"), d.get("high")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{m:.3f}"
    return f"{m:.3f} ± {(hi - lo) / 2:.3f}"


def _list_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    out = [f".. list-table:: {title}", "   :header-rows: 1", ""]
    for r in [header, *rows]:
        out.append(f"   * - {r[0]}")
        out += [f"     - {c}" for c in r[1:]]
    return "\n".join(out) + "\n"


def _last_change(curve: list[float] | None) -> float | None:
    """Relative change of the last epoch: |c[-1] - c[-2]| / |c[-2]|."""
    if not curve or len(curve) < 2 or not curve[-2]:
        return None
    return abs(curve[-1] - curve[-2]) / abs(curve[-2])


def report(folder: Path, docs: Path | None) -> str:
    doc = json.loads((folder / "results.json").read_text())
    summary, paired, repro = doc["summary"], doc.get("paired_vs_ce", {}), doc["reproducibility"]
    settings = doc["settings"]
    order = sorted(summary, key=lambda n: -(summary[n].get("r_auroc", {}).get("mean") or -1.0))
    rows = [[n, *(_cell(summary[n].get(k)) for k, _ in METRICS)] for n in order]
    parts = []
    n_splits = len(settings.get("class_splits", []))
    parts.append(
        _list_table(
            f"Standard preset: mean ± half-width of the 95 % t-interval over {n_splits} class "
            "splits (seed 0), sorted by R-AUROC",
            ["estimator", *(t for _, t in METRICS)],
            rows,
        )
    )
    # paired comparison against CE
    prow = []
    for n in order:
        if n == "ce":
            continue
        cells = []
        for k in ("r_auroc", "r@1", "ood_auroc"):
            p = paired.get(k, {}).get(n)
            if not p or p.get("mean_diff") is None:
                cells.append("n/a")
                continue
            cells.append(
                f"{p['mean_diff']:+.3f} (p {p['p_t']:.2g}, Holm {p['p_t_holm']:.2g}; "
                f"{p['verdict']})"
            )
        prow.append([n, *cells])
    parts.append(
        _list_table(
            "Paired difference to CE over the (split, seed) pairs: mean difference, paired "
            "t-test p and its Holm-adjusted value over the 16 estimators",
            ["estimator", "R-AUROC", "R@1", "OOD AUROC"],
            prow,
        )
    )
    rrow = []
    for k, t in (("r_auroc", "R-AUROC"), ("r@1", "R@1"), ("ood_auroc", "OOD AUROC")):
        r = repro.get(k, {})
        if r.get("mean") is None:
            rrow.append([t, "n/a", "n/a", "n/a", str(r.get("note", ""))])
            continue
        parts_s = ", ".join(f"{p['spearman']:.2f}" for p in r["partitions"])
        rrow.append([t, f"{r['mean']:.2f}", f"{r['min']:.2f}", f"{r['max']:.2f}", parts_s])
    parts.append(
        _list_table(
            "Split-half reproducibility: Spearman correlation of the estimators' mean metric "
            "between two disjoint halves of the class splits, over every balanced partition",
            ["metric", "mean", "min", "max", "per partition"],
            rrow,
        )
    )
    # training curves: did the loss and the probe u settle?
    crow = []
    runs = [r for r in doc["runs"] if r.get("error") is None]
    for n in sorted({r["method"] for r in runs}):
        mine = [r for r in runs if r["method"] == n]
        lc = [_last_change(r.get("loss_curve")) for r in mine]
        uc = [_last_change(r.get("u_curve")) for r in mine]
        lc = [v for v in lc if v is not None]
        uc = [v for v in uc if v is not None]
        if not lc and not uc:
            continue
        u_ratio = [
            r["u_curve"][-1] / r["u_curve"][0]
            for r in mine
            if r.get("u_curve") and len(r["u_curve"]) > 1 and r["u_curve"][0]
        ]
        crow.append(
            [
                n,
                f"{max(lc):.3f}" if lc else "n/a",
                f"{max(uc):.3f}" if uc else "n/a",
                f"{min(u_ratio):.3g}-{max(u_ratio):.3g}" if u_ratio else "n/a",
            ]
        )
    parts.append(
        _list_table(
            "Training curves (trained estimators): largest relative change over the last "
            "epoch of the loss and of the median u of a fixed batch of 256 training images, "
            "and the ratio of that u after the last to after the first epoch (over the splits)",
            ["estimator", "loss, last epoch", "u, last epoch", "u last / u first"],
            crow,
        )
    )
    text = "\n".join(parts)
    if docs is not None:
        inc = docs / "concepts" / "_standard_results.inc"
        inc.write_text(
            ".. generated by benchmarks/standard_report.py from "
            "results/benchmark/standard/results.json; do not edit\n\n" + text
        )
        static = docs / "_static" / "benchmark" / "standard"
        static.mkdir(parents=True, exist_ok=True)
        for f in ("results.json", "results.csv", "recall_vs_rauroc.png", "training_curves.png"):
            if (folder / f).exists():
                shutil.copy2(folder / f, static / f)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="folder holding results.json")
    ap.add_argument("--docs", type=Path, default=Path("docs"), help="docs folder to update")
    ap.add_argument("--no-docs", action="store_true", help="only print the tables")
    a = ap.parse_args()
    print(report(a.folder, None if a.no_docs else a.docs))


if __name__ == "__main__":
    main()
