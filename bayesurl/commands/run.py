"""Run one recipe: ``bayesurl run <dataset>/<estimator> [--preset NAME] [--set KEY=VALUE ...]``.

Reads the estimator's table from the data set's TOML recipe file
(:func:`bayesurl.runs.load_recipe`), trains it on the upstream classes, evaluates it zero-shot
on the downstream classes (URL section 3.2: R@1, R-AUROC, AUSC, ECE where a distribution is
defined, OOD AUROC) and writes ``result.json``, the checkpoint(s), the per-query record
``queries.npz`` and the HTML report ``report.html`` (:mod:`bayesurl.report`) into ``--out``.
The same recipe, preset and seed give the same metrics as the row of ``bayesurl benchmark``.

Examples::

    bayesurl run fashion_mnist/elk --preset smoke
    bayesurl run fashion_mnist/pvu --set train.epochs=5 --set estimator.fit.epochs=3
    bayesurl run cub/mcinfonce --set data.root=/data/cub --set backbone.checkpoint=r50.pt
    bayesurl run --list
    torchrun --nproc_per_node 2 -m bayesurl run fashion_mnist/mcinfonce --preset smoke

Under ``torchrun`` a registry method trains under DDP and the zero-shot evaluation is sharded
over the ranks (:func:`bayesurl.runs.runner.run`); rank 0 prints and writes.
"""

from __future__ import annotations

import argparse

OUTPUT_DIRS = ("out",)  # checked while parsing (bayesurl.cli)
HELP = "train and evaluate one recipe (dataset/estimator) from the TOML configs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bayesurl run``."""
    parser.add_argument(
        "recipe", nargs="?", help="<dataset>/<estimator>, e.g. fashion_mnist/elk (see --list)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value (train.epochs=5, estimator.kwargs.lam=0.1), repeatable",
    )
    parser.add_argument("--preset", default=None, help="a preset of the file: smoke, quick, full")
    parser.add_argument("--seed", type=int, default=None, help="training seed (= --set seed=N)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument("--out", default=None, help="output folder (default: runs/<recipe>)")
    parser.add_argument("--list", action="store_true", help="list every dataset/estimator")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    """Run the recipe and print its metrics; 0 on success."""
    from pathlib import Path

    from bayesurl._checks import check_device, check_output_dir
    from bayesurl.evaluation.table import metric_columns
    from bayesurl.report import print_notes, try_report
    from bayesurl.runs import list_recipes, load_recipe
    from bayesurl.runs import run as run_one
    from bayesurl.runs.queries import QUERIES_FILE
    from bayesurl.stats.intervals import interval_lines

    if args.list:
        for dataset, names in list_recipes().items():
            print(f"{dataset}: {' '.join(names)}")
        return 0
    if not args.recipe:
        raise ValueError("`recipe` is required: bayesurl run <dataset>/<estimator> (see --list)")
    overrides = list(args.overrides)
    if args.seed is not None:
        if args.seed < 0:
            raise ValueError(f"`--seed` must be >= 0, got {args.seed}")
        overrides.append(("seed", int(args.seed)))
    device = check_device(args.device, "--device")
    if device is not None:  # "auto" and no --device leave the recipe's choice
        overrides.append(("device", str(device)))
    out = check_output_dir(
        args.out if args.out is not None else Path("runs") / args.recipe, "--out"
    )
    cfg = load_recipe(args.recipe, overrides, preset=args.preset)
    result = run_one(cfg, out=out, progress=not args.no_progress, queries=out / QUERIES_FILE)
    if not result.main_process:  # torchrun: rank 0 reports
        return 0
    m = result.metrics
    print(f"{cfg.name} (seed {cfg.seed}, preset {cfg.preset}), each metric with its interval:")
    cols = [(c.key, c.title, c.digits) for c in metric_columns(shown=True)]
    for line in interval_lines(m, cols):
        print(f"  {line}")
    print(
        f"train {result.timings['train_time']:.1f} s, eval {result.timings['eval']:.1f} s; "
        f"wrote {out / 'result.json'}"
        + (f", checkpoint {result.checkpoint}" if result.checkpoint else "")
    )
    print_notes(out)
    print(try_report(out))
    return 0
