"""Add a post-hoc uncertainty u(x) to a trained checkpoint and save the wrapper.

Loads the method of a ``bayesurl train`` checkpoint, freezes it, fits one post-hoc method on
the upstream training data of the same zero-shot split and saves the wrapper
(:meth:`bayesurl.posthoc.PosthocWrapper.save`, loads with ``weights_only=True``):

- ``pvu``: pretrained visual uncertainties, loss-prediction head on cached embeddings with the
  ranking loss (thesis section 5.3), supervised contrastive task loss from the labels;
- ``tau``: post-hoc Temperature as Uncertainty on two augmented views (TaU section 4);
- ``laplace``: last-layer Laplace of the embedding projection (LAM section 3).

Example::

    bayesurl train --method ce --dataset default --epochs 2 --out runs/ce
    bayesurl wrap runs/ce/last.pt --method pvu --epochs 2 --out runs/ce/pvu.pt

Reload in Python with ``bayesurl.posthoc.load("runs/ce/pvu.pt",
bayesurl.training.load_method_from_checkpoint("runs/ce/last.pt"))``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HELP = "fit a post-hoc u(x) (pvu, tau or laplace) on a trained checkpoint and save it"

DATASETS = ("default", "fashion_mnist", "digits")
METHODS = ("pvu", "tau", "laplace")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bayesurl wrap``."""
    parser.add_argument("checkpoint", help="checkpoint written by `bayesurl train` (last.pt)")
    parser.add_argument("--method", default="pvu", help=f"one of {', '.join(METHODS)}")
    parser.add_argument("--out", required=True, help="file to write the wrapper to (.pt)")
    parser.add_argument("--dataset", default="default", help=f"one of {', '.join(DATASETS)}")
    parser.add_argument("--root", default=None, help="FashionMNIST folder (default: system path)")
    parser.add_argument("--subset", type=int, default=None, help="cap the training images")
    parser.add_argument("--epochs", type=int, default=2, help="pvu / tau epochs")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--loss", default="ranking", help="pvu: ranking or mse")
    parser.add_argument("--scale", type=float, default=0.1, help="tau: temperature lower bound")
    parser.add_argument(
        "--last-layer",
        default=None,
        help="laplace: submodule name of the last linear layer (default: the method's "
        "embedding projection `method.net.proj` when it has one)",
    )
    parser.add_argument("--margin", type=float, default=0.2, help="laplace: contrastive margin")
    parser.add_argument("--cache-dir", default=None, help="pvu: keep the embedding cache here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _train_set(args: argparse.Namespace, transform: Any) -> Any:
    from bayesurl.data import default_zero_shot, find_fashion_mnist

    name = str(args.dataset).lower().replace("-", "_")
    if name not in DATASETS:
        raise ValueError(
            f"unknown `--dataset` {args.dataset!r}; valid names: {', '.join(DATASETS)}"
        )
    root = args.root
    if name == "fashion_mnist" and root is None:
        root = find_fashion_mnist()
    data = default_zero_shot(
        root,
        force_digits=name == "digits",
        max_train=args.subset,
        val_fraction=0.0,
        seed=args.seed,
    )
    return data.train.with_transform(transform)


def run(args: argparse.Namespace) -> int:
    """Fit and save; prints a JSON summary. 0 on success."""
    import torch

    from bayesurl.data import TwoViews, default_augmentation, default_transform, make_loader
    from bayesurl.posthoc import MethodEncoder, wrap
    from bayesurl.training import load_method_from_checkpoint

    method_name = str(args.method).lower()
    if method_name not in METHODS:
        raise ValueError(f"unknown `--method` {args.method!r}; valid: {', '.join(METHODS)}")
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"`--{name.replace('_', '-')}` must be >= 1")
    if not Path(args.checkpoint).is_file():
        raise FileNotFoundError(f"no checkpoint at {args.checkpoint}")
    torch.manual_seed(args.seed)
    encoder = MethodEncoder(load_method_from_checkpoint(args.checkpoint))
    progress = not args.no_progress
    if method_name == "tau":
        train = _train_set(args, TwoViews(default_augmentation()))
        wrapped = wrap(encoder, "tau", scale=args.scale)
        fit_kw: dict[str, Any] = {"epochs": args.epochs, "lr": args.lr}
    elif method_name == "pvu":
        train = _train_set(args, default_augmentation())
        wrapped = wrap(encoder, "pvu", loss=args.loss)
        fit_kw = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size}
        if args.cache_dir is not None:
            fit_kw["cache_dir"] = args.cache_dir
    else:
        train = _train_set(args, default_transform())
        last = args.last_layer
        proj = getattr(getattr(encoder.method, "net", None), "proj", None)
        if last is None and isinstance(proj, torch.nn.Linear):
            last = "method.net.proj"
        wrapped = wrap(encoder, "laplace", last_layer=last, margin=args.margin)
        fit_kw = {}
    loader = make_loader(train, args.batch_size, shuffle=True, seed=args.seed)
    report = wrapped.fit(loader, progress=progress, **fit_kw)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    wrapped.save(args.out)
    summary = {
        "checkpoint": str(args.checkpoint),
        "method": method_name,
        "out": str(args.out),
        "fit": {k: v for k, v in report.items() if isinstance(v, (int, float, str, list))},
    }
    print(json.dumps(summary, indent=1))
    return 0
