r"""Train one method on the upstream classes of a zero-shot split and save a checkpoint.

The URL training recipe (Kirchhof et al., 2023, section 4 and appendix B): LAMB, linear warm-up
and cosine annealing, two augmented views for the self-supervised methods. The checkpoint
``OUT/last.pt`` records the method's registry name and constructor arguments, so
``bayesurl evaluate --checkpoint OUT/last.pt`` can rebuild it
(:func:`bayesurl.training.load_method_from_checkpoint`). Runs under ``torchrun`` too
(``torchrun --nproc_per_node 2 -m bayesurl train ...``): DDP with one process per rank.

Data: ``default`` (FashionMNIST classes 0-4, or the digits when FashionMNIST is absent),
``fashion_mnist``, ``digits``, or ``cub`` / ``cars`` / ``sop`` read from ``--root`` with their
standard train classes. The options become ``--set`` style overrides of a
:class:`bayesurl.runs.RunConfig` (:data:`FLAG_KEYS` says which key each sets; ``--set`` applies
after them, :func:`build_config` states the order) and :func:`bayesurl.runs.runner.train` does
the work (the data assembly, transforms and training of ``bayesurl run``, without the
evaluation); this module only parses and reports.

Examples::

    bayesurl train --method ce --dataset default --epochs 2 --subset 2000 --out runs/ce
    torchrun --nproc_per_node 8 -m bayesurl train --recipe imagenet/mcinfonce \
        --set data.root=/data/imagenet --set data.downstream_root=/data/dml \
        --set backbone.checkpoint=resnet50_imagenet.pt --out runs/imagenet/mcinfonce
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from bayesurl.data.registry import DatasetKind, dataset_kind, dataset_names
from bayesurl.files import write_json

OUTPUT_DIRS = ("out",)  # checked while parsing (bayesurl.cli)
HELP = "train one method on the upstream classes and save a checkpoint"

#: the embedded sets (28 x 28 grayscale, in memory) and the folder sets read from ``--root``
DATASETS = dataset_names(DatasetKind.EMBEDDED, DatasetKind.FOLDER)


def _method_arg(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--method-arg expects KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bayesurl train``."""
    parser.add_argument(
        "--method", default=None, help="registry name (bayesurl.methods); or give --recipe"
    )
    parser.add_argument(
        "--recipe",
        default=None,
        help="train a recipe's method instead (<dataset>/<estimator>, see `bayesurl run "
        "--list`); with --set / --preset / --device, the other run options are ignored",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value (train.epochs=5, eval.samples=2), after the other "
        "options; repeatable",
    )
    parser.add_argument("--preset", default=None, help="a preset of the recipe (with --recipe)")
    parser.add_argument(
        "--dataset",
        default="default",
        help=f"one of {', '.join(DATASETS)} (default: FashionMNIST 0-4, digits if absent)",
    )
    parser.add_argument(
        "--root",
        default=None,
        help="data folder: FashionMNIST (default: system path) or the cub/cars/sop root",
    )
    parser.add_argument(
        "--image-size", type=int, default=224, help="side of cub/cars/sop images (crop)"
    )
    parser.add_argument(
        "--backbone",
        default="small_convnet",
        help="'small_convnet' or a timm model name (random init, no download)",
    )
    parser.add_argument(
        "--backbone-checkpoint",
        default=None,
        help="local backbone weights (loaded with weights_only=True; works offline)",
    )
    parser.add_argument("--embed-dim", type=int, default=64, help="embedding dimension D")
    parser.add_argument(
        "--method-arg",
        type=_method_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra constructor argument of the method (VALUE parsed as JSON), repeatable",
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128, help="per-process micro-batch")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--optimizer", default="lamb", help="lamb, adamw or sgd")
    parser.add_argument("--warmup-epochs", type=float, default=1.0)
    parser.add_argument("--amp", default="auto", help="auto, off, bf16 or fp16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subset", type=int, default=None, help="cap on training images")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--out", default="runs/train", help="output folder (checkpoints, plot)")
    parser.add_argument("--resume", default=None, help="checkpoint to continue from")
    parser.add_argument("--keep-epoch-checkpoints", action="store_true")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads of torch (default: torch's choice)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


#: What each option sets in the run config, the one statement of their meaning; the other
#: options (``RUN_OPTIONS``) steer the command, not the run.
FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "method": ("estimator.name",),
    "method_arg": ("estimator.kwargs",),
    "dataset": ("data.name",),
    "root": ("data.root",),
    "image_size": ("data.image_size",),
    "subset": ("data.max_train",),
    "seed": ("seed", "data.seed"),
    "backbone": ("backbone.name",),
    "backbone_checkpoint": ("backbone.checkpoint",),
    "embed_dim": ("backbone.embed_dim",),
    "epochs": ("train.epochs",),
    "batch_size": ("train.batch_size",),
    "grad_accum": ("train.grad_accum",),
    "lr": ("train.lr",),
    "weight_decay": ("train.weight_decay",),
    "optimizer": ("train.optimizer",),
    "warmup_epochs": ("train.warmup_epochs",),
    "amp": ("train.amp",),
    "num_workers": ("train.num_workers",),
}
RUN_OPTIONS = (
    "recipe",
    "overrides",
    "preset",
    "device",
    "out",
    "resume",
    "keep_epoch_checkpoints",
    "threads",
    "no_progress",
)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The options' values as the config takes them (names resolved, checked naming the
    option); every option has one, given or its default."""
    from bayesurl.methods import get

    cls = get(args.method)  # unknown names raise, listing the valid ones
    name, kind = dataset_kind(args.dataset, argument="--dataset", allowed=DATASETS)
    if kind is DatasetKind.FOLDER:
        if args.root is None:
            raise ValueError(f"`--root` is required for --dataset {name}")
        if args.image_size < 8:
            raise ValueError(f"`--image-size` must be >= 8, got {args.image_size}")
    if args.subset is not None and args.subset < 1:
        raise ValueError(f"`--subset` must be >= 1, got {args.subset}")
    values = {dest: getattr(args, dest) for dest in FLAG_KEYS}
    values["method"] = cls.name
    values["method_arg"] = dict(args.method_arg)
    values["dataset"] = name
    # the embedded sets are 28 x 28; --image-size is the crop of the folder sets
    values["image_size"] = args.image_size if kind is DatasetKind.FOLDER else 28
    return values


def build_config(args: argparse.Namespace) -> Any:
    """The :class:`bayesurl.runs.RunConfig` of the options (validated, naming the option).

    With ``--recipe``: :func:`bayesurl.runs.load_recipe` (the recipe, its ``--preset``, then
    ``--set``, then ``--device``). Without, the options resolve through
    :func:`bayesurl.runs.config.resolve_tables`, the same overrides and checks, in this order
    (a later one wins):

    1. the defaults of :class:`bayesurl.runs.RunConfig`;
    2. every option of :data:`FLAG_KEYS` as an override of its keys, with its value or its
       default (so this command's defaults, 5 epochs of LAMB with one warm-up epoch, win over
       the config's);
    3. ``--set KEY=VALUE`` in order;
    4. ``--device``.

    Values pass as given: ``--method-arg spectral_norm=none`` is the string ``"none"`` (JSON
    ``null`` is ``None``). An error in a key an option sets names the option
    (``--epochs``, not ``train.epochs``).
    """
    from bayesurl._checks import check_device, check_output_dir
    from bayesurl.runs import load_recipe
    from bayesurl.runs.config import resolve_tables

    check_output_dir(args.out, "--out")
    device = check_device(args.device, "--device")
    if args.resume is not None and not Path(args.resume).is_file():
        raise FileNotFoundError(f"`--resume` checkpoint {args.resume!r} does not exist")
    last = [] if device is None else [("device", str(device))]
    if args.recipe is not None:
        _refuse_options_beside_recipe(args)
        return load_recipe(args.recipe, [*args.overrides, *last], preset=args.preset)
    if args.method is None:
        raise ValueError("`--method` (a registry name) or `--recipe` is required")
    if args.preset is not None:
        raise ValueError("`--preset` is a preset of a recipe file: give it with `--recipe`")
    values = _flag_values(args)
    flags = [(key, values[dest]) for dest, keys in FLAG_KEYS.items() for key in keys]
    try:
        return resolve_tables(
            {}, [*flags, *args.overrides, *last], dataset=values["dataset"], toml_none=False
        )
    except ValueError as exc:
        raise ValueError(_name_flags(str(exc), args.overrides)) from None


def _refuse_options_beside_recipe(args: argparse.Namespace) -> None:
    """A run option changed from its default beside ``--recipe`` would be ignored: refuse it,
    naming the ``--set`` that does what it meant."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    for dest, keys in FLAG_KEYS.items():
        value = getattr(args, dest, None)
        if value is not None and value != parser.get_default(dest):
            flag = "--" + dest.replace("_", "-")
            sets = " ".join(f"--set {key}=..." for key in keys)
            raise ValueError(
                f"`{flag}` has no effect with `--recipe` (the recipe sets {', '.join(keys)}); "
                f"give it as {sets}"
            )


def _name_flags(message: str, overrides: list[str]) -> str:
    """``message`` with the config keys an option sets named by the option (a key also
    given with ``--set`` keeps its name)."""
    given = {str(o).split("=", 1)[0].strip() for o in overrides}
    for dest, keys in FLAG_KEYS.items():
        for key in keys:
            if key not in given:
                message = message.replace(f"`{key}`", f"`{_flag(dest)}`")
    return message


def run(args: argparse.Namespace) -> int:
    """Train, checkpoint every epoch, write ``train.json`` and ``loss.png``; 0 on success."""
    import torch

    from bayesurl.runs.runner import train

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"`--threads` must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    cfg = build_config(args)
    out = Path(args.out)
    estimator, data = train(
        cfg,
        out=out,
        resume=args.resume,
        keep_epoch_checkpoints=args.keep_epoch_checkpoints,
        progress=not args.no_progress,
    )
    result = estimator.result
    if estimator.main_process:
        summary = {
            "method": estimator.cls.name,
            "method_kwargs": estimator.method_kwargs,
            "dataset": cfg.data.name if args.recipe else args.dataset,
            "n_train": len(data.sets.train),
            "epochs": result.epochs,
            "global_step": result.global_step,
            "train_time_s": result.train_time,
            "final_loss": result.final_loss,
            "history": result.history,
            "checkpoint": os.fspath(result.checkpoint) if result.checkpoint else None,
        }
        write_json(out / "train.json", summary, default=str)
        if result.losses:
            import matplotlib.pyplot as plt

            plt.close(result.plot(out / "loss.png"))
        print(
            f"trained {estimator.cls.name} for {result.epochs} epochs ({result.global_step} "
            f"steps, {result.train_time:.1f} s), final loss {result.final_loss:.4f}; "
            f"checkpoint {result.checkpoint}"
        )
    return 0
