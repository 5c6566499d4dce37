"""LAM Table 2 (FashionMNIST, closed set): the recipe's rows beside the committed table.

Reads the ``result.json`` of every run of the recipe ``fashion_mnist_closed.toml`` (``bayesurl
benchmark --dataset fashion_mnist_closed --save-checkpoints``: ``<recipe>/**/<row>_s<seed>/
result.json``) and the per-row JSON of the stand-alone driver it replaced
(``<committed>/<row>_s<seed>.json``), and writes one markdown table: per row and metric the
mean ± sd over seeds of both, and whether they agree within the seed spread -- the two means
differ by at most the sum of the two standard deviations (one seed on a side: its sd is 0).

Run: ``python benchmarks/lam_table2.py results/lam/fashion_mnist_closed_recipe
results/lam/fashion_mnist_closed --out results/lam/fashion_mnist_closed_recipe/
comparison.md``.
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
#: LAM reports no uncertainty for the deterministic row (its u is a norm heuristic here)
RETRIEVAL_ONLY = {"deterministic": ("map@1", "map@5", "map@10")}


def recipe_runs(folder: Path) -> dict[str, dict[int, dict]]:
    """``row -> seed -> metrics`` of the recipe's ``result.json`` files under ``folder``."""
    out: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("**/result.json")):
        rec = json.loads(path.read_text())
        if not rec.get("error"):
            out.setdefault(rec["estimator"], {})[int(rec["seed"])] = rec["metrics"]
    # a sweep's own records in ``folder`` itself (results.json / partial_runs.json: flat run
    # records under "runs"); not below it, where other sweeps' records may sit
    for name in ("results.json", "partial_runs.json"):
        for path in sorted(folder.glob(name)):
            for rec in json.loads(path.read_text()).get("runs", []):
                if isinstance(rec, dict) and "estimator" in rec and not rec.get("error"):
                    out.setdefault(rec["estimator"], {})[int(rec["seed"])] = rec
    return out


def committed_runs(folder: Path) -> dict[str, dict[int, dict]]:
    """``row -> seed -> metrics`` of the committed ``<row>_s<seed>.json`` files."""
    out: dict[str, dict[int, dict]] = {}
    for row in ROWS:
        for path in sorted(folder.glob(f"{row}_s*.json")):
            rec = json.loads(path.read_text())
            out.setdefault(rec["row"], {})[int(rec["seed"])] = rec["metrics"]
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


def compare(recipe: Path, committed: Path, also: tuple[Path, ...] = ()) -> str:
    """The markdown table (see module docstring); ``also``: more folders of recipe runs (other
    sweeps of the same recipe), read after ``recipe``."""
    new, old = recipe_runs(recipe), committed_runs(committed)
    for folder in also:
        for row, seeds in recipe_runs(folder).items():
            new.setdefault(row, {}).update(seeds)
    head = ["row", "seeds (recipe / committed)"]
    for _, title in METRICS:
        head += [f"{title} recipe", f"{title} committed"]
    head.append("within spread")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in ROWS:
        if row not in new:
            continue
        keys = RETRIEVAL_ONLY.get(row, tuple(k for k, _ in METRICS))
        cells = [row, f"{len(new[row])} / {len(old.get(row, {}))}"]
        outside = []
        for key, title in METRICS:
            a = _stats(new[row], key) if key in keys else None
            b = _stats(old.get(row, {}), key) if key in keys else None
            cells += [_cell(a), _cell(b)]
            if a is not None and b is not None and abs(a[0] - b[0]) > a[1] + b[1]:
                outside.append(title)
        cells.append("all" if not outside else "not: " + ", ".join(outside))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "recipe", type=Path, help="folder of the recipe's runs (searched for result.json)"
    )
    ap.add_argument("committed", type=Path, help="folder of the committed <row>_s<seed>.json")
    ap.add_argument(
        "--also", type=Path, action="append", default=[], help="another folder of recipe runs"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="markdown file to write (and its .csv beside it)"
    )
    args = ap.parse_args(argv)
    for folder in (args.recipe, args.committed, *args.also):
        if not folder.is_dir():
            raise SystemExit(f"{folder} is not a folder")
    table = compare(args.recipe, args.committed, tuple(args.also))
    if args.out is not None:
        args.out.write_text(table)
        # the same cells as quoted CSV, for the docs page's csv-table
        rows = [line.strip().strip("|").split("|") for line in table.splitlines()]
        csv = ['"' + '","'.join(c.strip() for c in r) + '"' for i, r in enumerate(rows) if i != 1]
        args.out.with_suffix(".csv").write_text("\n".join(csv) + "\n")
    print(table)


if __name__ == "__main__":
    main()
