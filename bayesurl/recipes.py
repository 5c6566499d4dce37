"""The shared runner behind ``recipes/<dataset>/<method>.py``: train, checkpoint, evaluate.

Every recipe is one call ``run_recipe_cli(method, dataset)``; this module holds the data
pipeline, the per-dataset and per-method hyper-parameters and the evaluation, so the recipe
scripts stay three lines long. The protocol is URL's zero-shot one (Kirchhof et al., 2023,
section 3.2): train on the upstream classes, report R@1, R-AUROC, AUSC, ECE on the disjoint
downstream classes (:func:`bayesurl.evaluation.evaluate_output`) and OOD AUROC of foreign data
against held-out upstream data. Training follows URL section 4 / appendix B
(:func:`bayesurl.training.fit`: LAMB, linear warm-up + cosine, gradient accumulation).

Methods (:data:`RECIPE_METHODS`): the eleven URL methods (URL section 4.1, appendix B), ``tau``
(TaU Algorithm 1, joint training), ``pvu`` (a CE encoder plus a post-hoc PVU head, thesis
section 5.3), ``lam_posthoc`` and ``lam_online`` (LAM section 3: contrastive training of an
embedding net, then a post-hoc last-layer Laplace, or the online LAM training of eqs. 4-5).

Data sets (:data:`RECIPE_DATASETS`): ``fashion_mnist`` (runs anywhere), ``cub``, ``cars``,
``sop`` (folder layouts under ``--root``), ``imagenet`` (the URL upstream setup: an
ImageFolder root, zero-shot evaluation on CUB / CARS / SOP under ``--downstream-root``).

Outputs in ``--out``: the checkpoint (``last.pt`` for trained methods, ``laplace.pt`` /
``pvu.pt`` for the Laplace and PVU parts), ``metrics.json`` and, when training wrote step
losses, ``loss.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "DATASET_CONFIGS",
    "PAPER_FIGURES",
    "RECIPE_DATASETS",
    "RECIPE_METHODS",
    "URL_IMAGENET_HPARAMS",
    "METHOD_KWARGS",
    "DatasetConfig",
    "build_parser",
    "run_recipe",
    "run_recipe_cli",
]

URL_METHODS = (
    "ce",
    "infonce",
    "mcinfonce",
    "elk",
    "nivmf",
    "hib",
    "hetxl",
    "sngp",
    "losspred",
    "ensemble",
    "mcdropout",
)
#: every method a recipe exists for
RECIPE_METHODS = (*URL_METHODS, "tau", "pvu", "lam_posthoc", "lam_online")
#: every data set a recipe exists for
RECIPE_DATASETS = ("fashion_mnist", "cub", "cars", "sop", "imagenet")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DatasetConfig:
    """Default hyper-parameters of the recipes on one data set.

    Attributes
    ----------
    backbone : str
        ``"small_convnet"`` or a timm model name.
    image_size : int
        Side of the (square) network input.
    embed_dim : int
        Embedding dimension ``D`` of the projection head.
    batch_size, grad_accum : int
        Micro-batch and micro-batches per optimiser step (URL appendix B: 128 x 16 = 2048).
    epochs : int
    warmup_epochs : float
        Linear warm-up (URL: 5 of 32 epochs).
    lr : float
        Peak learning rate of LAMB.
    needs_root : bool
        The data must be given with ``--root``.
    how_to_get : str
        Where to get the data (printed when ``--root`` is missing).
    """

    backbone: str
    image_size: int
    embed_dim: int
    batch_size: int
    grad_accum: int
    epochs: int
    warmup_epochs: float
    lr: float
    needs_root: bool
    how_to_get: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


_CUB_HOW = (
    "download CUB_200_2011.tgz from https://www.vision.caltech.edu/datasets/cub_200_2011/ and "
    "extract it so that ROOT/CUB_200_2011/images.txt exists"
)
_CARS_HOW = (
    "get Stanford Cars (cars_train, cars_test, devkit/cars_meta.mat, cars_test_annos_withlabels"
    ".mat, e.g. from https://www.kaggle.com/datasets/jessicali9530/stanford-cars-dataset) and "
    "put them under ROOT (see bayesurl.data.Cars196 for the accepted layouts)"
)
_SOP_HOW = (
    "download Stanford_Online_Products.zip (https://cvgl.stanford.edu/projects/lifted_struct/) "
    "and extract it so that ROOT/Stanford_Online_Products/Ebay_train.txt exists"
)
_IMAGENET_HOW = (
    "download ImageNet-1k (https://www.image-net.org/download.php) and arrange it as an "
    "ImageFolder: ROOT/train/<wnid>/<image>.JPEG"
)

#: per data set defaults; CUB / CARS / SOP fine-tune a timm ResNet-50 (use ``--pretrained``)
DATASET_CONFIGS: dict[str, DatasetConfig] = {
    "fashion_mnist": DatasetConfig("small_convnet", 28, 64, 128, 1, 10, 1.0, 1e-3, False),
    "cub": DatasetConfig("resnet50", 224, 128, 64, 1, 30, 2.0, 1e-3, True, _CUB_HOW),
    "cars": DatasetConfig("resnet50", 224, 128, 64, 1, 30, 2.0, 1e-3, True, _CARS_HOW),
    "sop": DatasetConfig("resnet50", 224, 128, 64, 1, 15, 1.0, 1e-3, True, _SOP_HOW),
    "imagenet": DatasetConfig("resnet50", 224, 2048, 128, 16, 32, 5.0, 1e-3, True, _IMAGENET_HOW),
}

#: method constructor arguments used on the small / DML data sets (library defaults otherwise)
METHOD_KWARGS: dict[str, dict[str, Any]] = {
    "ensemble": {"num_heads": 10},
    "mcdropout": {"p": 0.1, "n_passes": 10},
    "losspred": {"lam": 0.04},
    "hetxl": {"rank": 1},
}

# URL's best hyper-parameters (code appendix of Kirchhof et al., 2023: the calls in the
# benchmark repository's README). ``lr_base`` is per 256 images; the aggregated batch scales it
# linearly (lr = lr_base * batch / 256). ``batch``, ``accum``: micro-batch and accumulation.
_R50, _VIT = "resnet50", "vit_medium_patch16_gap_256"
#: URL appendix B ImageNet-upstream hyper-parameters per method and backbone (see above)
URL_IMAGENET_HPARAMS: dict[str, dict[str, dict[str, Any]]] = {
    _R50: {
        "ce": {"lr_base": 0.0027583475549166764},
        "infonce": {
            "lr_base": 0.0004452562693472003,
            "batch": 96,
            "accum": 21,
            "kwargs": {"inverse_temperature": 15.182859908025058},
        },
        "mcinfonce": {
            "lr_base": 2.384205225724591e-05,
            "batch": 96,
            "accum": 21,
            "kwargs": {"inverse_temperature": 52.43117045513681, "warmup_u": 0.001},
        },
        "elk": {
            "lr_base": 0.008324452068209802,
            "kwargs": {"kappa_scale": 27.685357549319253, "warmup_u": None},
        },
        "nivmf": {
            "lr_base": 0.00014942909398367403,
            "kwargs": {"kappa_scale": 10.896111351193488, "warmup_u": 0.001},
        },
        "hib": {
            "lr_base": 5.606607236666466e-05,
            "batch": 96,
            "accum": 21,
            "kwargs": {"scale": 26.850376086478832, "bias": 2.043464396656407, "warmup_u": None},
        },
        "hetxl": {"lr_base": 0.00030257136041070065, "kwargs": {"rank": 1}},
        "sngp": {
            "lr_base": 0.003935036929170965,
            "kwargs": {"spec_norm_bound": 3.0034958778109893, "spectral_norm": "all"},
        },
        "losspred": {
            "lr_base": 0.00907673293373138,
            "kwargs": {"lam": 0.04137484664752506, "warmup_u": None},
        },
        "ensemble": {"lr_base": 0.004405890102835956, "kwargs": {"num_heads": 10}},
        "mcdropout": {"lr_base": 0.00016199535513680024, "kwargs": {"p": 0.08702220252645132}},
    },
    _VIT: {
        "ce": {"lr_base": 0.004954014361368407},
        "infonce": {
            "lr_base": 0.006246538808281836,
            "batch": 96,
            "accum": 21,
            "kwargs": {"inverse_temperature": 20.82011649785067},
        },
        "mcinfonce": {
            "lr_base": 0.0031866603949435874,
            "batch": 96,
            "accum": 21,
            "kwargs": {"inverse_temperature": 50.27568453131382, "warmup_u": 0.001},
        },
        "elk": {
            "lr_base": 0.009041687325778511,
            "kwargs": {"kappa_scale": 56.77356863558765, "warmup_u": None},
        },
        "nivmf": {
            "lr_base": 0.0027583475549166764,
            "kwargs": {"kappa_scale": 31.353232263344143, "warmup_u": 0.001},
        },
        "hib": {
            "lr_base": 0.0005920448270870512,
            "batch": 48,
            "accum": 43,
            "kwargs": {"scale": 13.955844954616405, "bias": -5.360730528719454, "warmup_u": None},
        },
        "hetxl": {"lr_base": 0.00012722151293115814, "kwargs": {"rank": 1}},
        "sngp": {
            "lr_base": 0.0002973866135608272,
            "kwargs": {"spec_norm_bound": 2.0072013733952883, "spectral_norm": "none"},
        },
        "losspred": {
            "lr_base": 0.0026590263551453507,
            "kwargs": {"lam": 0.011424752423322174, "warmup_u": 0.001},
        },
        "ensemble": {"lr_base": 0.004944771531139904, "kwargs": {"num_heads": 10}},
        "mcdropout": {"lr_base": 0.0027583475549166764, "kwargs": {"p": 0.1334044009405148}},
    },
}

#: reference figures from the papers (spec DATA.md), stored next to the measured metrics
PAPER_FIGURES: dict[tuple[str, str], dict[str, Any]] = {
    ("fashion_mnist", "lam_online"): {
        "source": "LAM Table 2 (FashionMNIST vs MNIST)",
        "map@1": 0.81,
        "ood_auroc": 0.98,
        "ausc": 0.89,
        "ece": 0.02,
    },
    ("fashion_mnist", "lam_posthoc"): {
        "source": "LAM Table 2 (FashionMNIST vs MNIST)",
        "map@1": 0.78,
        "ood_auroc": 0.96,
        "ausc": 0.86,
        "ece": 0.03,
    },
    ("cub", "pvu"): {"source": "PVU Table 2 (ViT-B, zero-shot)", "r_auroc": 0.626},
    ("sop", "pvu"): {"source": "PVU Table 2 (ViT-B, zero-shot)", "r_auroc": 0.607},
    ("cars", "pvu"): {"source": "PVU Table 2 (ViT-B, zero-shot)", "r_auroc": 0.589},
    ("imagenet", "mcinfonce"): {
        "source": "URL (mean over CUB/CARS/SOP, best of ResNet-50 / ViT-M)",
        "r_auroc": 0.569,
    },
    ("imagenet", "losspred"): {
        "source": "URL (mean over CUB/CARS/SOP, best of ResNet-50 / ViT-M)",
        "r_auroc": 0.568,
    },
    ("imagenet", "nivmf"): {
        "source": "URL (mean over CUB/CARS/SOP, best of ResNet-50 / ViT-M)",
        "r@1": 0.57,
    },
}

_SMOKE = {"max_train": 256, "max_test": 200, "max_ood": 100, "epochs": 1, "batch_size": 64}
_REPORTED = ("r@1", "r_auroc", "ausc", "ece", "map@1", "ood_auroc", "ood_auprc")


# -- argument parsing -------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _check_names(method: str, dataset: str) -> tuple[str, str]:
    m, d = str(method).lower(), str(dataset).lower().replace("-", "_")
    if m not in RECIPE_METHODS:
        raise ValueError(f"unknown `method` {method!r}; valid: {', '.join(RECIPE_METHODS)}")
    if d not in RECIPE_DATASETS:
        raise ValueError(f"unknown `dataset` {dataset!r}; valid: {', '.join(RECIPE_DATASETS)}")
    return m, d


def build_parser(method: str, dataset: str) -> argparse.ArgumentParser:
    """Command-line options of the recipe ``method`` on ``dataset`` with its defaults.

    Parameters
    ----------
    method : str
        One of :data:`RECIPE_METHODS`.
    dataset : str
        One of :data:`RECIPE_DATASETS`.

    Returns
    -------
    argparse.ArgumentParser

    Raises
    ------
    ValueError
        For an unknown method or data set.
    """
    method, dataset = _check_names(method, dataset)
    cfg = DATASET_CONFIGS[dataset]
    p = argparse.ArgumentParser(
        prog=f"recipes/{dataset}/{method}.py",
        description=f"{method} on {dataset}: train on the upstream classes, save a checkpoint, "
        "evaluate zero-shot on the downstream classes (URL section 3.2) and write metrics.json.",
    )
    root_help = (
        "data root (required): " + cfg.how_to_get
        if cfg.needs_root
        else "FashionMNIST folder (default: the system copy; digits fallback if absent)"
    )
    p.add_argument("--root", default=None, help=root_help)
    if dataset == "imagenet":
        p.add_argument(
            "--downstream-root",
            default=None,
            help="folder holding the CUB / CARS / SOP roots as sub-folders cub/, cars/, sop/ "
            "for the zero-shot evaluation (skipped when not given)",
        )
    p.add_argument("--out", default=f"runs/{dataset}/{method}", help="output folder")
    p.add_argument("--epochs", type=_positive_int, default=cfg.epochs)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto)")
    p.add_argument("--backbone", default=cfg.backbone, help="'small_convnet' or a timm name")
    p.add_argument(
        "--pretrained",
        action="store_true",
        help="start from timm's pretrained weights (downloads them; URL starts from ImageNet)",
    )
    p.add_argument("--image-size", type=_positive_int, default=cfg.image_size)
    p.add_argument(
        "--embed-dim",
        type=int,
        default=cfg.embed_dim,
        help="embedding dimension D of a linear projection; 0 uses the backbone's features "
        "(URL: ResNet-50's 2048-d pooled features; URL methods only)",
    )
    p.add_argument("--batch-size", type=_positive_int, default=None, help="micro-batch")
    p.add_argument("--grad-accum", type=_positive_int, default=None, help="micro-batches/step")
    p.add_argument("--lr", type=_positive_float, default=None, help="peak learning rate")
    p.add_argument("--warmup-epochs", type=float, default=cfg.warmup_epochs)
    p.add_argument("--optimizer", default="lamb", help="lamb, adamw or sgd")
    p.add_argument("--amp", default="auto", help="auto, off, bf16 or fp16")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--max-train", type=_positive_int, default=None, help="cap training images")
    p.add_argument("--max-test", type=_positive_int, default=None, help="cap test images")
    p.add_argument("--eval-samples", type=int, default=16, help="vMF / posterior draws for ECE")
    if method in ("pvu",):
        p.add_argument("--head-epochs", type=_positive_int, default=5, help="PVU head epochs")
    if method.startswith("lam"):
        p.add_argument("--margin", type=float, default=0.2, help="contrastive margin (LAM eq. 1)")
        p.add_argument("--approximation", default="fixed", help="fixed, positive or full")
        p.add_argument("--geometry", default="arccos", help="arccos or euclidean")
    p.add_argument("--smoke", action="store_true", help="tiny data and one epoch (a test run)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return p


def _validate(args: argparse.Namespace, method: str, dataset: str) -> None:
    cfg = DATASET_CONFIGS[dataset]
    if cfg.needs_root:
        if args.root is None:
            raise ValueError(
                f"`--root` is required for {dataset}: {cfg.how_to_get}, then pass --root ROOT"
            )
        if not Path(args.root).is_dir():
            raise FileNotFoundError(
                f"`--root` {str(args.root)!r} does not exist or is not a folder; {cfg.how_to_get}"
            )
    if dataset == "imagenet" and args.root is not None:
        if not (Path(args.root) / "train").is_dir():
            raise FileNotFoundError(
                f"no ImageNet training folder {str(Path(args.root) / 'train')!r}; {cfg.how_to_get}"
            )
    droot = getattr(args, "downstream_root", None)
    if droot is not None and not Path(droot).is_dir():
        raise FileNotFoundError(f"`--downstream-root` {str(droot)!r} does not exist")
    if args.optimizer.lower() not in ("lamb", "adamw", "sgd"):
        raise ValueError(f"unknown `--optimizer` {args.optimizer!r}; valid: lamb, adamw, sgd")
    if not (math.isfinite(args.warmup_epochs) and args.warmup_epochs >= 0):
        raise ValueError(f"`--warmup-epochs` must be >= 0, got {args.warmup_epochs}")
    if args.embed_dim < 0:
        raise ValueError(f"`--embed-dim` must be >= 0, got {args.embed_dim}")
    if args.embed_dim == 0 and method not in URL_METHODS:
        raise ValueError(f"`--embed-dim 0` (backbone features) is for URL methods, not {method}")
    if args.eval_samples < 0:
        raise ValueError(f"`--eval-samples` must be >= 0, got {args.eval_samples}")
    if args.num_workers < 0:
        raise ValueError(f"`--num-workers` must be >= 0, got {args.num_workers}")


# -- data -------------------------------------------------------------------------------------
class _PilToUint8:
    """Per-item transform of a folder image: shorter side to ``size``, centre crop, ``uint8``."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __call__(self, img: Any) -> Tensor:
        from torchvision.transforms import functional as TF

        img = TF.center_crop(TF.resize(img.convert("RGB"), self.size), [self.size, self.size])
        return TF.pil_to_tensor(img)


@dataclass
class _Data:
    train: Any
    test: Any | None
    id_test: Any | None
    ood: Any | None
    num_classes: int
    channels: int
    stats: dict[str, Any]
    downstream: dict[str, Any] = field(default_factory=dict)


def _cap(ds: Any, n: int | None, seed: int) -> Any:
    from bayesurl import data as bd

    if n is None or n >= len(ds):
        return ds
    return bd.subset(ds, bd.stratified_subsample(ds, n, seed=seed))


def _load_data(args: argparse.Namespace, dataset: str) -> _Data:
    from bayesurl import data as bd

    rgb = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
    if dataset == "fashion_mnist":
        root = args.root if args.root is not None else None
        zs = bd.default_zero_shot(
            root,
            max_train=args.max_train,
            max_test=args.max_test,
            max_ood=args.max_test,
            val_fraction=0.0,
            seed=args.seed,
        )
        channels = 1 if args.backbone == "small_convnet" else 3
        return _Data(zs.train, zs.test, zs.id_test, zs.ood, zs.num_train_classes, channels, {})
    to_uint8 = _PilToUint8(args.image_size)
    if dataset in ("cub", "cars", "sop"):
        zs = bd.dml_zero_shot(dataset, args.root, transform=to_uint8, train_transform=to_uint8)
        train = _cap(zs.train, args.max_train, args.seed)
        test = _cap(zs.test, args.max_test, args.seed)
        return _Data(train, test, None, None, zs.num_train_classes, 3, rgb)
    from torchvision.datasets import ImageFolder

    train = ImageFolder(os.path.join(args.root, "train"), transform=to_uint8)
    num_classes = len(train.classes)
    train = _cap(train, args.max_train, args.seed) if args.max_train else train
    downstream = {}
    if args.downstream_root is not None:
        for name in ("cub", "cars", "sop"):
            sub = Path(args.downstream_root) / name
            if sub.is_dir():
                zs = bd.dml_zero_shot(name, sub, transform=to_uint8, train_transform=to_uint8)
                downstream[name] = _cap(zs.test, args.max_test, args.seed)
    return _Data(train, None, None, None, num_classes, 3, rgb, downstream)


class _Batches:
    """A loader whose batches are moved to ``device`` and transformed (for LAM / PVU fits)."""

    def __init__(self, loader: Any, transform: nn.Module, device: torch.device) -> None:
        self.loader, self.transform, self.device = loader, transform, device
        self.dataset = getattr(loader, "dataset", None)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for x, y in self.loader:
            yield self.transform(x.to(self.device)), y.to(self.device)


# -- evaluation -------------------------------------------------------------------------------
def _predict(
    fn: Callable[[Tensor], Any],
    dataset: Any,
    transform: nn.Module,
    device: torch.device,
    batch_size: int,
    progress: bool,
    desc: str,
) -> tuple[Any, Tensor]:
    """Concatenated :class:`~bayesurl.types.Output` of ``fn`` over ``dataset`` and its labels."""
    from tqdm.auto import tqdm

    from bayesurl.data import make_loader
    from bayesurl.types import Output

    loader = make_loader(dataset, batch_size, shuffle=False)
    outs, labels = [], []
    with torch.no_grad():
        for x, y in tqdm(loader, desc=desc, disable=not progress, leave=False):
            out = fn(transform(x.to(device)))
            outs.append(
                Output(
                    embedding=out.embedding.detach().cpu(),
                    uncertainty=out.uncertainty.detach().cpu(),
                    samples=None if out.samples is None else out.samples.detach().cpu(),
                    kappa=None if out.kappa is None else out.kappa.detach().cpu(),
                )
            )
            labels.append(torch.as_tensor(y))
    return Output.cat(outs), torch.cat(labels)


def _score(
    fn: Callable[[Tensor], Any],
    data: _Data,
    transform: nn.Module,
    device: torch.device,
    args: argparse.Namespace,
) -> dict[str, Any]:
    from bayesurl.evaluation import evaluate_output
    from bayesurl.evaluation.functional import ood_auroc

    kw = {"device": device, "batch_size": 256, "progress": not args.no_progress}
    sets = {"test": data.test} if data.test is not None else dict(data.downstream)
    metrics: dict[str, Any] = {}
    for name, ds in sets.items():
        out, y = _predict(fn, ds, transform, desc=f"embed {name}", **kw)
        res = evaluate_output(out, y, n_samples=args.eval_samples, seed=args.seed)
        metrics[name] = {k: res.get(k) for k in _REPORTED if res.get(k) is not None}
    if data.id_test is not None and data.ood is not None:
        u_id = _predict(fn, data.id_test, transform, desc="embed id_test", **kw)[0].uncertainty
        u_ood = _predict(fn, data.ood, transform, desc="embed ood", **kw)[0].uncertainty
        metrics.setdefault("test", {})["ood_auroc"] = float(ood_auroc(u_id, u_ood))
    if len(sets) > 1:
        keys = set.intersection(*(set(v) for v in metrics.values() if isinstance(v, dict)))
        metrics["mean"] = {k: sum(m[k] for m in metrics.values()) / len(sets) for k in keys}
    return metrics


# -- the recipe -------------------------------------------------------------------------------
def _resolve_hparams(
    args: argparse.Namespace, method: str, dataset: str
) -> tuple[int, int, float, dict[str, Any]]:
    cfg = DATASET_CONFIGS[dataset]
    batch, accum, lr = cfg.batch_size, cfg.grad_accum, cfg.lr
    kwargs = dict(METHOD_KWARGS.get(method, {}))
    if dataset == "imagenet":
        table = URL_IMAGENET_HPARAMS.get(args.backbone, URL_IMAGENET_HPARAMS[_R50])
        base = "ce" if method in ("pvu", "lam_posthoc", "lam_online", "tau") else method
        hp = table[base]
        batch, accum = int(hp.get("batch", 128)), int(hp.get("accum", 16))
        lr = float(hp["lr_base"]) * batch * accum / 256
        # the aggregated batch is world x batch x accum: keep URL's ~2048 under torchrun
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        accum = max(1, round(accum / max(world, 1)))
        if method in URL_METHODS:
            kwargs = {**kwargs, **hp.get("kwargs", {})}
    if args.smoke:
        batch, accum = min(batch, _SMOKE["batch_size"]), 1
    batch = args.batch_size or batch
    accum = args.grad_accum or accum
    lr = args.lr or lr
    return batch, accum, lr, kwargs


def run_recipe(args: argparse.Namespace, method: str, dataset: str) -> dict[str, Any]:
    """Run one recipe with parsed options; returns (and writes) the ``metrics.json`` record.

    Parameters
    ----------
    args : argparse.Namespace
        From :func:`build_parser` ``(method, dataset)``.
    method, dataset : str
        The recipe.

    Returns
    -------
    dict
        ``recipe``, ``hparams``, ``metrics`` (per evaluation set), ``paper`` (reference
        figures, where the papers report them), ``train_time_s`` and ``checkpoint``.

    Raises
    ------
    ValueError, FileNotFoundError
        On bad options or a missing data root (the message names the path and how to get it).
    """
    from bayesurl.data import default_augmentation, default_transform, make_loader
    from bayesurl.training import distributed as D
    from bayesurl.training import fit

    method, dataset = _check_names(method, dataset)
    if args.smoke:
        args.max_train = args.max_train or _SMOKE["max_train"]
        args.max_test = args.max_test or _SMOKE["max_test"]
        args.epochs = _SMOKE["epochs"]
        args.eval_samples = min(args.eval_samples, 4)
        if hasattr(args, "head_epochs"):
            args.head_epochs = 1
    _validate(args, method, dataset)
    batch, accum, lr, method_kwargs = _resolve_hparams(args, method, dataset)
    progress = not args.no_progress
    out_dir = Path(args.out)
    info = D.init_from_env(device=args.device)
    try:
        if info.world_size > 1 and method not in URL_METHODS and method != "tau":
            raise ValueError(
                f"the {method} recipe runs in one process (its Laplace / PVU fit is not "
                "distributed); start it with python, not torchrun"
            )
        device = torch.device(args.device) if args.device else info.device
        data = _load_data(args, dataset)
        stats = data.stats
        evaluate_tf = default_transform(data.channels, **stats).to(device)
        augment_tf = default_augmentation(data.channels, **stats).to(device)
        backbone_kwargs: dict[str, Any] = {"pretrained": True} if args.pretrained else {}
        if args.backbone == "small_convnet":
            if args.pretrained:
                raise ValueError("`--pretrained` needs a timm `--backbone`, not small_convnet")
            if data.channels != 1:
                backbone_kwargs["in_channels"] = data.channels
        base = {
            "backbone": args.backbone,
            "embed_dim": args.embed_dim or None,
            "num_classes": data.num_classes,
            **({"backbone_kwargs": backbone_kwargs} if backbone_kwargs else {}),
        }
        torch.manual_seed(args.seed)
        hparams = {
            "batch_size": batch,
            "grad_accum": accum,
            "lr": lr,
            "epochs": args.epochs,
            "warmup_epochs": args.warmup_epochs,
            "optimizer": args.optimizer,
            "method_kwargs": method_kwargs,
            **base,
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        checkpoint: Path | None = None
        if method in URL_METHODS or method in ("tau", "pvu"):
            from bayesurl.methods import get

            name = "ce" if method == "pvu" else method
            cls = get(name)
            kwargs = {**base, **method_kwargs}
            model = cls(**kwargs)
            loader = make_loader(
                data.train,
                batch,
                shuffle=True,
                num_workers=args.num_workers,
                seed=args.seed,
                drop_last=cls.two_view and len(data.train) > batch,
            )
            result = fit(
                model,
                loader,
                epochs=args.epochs,
                optimizer=args.optimizer,
                lr=lr,
                warmup_epochs=args.warmup_epochs,
                grad_accum=accum,
                amp=args.amp,
                seed=args.seed,
                augment=augment_tf if cls.two_view else evaluate_tf,
                checkpoint_dir=out_dir,
                method_kwargs=kwargs,
                device=device,
                progress=progress,
            )
            checkpoint = result.checkpoint
            if D.is_main_process() and result.losses:
                import matplotlib.pyplot as plt

                plt.close(result.plot(out_dir / "loss.png"))
            model.eval()
            predict: Callable[[Tensor], Any] = model
            if method == "pvu":
                from bayesurl.posthoc import MethodEncoder, wrap

                wrapped = wrap(MethodEncoder(model), "pvu").to(device)
                head_loader = make_loader(data.train, batch, shuffle=True, seed=args.seed)
                report = wrapped.fit(
                    _Batches(head_loader, augment_tf, device),
                    epochs=args.head_epochs,
                    batch_size=batch,
                    progress=progress,
                )
                hparams["pvu_fit"] = {
                    k: v for k, v in report.items() if isinstance(v, (int, float, list))
                }
                checkpoint = out_dir / "pvu.pt"
                wrapped.save(checkpoint)
                predict = wrapped
        else:
            predict, checkpoint = _run_lam(args, method, data, base, batch, lr, device, out_dir)
            hparams.update(margin=args.margin, approximation=args.approximation)
            hparams.update(geometry=args.geometry)
        train_time = time.perf_counter() - t0
        record: dict[str, Any] = {
            "recipe": {"method": method, "dataset": dataset, "smoke": bool(args.smoke)},
            "hparams": hparams,
            "n_train": len(data.train),
            "train_time_s": train_time,
            "checkpoint": None if checkpoint is None else os.fspath(checkpoint),
            "paper": PAPER_FIGURES.get((dataset, method)),
        }
        if D.is_main_process():
            record["metrics"] = _score(predict, data, evaluate_tf, device, args)
            (out_dir / "metrics.json").write_text(json.dumps(record, indent=2, default=str))
        return record
    finally:
        D.cleanup()


def _run_lam(
    args: argparse.Namespace,
    method: str,
    data: _Data,
    base: Mapping[str, Any],
    batch: int,
    lr: float,
    device: torch.device,
    out_dir: Path,
) -> tuple[Callable[[Tensor], Any], Path]:
    """LAM (Warburg et al., 2023): post-hoc (section 3) or online (eqs. 4-5) last-layer Laplace
    of an embedding net ending in a linear projection, trained with the contrastive loss."""
    from bayesurl.data import default_transform, make_loader
    from bayesurl.heads.embedding import EmbeddingNet
    from bayesurl.laplace import MetricLaplace, train_contrastive, train_online

    net = EmbeddingNet(base["backbone"], base["embed_dim"], **dict(base.get("backbone_kwargs", {})))
    net = net.to(device)
    transform = default_transform(data.channels, **data.stats).to(device)
    loader = _Batches(
        make_loader(data.train, batch, shuffle=True, seed=args.seed, drop_last=False),
        transform,
        device,
    )
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    progress = not args.no_progress
    common = {"approximation": args.approximation, "geometry": args.geometry}
    if method == "lam_posthoc":
        train_contrastive(net, loader, opt, args.epochs, margin=args.margin, progress=progress)
        la = MetricLaplace(net, margin=args.margin, **common)
        la.fit(loader, progress=progress)
    else:
        la = MetricLaplace(
            net, mode="online", margin=args.margin, dataset_size=len(data.train), **common
        )
        gen = torch.Generator(device=device).manual_seed(args.seed)
        train_online(la, loader, opt, args.epochs, generator=gen, progress=progress)
    try:
        la.optimize_prior_precision()
    except ValueError:  # every Hessian entry clamped: keep the prior (LAM's fixed prior)
        pass
    path = out_dir / "laplace.pt"
    torch.save({"model": net.state_dict(), "laplace": la.state_dict(), "config": dict(base)}, path)
    gen_eval = torch.Generator(device=device).manual_seed(args.seed)

    def predict(x: Tensor) -> Any:
        return la.predictive(x, n_samples=args.eval_samples, generator=gen_eval)

    return predict, path


def run_recipe_cli(method: str, dataset: str, argv: list[str] | None = None) -> int:
    """Entry point of ``recipes/<dataset>/<method>.py``: parse, run, print; exit status.

    Bad options and missing data end with ``<prog>: error: <message>`` and exit status 2.
    """
    parser = build_parser(method, dataset)
    args = parser.parse_args(argv)
    try:
        record = run_recipe(args, method, dataset)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    if "metrics" not in record:  # not rank 0 under torchrun: rank 0 reports
        return 0
    metrics = record["metrics"]
    for name, vals in metrics.items():
        line = " ".join(f"{k}={v:.3f}" for k, v in vals.items() if isinstance(v, float))
        print(f"{method} on {dataset} [{name}]: {line}")
    print(f"metrics: {Path(args.out) / 'metrics.json'}; checkpoint: {record['checkpoint']}")
    return 0
