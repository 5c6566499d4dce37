"""Add a post-hoc uncertainty u(x) to a trained checkpoint and save the wrapper.

Loads the method of a ``bayesurl train`` checkpoint, freezes it, fits one post-hoc method on
the upstream training data of the same zero-shot split and saves the wrapper
(:meth:`bayesurl.posthoc.PosthocWrapper.save`, loads with ``weights_only=True``). The options
become a :class:`bayesurl.runs.RunConfig`; the data, batch transforms and the fit are those of
the post-hoc estimators of ``bayesurl run`` (:class:`bayesurl.runs.estimators.PosthocEstimator`):

- ``pvu``: pretrained visual uncertainties, loss-prediction head on cached embeddings with the
  ranking loss (thesis section 5.3), supervised contrastive task loss from the labels;
- ``tau``: post-hoc Temperature as Uncertainty on two augmented views (TaU section 4);
- ``laplace``: last-layer Laplace of the embedding projection (LAM section 3);
- ``knn``, ``mahalanobis``, ``gmm``: scores fitted on the method's embeddings of the training
  images, nothing trained (kNN distance, Sun et al., 2022; Mahalanobis distance to the
  classes, Lee et al., 2018; class-conditional Gaussian density, DDU, Mukhoti et al., 2023).

Example::

    bayesurl train --method ce --dataset default --epochs 2 --out runs/ce
    bayesurl wrap runs/ce/last.pt --method pvu --epochs 2 --out runs/ce/pvu.pt

Reload in Python with ``bayesurl.posthoc.load("runs/ce/pvu.pt",
bayesurl.training.load_method_from_checkpoint("runs/ce/last.pt"))``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from bayesurl.data.registry import DatasetKind, dataset_kind, dataset_names

OUTPUT_FILES = ("out",)  # checked while parsing (bayesurl.cli)
HELP = "fit a post-hoc u(x) (a registered wrapper: pvu, tau, laplace ...) on a trained checkpoint"

DATASETS = dataset_names(DatasetKind.EMBEDDED)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bayesurl wrap``."""
    parser.add_argument("checkpoint", help="checkpoint written by `bayesurl train` (last.pt)")
    parser.add_argument(
        "--method",
        default="pvu",
        help="a post-hoc wrapper's name (bayesurl.posthoc.wrapper_names(); an unknown one is "
        "named with the valid ones)",
    )
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
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _options(args: argparse.Namespace, method: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wrapper constructor options and fit options of ``--method``."""
    import torch

    name = args.method.lower()
    if name in ("knn", "mahalanobis", "gmm"):
        return {}, {}  # their defaults: k = 10, Ledoit-Wolf shrinkage, a Gaussian per class
    if name == "tau":
        return {"scale": args.scale}, {"epochs": args.epochs, "lr": args.lr}
    if name == "pvu":
        fit = {"epochs": args.epochs, "lr": args.lr}
        if args.cache_dir is not None:
            fit["cache_dir"] = args.cache_dir
        return {"loss": args.loss}, fit
    last = args.last_layer
    proj = getattr(getattr(method, "net", None), "proj", None)
    if last is None and isinstance(proj, torch.nn.Linear):
        last = "method.net.proj"
    return {"last_layer": last, "margin": args.margin}, {}


def run(args: argparse.Namespace) -> int:
    """Fit and save; prints a JSON summary. 0 on success."""
    from bayesurl._checks import check_output_file, resolve_device
    from bayesurl.posthoc.base import wrapper_class
    from bayesurl.runs import DataConfig, EstimatorConfig, RunConfig, TrainConfig
    from bayesurl.runs.data import build_data
    from bayesurl.runs.estimators import FitContext, MethodEstimator, PosthocEstimator
    from bayesurl.training import load_method_from_checkpoint, seed_everything

    method_name = wrapper_class(args.method, argument="--method").method
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"`--{name.replace('_', '-')}` must be >= 1")
    if args.subset is not None and args.subset < 1:
        raise ValueError(f"`--subset` must be >= 1, got {args.subset}")
    dataset, _ = dataset_kind(args.dataset, argument="--dataset", allowed=DATASETS)
    if not Path(args.checkpoint).is_file():
        raise FileNotFoundError(f"no checkpoint at {args.checkpoint}")
    check_output_file(args.out, "--out")
    device = resolve_device(args.device, "--device")
    method = load_method_from_checkpoint(args.checkpoint, map_location=device)
    options, fit = _options(args, method)
    cfg = RunConfig.from_checkpoint(
        method,
        dataset=dataset,
        estimator=EstimatorConfig(
            name=method_name,
            kind="posthoc",
            base=method.name,
            wrapper=method_name,
            kwargs=options,
            fit=fit,
        ),
        data=DataConfig(name=dataset, root=args.root, max_train=args.subset, seed=args.seed),
        train=TrainConfig(batch_size=args.batch_size),
        seed=args.seed,
        device=str(device),
    )
    base_cfg = replace(cfg, estimator=EstimatorConfig(name=method.name))
    base = MethodEstimator.from_trained(base_cfg, method)
    estimator = PosthocEstimator(cfg)
    data = build_data(cfg)
    seed_everything(args.seed)
    report = estimator.fit(data, FitContext(device, progress=not args.no_progress, base=base))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    estimator.wrapped.save(args.out)
    summary = {
        "checkpoint": str(args.checkpoint),
        "method": method_name,
        "out": str(args.out),
        "fit": report["fit"],
    }
    print(json.dumps(summary, indent=1))
    return 0
