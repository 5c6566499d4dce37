"""Data assembly of a run: the zero-shot sets and the batch transforms of the backbone.

One function, :func:`build_data`, turns a :class:`~bayesurl.runs.config.RunConfig` into a
:class:`RunData`: the upstream training set, the downstream test set, the held-out upstream
set and the OOD set of the URL zero-shot protocol (Kirchhof et al., 2023, section 3.2;
docs/concepts/zero_shot.rst) -- or, with ``data.split = "closed"``, LAM's closed set (Warburg et
al., 2023, section 4: the same classes trained on and retrieved) --, all stored as ``uint8`` images,
and the per-batch transforms that the backbone's data configuration asks for
(:func:`bayesurl.backbones.data_config`: channels, mean / std).
Grayscale images are normalised with their data set's statistics and repeated to the
backbone's channels; folder images (CUB, CARS, SOP) are RGB crops normalised with the
backbone's statistics.

With ``backbone.freeze = true`` the backbone never trains, so its features are the data (the
PVU thesis' "cache everything", section 5.3): :func:`frozen_data` swaps each set for its
features from the run's frozen-feature store (:func:`feature_store`; :mod:`bayesurl.features`:
each image encoded once per weights fingerprint, transform, resolution and views,
content-addressed by the SHA-1 of its bytes, so the class splits of a protocol share one
extraction) and every estimator trains its head on them, the backbone replaced by the
identity (:class:`bayesurl.backbones.Identity`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from bayesurl.data.registry import (
    DATASETS,
    DatasetKind,
    dataset_classes,
    dataset_kind,
    dataset_names,
    get_dataset,
    pool_datasets,
)
from bayesurl.data.splits import capped
from bayesurl.features import FeatureStore, FirstView, FrozenEncoder, RandomView, cached_features
from bayesurl.runs.config import RunConfig

__all__ = [
    "RunData",
    "backbone_kwargs",
    "build_data",
    "data_key",
    "feature_store",
    "frozen_data",
    "method_backbone",
]


@dataclass
class RunData:
    """The sets and transforms of one run.

    Attributes
    ----------
    name : str
        Data set name (``"digits"`` when FashionMNIST was absent).
    sets : ZeroShotData
        ``train`` (upstream, labels ``0..K-1``), ``test`` (downstream), ``id_test`` and
        ``ood`` (``None`` where the data set has none); per-item transforms keep ``uint8``.
    num_classes : int
        Upstream classes (the classifier width).
    channels : int
        Channels the backbone expects.
    transform : nn.Module
        Deterministic batch transform (``uint8`` -> normalised float).
    augment : nn.Module
        Random batch augmentation (two draws give the two views of two-view methods).
    info : dict
        Sizes and settings for the result record.
    tests : dict
        Several downstream test sets by name (ImageNet upstream: CUB, CARS, SOP); the runner
        scores each and reports their mean. Empty: ``sets.test`` is the one test set.
    backbone : (str, dict) or None
        The estimators' backbone name and arguments when the data are not images (frozen
        features: ``("identity", {"num_features": F})``); ``None``: the config's.
    """

    name: str
    sets: Any
    num_classes: int
    channels: int
    transform: nn.Module
    augment: nn.Module
    info: dict[str, Any] = field(default_factory=dict)
    tests: dict[str, Any] = field(default_factory=dict)
    backbone: tuple[str, dict[str, Any]] | None = None


class _Keep(nn.Module):
    """Per-item transform that keeps the stored ``uint8`` image (batches are transformed later,
    much faster than item by item)."""

    def forward(self, x: Any) -> Any:
        return x


def data_key(cfg: RunConfig) -> tuple[Any, ...]:
    """What the assembled data depend on (runs with equal keys share one :class:`RunData`)."""
    d, b = cfg.data, cfg.backbone
    return (
        d.name,
        d.root,
        d.image_size,
        d.max_train,
        d.max_test,
        d.max_ood,
        d.seed,
        d.downstream_root,
        None
        if d.class_split is None
        else tuple(sorted((k, repr(v)) for k, v in d.class_split.items())),
        d.stage,
        d.split,
        b.name,
        tuple(sorted((k, repr(v)) for k, v in b.kwargs.items())),
        b.checkpoint,
        b.pretrained,
        (b.freeze, b.resolution, b.views, b.cache) if b.freeze else None,
    )


@dataclass(frozen=True)
class _Road:
    """How the runs read the data sets of one :class:`DatasetKind`."""

    #: ``sets(cfg, name, split) -> (ZeroShotData, further test sets by name)`` at
    #: ``data.stage = "final"`` without a ``data.class_split`` (else the class-split road)
    sets: Callable[[RunConfig, str, Any], tuple[Any, dict[str, Any]]]
    #: colour images normalised with the backbone's statistics (else grayscale, normalised
    #: with the data set's own or the pretrained weights' averaged statistics)
    colour: bool
    #: images read in as three channels, whatever channels the backbone is built with
    three_channels: bool
    #: fine-tuning a pretrained backbone enlarges the images to the size it was made with
    upsize: bool


def build_data(cfg: RunConfig, progress: bool = True) -> RunData:
    """Assemble the zero-shot sets and batch transforms of ``cfg`` (``progress``: the frozen
    features' extraction shows its bar).

    The data set's declared kind (:mod:`bayesurl.data.registry`) picks the road: its sets,
    how its images are normalised and whether they are resized.

    Raises
    ------
    ValueError
        For an unknown ``data.name``, a missing ``data.root`` of a folder data set (the
        message says where to get the data) or bad caps.
    FileNotFoundError
        If ``data.root`` does not exist.
    """
    from bayesurl.backbones import data_config

    d = cfg.data
    name, kind = dataset_kind(d.name, argument="data.name")
    split = _check_data(cfg, kind, name)
    road = _ROADS[kind]
    if d.class_split is not None or d.stage != "final":
        zs, tests = _class_split_sets(cfg, name), {}
    else:
        zs, tests = road.sets(cfg, name, split)
    dc = data_config(cfg.backbone.name, **backbone_kwargs(cfg, 3 if road.three_channels else None))
    channels = 3 if road.three_channels else dc.in_chans
    transform, augment = _batch_transforms(cfg, road, dc, channels)
    info = {
        "dataset": zs.name,
        "ood": zs.ood_name,
        "upstream_classes": list(zs.upstream_classes),
        "downstream_classes": list(zs.downstream_classes),
        "sizes": {
            k: (None if getattr(zs, k) is None else len(getattr(zs, k)))
            for k in ("train", "test", "id_test", "ood")
        },
        "channels": channels,
        "data_seed": d.seed,
        "split": split.value,
    }
    if d.class_split is not None:
        info.update(class_split=dict(d.class_split), stage=d.stage)
    if tests:
        info["sizes"].update({f"test_{k}": len(v) for k, v in tests.items()})
    data = RunData(
        zs.name, zs, int(zs.num_train_classes), channels, transform, augment, info, tests
    )
    if cfg.backbone.freeze:
        data = frozen_data(cfg, data, backbone_kwargs(cfg, None), progress)
    return data


def _check_data(cfg: RunConfig, kind: DatasetKind, name: str) -> Any:
    """Check the caps, ``data.root`` and ``data.split`` of ``cfg``; the :class:`Split`."""
    from bayesurl import data as bd

    d = cfg.data
    for key in ("max_train", "max_test", "max_ood"):
        v = getattr(d, key)
        if v is not None and v < 1:
            raise ValueError(f"`data.{key}` must be a positive size or none, got {v}")
    if d.root is not None and not Path(d.root).exists():
        raise FileNotFoundError(f"`data.root` {d.root!r} does not exist")
    try:
        split = bd.Split(d.split)
    except ValueError:
        valid_splits = ", ".join(x.value for x in bd.Split)
        raise ValueError(f"unknown `data.split` {d.split!r}; valid: {valid_splits}") from None
    if split is not bd.Split.ZERO_SHOT and (kind is not DatasetKind.EMBEDDED or d.class_split):
        raise ValueError(
            f"`data.split` {d.split!r} is available for the embedded sets "
            f"({', '.join(dataset_names(DatasetKind.EMBEDDED))}) without a `data.class_split`, "
            f"not {name!r}"
        )
    return split


def _batch_transforms(cfg: RunConfig, road: _Road, dc: Any, channels: int) -> tuple[Any, Any]:
    """The deterministic batch transform and the random augmentation of the run's images."""
    from bayesurl import data as bd

    stats: dict[str, Any] = {}
    if road.colour:
        stats = {"mean": dc.mean, "std": dc.std}
    elif cfg.backbone.pretrained:
        # grayscale: the data set's own statistics repeated to the channels, or the pretrained
        # weights' own (averaged over their channels)
        stats = dc.grayscale_statistics()
    transform = bd.default_transform(channels, **stats)
    augment = bd.default_augmentation(channels, **stats)
    if cfg.backbone.pretrained and not cfg.backbone.freeze and road.upsize:
        # fine-tuning a pretrained backbone on small images: at the size it was made with
        size = cfg.backbone.resolution or dc.input_size[-1]
        transform = nn.Sequential(*transform, bd.Resize(size))
        augment = nn.Sequential(augment, bd.Resize(size))
    return transform, augment


def _embedded_sets(cfg: RunConfig, name: str, split: Any) -> tuple[Any, dict[str, Any]]:
    """An embedded set's standard split (:data:`bayesurl.data.SPLITS`, with the keywords the
    set declares in ``split_options``), or its pool's first class split when it declares
    none."""
    from bayesurl import data as bd

    d = cfg.data
    options = DATASETS.traits(name).get("split_options")
    if options is None:
        if split is not bd.Split.ZERO_SHOT:
            raise ValueError(f"`data.split` {d.split!r} is not available for {name!r}")
        return _class_split_sets(cfg, name), {}
    zs = bd.SPLITS[split](
        d.root,
        **options,
        max_train=d.max_train,
        max_test=d.max_test,
        max_ood=d.max_ood,
        val_fraction=0.0,
        seed=d.seed,
    )
    return zs.with_transform(_Keep()), {}


def _folder_sets(cfg: RunConfig, name: str, split: Any) -> tuple[Any, dict[str, Any]]:
    """A folder set's standard zero-shot class split (:func:`bayesurl.data.dml_zero_shot`)."""
    from bayesurl import data as bd

    d = cfg.data
    if d.root is None:
        how = f": {d.how_to_get}" if d.how_to_get else ""
        raise ValueError(f"`data.root` is required for {name}{how}; then --set data.root=DIR")
    to_uint8 = bd.PilToUint8(d.image_size)
    zs = bd.dml_zero_shot(name, d.root, transform=to_uint8, train_transform=to_uint8)
    zs.train = capped(zs.train, d.max_train, d.seed)
    zs.test = capped(zs.test, d.max_test, d.seed)
    return zs, {}


def _pool_sets(cfg: RunConfig, name: str, split: Any) -> tuple[Any, dict[str, Any]]:
    """A pool set without a ``data.class_split``: its first class split."""
    return _class_split_sets(cfg, name), {}


def _class_split_sets(cfg: RunConfig, name: str) -> Any:
    """The sets of ``data.class_split`` at ``data.stage`` (the benchmark's class-split
    protocol, :func:`bayesurl.data.class_splits.split_data`; sets that declare a pool)."""
    from bayesurl.data.class_splits import ClassSplit, class_splits, split_data

    d = cfg.data
    if name not in pool_datasets():  # the data sets split_data can split by class
        raise ValueError(
            f"`data.class_split` needs one of {', '.join(pool_datasets())}, got {d.name!r}"
        )
    if d.stage not in ("final", "tune"):
        raise ValueError(f"`data.stage` must be 'final' or 'tune', got {d.stage!r}")
    if d.class_split is None and d.stage != "final":
        raise ValueError("`data.stage` 'tune' needs a `data.class_split`")
    cs = d.class_split
    if cs is None:  # a pool set without a class split: its first split (the lower half up)
        k = len(dataset_classes(name))
        cs = class_splits(1, num_classes=k, n_val=max(1, min(2, k // 2 - 1)))[0].to_dict()
    try:
        split = ClassSplit(
            index=int(cs.get("index", 0)),
            upstream=tuple(int(c) for c in cs["upstream"]),
            downstream=tuple(int(c) for c in cs["downstream"]),
            val=tuple(int(c) for c in cs.get("val", ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            "`data.class_split` must be a table {index, upstream, downstream, val} of class "
            f"indices, got {d.class_split!r} ({exc})"
        ) from None
    return split_data(
        split,
        stage=d.stage,
        root=d.root,
        dataset=name,
        max_train=d.max_train,
        max_test=d.max_test,
        max_id=d.max_test,
        max_ood=d.max_ood,
        seed=d.seed,
        image_size=d.image_size,
    ).with_transform(_Keep())


def _upstream_sets(cfg: RunConfig, name: str, split: Any) -> tuple[Any, dict[str, Any]]:
    """ImageNet-style upstream data: ``root/train/<class>/*`` (the set's loader) and the
    downstream test sets of the folder data sets under ``data.downstream_root``."""
    from bayesurl import data as bd

    d = cfg.data
    if d.root is None:
        how = f": {d.how_to_get}" if d.how_to_get else ""
        raise ValueError(f"`data.root` is required for {d.name}{how}; then --set data.root=DIR")
    folder = Path(d.root) / "train"
    if not folder.is_dir():
        raise FileNotFoundError(f"`data.root` has no training folder {str(folder)!r}")
    folder_sets = dataset_names(DatasetKind.FOLDER)
    if d.downstream_root is None:
        raise ValueError(
            f"`data.downstream_root` is required for {d.name}: a folder holding one or more "
            f"of {', '.join(f'{n}/' for n in folder_sets)} for the zero-shot evaluation"
        )
    droot = Path(d.downstream_root)
    if not droot.is_dir():
        raise FileNotFoundError(f"`data.downstream_root` {str(droot)!r} does not exist")
    to_uint8 = bd.PilToUint8(d.image_size)
    train = get_dataset(name, d.root, "train", to_uint8)
    num_classes = len(train.classes)
    train = capped(train, d.max_train, d.seed)
    tests = {
        n: capped(bd.dml_zero_shot(n, droot / n, transform=to_uint8).test, d.max_test, d.seed)
        for n in folder_sets
        if (droot / n).is_dir()
    }
    if not tests:
        raise FileNotFoundError(
            f"`data.downstream_root` {str(droot)!r} holds none of {', '.join(folder_sets)}"
        )
    first = next(iter(tests.values()))
    zs = bd.ZeroShotData(
        name=d.name,
        train=train,
        val=None,
        test=first,
        id_test=None,
        ood=None,
        ood_name=None,
        upstream_classes=list(range(num_classes)),
        downstream_classes=[],
        num_train_classes=num_classes,
        image_shape=None,
    )
    return zs, tests


_ROADS = {
    DatasetKind.EMBEDDED: _Road(_embedded_sets, colour=False, three_channels=False, upsize=True),
    DatasetKind.POOL: _Road(_pool_sets, colour=True, three_channels=False, upsize=False),
    DatasetKind.FOLDER: _Road(_folder_sets, colour=True, three_channels=True, upsize=False),
    DatasetKind.UPSTREAM: _Road(_upstream_sets, colour=True, three_channels=True, upsize=False),
}


def method_backbone(cfg: RunConfig, data: RunData) -> tuple[str, dict[str, Any]]:
    """Backbone name and arguments of the estimators trained on ``data``."""
    if data.backbone is not None:
        return data.backbone[0], dict(data.backbone[1])
    return cfg.backbone.name, backbone_kwargs(cfg, data.channels)


def backbone_kwargs(cfg: RunConfig, channels: int | None) -> dict[str, Any]:
    """Constructor arguments of the backbone: the config's, its checkpoint, the channels."""
    kw = dict(cfg.backbone.kwargs)
    if cfg.backbone.checkpoint:
        kw["checkpoint"] = cfg.backbone.checkpoint
    if cfg.backbone.pretrained:
        kw["pretrained"] = True
    if channels is not None:
        kw.setdefault("in_chans", channels)
    return kw


def feature_store(
    cfg: RunConfig, channels: int, kwargs: dict[str, Any], progress: bool = True
) -> FeatureStore:
    """The frozen-feature store (:class:`~bayesurl.features.FeatureStore`) of ``cfg``'s
    frozen backbone (built from ``kwargs`` with its weights) in ``backbone.cache``."""
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


def frozen_data(
    cfg: RunConfig, data: RunData, kwargs: dict[str, Any], progress: bool = True
) -> RunData:
    """``data`` (images) with each set replaced by its cached frozen features
    (:func:`bayesurl.features.cached_features`): ``train`` ``[N, views, F]``, the others
    ``[N, 1, F]``; the batch transform takes row 0 (:class:`~bayesurl.features.FirstView`),
    the augmentation a random cached view (:class:`~bayesurl.features.RandomView`), and the
    estimators' backbone is the identity on ``F`` features. ``kwargs``: the arguments of the
    frozen backbone (its weights)."""
    if data.tests:
        raise ValueError("`backbone.freeze` supports the embedded data sets (one test set)")
    store = feature_store(cfg, data.channels, kwargs, progress)
    sets = copy.copy(data.sets)
    dim = 0
    for name in ("train", "val", "test", "id_test", "ood"):
        ds = getattr(sets, name, None)
        if ds is None or len(ds) == 0:
            continue
        cached = cached_features(store, ds, augmented=name == "train")
        dim = int(cached.tensors[0].shape[-1])
        setattr(sets, name, cached)
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
