"""LAM Table 2 (FashionMNIST, closed set): the recipe's rows beside the paper's.

Reads the run records of the recipe ``fashion_mnist_closed.toml`` (the ``runs`` of a sweep's
``results.json`` / ``partial_runs.json``, or ``<row>_s<seed>/result.json`` below a folder) and
writes one markdown table: per row and metric the mean ± sd over seeds beside Warburg et al.
(2023), Table 2 (FashionMNIST vs MNIST, five runs), and whether the two agree within the
spread -- the two means differ by at most the sum of the two standard deviations (one seed,
or a paper cell without ±: its sd is 0). AUPRC is left out of the agreement: its chance
level depends on the OOD set's size (the paper's MNIST against the digits here).

Run: ``python benchmarks/lam_table2.py results/lam/fashion_mnist_closed
--also results/lam/fashion_mnist_closed/mc_dropout_kron --also
results/lam/fashion_mnist_closed/hib --also results/lam/fashion_mnist_closed/deep_ensemble
--out results/lam/fashion_mnist_closed/table.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROWS = (
    "deterministic",
    "mc_dropout",
    "deep_ensemble",
    "deep_ensemble_aligned",
    "hib",
    "lam_posthoc",
    "lam_online",
    "lam_posthoc_kron",
    "lam_online_kron",
)
METRICS = (
    ("map@1", "mAP@1"),
    ("map@5", "mAP@5"),
    ("map@10", "mAP@10"),
    ("ood_auroc", "AUROC"),
    ("ood_auprc", "AUPRC"),
    ("ausc", "AUSC"),
    ("ece", "ECE"),
)
#: metrics whose value depends on the OOD set's size, so not compared with the paper's
NOT_COMPARED = {"ood_auprc"}
#: LAM reports no uncertainty for the deterministic row (its u is a norm heuristic here)
RETRIEVAL_ONLY = {"deterministic": ("map@1", "map@5", "map@10")}

#: Warburg et al. (2023), Table 2, FashionMNIST: (mean, sd) per metric in METRICS' order; sd
#: None where the paper gives one value (its single ensemble), a cell None where it has none
PAPER: dict[str, tuple[tuple[float, float | None] | None, ...]] = {
    "deterministic": ((0.78, 0.01), (0.73, 0.01), (0.72, 0.01), None, None, None, None),
    "deep_ensemble": (
        (0.69, None),
        (0.62, None),
        (0.59, None),
        (0.41, None),
        (0.46, None),
        (0.61, None),
        (0.04, None),
    ),
    "hib": (
        (0.69, 0.08),
        (0.63, 0.09),
        (0.61, 0.09),
        (0.60, 0.12),
        (0.60, 0.11),
        (0.65, 0.08),
        (0.54, 0.08),
    ),
    "mc_dropout": (
        (0.76, 0.03),
        (0.71, 0.03),
        (0.70, 0.03),
        (0.93, 0.03),
        (0.93, 0.03),
        (0.84, 0.06),
        (0.03, 0.04),
    ),
    "lam_posthoc": (
        (0.78, 0.00),
        (0.74, 0.00),
        (0.72, 0.00),
        (0.96, 0.02),
        (0.96, 0.02),
        (0.86, 0.01),
        (0.03, 0.00),
    ),
    "lam_online": (
        (0.81, 0.00),
        (0.77, 0.01),
        (0.76, 0.01),
        (0.98, 0.01),
        (0.98, 0.01),
        (0.89, 0.01),
        (0.02, 0.00),
    ),
}


def recipe_runs(folder: Path) -> dict[str, dict[int, dict]]:
    """``row -> seed -> metrics`` of the recipe's run records in ``folder``."""
    from bayesurl.sweeps import read_results

    out: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("**/result.json")):
        rec = json.loads(path.read_text())
        if not rec.get("error"):
            out.setdefault(rec["estimator"], {})[int(rec["seed"])] = rec["metrics"]
    # a sweep's own records in ``folder`` itself (results.json / partial_runs.json: flat run
    # records under "runs"); not below it, where other sweeps' records may sit
    for name in ("results.json", "partial_runs.json"):
        for path in sorted(folder.glob(name)):
            doc = read_results(path) if name == "results.json" else json.loads(path.read_text())
            for rec in doc.get("runs", []):
                if isinstance(rec, dict) and "estimator" in rec and not rec.get("error"):
                    out.setdefault(rec["estimator"], {})[int(rec["seed"])] = rec
    return out


def _stats(per_seed: dict[int, dict], key: str) -> tuple[float, float, int] | None:
    vals = [float(m[key]) for m in per_seed.values() if m.get(key) is not None]
    if not vals:
        return None
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return statistics.fmean(vals), sd, len(vals)


def _cell(s: tuple[float, float, int] | None) -> str:
    if s is None:
        return "—"
    return f"{s[0]:.3f}" if s[2] == 1 else f"{s[0]:.3f} ± {s[1]:.3f}"


def _paper_cell(p: tuple[float, float | None] | None) -> str:
    if p is None:
        return "—"
    return f"{p[0]:.2f}" if p[1] is None else f"{p[0]:.2f} ± {p[1]:.2f}"


def compare(recipe: Path, also: tuple[Path, ...] = ()) -> str:
    """The markdown table (see module docstring); ``also``: more folders of recipe runs (other
    sweeps of the same recipe), read after ``recipe``."""
    ours = recipe_runs(recipe)
    for folder in also:
        for row, seeds in recipe_runs(folder).items():
            ours.setdefault(row, {}).update(seeds)
    head = ["row", "seeds"]
    for _, title in METRICS:
        head += [title, f"{title} paper"]
    head.append("within spread of the paper")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in ROWS:
        if row not in ours:
            continue
        keys = RETRIEVAL_ONLY.get(row, tuple(k for k, _ in METRICS))
        paper = PAPER.get(row, (None,) * len(METRICS))
        cells = [row, str(len(ours[row]))]
        outside = []
        for (key, title), p in zip(METRICS, paper):
            a = _stats(ours[row], key) if key in keys else None
            cells += [_cell(a), _paper_cell(p)]
            if a is not None and p is not None and key not in NOT_COMPARED:
                if abs(a[0] - p[0]) > a[1] + (p[1] or 0.0):
                    outside.append(title)
        if row not in PAPER:
            cells.append("—")
        else:
            cells.append("all" if not outside else "not: " + ", ".join(outside))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe", type=Path, help="folder of the recipe's runs")
    ap.add_argument(
        "--also", type=Path, action="append", default=[], help="another folder of recipe runs"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="markdown file to write (and its .csv beside it)"
    )
    args = ap.parse_args(argv)
    for folder in (args.recipe, *args.also):
        if not folder.is_dir():
            raise SystemExit(f"{folder} is not a folder")
    table = compare(args.recipe, tuple(args.also))
    if args.out is not None:
        args.out.write_text(table)
        # the same cells as quoted CSV, for the docs page's csv-table
        rows = [line.strip().strip("|").split("|") for line in table.splitlines()]
        csv = ['"' + '","'.join(c.strip() for c in r) + '"' for i, r in enumerate(rows) if i != 1]
        args.out.with_suffix(".csv").write_text("\n".join(csv) + "\n")
    print(table)


if __name__ == "__main__":
    main()
