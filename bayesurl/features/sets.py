"""Frozen features as a data source: a set of images swapped for its cached features.

With a frozen backbone the features are the data (the PVU thesis' "cache everything", section
5.3): :func:`cached_features` looks a set's images up in the store
(:class:`~bayesurl.features.store.FeatureStore`, encoding the ones it does not hold yet) and
returns them as :class:`CachedFeatures`, which keep, per row, the SHA-1 digest of the image it
was encoded from (the store's address of that image), so a run's per-query record and its
report name the image a feature row came from (:func:`source_digests`).

Training images get ``views`` rows: row 0 the deterministic transform, rows ``1..views-1``
random augmentations drawn once at extraction; the batch transform of cached features takes
row 0 (:class:`FirstView`) and the two-view methods (InfoNCE, MCInfoNCE, HIB, TaU) draw their
two views among the cached augmentations (:class:`RandomView`) instead of fresh ones.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from bayesurl.data import ImageTensorDataset, make_loader
from bayesurl.features.store import FeatureStore, image_digests

__all__ = ["CachedFeatures", "FirstView", "RandomView", "cached_features", "source_digests"]


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
        (:func:`~bayesurl.features.store.image_digests`): the link from a cached row back to
        its picture.
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
    if isinstance(dataset, ImageTensorDataset):
        return dataset.images, dataset.targets
    xs, ys = [], []
    for x, y in make_loader(dataset, 1024, shuffle=False, distributed=False):
        xs.append(torch.as_tensor(x))
        ys.append(torch.as_tensor(y))
    x = torch.cat(xs)
    return (x.unsqueeze(1) if x.ndim == 3 else x), torch.cat(ys).to(torch.int64)


def cached_features(store: FeatureStore, dataset: Any, *, augmented: bool) -> CachedFeatures:
    """The features of every ``(uint8 image, label)`` item of ``dataset`` from ``store``
    (``[N, views, F]`` with ``augmented``, else ``[N, 1, F]``), with each row's source digest."""
    images, labels = _images_of(dataset)
    digests = image_digests(images)
    feats = store.features(images, augmented=augmented, digests=digests)
    return CachedFeatures(feats, labels, digests)
