"""Run a stored sweep's finished runs of one class split again and compare with their records.

    python tools/reproduce_split.py results/pretrained/crossfit/default --split 0
    python tools/reproduce_split.py results/clipart/protocol --split 0 --dataset clipart

Each finished run of split ``--split`` in ``FOLDER/sweep.db`` is run again from its stored
parameters (the same resolved settings a worker of the sweep would run) with the frozen
features extracted into ``--cache`` -- by default a fresh, empty temporary folder, so that
nothing the sweep's own cache held can reach the result -- and every metric of the new record
is compared with the stored one. The storage is read from a copy (SQLite's backup API); it is
never written.

Prints one line per estimator (its largest absolute difference over the metrics) and writes
``--out`` (JSON: every metric, stored and now). Exit status 1 when a difference exceeds
``--tol``.
"""

from __future__ import annotations

import argparse
import lzma
import math
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
import torch

from bayesurl.files import write_json
from bayesurl.sweeps.options import SweepOptions
from bayesurl.sweeps.pipeline import PipelineRun
from bayesurl.sweeps.plan import sweep_preset
from bayesurl.sweeps.record import RunRecord

#: The metrics compared (every number a protocol's tables read).
METRICS = (
    "r@1",
    "r_auroc",
    "ausc",
    "ece",
    "ood_auroc",
    "ood_auprc",
    "map@5",
    "recall@5",
    "rank_correlation",
    "mixed_r_auroc",
)


def stored_runs(folder: Path, split: int) -> tuple[str, list[tuple[dict, dict]]]:
    """The sweep's name and ``(params, record)`` of its finished runs of ``split`` (each
    record a row of :class:`~bayesurl.sweeps.record.RunRecord`, whatever the sweep stored)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "sweep.db"
        packed = folder / "sweep.db.xz"
        if not (folder / "sweep.db").is_file() and packed.is_file():
            # a committed protocol keeps its storage compressed (results/README.md)
            with lzma.open(packed) as src, open(copy, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            # SQLite's backup API: a consistent copy, a running sweep's write-ahead log included
            with sqlite3.connect(folder / "sweep.db") as src, sqlite3.connect(copy) as dst:
                src.backup(dst)
        storage = optuna.storages.RDBStorage(f"sqlite:///{copy}")
        names = [
            s.study_name for s in storage.get_all_studies() if s.study_name.startswith("sweep:")
        ]
        if len(names) != 1:
            raise SystemExit(f"{folder / 'sweep.db'}: expected one sweep, found {names}")
        trials = storage.get_all_trials(storage.get_study_id_from_name(names[0]))
        storage.engine.dispose()
    done: dict[str, tuple[dict, dict]] = {}
    for t in sorted(trials, key=lambda t: t._trial_id):
        key = t.user_attrs.get("key")
        if (
            key is None
            or t.state != optuna.trial.TrialState.COMPLETE
            or t.system_attrs.get("superseded")
            or int(t.user_attrs["params"]["split"]) != split
        ):
            continue
        record = RunRecord.from_row(t.user_attrs["record"]).to_row()
        done.setdefault(key, (dict(t.user_attrs["params"]), record))
    return names[0].removeprefix("sweep:"), list(done.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a stored sweep's folder (sweep.db or sweep.db.xz)")
    ap.add_argument("--split", type=int, default=0, help="the class split to run again")
    ap.add_argument("--dataset", default="fashion_mnist", help="the sweep's recipe file")
    ap.add_argument("--estimators", default=None, help="comma-separated (default: all)")
    ap.add_argument("--cache", type=Path, default=None, help="feature cache (default: empty)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--tol", type=float, default=1e-6, help="largest allowed difference")
    ap.add_argument("--out", type=Path, default=None, help="JSON of every comparison")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    name, runs = stored_runs(a.folder, a.split)
    if a.estimators:
        keep = set(a.estimators.split(","))
        runs = [r for r in runs if r[0]["estimator"] in keep]
    if not runs:
        raise SystemExit(f"no finished runs of split {a.split} in {a.folder / 'sweep.db'}")
    cache = a.cache or Path(tempfile.mkdtemp(prefix="features-"))
    print(f"{len(runs)} runs of split {a.split} ({name}); feature cache {cache}", flush=True)
    fns: dict[bool, PipelineRun] = {}
    rows: list[dict[str, Any]] = []
    worst = 0.0
    for params, record in runs:
        tuned = bool(params.get("recipe_tuned", True))
        if tuned not in fns:
            opts = SweepOptions(
                dataset=a.dataset,
                overrides=[f"backbone.cache={cache}"],
                recipe_tuned=tuned,
                progress=False,
            )
            fns[tuned] = PipelineRun(opts, preset=sweep_preset(a.dataset, name), device="cpu")
        t0 = time.perf_counter()
        now = fns[tuned](dict(params))
        diffs = {}
        for m in METRICS:
            old, new = record.get(m), now.get(m)
            if old is None and new is None:
                continue
            both = isinstance(old, (int, float)) and isinstance(new, (int, float))
            diffs[m] = abs(float(new) - float(old)) if both else math.inf
        top = max(diffs, key=lambda m: diffs[m])
        worst = max(worst, diffs[top])
        rows.append(
            {
                "estimator": params["estimator"],
                "error": now.get("error"),
                "max_abs_diff": diffs[top],
                "worst_metric": top,
                "stored": {m: record.get(m) for m in diffs},
                "now": {m: now.get(m) for m in diffs},
            }
        )
        print(
            f"{params['estimator']:>13}: max |diff| {diffs[top]:.2e} ({top}); R-AUROC "
            f"{record.get('r_auroc')} -> {now.get('r_auroc')}  [{time.perf_counter() - t0:.0f} s]",
            flush=True,
        )
    if a.out is not None:
        doc = {"folder": str(a.folder), "split": a.split, "cache": str(cache), "runs": rows}
        write_json(a.out, doc, indent=1)
    print(f"largest difference {worst:.2e} (tolerance {a.tol:g})")
    return 0 if worst <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
