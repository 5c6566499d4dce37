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
from typing import TYPE_CHECKING, Any

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10 (the tomli dependency)
    import tomli as tomllib

from bayesurl.commands import name_flags

if TYPE_CHECKING:
    from bayesurl.sweeps.results import SweepResults
    from bayesurl.sweeps.sweep import SweepOptions

OUTPUT_DIRS = ("out",)  # checked while parsing (bayesurl.cli)
HELP = "train and evaluate every estimator on the same zero-shot data; print one table"

#: Default ``--out`` of an in-memory sweep; a stored one writes to ``results/sweeps/<preset>``
#: unless ``--out`` is given.
DEFAULT_OUT = "runs/benchmark"


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
            parts = [s.strip() for s in raw.removesuffix(",").split(",")]
            if "" in parts:  # "0,,1": a seed left out, not a list of two
                raise ValueError(f"`--seeds {raw}` has an empty entry")
            seeds = [int(s) for s in parts]
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"`--seeds {raw}` names a seed twice")
        else:
            n = int(raw)
            if n < 0:
                raise ValueError(f"`--seeds {raw}`: seeds are non-negative integers")
            if n < 1:
                raise ValueError(
                    f"`--seeds {raw}`: a single number is a count (>= 1); "
                    f"write `{raw},` for that one seed"
                )
            seeds = list(range(n))
    except ValueError as exc:
        if "`--seeds" in str(exc):
            raise
        raise ValueError(
            f"`--seeds` must be a count (3) or a comma-separated list (0,1,2), got {text!r}"
        ) from None
    if not seeds or min(seeds) < 0:
        raise ValueError(f"`--seeds` must hold non-negative integers, got {text!r}")
    return list(dict.fromkeys(seeds))


def _recipe_presets(dataset: str = "fashion_mnist") -> list[str]:
    """The presets of a packaged recipe file, read when the parser is built (``--help`` lists
    them). Read as plain TOML: building the parser of every command must not import the run
    pipeline (``bayesurl evaluate`` starts without it)."""
    path = Path(__file__).resolve().parents[1] / "runs" / "recipes" / f"{dataset}.toml"
    with path.open("rb") as f:
        return list(tomllib.load(f).get("presets", {}))


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
        default=None,
        help="comma-separated seeds (0,1,2; one seed: 7,) or a count (3 = seeds 0,1,2); "
        "default: the preset's (seed 0)",
    )
    parser.add_argument(
        "--splits",
        type=int,
        default=None,
        help="class splits instead of the preset's (0: the standard zero-shot split)",
    )
    parser.add_argument(
        "--preset",
        default="quick",
        help="a preset of the recipe file: smoke (tests), quick (minutes, one split), "
        "standard (4 class splits, stored, resumable), full; on pretrained features "
        "pretrained_smoke, pretrained_quick (the main job, make run) and pretrained (the "
        "cross-fitted class splits). The default recipe's presets: " + ", ".join(_recipe_presets()),
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
    parser.add_argument(
        "--out",
        default=None,
        help=f"output folder (default: {DEFAULT_OUT}; a stored sweep: results/sweeps/PRESET)",
    )
    parser.add_argument("--root", default=None, help="data folder (= --set data.root=DIR)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    parser.add_argument(
        "--save-checkpoints",
        action="store_true",
        help="keep each run's checkpoint in OUT/checkpoints/<estimator>[_split<k>]_s<seed>/",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the per-run lines")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        default=None,
        help="train nothing: merge the results.json of earlier one-split sweeps (e.g. one "
        "seed each) into one table in --out",
    )
    g = parser.add_argument_group("stored sweeps (resumable, several workers)")
    g.add_argument(
        "--worker",
        action="store_true",
        help="join a running sweep: work on the runs already in --storage, then exit",
    )
    g.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="SQLAlchemy URL of the sweep storage (default of a stored preset: "
        "sqlite:///OUT/sweep.db); postgresql+psycopg2://... for workers on several machines",
    )
    g.add_argument(
        "--heartbeat",
        type=int,
        default=30,
        metavar="SECONDS",
        help="seconds between a running run's heartbeats; a run whose worker stays silent for "
        "4 heartbeats (killed, machine lost) is given to another worker (default: 30)",
    )
    g.add_argument(
        "--poll",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between looks while waiting for the plan or for runs elsewhere (default: 10)",
    )
    g.add_argument(
        "--tune",
        type=int,
        default=0,
        metavar="N",
        help="Optuna trials per estimator on the validation classes before the sweep "
        "(R-AUROC objective, R@1 < 0.1 discarded); chosen settings -> OUT/tuned.json and "
        "OUT/tuned.toml (the recipe's [presets.NAME.tuned] table)",
    )
    g.add_argument(
        "--tune-split",
        type=int,
        default=0,
        metavar="K",
        help="tune on class split K's validation classes (training on its other upstream "
        "classes); in a cross-fitted preset split K holds the K-th validation set",
    )
    g.add_argument(
        "--tune-only",
        action="store_true",
        help="stop after --tune: plan and run nothing (then commit OUT/tuned.toml)",
    )
    g.add_argument(
        "--untuned",
        action="store_true",
        help="ignore the preset's committed [presets.NAME.tuned] table: the recipe's default "
        "settings (how results/pretrained/protocol ran); a --worker follows the lead's choice",
    )


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


#: the :class:`~bayesurl.sweeps.sweep.SweepOptions` fields set by a flag of another name
FLAGS = {
    "dataset": "--dataset",
    "preset": "--preset",
    "seeds": "--seeds",
    "splits": "--splits",
    "overrides": "--set",
    "device": "--device",
    "out": "--out",
    "storage": "--storage",
    "save_checkpoints": "--save-checkpoints",
    "tune": "--tune",
    "tune_only": "--tune-only",
    "tune_split": "--tune-split",
    "worker": "--worker",
    "poll": "--poll",
    "heartbeat_interval": "--heartbeat",
}


def sweep_options(
    args: argparse.Namespace, seeds: Any, overrides: list[Any], device: Any
) -> SweepOptions:
    """The sweep's options from the flags; an error names the flag.

    Raises
    ------
    ValueError
        As :class:`~bayesurl.sweeps.sweep.SweepOptions`, naming the flags.
    """
    from bayesurl.sweeps.sweep import SweepOptions

    try:
        return SweepOptions(
            dataset=args.dataset,
            preset=args.preset,
            seeds=seeds,
            splits=args.splits,
            overrides=overrides,
            device=device,
            out=args.out,
            default_out=DEFAULT_OUT,
            storage=args.storage,
            worker=args.worker,
            tune=args.tune,
            tune_only=args.tune_only,
            tune_split=args.tune_split,
            recipe_tuned=not args.untuned,
            save_checkpoints=args.save_checkpoints,
            progress=not args.no_progress,
            poll=args.poll,
            heartbeat_interval=args.heartbeat,
        )
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

    from bayesurl._checks import check_device
    from bayesurl.sweeps.sweep import run_sweep

    check_arguments(args)
    device = check_device(args.device, "--device")
    seeds = None if args.seeds is None else parse_seeds(args.seeds)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    overrides = list(args.overrides)
    if args.root is not None:
        overrides.append(("data.root", str(args.root)))
    options = sweep_options(args, seeds, overrides, device)
    try:
        res = run_sweep(args.methods, options)
    except ValueError as exc:  # an estimator name is given with --methods
        raise ValueError(name_flags(str(exc), {"estimators": "--methods"})) from exc
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
