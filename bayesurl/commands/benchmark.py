"""Train every estimator of a recipe file on the same data and print one comparison table.

A sweep of ``bayesurl run`` (:func:`bayesurl.runs.run_sweep`): every estimator table of the
data set's TOML recipe (default FashionMNIST zero-shot, upstream classes 0-4, downstream 5-9,
OOD = scikit-learn digits; URL benchmark, Kirchhof et al., 2023, section 3) -- the twelve
registry methods, PVU, post-hoc TaU and laplace-torch Laplace on the CE base, LAM post-hoc and
LAM online -- with the preset's data sizes and training length. Columns: R@1, R-AUROC, AUSC,
ECE (estimators with a distribution), OOD AUROC, training time; mean +- std over seeds.
Writes ``results.json``, ``results.csv``, ``recall_vs_rauroc.png`` (URL Fig. 2), each run's
per-query record (``queries/``) and the HTML report ``report.html`` (:mod:`bayesurl.report`)
to ``--out``.

Under ``torchrun`` every rank runs the same runs in the same order in one process group: each
method trains under DDP and is evaluated sharded (issue 16); rank 0 alone prints and writes.
Estimators whose fit is not distributed (post-hoc) are refused before anything runs, in
one error naming them. In the stored protocol (``--preset standard``, ``--storage``) rank 0
claims each run and sends it to the other ranks; ``--worker`` and ``--tune`` are refused
under ``torchrun`` (:func:`bayesurl.runs.protocol.refuse_under_torchrun`).

Examples::

    bayesurl benchmark --preset quick --out runs/benchmark
    bayesurl benchmark --methods ce,mcinfonce,pvu --seeds 0,1,2 --set train.epochs=5
    torchrun --nproc_per_node 2 -m bayesurl benchmark --methods ce,mcinfonce --preset quick
"""

from __future__ import annotations

import argparse

from bayesurl.commands._protocol import (
    add_protocol_arguments,
    run_protocol_command,
    smoke_notice,
    wants_protocol,
)

OUTPUT_DIRS = ("out",)  # checked while parsing (bayesurl.cli)
HELP = "train and evaluate every estimator on the same zero-shot data; print one table"


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; a single number ``"3"`` is a count -> ``[0, 1, 2]``.

    A single explicit seed is written with a trailing comma (``"7,"``).

    Raises
    ------
    ValueError
        On anything but non-negative integers, or a count below 1.
    """
    raw = str(text).strip()
    try:
        if "," in raw:
            seeds = [int(s) for s in raw.split(",") if s.strip()]
        else:
            n = int(raw)
            if n < 1:
                raise ValueError(
                    f"`--seeds {raw}`: a single number is a count (>= 1); "
                    f"write `{raw},` for that one seed"
                )
            seeds = list(range(n))
    except ValueError as exc:
        if "`--seeds`" in str(exc):
            raise
        raise ValueError(
            f"`--seeds` must be a count (3) or a comma-separated list (0,1,2), got {text!r}"
        ) from None
    if not seeds or min(seeds) < 0:
        raise ValueError(f"`--seeds` must hold non-negative integers, got {text!r}")
    return list(dict.fromkeys(seeds))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bayesurl benchmark``."""
    parser.add_argument(
        "--methods",
        "--estimators",
        dest="methods",
        default=None,
        help="comma-separated estimator names of the recipe file (default: all of them)",
    )
    parser.add_argument(
        "--dataset", default="fashion_mnist", help="recipe file (default: fashion_mnist)"
    )
    parser.add_argument(
        "--seeds",
        default="1",
        help="comma-separated seeds (0,1,2; one seed: 7,) or a count (3 = seeds 0,1,2); "
        "default: 1 (seed 0)",
    )
    parser.add_argument(
        "--preset",
        default="quick",
        help="a preset of the recipe file: quick (minutes on 2 CPU cores, smoke scale), full, "
        "smoke (tests); standard: the reproducible protocol (class splits x seeds, stored, "
        "resumable; bayesurl.runs.protocol)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value of every run (train.epochs=5), repeatable",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument("--out", default="runs/benchmark", help="output folder")
    parser.add_argument("--root", default=None, help="data folder (= --set data.root=DIR)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    parser.add_argument(
        "--save-checkpoints",
        action="store_true",
        help="keep each run's checkpoint in OUT/checkpoints/<estimator>_s<seed>/",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        default=None,
        help="train nothing: merge the results.json of earlier runs (e.g. one seed each) "
        "into one table in --out",
    )
    add_protocol_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``bayesurl benchmark``; 0 when every run succeeded, 1 if some failed."""
    if wants_protocol(args):  # the stored class-split protocol (bayesurl.runs.protocol)
        return run_protocol_command(args)
    from pathlib import Path

    import torch

    from bayesurl._checks import check_device, check_output_dir
    from bayesurl.report import try_report
    from bayesurl.runs.results import merge_results
    from bayesurl.runs.runner import launch_rank
    from bayesurl.runs.sweep import resolve_estimators, run_sweep

    notice = smoke_notice(args.preset)
    if notice and not args.merge and launch_rank() == 0:  # torchrun: rank 0 prints
        print(notice)

    out = check_output_dir(args.out, "--out")
    device = check_device(args.device, "--device")
    if args.merge:
        if launch_rank() != 0:  # torchrun: merging trains nothing, rank 0 does it alone
            return 0
        merged = merge_results(args.merge)
        merged.save(out)
        print(merged.table())
        print(f"merged {len(args.merge)} results into {out / 'results.json'}")
        print(try_report(out))
        return 0
    names = resolve_estimators(args.methods, args.dataset)  # unknown names raise
    seeds = parse_seeds(args.seeds)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"`--threads` must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    overrides = list(args.overrides)
    if args.root is not None:
        if not Path(args.root).exists():
            raise FileNotFoundError(f"`--root` {args.root!r} does not exist")
        overrides.append(("data.root", str(args.root)))
    results = run_sweep(
        names,
        dataset=args.dataset,
        preset=args.preset,
        seeds=seeds,
        overrides=overrides,
        device=device,
        out=out,
        checkpoint_dir=out / "checkpoints" if args.save_checkpoints else None,
        progress=not args.no_progress,
    )
    if not results.main_process:  # torchrun: rank 0 reports (and alone wrote the files)
        return 1 if any(r["error"] for r in results.runs) else 0
    print(results.table())
    total = results.settings["total_time"]
    print(
        f"total time {total:.1f} s; wrote {out / 'results.json'}, results.csv, recall_vs_rauroc.png"
    )
    print(try_report(out))
    return 1 if any(r["error"] for r in results.runs) else 0
