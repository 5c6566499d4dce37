"""Uncertainty of every image in a folder of one's own: ``uncertainty.csv`` and a report.

``bayesurl folder DIR`` takes ``DIR/<class>/<image>`` (class sub-folders: labelled) or
``DIR/<image>`` (flat: unlabelled), decodes every image once and encodes it once per view the
method needs with a frozen backbone (streamed with a progress bar; only the features stay in
memory; ``--cache`` keeps the plain features for a later run), fits a post-hoc u on the
features without the labels (``tau``: two augmented views of an image are its positive pair;
``pvu`` and ``laplace``: its nearest neighbour among the plain features is, so they encode
each image once; ``knn``, ``mahalanobis`` and ``gmm`` train nothing and score each image from
the other folds, with those folds' classes where the method uses them) and writes to
``--out``:

- ``uncertainty.csv``: every file -- path, class, u, its rank (1 = least certain), nearest
  neighbour, its class, right / wrong; an unreadable file is listed with its error (it was
  skipped with a warning and counted; ``--strict`` stops on it instead);
- ``folder.json`` (settings, sizes, metrics), ``queries.npz`` and ``report.html``
  (:mod:`bayesurl.report`): with labels R@1, R-AUROC, AUSC and the rest from bayesurl's
  evaluator, and the galleries of the most / least uncertain images beside their neighbours.

Methods (:mod:`bayesurl.folder`): ``tau`` (post-hoc TaU, section 4), ``pvu`` (PVU head,
thesis section 5.3), ``laplace`` (last-layer Laplace on an identity read-out, LAM section 3),
and three that train nothing, cross-fitted over 5 folds: ``knn`` (kNN distance, Sun et al.,
2022), ``mahalanobis`` (Lee et al., 2018; class sub-folders needed) and ``gmm`` (DDU's
feature density, Mukhoti et al., 2023).

Examples::

    bayesurl folder photos/ --out runs/photos
    bayesurl folder photos/ --method laplace --backbone small_convnet --random-weights \
        --out runs/photos_la
"""

from __future__ import annotations

import argparse
from typing import Any

from bayesurl.commands import name_flags

HELP = "u(x) for every image of a folder (class sub-folders or flat): CSV and report"
OUTPUT_DIRS = ("out", "cache")  # checked while parsing (bayesurl.cli)
#: the default encoder: EfficientNet-Lite0 with its packaged ImageNet weights
DEFAULT_BACKBONE = "efficientnet_lite0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bayesurl folder``."""
    parser.add_argument("images", metavar="DIR", help="DIR/<class>/<image> or DIR/<image>")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--method",
        default="tau",
        help="tau (default), pvu, laplace, knn, mahalanobis (needs class sub-folders) or gmm",
    )
    parser.add_argument(
        "--backbone",
        default=DEFAULT_BACKBONE,
        help=f"encoder (default {DEFAULT_BACKBONE}, pretrained); another needs --random-weights",
    )
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="encode with random weights (needed for a backbone without packaged weights)",
    )
    parser.add_argument(
        "--image-size", type=int, default=None, help="input side (default: the backbone's)"
    )
    parser.add_argument("--epochs", type=int, default=5, help="tau / pvu head epochs (default 5)")
    parser.add_argument(
        "--fit-max",
        type=int,
        default=None,
        help="images the u is fitted on (default: 500 for tau, each encoded twice more for its "
        "two views; 5000 for pvu and laplace)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--workers", type=int, default=0, help="image-decoding processes (default 0)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache",
        default=None,
        help="feature-store folder that keeps the plain features: a later run over the same "
        "images reads them instead of encoding them again (default: none kept)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the method's post-hoc wrapper, repeatable (e.g. --option "
        "hessian_miner=hard for laplace; bayesurl.posthoc.wrap)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="largest image decoded, width x height: a file whose header claims more is "
        "skipped and listed, never decoded (default: Pillow's own limit, about 89 million; "
        "0: no limit)",
    )
    parser.add_argument("--strict", action="store_true", help="stop on an unreadable image")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    """Score the folder, write the CSV and the report; 0 on success."""
    from bayesurl.backbones import PACKAGED_WEIGHTS
    from bayesurl.evaluation.table import metric_columns
    from bayesurl.folder import U_MEASURED, score_folder
    from bayesurl.report import print_notes, try_report
    from bayesurl.runs.config import parse_value
    from bayesurl.stats.intervals import interval_lines

    pretrained = not args.random_weights
    if pretrained and args.backbone.lower() not in PACKAGED_WEIGHTS:
        raise ValueError(
            f"`--backbone` {args.backbone!r} has no packaged pretrained weights "
            f"({', '.join(PACKAGED_WEIGHTS)}): pass --random-weights to encode with random weights"
        )
    wrapper_options = {}
    for item in args.option:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"`--option` expects KEY=VALUE (e.g. hessian_miner=hard), got {item!r}"
            )
        wrapper_options[key.strip()] = parse_value(raw)
    try:  # errors named by the flags the user typed
        options = _options(args, pretrained, wrapper_options)
        res = score_folder(args.images, out=args.out, options=options)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        raise type(exc)(name_flags(str(exc), FLAGS)) from exc
    for line in res.info["describe"]:
        print(line)
    if options.method.value in U_MEASURED:
        print(f"caution: {U_MEASURED[options.method.value]}")
    for path, err in res.skipped:
        print(f"skipped {path}: {err}")
    if res.metrics is not None:
        # a folder has no posterior draws and no OOD set: those columns would only say so
        cols = [
            (c.key, c.title, c.digits)
            for c in metric_columns(shown=True)
            if c.key not in ("ece", "ood_auroc")
        ]
        for line in interval_lines(res.metrics, cols):
            print(line)
    print_notes(args.out)
    print(
        f"wrote {res.paths['csv']} (read {res.paths['readme'].name} beside it), "
        f"{res.paths['json'].name}, {res.paths['queries'].name}"
    )
    print(try_report(args.out))
    return 0


#: the :class:`~bayesurl.folder.FolderOptions` fields and their flags
FLAGS = {
    "images": "DIR",
    "method": "--method",
    "backbone": "--backbone",
    "image_size": "--image-size",
    "epochs": "--epochs",
    "fit_max": "--fit-max",
    "batch_size": "--batch-size",
    "workers": "--workers",
    "seed": "--seed",
    "cache": "--cache",
    "device": "--device",
    "max_pixels": "--max-pixels",
    "wrapper_options": "--option",
}


def _options(args: argparse.Namespace, pretrained: bool, wrapper_options: dict[str, Any]) -> Any:
    from bayesurl.folder import FolderOptions

    return FolderOptions(
        method=args.method,
        wrapper_options=wrapper_options,
        backbone=args.backbone,
        pretrained=pretrained,
        image_size=args.image_size,
        epochs=args.epochs,
        fit_max=args.fit_max,
        batch_size=args.batch_size,
        workers=args.workers,
        device=args.device,
        seed=args.seed,
        strict=args.strict,
        progress=not args.no_progress,
        cache=args.cache,
        **({} if args.max_pixels is None else {"max_pixels": args.max_pixels or None}),
    )
