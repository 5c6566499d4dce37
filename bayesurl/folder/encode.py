"""Scan and encode a folder in one streaming pass (step 2 of :mod:`bayesurl.folder`).

Each image is decoded once (the next batch is decoded while the current one is encoded) and
encoded once per view: its plain row through the frozen-feature store
(:class:`bayesurl.features.FeatureStore`), the augmented views of the fit sample by the
store's backbone (:func:`bayesurl.features.encode_batches`).
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from bayesurl.backbones import build_backbone, data_config
from bayesurl.data import default_augmentation, default_transform
from bayesurl.data.folder import (
    ReadableImages,
    collate_readable,
    scan_image_folder,
)
from bayesurl.features import FeatureStore, FrozenEncoder, encode_batches
from bayesurl.folder.methods import FIT_PLANS, FolderMethod
from bayesurl.folder.options import FolderOptions

__all__ = ["Encoded", "Features", "encode_folder"]


@dataclass
class Features:
    """What the streaming pass kept of a folder: the plain features of its readable images,
    the augmented views of the fit sample and the files it could not read."""

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


def _encode_stream(
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
) -> Features:
    """One streaming pass: each image decoded once; its plain row from ``store``, the
    ``views`` augmentations of the fit sample from ``store``'s backbone (the store's loop,
    :func:`bayesurl.features.encode_batches`)."""
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
    return Features(
        torch.cat(feats),
        torch.cat(ids),
        torch.cat(labels),
        torch.cat(view_feats) if view_feats else torch.empty(0, views, dim),
        skipped,
        digests,
    )


@dataclass
class Encoded:
    """The folder scanned and encoded: features, sizes and the time it took."""

    scan: Any
    fx: Features
    size: int
    device: torch.device
    generator: torch.Generator  # the seeded stream, past the fit sample's draw
    fit_ids: set[int]  # scan indices of the fit sample
    seconds: float


def encode_folder(images: str | os.PathLike[str], opts: FolderOptions) -> Encoded:
    """Scan the folder, build the frozen backbone and stream every image through it."""
    t0 = time.perf_counter()
    scan = scan_image_folder(images)
    if opts.method is FolderMethod.MAHALANOBIS and scan.labels is None:
        raise ValueError(
            f"`method` 'mahalanobis' fits one Gaussian per class and needs labels: class "
            f"sub-folders DIR/<class>/<image>, but {scan.root} has none; 'gmm' (k-means "
            "components) and 'knn' need no labels"
        )
    dev = opts.device
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
        fx = _encode_stream(
            store, ReadableImages(scan, size, opts.max_pixels), augment, fit_ids=fit_ids,
            views=opts.views if FIT_PLANS[opts.method].augmented else 0,
            batch_size=opts.batch_size, workers=opts.workers, device=dev, generator=aug_gen,
            progress=opts.progress, strict=opts.strict,
        )  # fmt: skip
    return Encoded(scan, fx, size, dev, gen, fit_ids, time.perf_counter() - t0)
