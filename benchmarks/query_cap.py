"""What a cap on the downstream queries per class split costs: within-split noise against the
between-split spread.

A protocol run retrieves every downstream image among the others (about 35,000 per
FashionMNIST split). ``data.max_test = n`` keeps a seeded, class-balanced subsample of ``n``
downstream images instead (the same subsample for every estimator of a split): the queries and
the gallery shrink together, and the exact searches, quadratic in the set, with them. The cap
is free when the noise it adds to a split's R-AUROC is small against the between-split spread
that the protocol's intervals and tests already carry.

Per class split and estimator (trained once, at the preset's settings, on the split's
upstream classes) this script measures

* ``full``: R-AUROC on every downstream image, and its **within-split bootstrap SE** (queries
  resampled with replacement, neighbours fixed; 200 resamples);
* per cap ``n``: R-AUROC on ``draws`` class-balanced subsamples of ``n`` images (seeds
  ``0..draws-1``; seed 0 is the protocol's), each with its own 1-NN search inside the
  subsample (what a capped run does): the **cap SD** (the noise the cap adds), the mean
  shift against ``full``, and the same for the paired difference to CE on the same subsample
  (what the paired tests see);

and writes one JSON line per (split, estimator) to ``--log`` (resumable). ``--summary``
compares the cap SDs with the between-split SD of R-AUROC and of the paired difference to CE
from a finished protocol's ``results.json`` (``--protocol``) and prints the table.

    PYTHONPATH=. python benchmarks/query_cap.py --splits 0 1 2 3 \
        --log results/pretrained/query_cap/query_cap.jsonl --set backbone.cache=runs/features
    PYTHONPATH=. python benchmarks/query_cap.py --summary \
        --log results/pretrained/query_cap/query_cap.jsonl \
        --protocol results/pretrained/protocol/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bayesurl.sweeps.report import read_results


def _auroc_wrong(u: np.ndarray, wrong: np.ndarray) -> float:
    """AUROC of ``u`` for the positives ``wrong`` (average ranks for ties)."""
    from scipy.stats import rankdata

    r = rankdata(u)
    n1 = int(wrong.sum())
    n0 = wrong.size - n1
    return float((r[wrong].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _wrong(emb: Any, labels: Any) -> np.ndarray:
    """R@1 misses of every row among the others (cosine, self excluded)."""
    from bayesurl.search.exact import neighbor_ids

    nb = neighbor_ids(emb, 1)[:, 0]
    return (labels[nb] != labels).numpy()


def measure(args: argparse.Namespace) -> None:
    import torch

    from bayesurl.data.class_splits import class_splits
    from bayesurl.data.splits import stratified_subsample
    from bayesurl.runs.config import load_recipe
    from bayesurl.runs.runner import RunCache, run

    torch.set_num_threads(args.threads)
    log = Path(args.log)
    done = set()
    if log.is_file():
        for line in log.read_text().splitlines():
            if line:
                row = json.loads(line)
                done.add((row["split"], row["estimator"]))
    splits = class_splits(max(args.splits) + 1, seed=0)
    ests = [e.strip() for e in args.estimators.split(",")]
    for k in args.splits:
        cs = splits[k].to_dict()
        cache = RunCache(keep={"ce"})
        subs: dict[int, list[Any]] = {}
        for est in ests:
            if (k, est) in done:
                continue
            cfg = load_recipe(
                f"fashion_mnist/{est}",
                # every downstream image (the preset may cap them): the caps are drawn here
                [
                    *args.set,
                    ("data.max_test", None),
                    ("data.class_split", cs),
                    ("seed", 0),
                    ("device", "cpu"),
                ],
                preset=args.preset,
                tuned=False,
            )
            c0, w0 = time.process_time(), time.perf_counter()
            res = run(cfg, cache=cache, keep_outputs=True, raise_errors=True, n_samples=0)
            out, labels = res.outputs["test"]
            emb = out.embedding.float()
            u = out.uncertainty.double().numpy()
            labels = torch.as_tensor(labels)
            wrong = _wrong(emb, labels)
            full = _auroc_wrong(u, wrong)
            rng = np.random.default_rng(0)
            boot = [
                _auroc_wrong(u[i], wrong[i])
                for i in (rng.integers(0, u.size, u.size) for _ in range(args.boot))
            ]
            caps: dict[str, list[float]] = {}
            for n in args.caps:
                if n not in subs:
                    subs[n] = [stratified_subsample(labels, n, seed=d) for d in range(args.draws)]
                vals = []
                for idx in subs[n]:
                    vals.append(_auroc_wrong(u[idx.numpy()], _wrong(emb[idx], labels[idx])))
                caps[str(n)] = vals
            row = {
                "split": k,
                "estimator": est,
                "n_test": int(u.size),
                "r_auroc_full": full,
                "r_auroc_run": res.metrics.get("r_auroc"),
                "boot_se_full": float(np.std(boot, ddof=1)),
                "caps": caps,
                "cpu_s": time.process_time() - c0,
                "wall_s": time.perf_counter() - w0,
                "load": os.getloadavg()[0],
            }
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(
                f"split {k} {est}: full {full:.4f} (run {row['r_auroc_run']:.4f}), boot SE "
                f"{row['boot_se_full']:.4f}, "
                + ", ".join(f"cap {n}: sd {np.std(v, ddof=1):.4f}" for n, v in caps.items())
                + f" ({row['cpu_s']:.0f} s CPU)",
                flush=True,
            )


def summary(args: argparse.Namespace) -> str:
    rows = [json.loads(line) for line in Path(args.log).read_text().splitlines() if line]
    proto = read_results(args.protocol, detail=False) if args.protocol else None
    between: dict[str, float] = {}
    between_diff: dict[str, float] = {}
    if proto is not None:
        runs = [r for r in proto["runs"] if r.get("error") is None]
        by = {(r["estimator"], r["split"]): r["r_auroc"] for r in runs}
        for e in {r["estimator"] for r in runs}:
            v = [by[(e, s)] for (m, s) in by if m == e]
            between[e] = float(np.std(v, ddof=1))
            d = [by[(e, s)] - by[("ce", s)] for (m, s) in by if m == e and ("ce", s) in by]
            if e != "ce" and len(d) > 1:
                between_diff[e] = float(np.std(d, ddof=1))
    ce = {r["split"]: r for r in rows if r["estimator"] == "ce"}
    caps = sorted({int(n) for r in rows for n in r["caps"]})
    lines = [
        "R-AUROC per (split, estimator): full-set value and within-split bootstrap SE; per "
        "cap the SD over class-balanced subsamples (the noise the cap adds), the mean shift "
        "(cap mean - full), and the SD of the paired difference to CE on the same subsamples",
        f"between-split SD (B) from {args.protocol} (every downstream image a query)",
        "",
        f"{'split':>5} {'estimator':<13} {'n':>6} {'full':>7} {'bootSE':>7} "
        + " ".join(f"{'sd@' + str(n):>8} {'shift':>7} {'dSD@' + str(n):>9}" for n in caps)
        + f" {'B':>7} {'B(d-CE)':>8}",
    ]
    ratios: dict[int, list[float]] = {n: [] for n in caps}
    ratios_d: dict[int, list[float]] = {n: [] for n in caps}
    for r in sorted(rows, key=lambda r: (r["split"], r["estimator"])):
        cells = []
        for n in caps:
            v = np.asarray(r["caps"][str(n)])
            sd = float(v.std(ddof=1))
            c = ce.get(r["split"])
            if c is not None and r["estimator"] != "ce":
                d = v - np.asarray(c["caps"][str(n)])
                dsd = float(d.std(ddof=1))
            else:
                dsd = float("nan")
            cells.append(f"{sd:8.4f} {v.mean() - r['r_auroc_full']:+7.4f} {dsd:9.4f}")
            b = between.get(r["estimator"])
            if b:
                ratios[n].append((sd / b) ** 2)
            bd = between_diff.get(r["estimator"])
            if bd and np.isfinite(dsd):
                ratios_d[n].append((dsd / bd) ** 2)
        b = between.get(r["estimator"], float("nan"))
        bd = between_diff.get(r["estimator"], float("nan"))
        lines.append(
            f"{r['split']:>5} {r['estimator']:<13} {r['n_test']:>6} {r['r_auroc_full']:7.4f} "
            f"{r['boot_se_full']:7.4f} " + " ".join(cells) + f" {b:7.4f} {bd:8.4f}"
        )
    lines.append("")
    for n in caps:
        if ratios[n]:
            lines.append(
                f"cap {n}: added variance / between-split variance of R-AUROC: median "
                f"{np.median(ratios[n]):.3f}, max {np.max(ratios[n]):.3f}; of the paired "
                f"difference to CE: median {np.median(ratios_d[n]):.3f}, max "
                f"{np.max(ratios_d[n]):.3f}"
                if ratios_d[n]
                else f"cap {n}: added / between-split variance median {np.median(ratios[n]):.3f}"
            )
    cpu = sum(r["cpu_s"] for r in rows)
    lines.append(f"{len(rows)} (split, estimator) rows, {cpu:.0f} s CPU (machine shared)")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--estimators", default="ce,losspred,infonce,elk,hetxl,tau,feature_norm")
    ap.add_argument("--caps", type=int, nargs="+", default=[5000, 8000])
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--boot", type=int, default=200)
    ap.add_argument("--preset", default="pretrained")
    ap.add_argument("--set", action="append", default=[], help="override of every run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log", required=True)
    ap.add_argument("--summary", action="store_true", help="print the table of --log")
    ap.add_argument("--protocol", default=None, help="a protocol's results.json (between SD)")
    ap.add_argument("--out", default=None, help="also write the table here")
    a = ap.parse_args()
    if a.summary:
        text = summary(a)
        print(text)
        if a.out:
            Path(a.out).write_text(text)
        return
    measure(a)


if __name__ == "__main__":
    main()
