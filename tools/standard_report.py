"""Tables of a finished protocol sweep, for the docs and the closing note.

Reads ``results.json`` written by ``bayesurl benchmark --preset standard`` and writes

* ``docs/concepts/_standard_results.inc`` (reStructuredText included by
  ``docs/concepts/which_method.rst``): the per-estimator means with 95 % t-intervals over the
  class splits, the paired comparison against CE (Holm-adjusted), the split-half
  reproducibility, URL's crop share and mixed R-AUROC, and the training curves' last-epoch
  changes;
* copies of ``results.json``, ``results.csv`` and the two plots under
  ``docs/_static/benchmark/standard/``;

and prints the same tables as plain text. Usage (repository root)::

    python tools/standard_report.py results/benchmark/standard
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


def reliability(runs: list[dict[str, Any]], metric: str) -> dict[str, float] | None:
    """Two-way (estimator x split) variance decomposition of ``metric`` and what it implies.

    ``icc`` is the consistency intra-class correlation ICC(C, 1) = (MS_est - MS_res) /
    (MS_est + (k - 1) MS_res) of one split (k splits, one seed each): the share of a single
    split's metric variance that is a stable estimator difference. By Spearman-Brown, a mean
    over ``m`` splits has reliability m ICC / (1 + (m - 1) ICC), and two disjoint halves of
    ``m`` splits each correlate at about that value; ``splits_for_0.7`` is the total number of
    splits (two halves) for a split-half correlation of 0.7 (``inf`` when ICC <= 0).
    """
    import numpy as np

    ok = [r for r in runs if r.get("error") is None and r.get(metric) is not None]
    ests = sorted({r["method"] for r in ok})
    splits = sorted({r["split"] for r in ok})
    table = np.full((len(ests), len(splits)), np.nan)
    for r in ok:
        table[ests.index(r["method"]), splits.index(r["split"])] = float(r[metric])
    table = table[~np.isnan(table).any(axis=1)]
    n, k = table.shape
    if n < 3 or k < 2:
        return None
    grand = table.mean()
    ms_e = k * ((table.mean(axis=1) - grand) ** 2).sum() / (n - 1)
    resid = table - table.mean(axis=1, keepdims=True) - table.mean(axis=0, keepdims=True) + grand
    ms_r = (resid**2).sum() / ((n - 1) * (k - 1))
    icc = (ms_e - ms_r) / (ms_e + (k - 1) * ms_r)
    need = math.inf if icc <= 0 else 2 * math.ceil(0.7 * (1 - icc) / (icc * 0.3))
    return {
        "icc": float(icc),
        "sd_between_estimators": float(math.sqrt(max(ms_e - ms_r, 0.0) / k)),
        "sd_residual": float(math.sqrt(ms_r)),
        "splits_for_0.7": float(need),
    }


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
    for row in rrow:
        key = {"R-AUROC": "r_auroc", "R@1": "r@1", "OOD AUROC": "ood_auroc"}[row[0]]
        rel = reliability(doc["runs"], key)
        if rel is None:
            row += ["n/a"] * 4
            continue
        need = rel["splits_for_0.7"]
        row += [
            f"{rel['sd_between_estimators']:.3f}",
            f"{rel['sd_residual']:.3f}",
            f"{rel['icc']:.2f}",
            "never (ICC <= 0)" if math.isinf(need) else f"{need:.0f}",
        ]
    parts.append(
        _list_table(
            "Split-half reproducibility: Spearman correlation of the estimators' mean metric "
            "between two disjoint halves of the class splits, over every balanced partition; "
            "variance decomposition over estimator x split (two-way, one seed) and the number "
            "of splits a split-half correlation of 0.7 would need by Spearman-Brown",
            [
                "metric",
                "mean",
                "min",
                "max",
                "per partition",
                "SD between estimators",
                "SD estimator x split",
                "ICC (one split)",
                "splits for 0.7",
            ],
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
            ".. generated by tools/standard_report.py from "
            "results/benchmark/standard/results.json; do not edit\n\n" + text
        )
        static = docs / "_static" / "benchmark" / "standard"
        static.mkdir(parents=True, exist_ok=True)
        for f in ("results.json", "results.csv", "recall_vs_rauroc.png", "training_curves.png"):
            if (folder / f).exists():
                shutil.copy2(folder / f, static / f)
    return text


def combine(base: Path, rerun: Path, keep_before: Path | None = None) -> Path:
    """Replace the runs of ``base/results.json`` whose estimator was re-run in ``rerun``.

    For a sweep of which some estimators were run again after a fix (here: the four vMF
    methods after the kappa-head warm-up fix): every record of an estimator present in
    ``rerun/results.json`` replaces that estimator's records of ``base``; the summary, paired
    tests, reproducibility and plots are recomputed (:func:`bayesurl.runs.report.
    write_results`) into ``base``. The original ``base`` files are first copied to
    ``keep_before`` (default ``base/before_rerun``). Returns the new ``results.json``.
    """
    from bayesurl.runs.report import write_results

    old = json.loads((base / "results.json").read_text())
    new = json.loads((rerun / "results.json").read_text())
    again = {r["method"] for r in new["runs"]}
    keep = keep_before if keep_before is not None else base / "before_rerun"
    keep.mkdir(parents=True, exist_ok=True)
    for f in ("results.json", "results.csv", "recall_vs_rauroc.png", "training_curves.png"):
        if (base / f).exists() and not (keep / f).exists():
            shutil.copy2(base / f, keep / f)
    runs = [r for r in old["runs"] if r["method"] not in again] + new["runs"]
    settings = dict(old["settings"])
    settings["rerun"] = {
        "estimators": sorted(again),
        "from": str(rerun),
        "settings": new["settings"],
        "before": str(keep),
    }
    settings["estimators"] = sorted({r["method"] for r in runs})
    settings["sum_of_run_times_s"] = sum(float(r.get("total_time") or 0.0) for r in runs)
    return write_results(runs, base, settings)["json"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="folder holding results.json")
    ap.add_argument("--docs", type=Path, default=Path("docs"), help="docs folder to update")
    ap.add_argument("--no-docs", action="store_true", help="only print the tables")
    ap.add_argument(
        "--rerun",
        type=Path,
        default=None,
        help="a sweep folder whose estimators replace those of FOLDER (see combine())",
    )
    a = ap.parse_args()
    if a.rerun is not None:
        combine(a.folder, a.rerun)
    print(report(a.folder, None if a.no_docs else a.docs))


if __name__ == "__main__":
    main()
