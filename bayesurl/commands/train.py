"""Train one method on the upstream classes of a zero-shot split and save a checkpoint.

The URL training recipe (Kirchhof et al., 2023, section 4 and appendix B): LAMB, linear warm-up
and cosine annealing, two augmented views for the self-supervised methods. The checkpoint
``OUT/last.pt`` records the method's registry name and constructor arguments, so
``bayesurl evaluate --checkpoint OUT/last.pt`` can rebuild it
(:func:`bayesurl.training.load_method_from_checkpoint`). Runs under ``torchrun`` too
(``torchrun --nproc_per_node 2 -m bayesurl train ...``): DDP with one process per rank.

Data: ``default`` (FashionMNIST classes 0-4, or the digits when FashionMNIST is absent),
``fashion_mnist``, ``digits``, or ``cub`` / ``cars`` / ``sop`` read from ``--root`` with their
standard train classes. Images are batched as ``uint8`` and transformed per batch on the
training device: a deterministic normalisation for supervised methods, two independent draws of
:func:`bayesurl.data.default_augmentation` for the two-view methods (InfoNCE, MCInfoNCE).

Example::

    bayesurl train --method ce --dataset default --epochs 2 --subset 2000 --out runs/ce
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

HELP = "train one method on the upstream classes and save a checkpoint"

#: the embedded zero-shot default and its two sources (28 x 28 grayscale, in memory)
EMBEDDED = ("default", "fashion_mnist", "digits")
#: folder data sets read from ``--root`` with their standard zero-shot class splits
FOLDER = ("cub", "cars", "sop")
DATASETS = EMBEDDED + FOLDER
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class _KeepUint8(nn.Module):
    """Per-item transform that keeps the stored ``uint8`` image (batches are augmented later)."""

    def forward(self, x: Tensor) -> Tensor:
        return x


class _PilToUint8:
    """Per-item transform of a folder image: shorter side to ``size``, centre crop, ``uint8``."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __call__(self, img: Any) -> Tensor:
        from torchvision.transforms import functional as TF

        img = TF.center_crop(TF.resize(img, self.size), [self.size, self.size])
        return TF.pil_to_tensor(img.convert("RGB"))


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
    parser.add_argument("--method", required=True, help="registry name (bayesurl.methods)")
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
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _channels(args: argparse.Namespace) -> int:
    folder = str(args.dataset).lower() in FOLDER
    return 3 if folder or args.backbone.lower() != "small_convnet" else 1


def build_train_data(args: argparse.Namespace) -> tuple[Any, int]:
    """The upstream training set (``uint8`` image tensors) and its number of classes.

    Embedded sets: the ``train`` split of :func:`bayesurl.data.default_zero_shot` (URL
    section 3.2 protocol on FashionMNIST 0-4, or digits). Folder sets: the train classes of
    :func:`bayesurl.data.dml_zero_shot`, resized and centre-cropped to ``--image-size``.
    ``--subset`` keeps a seeded class-balanced sample.
    """
    from bayesurl import data as bd

    name = str(args.dataset).lower().replace("-", "_")
    if name not in DATASETS:
        raise ValueError(
            f"unknown `--dataset` {args.dataset!r}; valid names: {', '.join(DATASETS)}"
        )
    if args.subset is not None and args.subset < 1:
        raise ValueError(f"`--subset` must be >= 1, got {args.subset}")
    if name in FOLDER:
        if args.root is None:
            raise ValueError(f"`--root` is required for --dataset {name}")
        if args.image_size < 8:
            raise ValueError(f"`--image-size` must be >= 8, got {args.image_size}")
        zs = bd.dml_zero_shot(name, args.root, train_transform=_PilToUint8(args.image_size))
        train = zs.train
        if args.subset is not None:
            train = bd.subset(train, bd.stratified_subsample(train, args.subset, seed=args.seed))
        return train, int(zs.num_train_classes)
    root = args.root
    if name == "fashion_mnist" and root is None:
        root = bd.find_fashion_mnist()
    zs = bd.default_zero_shot(
        root,
        force_digits=name == "digits",
        max_train=args.subset,
        val_fraction=0.0,
        seed=args.seed,
    )
    return zs.train.with_transform(_KeepUint8()), int(zs.num_train_classes)


def _batch_transforms(args: argparse.Namespace, two_view: bool) -> nn.Module:
    from bayesurl.data import default_augmentation, default_transform

    channels = _channels(args)
    stats = (
        {"mean": IMAGENET_MEAN, "std": IMAGENET_STD} if str(args.dataset).lower() in FOLDER else {}
    )
    if two_view:
        return default_augmentation(channels, **stats)
    return default_transform(channels, **stats)


def run(args: argparse.Namespace) -> int:
    """Train, checkpoint every epoch, write ``train.json`` and ``loss.png``; 0 on success."""
    from bayesurl.methods import get
    from bayesurl.training import distributed as D
    from bayesurl.training import fit

    for name in ("epochs", "batch_size", "grad_accum", "embed_dim"):
        if getattr(args, name) < 1:
            raise ValueError(
                f"`--{name.replace('_', '-')}` must be >= 1, got {getattr(args, name)}"
            )
    cls = get(args.method)  # unknown names raise, listing the valid ones
    if args.resume is not None and not Path(args.resume).is_file():
        raise FileNotFoundError(f"`--resume` checkpoint {args.resume!r} does not exist")
    if str(args.dataset).lower().replace("-", "_") not in DATASETS:
        raise ValueError(
            f"unknown `--dataset` {args.dataset!r}; valid names: {', '.join(DATASETS)}"
        )
    from bayesurl.data import make_loader

    info = D.init_from_env(device=args.device)
    try:
        device = torch.device(args.device) if args.device else info.device
        train_set, num_classes = build_train_data(args)
        kwargs: dict[str, Any] = {
            "backbone": args.backbone,
            "embed_dim": args.embed_dim,
            "num_classes": num_classes,
            **dict(args.method_arg),
        }
        torch.manual_seed(args.seed)
        method = cls(**kwargs)
        # the method's own record also holds its defaults, so later default changes cannot
        # alter what the checkpoint rebuilds
        record = getattr(method, "hparams", None)
        if isinstance(record, dict):
            kwargs = {**dict(record), **kwargs}
        augment = _batch_transforms(args, cls.two_view).to(device)
        loader = make_loader(
            train_set,
            args.batch_size,
            shuffle=True,
            num_workers=args.num_workers,
            seed=args.seed,
            drop_last=cls.two_view,
        )
        out = Path(args.out)
        result = fit(
            method,
            loader,
            epochs=args.epochs,
            optimizer=args.optimizer,
            lr=args.lr,
            weight_decay=args.weight_decay,
            warmup_epochs=args.warmup_epochs,
            grad_accum=args.grad_accum,
            amp=args.amp,
            seed=args.seed,
            augment=augment,
            checkpoint_dir=out,
            keep_epoch_checkpoints=args.keep_epoch_checkpoints,
            resume=args.resume,
            method_kwargs=kwargs,
            device=device,
            progress=not args.no_progress,
        )
        if D.is_main_process():
            summary = {
                "method": cls.name,
                "method_kwargs": kwargs,
                "dataset": args.dataset,
                "n_train": len(train_set),
                "epochs": result.epochs,
                "global_step": result.global_step,
                "train_time_s": result.train_time,
                "final_loss": result.final_loss,
                "history": result.history,
                "checkpoint": os.fspath(result.checkpoint) if result.checkpoint else None,
            }
            (out / "train.json").write_text(json.dumps(summary, indent=2, default=str))
            if result.losses:
                import matplotlib.pyplot as plt

                plt.close(result.plot(out / "loss.png"))
            print(
                f"trained {cls.name} for {result.epochs} epochs ({result.global_step} steps, "
                f"{result.train_time:.1f} s), final loss {result.final_loss:.4f}; "
                f"checkpoint {result.checkpoint}"
            )
        return 0
    finally:
        D.cleanup()
