"""Per-run CPU cost of the benchmark protocol, and the standard preset's wall-time estimate.

Runs every estimator once on class split 0 with the evaluation at full size (35,000 downstream
retrieval images, 5,000 held-out upstream images, 1,797 digits) and a short training
(``--train`` images x 1 epoch), one torch thread, and appends one JSON line per estimator to
``--log`` (resumable: estimators already in the log are skipped). Then

    cost(run) = train_cpu / (train images x 1 epoch) x (max_train x epochs)  +  rest_cpu

where ``rest_cpu`` = the run's CPU time minus its training CPU time (data, embedding,
kNN, ECE draws), and the standard preset's wall time on 2 cores with two one-thread workers is
``sum(cost) * n_splits * n_seeds / 2``. CPU time is used because the shared machine's wall
time is inflated by other jobs (the load average is logged per run).

    PYTHONPATH=. python benchmarks/protocol_run_costs.py \
        --log results/benchmarks/protocol_run_costs.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def measure(estimators: list[str], log: Path, n_train: int) -> None:
    import torch

    from bayesurl.data.class_splits import class_splits
    from bayesurl.sweeps.options import SweepOptions
    from bayesurl.sweeps.pipeline import PipelineRun
    from bayesurl.sweeps.plan import SweepPreset

    torch.set_num_threads(1)
    done = set()
    if log.is_file():
        done = {json.loads(line)["estimator"] for line in log.read_text().splitlines() if line}
    preset = SweepPreset("timing", recipe_preset="quick", splits=1)
    sizes = [f"data.max_train={n_train}", "data.max_test=none", "data.max_ood=none"]
    fn = PipelineRun(
        SweepOptions(overrides=["train.epochs=1", *sizes]), preset=preset, device="cpu"
    )
    split = class_splits(1)[0].to_dict()
    for est in estimators:
        if est in done:
            continue
        c0, w0 = time.process_time(), time.perf_counter()
        rec = fn({"estimator": est, "split": 0, "seed": 0, "class_split": split, "stage": "final"})
        row = {
            "estimator": est,
            "n_train": n_train,
            "cpu_total": time.process_time() - c0,
            "wall": time.perf_counter() - w0,
            "train_cpu": rec.get("train_cpu_time"),
            "n_test": rec.get("n_test"),
            "r@1": rec.get("r@1"),
            "r_auroc": rec.get("r_auroc"),
            "error": rec.get("error"),
            "load": os.getloadavg()[0],
        }
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(row, flush=True)


def estimate(
    log: Path,
    max_train: int,
    epochs: int,
    n_runs_per_estimator: int,
    n_estimators: int = 0,
    n_posthoc: int = 0,
) -> float:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line]
    total = 0.0
    print(f"{'estimator':14s} {'train s/1k img-ep':>18s} {'rest CPU s':>10s} {'run CPU s':>10s}")
    for r in rows:
        per = (r["train_cpu"] or 0.0) / r["n_train"]
        rest = r["cpu_total"] - (r["train_cpu"] or 0.0)
        cost = per * max_train * epochs + rest
        total += cost
        print(f"{r['estimator']:14s} {1000 * per:18.2f} {rest:10.1f} {cost:10.1f}")
    wall = total * n_runs_per_estimator / 2
    print(
        f"sum over {len(rows)} measured estimators: {total:.0f} CPU s per (split, seed); "
        f"x {n_runs_per_estimator} (split, seed) pairs / 2 workers = {wall / 3600:.2f} h"
    )
    if n_estimators > len(rows):
        mean = total / len(rows)
        ce = next((r for r in rows if r["estimator"] == "ce"), None)
        base = 0.0
        if ce is not None:  # post-hoc estimators may retrain their CE base in each worker
            base = n_posthoc * (ce["train_cpu"] / ce["n_train"]) * max_train * epochs
        wall = (n_estimators * mean + base) * n_runs_per_estimator / 2
        print(
            f"scaled to {n_estimators} estimators at the measured mean ({mean:.0f} CPU s per run)"
            f" + {n_posthoc} CE base retrainings per (split, seed) ({base:.0f} CPU s): "
            f"{wall / 3600:.2f} h on 2 cores with two one-thread workers"
        )
    return wall


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--estimators",
        default="ce,elk,mcinfonce,hib,nivmf,infonce,hetxl,sngp,"
        "losspred,ensemble,mcdropout,tau,pvu,tau_posthoc,laplace_ce,lam_posthoc,lam_online",
    )
    ap.add_argument("--log", type=Path, default=Path("results/benchmarks/protocol_run_costs.jsonl"))
    ap.add_argument("--train", type=int, default=2000, help="training images of the measurement")
    ap.add_argument("--max-train", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=4, help="(split, seed) pairs of the preset")
    ap.add_argument("--estimate-only", action="store_true")
    ap.add_argument("--n-estimators", type=int, default=17, help="estimators of the sweep")
    ap.add_argument("--n-posthoc", type=int, default=3, help="post-hoc estimators on a CE base")
    a = ap.parse_args()
    if not a.estimate_only:
        measure(a.estimators.split(","), a.log, a.train)
    estimate(a.log, a.max_train, a.epochs, a.pairs, a.n_estimators, a.n_posthoc)
