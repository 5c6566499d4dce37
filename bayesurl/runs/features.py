"""Frozen-feature data: a pretrained backbone's features, extracted once and reused.

With ``backbone.freeze = true`` the backbone never trains, so its features are a data source
(the PVU thesis' "cache everything", section 5.3): each image is encoded once per (weights
fingerprint, transform, resolution, views) and every estimator then trains its head on the
cached features, the backbone replaced by the identity (:class:`bayesurl.backbones.Identity`).

The store is content-addressed: an image is found by the SHA-1 of its bytes, so the class
splits of a protocol share one extraction (an image upstream in one split and downstream in
another is encoded once). Missing images are encoded into a new *shard*, a folder sealed by
:func:`bayesurl.files.reuse_or_build` (size and SHA-256 of each file, checked before reuse; a
corrupted shard is rebuilt, never read).

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
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from bayesurl._modules import eval_mode
from bayesurl.data.transforms import Resize
from bayesurl.files import CorruptedFileError, reuse_or_build, unseal
from bayesurl.posthoc.base import iterate
from bayesurl.posthoc.cache import encoder_fingerprint
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

#: images per extraction batch
EXTRACT_BATCH = 128


class FrozenEncoder(nn.Module):
    """``uint8`` images -> transform -> resize to ``resolution`` -> frozen backbone features.

    Parameters
    ----------
    backbone : nn.Module
        Maps ``[N, C, R, R]`` inputs to features ``[N, F]``.
    transform : nn.Module
        ``uint8`` batch -> normalised float batch with the backbone's channels.
    resolution : int
        Side the images are resized to (bilinear) before the backbone.
    """

    def __init__(self, backbone: nn.Module, transform: nn.Module, resolution: int) -> None:
        super().__init__()
        self.backbone, self.transform, self.resolution = backbone, transform, int(resolution)
        self.resize = Resize(self.resolution)
        # frozen: in eval mode from the start, so that the store's eval_mode block restores
        # eval mode, not a new module's training flag, to the backbone
        self.eval()

    def forward(self, images: Tensor) -> Tensor:
        return self.backbone(self.resize(self.transform(images)))


def image_digests(images: Tensor) -> list[str]:
    """SHA-1 hex digest of each image's bytes (the store's address of an image)."""
    flat = images.reshape(len(images), -1).contiguous().cpu().numpy()
    return [hashlib.sha1(row.tobytes()).hexdigest() for row in flat]


@dataclass
class FeatureStore:
    """Content-addressed, sealed on-disk store of frozen-backbone features.

    Parameters
    ----------
    directory : str or PathLike
        Root folder; one sub-folder per store key, one sealed shard per extraction.
    encoder : FrozenEncoder
        Deterministic encoder (row 0 of every image).
    augment : nn.Module or None
        Random ``uint8`` -> input augmentation of rows ``1..views-1``.
    views : int
        Rows per image when ``augmented`` is asked for (1: no augmentation).
    description : dict
        What the transform and resolution are (JSON-able; part of the key).
    seed : int
        Seed of the augmentations drawn at extraction.
    progress : bool
        tqdm bar per extraction.
    """

    directory: str | os.PathLike[str]
    encoder: FrozenEncoder
    augment: nn.Module | None
    views: int
    description: dict[str, Any]
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if int(self.views) < 1:
            raise ValueError(f"`views` must be >= 1, got {self.views}")
        if self.views > 1 and self.augment is None:
            raise ValueError("`augment` is required for `views` > 1")
        self.fingerprint = encoder_fingerprint(self.encoder.backbone)
        self.timings: dict[str, float] = {"extract_images": 0.0, "extract_seconds": 0.0}
        # verified shards read once per store object: a caller that streams many small calls
        # (``bayesurl folder``, one call per batch) would otherwise re-verify every shard per call
        self._indices: dict[Path, dict[str, tuple[np.ndarray, int]]] = {}

    def key(self, views: int) -> dict[str, Any]:
        """What the features of one store depend on."""
        return {
            "weights": self.fingerprint,
            "transform": self.description,
            "views": int(views),
            "seed": int(self.seed) if views > 1 else None,
        }

    def folder(self, views: int) -> Path:
        blob = json.dumps(self.key(views), sort_keys=True, default=str).encode()
        return Path(self.directory) / hashlib.sha256(blob).hexdigest()[:16]

    def features(
        self, images: Tensor, *, augmented: bool = False, digests: list[str] | None = None
    ) -> Tensor:
        """Features ``[N, V, F]`` (float32) of ``images`` (``uint8 [N, C, H, W]``).

        ``V = views`` when ``augmented`` else 1. Images not in the store yet are encoded
        into a new sealed shard first. ``digests``: :func:`image_digests` of ``images``,
        when the caller has them already.
        """
        views = int(self.views) if augmented else 1
        if digests is None:
            digests = image_digests(images)
        elif len(digests) != len(images):
            raise ValueError(f"`digests` holds {len(digests)} entries for {len(images)} `images`")
        folder = self.folder(views)
        if folder not in self._indices:
            self._indices[folder] = _load_shards(folder)
        index = self._indices[folder]
        missing: dict[str, int] = {}
        for i, d in enumerate(digests):
            if d not in index:
                missing.setdefault(d, i)
        if missing:
            shard = self._extract(folder, images[list(missing.values())], list(missing), views)
            _load_shard(shard, index)
        out = np.empty((len(images), views, self.dim(index)), dtype=np.float32)
        by_shard: dict[int, tuple[np.ndarray, list[int], list[int]]] = {}
        for pos, d in enumerate(digests):
            feats, row = index[d]
            by_shard.setdefault(id(feats), (feats, [], []))[1].append(pos)
            by_shard[id(feats)][2].append(row)
        for feats, positions, rows in by_shard.values():
            order = np.argsort(rows, kind="stable")  # sorted reads are sequential on disk
            out[np.asarray(positions)[order]] = feats[np.asarray(rows)[order]]
        return torch.from_numpy(out)

    @staticmethod
    def dim(index: dict[str, tuple[np.ndarray, int]]) -> int:
        """Feature dimension of a loaded index (0 when empty)."""
        first = next(iter(index.values()), None)
        return 0 if first is None else int(first[0].shape[-1])

    def _extract(self, folder: Path, images: Tensor, digests: list[str], views: int) -> Path:
        name = hashlib.sha256("".join(digests).encode()).hexdigest()[:16]
        key = {**self.key(views), "images": name}
        gen = torch.Generator().manual_seed(int(self.seed))

        def build(shard: Path) -> dict[str, Any]:
            t0 = time.perf_counter()
            feats = self._encode(images, views, gen)
            self.timings["extract_seconds"] += time.perf_counter() - t0
            self.timings["extract_images"] += len(images) * views
            np.save(shard / "features.npy", feats)
            (shard / "digests.txt").write_text("\n".join(digests) + "\n")
            return {"files": ["features.npy", "digests.txt"], "meta": {"n": len(digests)}}

        reuse_or_build(folder / f"shard-{name}", build, key=key)
        return folder / f"shard-{name}"

    @torch.no_grad()
    def _encode(self, images: Tensor, views: int, gen: torch.Generator) -> np.ndarray:
        chunks = []
        batches = range(0, len(images), EXTRACT_BATCH)
        desc = f"extracting features ({len(images)} images x {views} views)"
        with eval_mode(self.encoder):
            for lo in iterate(batches, self.progress, desc):
                x = images[lo : lo + EXTRACT_BATCH]
                rows = [self.encoder(x)]
                for _ in range(views - 1):
                    # the augmentations draw from torch's global generator: seed a fork of it
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
                        aug = self.augment(x)  # type: ignore[misc]
                    rows.append(self.encoder.backbone(self.encoder.resize(aug)))
                chunks.append(torch.stack(rows, dim=1).float().cpu().numpy())
        return np.concatenate(chunks)


def _load_shards(folder: Path) -> dict[str, tuple[np.ndarray, int]]:
    """digest -> (the shard's memory-mapped features, row) over every verified shard."""
    index: dict[str, tuple[np.ndarray, int]] = {}
    if not folder.is_dir():
        return index
    for shard in sorted(folder.glob("shard-*")):
        try:
            _load_shard(shard, index)
        except (FileNotFoundError, CorruptedFileError):
            continue  # an unfinished or corrupted shard is rebuilt by the next extraction
    return index


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


def _load_shard(shard: Path, index: dict[str, tuple[np.ndarray, int]]) -> None:
    """Add the rows of one verified shard to ``index`` (the first shard of a digest wins)."""
    unseal(shard)
    feats = np.load(shard / "features.npy", mmap_mode="r")
    for row, digest in enumerate((shard / "digests.txt").read_text().split()):
        index.setdefault(digest, (feats, row))


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
