"""Train every URL method on the embedded zero-shot default and print one comparison table.

FashionMNIST zero-shot (upstream classes 0-4, downstream 5-9, OOD = scikit-learn digits;
digits alone if FashionMNIST is absent), the protocol of the URL benchmark (Kirchhof et al.,
2023, section 3). Columns: R@1, R-AUROC, AUSC, ECE (methods with a distribution), OOD AUROC,
training time; mean +- std over seeds. Writes ``results.json``, ``results.csv`` and
``recall_vs_rauroc.png`` (URL Fig. 2) into ``--out``. See :func:`bayesurl.benchmark.run_benchmark`.

Examples::

    bayesurl benchmark --preset quick --out runs/benchmark
    bayesurl benchmark --methods ce,mcinfonce,hetxl --seeds 0,1,2
"""

from __future__ import annotations

import argparse

from bayesurl.commands._protocol import (
    add_protocol_arguments,
    run_protocol_command,
    smoke_notice,
    wants_protocol,
)

HELP = "train and evaluate every method on the zero-shot default; print one table"


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
    from bayesurl.benchmark import PRESETS

    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated registry names (default: every registered method)",
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
        choices=[*PRESETS, "standard"],
        help="quick: <= 10 min on 2 CPU cores (smoke scale); full: all data, longer training; "
        "smoke: tests; standard: the reproducible protocol (class splits x seeds, stored, "
        "resumable; bayesurl.runs.protocol)",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument("--out", default="runs/benchmark", help="output folder")
    parser.add_argument("--root", default=None, help="FashionMNIST folder (default: system path)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    parser.add_argument(
        "--save-checkpoints",
        action="store_true",
        help="keep each run's checkpoint in OUT/checkpoints/<method>_s<seed>/last.pt",
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
    from pathlib import Path

    import torch

    from bayesurl.benchmark import merge_results, resolve_methods, run_benchmark

    if wants_protocol(args):
        return run_protocol_command(args)
    notice = smoke_notice(args.preset)
    if notice and not args.merge:
        print(notice)
    if args.merge:
        merged = merge_results(args.merge)
        merged.save(args.out)
        print(merged.table())
        print(f"merged {len(args.merge)} results into {Path(args.out) / 'results.json'}")
        return 0
    methods = resolve_methods(args.methods)  # unknown names raise, listing the valid ones
    seeds = parse_seeds(args.seeds)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"`--threads` must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.root is not None and not Path(args.root).exists():
        raise FileNotFoundError(f"`--root` {args.root!r} does not exist")
    out = Path(args.out)
    results = run_benchmark(
        methods,
        seeds=seeds,
        preset=args.preset,
        device=args.device,
        out=out,
        progress=not args.no_progress,
        root=args.root,
        checkpoint_dir=out / "checkpoints" if args.save_checkpoints else None,
    )
    print(results.table())
    total = results.settings["total_time"]
    print(
        f"total time {total:.1f} s; wrote {out / 'results.json'}, results.csv, recall_vs_rauroc.png"
    )
    return 1 if any(r["error"] for r in results.runs) else 0
