"""``bayesurl benchmark`` options of the reproducible protocol (:mod:`bayesurl.runs.protocol`).

``--preset standard`` (or ``--worker``, ``--storage``, ``--tune``) turns ``bayesurl benchmark``
into the class-split x seed sweep stored in an Optuna RDB storage:

* ``bayesurl benchmark --preset standard``: tune nothing, enqueue every (estimator, split,
  seed) run in ``results/benchmark/standard/sweep.db``, work through them, write
  ``results.json`` / ``results.csv`` / ``recall_vs_rauroc.png`` when all are done. Killed and
  started again, it goes on where it stopped.
* ``--tune N``: first N Optuna trials per estimator on the validation classes (R-AUROC, R@1 <
  0.1 discarded); the chosen settings go to ``tuned.json`` and the sweep uses them.
* several machines / GPUs: ``--storage postgresql+psycopg2://user:pw@host/db`` on all of them, the
  first without ``--worker``, every further one with ``--worker`` (one per GPU:
  ``CUDA_VISIBLE_DEVICES=k bayesurl benchmark --worker --storage URL``).
* under ``torchrun`` (registry methods only): rank 0 claims each run and every rank runs it
  (DDP training, sharded evaluation); ``--worker`` and ``--tune`` are refused there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: Default ``--out`` of the single-split benchmark; the protocol writes to
#: ``results/benchmark/<preset>`` unless ``--out`` is given.
LEGACY_OUT = "runs/benchmark"


def add_protocol_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--worker``, ``--storage``, ``--tune`` to ``bayesurl benchmark``."""
    g = parser.add_argument_group("reproducible protocol (class splits x seeds, stored sweep)")
    g.add_argument(
        "--worker",
        action="store_true",
        help="join a running sweep: work on the runs already in --storage, then exit",
    )
    g.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="SQLAlchemy URL of the sweep storage (default sqlite:///OUT/sweep.db); "
        "postgresql+psycopg2://... for workers on several machines",
    )
    g.add_argument(
        "--tune",
        type=int,
        default=0,
        metavar="N",
        help="Optuna trials per estimator on the validation classes before the sweep "
        "(R-AUROC objective, R@1 < 0.1 discarded); chosen settings -> OUT/tuned.json",
    )


def wants_protocol(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask for the stored class-split protocol."""
    from bayesurl.runs.protocol import PROTOCOL_PRESETS

    return bool(
        (args.preset == "standard" and args.preset in PROTOCOL_PRESETS)
        or getattr(args, "worker", False)
        or getattr(args, "storage", None)
        or getattr(args, "tune", 0)
    )


def smoke_notice(preset: str) -> str | None:
    """The line a smoke-scale preset prints (``None`` for the real one)."""
    if preset in ("quick", "smoke"):
        return (
            f"NOTE: --preset {preset} is a smoke-scale run (one class split, few epochs, small "
            "sets): its ranking of the uncertainties is noise, not a verdict. The real benchmark: "
            "`bayesurl benchmark --preset standard` (>= 4 class splits, <= 3 h on 2 CPU cores, "
            "minutes on a GPU; resumable; add machines with --worker --storage URL)."
        )
    return None


def run_protocol_command(args: argparse.Namespace) -> int:
    """Run the protocol for ``args``; 0 when every run of the sweep succeeded."""
    from bayesurl.runs.protocol import get_protocol_preset, run_protocol

    if args.tune < 0:
        raise ValueError(f"`--tune` must be >= 0, got {args.tune}")
    if args.worker and args.tune:
        raise ValueError("`--tune` runs on the first machine only; drop it with --worker")
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"`--threads` must be >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    preset = get_protocol_preset(args.preset)
    out = None if args.out == LEGACY_OUT else args.out
    methods = None
    if args.methods:
        methods = [m.strip().lower() for m in str(args.methods).split(",") if m.strip()]
    res = run_protocol(
        methods,
        preset=preset,
        out=out,
        storage=args.storage,
        worker=args.worker,
        tune=args.tune,
        dataset=getattr(args, "dataset", "fashion_mnist"),
        overrides=list(getattr(args, "overrides", None) or []),
        root=args.root,
        device=args.device,
    )
    if not res.get("main_process", True):  # torchrun: rank 0 reports
        return 0
    st = res["status"]
    print(
        f"sweep {preset.name}: {st['complete']}/{st['total']} runs finished "
        f"({res['done_here']} here), {st['running']} running elsewhere, {st['failed']} failed"
    )
    for key, path in res["paths"].items():
        print(f"  {key}: {path}")
    if res["paths"]:
        from bayesurl.report import try_report

        print(try_report(Path(next(iter(res["paths"].values()))).parent))
    return 1 if st["failed"] else 0
