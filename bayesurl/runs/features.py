"""Frozen-feature data: a pretrained backbone's features, extracted once and reused.

With ``backbone.freeze = true`` the backbone never trains, so its features are a data source
(the PVU thesis' "cache everything", section 5.3): each image is encoded once per (weights
fingerprint, transform, resolution, views) and every estimator then trains its head on the
cached features, the backbone replaced by the identity (:class:`bayesurl.backbones.Identity`).

The features live in the embedding store (:class:`bayesurl.posthoc.store.FeatureStore`,
re-exported here with :class:`~bayesurl.posthoc.store.FrozenEncoder` and
:func:`~bayesurl.posthoc.store.image_digests`): content-addressed by the SHA-1 of each image's
bytes, so the class splits of a protocol share one extraction, in sealed shards that are
rebuilt, never read, when corrupted. This module builds the store of a run's configuration
(:func:`feature_store`) and swaps a run's images for their features (:func:`frozen_data`).

Training images get ``views`` rows: row 0 the deterministic transform, rows ``1..views-1``
random augmentations (:func:`bayesurl.data.default_augmentation`) drawn once at extraction; the
two-view methods (InfoNCE, MCInfoNCE, HIB, TaU) draw their two views among these cached
augmentations (:class:`RandomView`) instead of fresh ones. Other sets get row 0 only.

Each set of cached features keeps the link back to its pictures: :class:`CachedFeatures`
holds, per row, the SHA-1 digest of the image it was encoded from (the store's address of
that image), so a run's per-query record and its report name the image a feature row came
from (:func:`source_digests`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from bayesurl.posthoc.store import FeatureStore, FrozenEncoder, image_digests
from bayesurl.runs.config import RunConfig

__all__ = [
    "CachedFeatures",
    "FeatureStore",
    "FirstView",
    "FrozenEncoder",
    "RandomView",
    "feature_store",
    "frozen_data",
    "image_digests",
    "source_digests",
]


class CachedFeatures(TensorDataset):
    """Cached features ``[N, V, F]`` and labels, with the source image of every row.

    Parameters
    ----------
    features : Tensor
        ``[N, V, F]`` frozen-backbone features.
    labels : Tensor
        ``[N]`` classes.
    digests : list of str
        SHA-1 hex digest of the ``uint8`` image row ``i`` was encoded from
        (:func:`image_digests`): the link from a cached row back to its picture.
    """

    def __init__(self, features: Tensor, labels: Tensor, digests: list[str]) -> None:
        super().__init__(features, labels)
        if len(digests) != len(features):
            raise ValueError(
                f"`digests` holds {len(digests)} entries for {len(features)} feature rows"
            )
        self.digests = list(digests)


def source_digests(dataset: Any) -> list[str] | None:
    """SHA-1 digest of the source image of each item of ``dataset``, in order.

    :class:`CachedFeatures` keep them from the extraction; a set of ``uint8`` images in
    memory (:class:`bayesurl.data.ImageTensorDataset`) is hashed here. ``None`` for any other
    set (images read from files on demand: their paths name them).
    """
    from bayesurl.data import ImageTensorDataset

    if isinstance(dataset, CachedFeatures):
        return list(dataset.digests)
    if isinstance(dataset, ImageTensorDataset):
        return image_digests(dataset.images)
    return None


class FirstView(nn.Module):
    """Batch transform of cached features: ``[B, V, F] -> [B, F]``, row 0 (no augmentation)."""

    def forward(self, x: Tensor) -> Tensor:
        return x[:, 0]


class RandomView(nn.Module):
    """Batch augmentation of cached features: one of the augmented rows ``1..V-1`` per item.

    Two calls draw independently, so a two-view method gets two (usually different) cached
    augmentations of each image; with ``V = 1`` it returns row 0.
    """

    def forward(self, x: Tensor) -> Tensor:
        v = x.shape[1]
        if v == 1:
            return x[:, 0]
        pick = torch.randint(1, v, (x.shape[0],), device=x.device)
        return x[torch.arange(x.shape[0], device=x.device), pick]


def _images_of(dataset: Any) -> tuple[Tensor, Tensor]:
    """All ``uint8`` images ``[N, C, H, W]`` and labels of a data set, in order."""
    from bayesurl.data import ImageTensorDataset, make_loader

    if isinstance(dataset, ImageTensorDataset):
        return dataset.images, dataset.targets
    xs, ys = [], []
    for x, y in make_loader(dataset, 1024, shuffle=False, distributed=False):
        xs.append(torch.as_tensor(x))
        ys.append(torch.as_tensor(y))
    x = torch.cat(xs)
    return (x.unsqueeze(1) if x.ndim == 3 else x), torch.cat(ys).to(torch.int64)


def feature_store(
    cfg: RunConfig, channels: int, kwargs: dict[str, Any], progress: bool = True
) -> FeatureStore:
    """The store of ``cfg``'s frozen backbone (built from ``kwargs`` with its weights)."""
    from bayesurl import data as bd
    from bayesurl.backbones import build_backbone, data_config

    backbone, _ = build_backbone(cfg.backbone.name, **kwargs)
    dc = data_config(backbone)
    resolution = int(cfg.backbone.resolution or dc.input_size[-1])
    # grayscale images: one mean / std for the repeated channel (the backbone's average);
    # images with the backbone's channels (clipart's RGB): its own per-channel statistics
    stats: dict[str, Any] = dc.grayscale_statistics()
    if int(channels) == dc.in_chans != 1:
        stats = {"mean": list(dc.mean), "std": list(dc.std)}
    transform = bd.default_transform(dc.in_chans, **stats)
    augment = bd.default_augmentation(dc.in_chans, **stats)
    description = {
        "backbone": cfg.backbone.name,
        "channels_in": int(channels),
        "in_chans": dc.in_chans,
        **stats,
        "resolution": resolution,
        "augment": "default_augmentation",
    }
    return FeatureStore(
        cfg.backbone.cache,
        FrozenEncoder(backbone.eval(), transform, resolution),
        augment,
        int(cfg.backbone.views),
        description,
        seed=int(cfg.data.seed),
        progress=progress,
    )


def frozen_data(cfg: RunConfig, data: Any, kwargs: dict[str, Any], progress: bool = True) -> Any:
    """``data`` (:class:`~bayesurl.runs.data.RunData` of images) with each set replaced by its
    cached frozen features: ``train`` ``[N, views, F]``, the others ``[N, 1, F]``; the batch
    transform takes row 0 (:class:`FirstView`), the augmentation a random cached view
    (:class:`RandomView`), and the estimators' backbone is the identity on ``F`` features.
    ``kwargs``: the arguments of the frozen backbone (its weights)."""
    if data.tests:
        raise ValueError("`backbone.freeze` supports the embedded data sets (one test set)")
    store = feature_store(cfg, data.channels, kwargs, progress)
    sets = copy.copy(data.sets)
    dim = 0
    for name in ("train", "val", "test", "id_test", "ood"):
        ds = getattr(sets, name, None)
        if ds is None or len(ds) == 0:
            continue
        images, labels = _images_of(ds)
        digests = image_digests(images)
        feats = store.features(images, augmented=name == "train", digests=digests)
        dim = int(feats.shape[-1])
        setattr(sets, name, CachedFeatures(feats, labels, digests))
    info = {
        **data.info,
        "frozen": {
            "weights": store.fingerprint,
            **store.description,
            "views": int(cfg.backbone.views),
            "extract_images": store.timings["extract_images"],
            "extract_seconds": round(store.timings["extract_seconds"], 3),
        },
    }
    return dataclasses.replace(
        data,
        sets=sets,
        transform=FirstView(),
        augment=RandomView(),
        info=info,
        backbone=("identity", {"num_features": dim}),
    )
