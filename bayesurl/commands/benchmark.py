"""Train every estimator of a recipe file on the same data and print one comparison table.

One sweep engine (:func:`bayesurl.sweeps.run_sweep`) runs every estimator table of the data
set's TOML recipe (default FashionMNIST zero-shot, OOD = scikit-learn digits; URL benchmark,
Kirchhof et al., 2023, section 3) -- the twelve registry methods, PVU, post-hoc TaU and
laplace-torch Laplace on the CE base, LAM post-hoc and LAM online -- with the preset's data
sizes, training length and plan (``[presets.<name>.sweep]``: class splits, seeds, storage):

* ``--preset quick`` / ``smoke``: the standard split (upstream 0-4, downstream 5-9), in
  memory; prints R@1, R-AUROC, AUSC, ECE, OOD AUROC and training time, each with its 95 %
  interval (over the queries of one seed's run, or Student-t over the seeds; a column's best
  marked where a paired test separates it) and writes ``results.json``, ``results.csv``,
  ``recall_vs_rauroc.png`` (URL Fig. 2), each run's per-query record (``queries/``) and the
  HTML report ``report.html`` (:mod:`bayesurl.report`) to ``--out``. ``--merge`` joins such
  results made separately (e.g. one seed each).
* ``--preset standard``: 4 class splits in an Optuna RDB storage
  (``results/sweeps/standard/sweep.db``): killed and started again it goes on where it
  stopped; ``--storage URL`` on several machines, the further ones with ``--worker``;
  ``--tune N`` first runs N Optuna trials per estimator on the validation classes
  (``--tune-only``: and stops; ``OUT/tuned.toml`` is the ``[presets.<name>.tuned]`` table
  that commits the chosen settings to the recipe; ``--untuned`` runs without that table,
  at the recipe's defaults). The report holds t-intervals over the splits, the paired
  comparison against CE and the split-half reproducibility.

``--storage`` stores any preset's runs; ``--splits`` and ``--seeds`` replace the preset's.
Under ``torchrun`` every rank runs each run together (DDP training, sharded evaluation) and
rank 0 alone prints and writes; estimators whose fit is not distributed (post-hoc),
``--worker`` and ``--tune`` are refused before anything runs.

Examples::

    bayesurl benchmark --preset quick --out runs/benchmark
    bayesurl benchmark --methods ce,mcinfonce,pvu --seeds 0,1,2 --set train.epochs=5
    bayesurl benchmark --preset standard --tune 20
    bayesurl benchmark --preset pretrained --tune 20 --tune-only --out runs/tune
    torchrun --nproc_per_node 2 -m bayesurl benchmark --methods ce,mcinfonce --preset quick
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10 (the tomli dependency)
    import tomli as tomllib

from bayesurl.commands import name_flags, name_set_overrides
from bayesurl.sweeps.options import FLAGS, SweepOptions, add_flags, parse_seeds

if TYPE_CHECKING:
    from bayesurl.sweeps.results import SweepResults

__all__ = ["add_arguments", "parse_seeds", "run", "sweep_options"]

OUTPUT_DIRS = ("out",)  # checked while parsing (bayesurl.cli)
HELP = "train and evaluate every estimator on the same zero-shot data; print one table"

#: Default ``--out`` of an in-memory sweep; a stored one writes to ``results/sweeps/<preset>``
#: unless ``--out`` is given.
DEFAULT_OUT = "runs/benchmark"


def _recipe_presets(dataset: str = "fashion_mnist") -> list[str]:
    """The presets of a packaged recipe file, read when the parser is built (``--help`` lists
    them). Read as plain TOML: building the parser of every command must not import the run
    pipeline (``bayesurl evaluate`` starts without it)."""
    path = Path(__file__).resolve().parents[1] / "runs" / "recipes" / f"{dataset}.toml"
    with path.open("rb") as f:
        return list(tomllib.load(f).get("presets", {}))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bayesurl benchmark``: the command's own, then a flag per field of
    :class:`~bayesurl.sweeps.options.SweepOptions` that declares one
    (:func:`~bayesurl.sweeps.options.add_flags`)."""
    parser.add_argument(
        "--methods",
        "--estimators",
        dest="methods",
        default=None,
        help="comma-separated estimator names of the recipe file (default: all of them)",
    )
    parser.add_argument("--root", default=None, help="data folder (= --set data.root=DIR)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        default=None,
        help="train nothing: merge the results.json of earlier one-split sweeps (e.g. one "
        "seed each) into one table in --out",
    )
    add_flags(parser, default_out=DEFAULT_OUT, presets=", ".join(_recipe_presets()))


def check_arguments(args: argparse.Namespace) -> None:
    """The checks of the options that :func:`~bayesurl.sweeps.sweep.run_sweep` does not make
    (its :class:`~bayesurl.sweeps.sweep.SweepOptions` checks the sweep's own).

    Raises
    ------
    ValueError
        For ``--threads`` < 1.
    FileNotFoundError
        For a ``--root`` that does not exist.
    """
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"`--threads` must be >= 1, got {args.threads}")
    if args.root is not None and not Path(args.root).exists():
        raise FileNotFoundError(f"`--root` {args.root!r} does not exist")


def sweep_options(args: argparse.Namespace) -> SweepOptions:
    """The sweep's options from the flags (``--root`` joins the ``--set`` overrides); an
    error names the flag.

    Raises
    ------
    ValueError, TypeError
        As :class:`~bayesurl.sweeps.options.SweepOptions`, naming the flags.
    """
    overrides = list(args.overrides)
    if args.root is not None:
        overrides.append(("data.root", str(args.root)))
    try:
        return SweepOptions.from_flags(args, overrides=overrides, default_out=DEFAULT_OUT)
    except (ValueError, TypeError) as exc:
        raise type(exc)(name_flags(str(exc), FLAGS)) from exc


def merge(args: argparse.Namespace) -> int:
    """``--merge``: one table from earlier results; rank 0 alone under torchrun."""
    from bayesurl._checks import check_output_dir
    from bayesurl.report import print_notes, try_report
    from bayesurl.runs.runner import launch_rank
    from bayesurl.sweeps.results import merge_results

    out = check_output_dir(args.out or DEFAULT_OUT, "--out")
    if launch_rank() != 0:  # torchrun: merging trains nothing, rank 0 does it alone
        return 0
    merged = merge_results(args.merge)
    merged.save(out)
    print(merged.table())
    print_notes(out)
    print(f"merged {len(args.merge)} results into {out / 'results.json'}")
    print(try_report(out))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``bayesurl benchmark``; 0 when every run succeeded, 1 if some failed."""
    if args.merge:
        return merge(args)
    import torch

    from bayesurl.sweeps.sweep import run_sweep

    check_arguments(args)
    options = sweep_options(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        res = run_sweep(args.methods, options)
    except (ValueError, TypeError) as exc:  # the recipe's checks: --preset, --methods ...
        message = name_flags(str(exc), {**FLAGS, "estimators": "--methods"})
        raise type(exc)(name_set_overrides(message, args.overrides)) from exc
    if not res.main_process:  # torchrun: rank 0 reports (and alone wrote the files)
        return 1 if any(r.get("error") for r in res.runs) else 0
    if args.tune_only:
        return report_tuned(res)
    return report(res)


def report_tuned(res: SweepResults) -> int:
    """Print the settings ``--tune-only`` chose and where they were written; 0."""
    from bayesurl.sweeps.tuning import tuned_table

    print(tuned_table(res.settings["tuned"], res.settings.get("preset")), end="")
    if res.paths:
        print(f"written to {' and '.join(res.paths.values())}")
    return 0


def report(res: SweepResults) -> int:
    """Print the sweep's outcome and write its HTML report; 0 when every run succeeded.

    The notes and the page are made from the results in memory (the records and the document
    the sweep wrote); the page's thumbnails, which need the data built again, are left to
    ``bayesurl report DIR``.
    """
    from bayesurl.report import benchmark_source, notes_lines, try_report

    st = res.status or {}
    plan = res.settings.get("plan", {})
    one_split = plan.get("splits") == 0
    doc = res.document
    source = None
    if res.paths and doc is not None:
        folder = Path(res.paths["json"]).parent
        source = benchmark_source(folder, res.runs, res.settings, doc["summary"], doc["best"])
    if one_split and not (st.get("waiting") or st.get("running")):
        print(res.table())
        for line in [] if source is None else notes_lines(source):
            print(line)
    if plan.get("storage") == "stored" or not one_split:
        print(
            f"sweep {plan.get('name')}: {st.get('complete')}/{st.get('total')} runs finished "
            f"({res.done_here} here), {st.get('running')} running elsewhere, "
            f"{st.get('failed')} failed"
        )
        for key, path in res.paths.items():
            print(f"  {key}: {path}")
    else:
        total = res.settings["total_time"]
        print(f"total time {total:.1f} s; wrote {', '.join(res.paths.values())}")
    if source is not None:
        print(try_report(source, images=False))
        print(f"its thumbnails: bayesurl report {source.folder}")
    return 1 if st.get("failed") else 0
