"""The embedded default zero-shot data: Fashion-MNIST 0-4 -> 5-9, digits as OOD.

This is the small, offline instance of the URL protocol (Kirchhof et al., 2023, Sec. 3.2) that
``bayesurl benchmark`` and the recipes run on, with LAM's closed-set OOD pairing
(Fashion-MNIST vs MNIST, Warburg et al., 2023, Sec. 4) approximated by scikit-learn digits:

* ``train``: Fashion-MNIST train images of the upstream classes (default 0-4), labels
  relabelled to ``0..K-1`` in the order of ``upstream``;
* ``val``: a seeded, stratified ``val_fraction`` of those images (or, with ``val_classes``, the
  images of those upstream classes, class-disjoint as in URL Sec. 3.2);
* ``test``: Fashion-MNIST t10k images of the downstream classes (default 5-9), original labels
  -- the retrieval set for R@1, R-AUROC, AUSC, ECE;
* ``id_test``: t10k images of the upstream classes -- held-out in-distribution data, the
  negative side of OOD AUROC (docs/concepts/zero_shot.rst), labelled like ``train``;
* ``ood``: the 1,797 digits bilinearly upsampled to 28x28 and scaled to 0-255.

**Fallback.** When Fashion-MNIST is absent (and no ``root`` was given) or ``force_digits=True``,
the same protocol runs on the digits alone (upsampled to ``image_size``): upstream digits are
split 80/20 (seeded, stratified) into ``train``(+``val``) and ``id_test``, ``test`` holds every
downstream digit, and -- as no foreign image set ships offline -- ``ood`` is ``synthetic_ood``:
seeded smooth noise images (uniform noise on a grid a quarter of the side, bilinearly
upsampled and min-max scaled to 0-255 per image), as many as the digits (or ``max_ood``).

**Closed set.** :func:`closed_set` is LAM's closed-set protocol (Warburg et al., 2023,
section 4, Table 2) on the same data: train on every class of the Fashion-MNIST training
images, retrieve within the t10k images of the same classes; ``id_test`` is that retrieval
set (the in-distribution side of OOD AUROC), ``ood`` the upsampled digits (LAM uses MNIST,
which does not ship offline). The digits fallback splits the digits 80/20 into ``train`` and
``test`` and uses ``synthetic_ood``. ``SPLITS`` names both builders.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

import torch
from torch.utils.data import Dataset

from bayesurl._checks import check_int

from .base import ImageTensorDataset, subset, synthetic_ood
from .fmnist import fashion_mnist, find_fashion_mnist
from .registry import DatasetKind, dataset_names, get_dataset
from .sklearn_digits import load_digits_images
from .splits import capped, stratified_split, zero_shot_split

__all__ = [
    "SPLITS",
    "Split",
    "ZeroShotData",
    "ZeroShotOptions",
    "closed_set",
    "default_zero_shot",
    "dml_zero_shot",
    "synthetic_ood",
]


@dataclass
class ZeroShotData:
    """The sets of one zero-shot experiment (URL Sec. 3.2).

    Attributes
    ----------
    name : str
        ``"fashion_mnist"``, ``"digits"``, or a folder data set (``"cub"``, ``"cars"``, ``"sop"``).
    train, val, test : Dataset
        Upstream training data (labels ``0..K-1``), validation data, downstream retrieval data
        (original labels). In-memory :class:`bayesurl.data.base.ImageTensorDataset` for
        Fashion-MNIST / digits. ``val`` may be empty when ``val_fraction=0``.
    id_test, ood : Dataset or None
        Held-out upstream data and foreign data, the two sides of OOD AUROC
        (docs/concepts/zero_shot.rst); always set by :func:`default_zero_shot`, optional for
        :func:`dml_zero_shot`.
    ood_name : str or None
        What ``ood`` holds (``"digits"``, ``"noise"``, a data set name).
    upstream_classes, downstream_classes : list of int
        Original (0-based) class ids of ``train`` and ``test``; ``train`` label ``i`` is
        ``upstream_classes[i]``. Validation classes (``val_classes``) are not listed here but
        in ``info["val_classes"]``.
    num_train_classes : int
        ``len(upstream_classes)``: the classifier width.
    image_shape : tuple of int or None
        ``(C, H, W)`` of the stored images (``None`` for folder data sets).
    info : dict
        Sizes and settings, for logs.
    """

    name: str
    train: Dataset
    val: Dataset
    test: Dataset
    id_test: Dataset | None
    ood: Dataset | None
    ood_name: str | None
    upstream_classes: list[int]
    downstream_classes: list[int]
    num_train_classes: int
    image_shape: tuple[int, int, int] | None
    info: dict[str, Any] = field(default_factory=dict)

    def with_transform(
        self,
        transform: Callable[[Any], Any] | None,
        train_transform: Callable[[Any], Any] | None = None,
    ) -> ZeroShotData:
        """Copy with ``transform`` on every set (``train_transform`` on ``train`` if given)."""
        tt = transform if train_transform is None else train_transform

        def re(ds: Any, t: Any) -> Any:
            return None if ds is None else ds.with_transform(t)

        return replace(
            self,
            train=re(self.train, tt),
            val=re(self.val, transform),
            test=re(self.test, transform),
            id_test=re(self.id_test, transform),
            ood=re(self.ood, transform),
        )

    def summary(self) -> str:
        """One line per set: size and classes."""
        lines = [
            f"ZeroShotData({self.name}; {len(self.upstream_classes)} upstream -> "
            f"{len(self.downstream_classes)} downstream classes; OOD {self.ood_name})"
        ]
        for key in ("train", "val", "test", "id_test", "ood"):
            ds = getattr(self, key)
            if ds is None:
                lines.append(f"  {key:8s} --")
                continue
            cls = ds.targets.unique().tolist()
            shown = cls if len(cls) <= 12 else f"{cls[:5]} ... {cls[-5:]} ({len(cls)})"
            lines.append(f"  {key:8s} n={len(ds):6d} classes={shown}")
        return "\n".join(lines)


def _embedded_name(root: str | os.PathLike[str] | None, force_digits: bool) -> str:
    """``"fashion_mnist"``, or ``"digits"`` when forced or (no ``root`` given) it is absent."""
    if force_digits:
        return "digits"
    try:
        find_fashion_mnist(root)
    except FileNotFoundError as exc:
        if root is not None:
            raise
        warnings.warn(
            f"{exc} Falling back to the scikit-learn digits (see bayesurl.data.zero_shot).",
            stacklevel=3,
        )
        return "digits"
    return "fashion_mnist"


def _named(ds: ImageTensorDataset, name: str) -> ImageTensorDataset:
    ds.name = name
    return ds


@dataclass(frozen=True)
class ZeroShotOptions:
    """How :func:`default_zero_shot` builds the embedded sets; checked once, when built.

    Parameters
    ----------
    upstream, downstream : sequence of int, optional
        Class lists; default ``0-4`` / ``5-9``, or a seeded permutation when ``class_seed`` is
        set (URL Sec. 3.2: disjoint upstream / downstream classes).
    class_seed : int, optional
        Seed of the class permutation when no lists are given.
    val_fraction : float
        Share of the upstream training images held out for validation (seeded, stratified);
        0 gives an empty ``val``.
    val_classes : sequence of int, optional
        Instead: upstream classes whose images form ``val`` (class-disjoint validation as in
        URL Sec. 3.2); they are removed from ``train``.
    max_train : int, optional
        Cap on the upstream training pool (before ``val`` is split off), class-balanced.
    max_test : int, optional
        Cap on ``test`` and on ``id_test`` each.
    max_ood : int, optional
        Cap on ``ood``.
    force_digits : bool
        Use the digits fallback even when Fashion-MNIST is present.
    image_size : int
        Side of the digits images (fallback training data and OOD); 28 matches Fashion-MNIST.
    transform : callable, optional
        Per-item transform of every set (e.g. :func:`bayesurl.data.default_transform`).
    train_transform : callable, optional
        Per-item transform of ``train`` (e.g. ``TwoViews(default_augmentation())``).
    seed : int
        Seed of the validation split, the fallback's held-out split and the subsampling.

    Raises
    ------
    ValueError
        For a cap or ``image_size`` below 1, or (without ``val_classes``) a ``val_fraction``
        outside ``[0, 1)``.
    """

    upstream: Sequence[int] | None = None
    downstream: Sequence[int] | None = None
    class_seed: int | None = None
    val_fraction: float = 0.1
    val_classes: Sequence[int] | None = None
    max_train: int | None = None
    max_test: int | None = None
    max_ood: int | None = None
    force_digits: bool = False
    image_size: int = 28
    transform: Callable[[Any], Any] | None = None
    train_transform: Callable[[Any], Any] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        _check_caps(self.max_train, self.max_test, self.max_ood, self.image_size)
        if self.val_classes is None:
            _check_fraction(self.val_fraction)


_OPTION_FIELDS = frozenset(f.name for f in fields(ZeroShotOptions))


def default_zero_shot(
    root: str | os.PathLike[str] | None = None,
    options: ZeroShotOptions | None = None,
    **settings: Any,
) -> ZeroShotData:
    """Build the embedded default zero-shot data (see :mod:`bayesurl.data.zero_shot`).

    Parameters
    ----------
    root : str or PathLike, optional
        Fashion-MNIST location (see :func:`bayesurl.data.find_fashion_mnist`). When ``None``
        and the default location is empty, the digits fallback is used with a warning; an
        explicit ``root`` without the data raises :class:`FileNotFoundError`.
    options : ZeroShotOptions, optional
        Classes, validation, caps, transforms and seeds (default ``ZeroShotOptions()``).
    **settings
        :class:`ZeroShotOptions` fields replacing those of ``options``.

    Returns
    -------
    ZeroShotData

    Examples
    --------
    >>> from bayesurl.data import TwoViews, as_tensors, default_augmentation, default_transform
    >>> data = default_zero_shot(max_train=2000, max_test=1000,
    ...                          transform=default_transform(),
    ...                          train_transform=TwoViews(default_augmentation()))
    >>> (x1, x2), y = data.train[0]          # two views for InfoNCE / MCInfoNCE
    >>> x_test, y_test = as_tensors(data.test)  # downstream retrieval set, all at once
    """
    opts = _zero_shot_options(options, settings)
    name = _embedded_name(root, opts.force_digits)
    pool_all, eval_all, size = _embedded_files(name, root, opts.image_size)
    up_idx, up_cls, down_idx, down_cls = _zero_shot_classes(pool_all, eval_all, opts)
    pool_idx, id_idx = _held_out(name, pool_all, eval_all, up_idx, (up_cls, down_cls), opts.seed)
    pool = capped(subset(pool_all, pool_idx), opts.max_train, opts.seed)
    if opts.val_classes is not None:
        train, val, up_cls, relabel = _class_disjoint_val(pool, up_cls, opts.val_classes)
        # held-out data of the classes actually trained on
        id_idx = id_idx[torch.isin(eval_all.targets[id_idx], torch.tensor(up_cls))]
    else:
        relabel = {c: i for i, c in enumerate(up_cls)}
        train, val = _stratified_val(pool, opts.val_fraction, opts.seed, relabel)
    ood, ood_name = _embedded_ood(name, len(pool_all), size, opts.max_ood, opts.seed)
    sets = {
        "train": train,
        "val": val,
        "test": capped(subset(eval_all, down_idx), opts.max_test, opts.seed),
        "id_test": capped(subset(eval_all, id_idx, relabel=relabel), opts.max_test, opts.seed),
        "ood": ood,
    }
    sets = _finish(sets, name, ood_name, opts.transform, opts.train_transform)
    return ZeroShotData(
        name=name,
        **sets,
        ood_name=ood_name,
        upstream_classes=list(up_cls),
        downstream_classes=list(down_cls),
        num_train_classes=len(up_cls),
        image_shape=tuple(pool_all.images.shape[1:]),  # type: ignore[arg-type]
        info={
            "val_fraction": None if opts.val_classes is not None else float(opts.val_fraction),
            "val_classes": None
            if opts.val_classes is None
            else sorted(int(c) for c in opts.val_classes),
            "seed": opts.seed,
            "class_seed": opts.class_seed,
            "sizes": {k: len(v) for k, v in sets.items()},
        },
    )


def _zero_shot_options(
    options: ZeroShotOptions | None, settings: dict[str, Any]
) -> ZeroShotOptions:
    """``options`` with ``settings`` replacing its fields (or built from ``settings``)."""
    unknown = sorted(set(settings) - _OPTION_FIELDS)
    if unknown:
        raise TypeError(f"default_zero_shot() got an unexpected keyword argument {unknown[0]!r}")
    if options is None:
        return ZeroShotOptions(**settings)
    if not isinstance(options, ZeroShotOptions):
        raise TypeError(f"`options` must be a ZeroShotOptions, got {type(options).__name__}")
    return replace(options, **settings) if settings else options


def _check_caps(
    max_train: int | None, max_test: int | None, max_ood: int | None, image_size: int
) -> None:
    for arg, value in (("max_train", max_train), ("max_test", max_test), ("max_ood", max_ood)):
        if value is not None:
            check_int(value, arg, low=1)
    check_int(image_size, "image_size", low=1)


def _check_fraction(val_fraction: float) -> None:
    if not 0.0 <= float(val_fraction) < 1.0:
        raise ValueError(f"`val_fraction` must be in [0, 1), got {val_fraction}")


def _embedded_files(
    name: str, root: str | os.PathLike[str] | None, image_size: int
) -> tuple[ImageTensorDataset, ImageTensorDataset, int]:
    """The training pool, the evaluation pool and the image side of the embedded set: the
    two Fashion-MNIST files, or the digits (one pool for both) at ``image_size``."""
    if name == "fashion_mnist":
        pool_all = fashion_mnist(root, "train")
        return pool_all, fashion_mnist(root, "test"), int(pool_all.images.shape[-1])
    images, labels = load_digits_images(int(image_size))
    pool_all = ImageTensorDataset(images, labels, name="digits")
    return pool_all, pool_all, int(image_size)


def _zero_shot_classes(
    pool_all: ImageTensorDataset, eval_all: ImageTensorDataset, opts: ZeroShotOptions
) -> tuple[torch.Tensor, list[int], torch.Tensor, list[int]]:
    """The upstream rows of the training pool and the upstream classes, the downstream rows
    of the evaluation pool and the downstream classes (the given lists, else ``0-4`` /
    ``5-9``, else a permutation seeded by ``class_seed``)."""
    upstream, downstream = opts.upstream, opts.downstream
    if upstream is None and downstream is None and opts.class_seed is None:
        upstream, downstream = list(range(5)), list(range(5, 10))
    up_idx, _ = zero_shot_split(pool_all, upstream, downstream, seed=opts.class_seed)
    up_cls = sorted(set(pool_all.targets[up_idx].tolist()))
    if upstream is not None:
        up_cls = [int(c) for c in upstream]
    _, down_idx = zero_shot_split(eval_all, up_cls, downstream)
    down_cls = sorted(set(eval_all.targets[down_idx].tolist()))
    if downstream is not None:
        down_cls = [int(c) for c in downstream]
    return up_idx, up_cls, down_idx, down_cls


def _held_out(
    name: str,
    pool_all: ImageTensorDataset,
    eval_all: ImageTensorDataset,
    up_idx: torch.Tensor,
    classes: tuple[list[int], list[int]],
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of the upstream training pool and of the held-out upstream images: the t10k
    file's upstream images for Fashion-MNIST, a seeded stratified 20 % of the digits."""
    if name == "fashion_mnist":
        id_idx, _ = zero_shot_split(eval_all, *classes)
        return up_idx, id_idx
    keep, held = stratified_split(pool_all.targets[up_idx], 0.2, seed=seed)
    return up_idx[keep], up_idx[held]


def _class_disjoint_val(
    pool: ImageTensorDataset, up_cls: list[int], val_classes: Sequence[int]
) -> tuple[Any, Any, list[int], dict[int, int]]:
    """``train`` without the ``val_classes``, ``val`` their images (URL Sec. 3.2), the classes
    trained on and their relabelling."""
    vcls = [int(c) for c in val_classes]
    bad = sorted(set(vcls) - set(up_cls))
    if bad:
        raise ValueError(f"`val_classes` {bad} are not upstream classes {up_cls}")
    if len(set(vcls)) >= len(up_cls):
        raise ValueError("`val_classes` must leave at least one upstream class for training")
    fit_cls = [c for c in up_cls if c not in set(vcls)]
    fit_idx, val_idx = zero_shot_split(pool, fit_cls, vcls)
    relabel = {c: i for i, c in enumerate(fit_cls)}
    val_map = {c: i for i, c in enumerate(sorted(vcls))}
    train = subset(pool, fit_idx, relabel=relabel)
    return train, subset(pool, val_idx, relabel=val_map), fit_cls, relabel


def _stratified_val(
    pool: ImageTensorDataset,
    val_fraction: float,
    seed: int,
    relabel: dict[int, int] | bool = False,
) -> tuple[Any, Any]:
    """``train`` and a seeded, stratified ``val_fraction`` of it as ``val``."""
    _check_fraction(val_fraction)
    if val_fraction > 0:
        fit_idx, val_idx = stratified_split(pool, val_fraction, seed=seed)
    else:
        fit_idx, val_idx = torch.arange(len(pool)), torch.empty(0, dtype=torch.int64)
    return subset(pool, fit_idx, relabel=relabel), subset(pool, val_idx, relabel=relabel)


def _embedded_ood(
    name: str, n_pool: int, size: int, max_ood: int | None, seed: int
) -> tuple[ImageTensorDataset, str]:
    """The OOD set of the embedded zero-shot data: the digits for Fashion-MNIST, seeded noise
    images for the digits."""
    if name == "fashion_mnist":
        d_img, d_lbl = load_digits_images(size)
        ood, ood_name = ImageTensorDataset(d_img, d_lbl, name="digits"), "digits"
    else:
        n_ood = n_pool if max_ood is None else min(n_pool, int(max_ood))
        ood, ood_name = synthetic_ood(n_ood, size, seed=seed), "noise"
    return capped(ood, max_ood, seed), ood_name


def _finish(
    sets: dict[str, Any],
    name: str,
    ood_name: str,
    transform: Callable[[Any], Any] | None,
    train_transform: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Name every set (``<name>/<key>``, ``<ood_name>/ood``) and give it its transform."""
    out = {}
    for key, ds in sets.items():
        ds = _named(ds, f"{name}/{key}" if key != "ood" else f"{ood_name}/ood")
        t = train_transform if key == "train" and train_transform is not None else transform
        out[key] = ds.with_transform(t)
    return out


def closed_set(
    root: str | os.PathLike[str] | None = None,
    *,
    val_fraction: float = 0.0,
    max_train: int | None = None,
    max_test: int | None = None,
    max_ood: int | None = None,
    force_digits: bool = False,
    image_size: int = 28,
    transform: Callable[[Any], Any] | None = None,
    seed: int = 0,
) -> ZeroShotData:
    """LAM's closed-set data: train and retrieve on the same classes (see module docs).

    Warburg et al. (2023), section 4, "Closed-Set Retrieval" and Table 2: every class of the
    training images is trained on, the test images of the same classes are the retrieval set
    (every image a query) and the in-distribution side of OOD AUROC, against a foreign OOD set.

    Parameters
    ----------
    root
        As for :func:`default_zero_shot`.
    max_train, max_ood, force_digits, image_size, transform, seed
        As in :class:`ZeroShotOptions` (``max_train`` caps ``train`` before ``val`` is split
        off, class-balanced).
    val_fraction : float
        Share of the training images held out as ``val`` (seeded, stratified; 0: empty).
    max_test : int, optional
        Cap on ``test`` (which is also ``id_test``).

    Returns
    -------
    ZeroShotData
        ``upstream_classes == downstream_classes``; ``id_test`` is ``test``; labels are the
        original class ids (``0..K-1`` for Fashion-MNIST and the digits).

    Raises
    ------
    ValueError
        For a non-positive cap or image size, or ``val_fraction`` outside ``[0, 1)``.
    """
    _check_caps(max_train, max_test, max_ood, image_size)
    _check_fraction(val_fraction)
    name = _embedded_name(root, force_digits)
    train_all, test_all, size = _embedded_files(name, root, image_size)
    ood, ood_name = _embedded_ood(name, len(train_all), size, None, seed)
    if name != "fashion_mnist":  # one pool of digits: a seeded stratified 20 % is retrieved
        keep, held = stratified_split(train_all, 0.2, seed=seed)
        train_all, test_all = subset(train_all, keep), subset(train_all, held)
    train, val = _stratified_val(capped(train_all, max_train, seed), val_fraction, seed)
    sets: dict[str, Any] = {
        "train": train,
        "val": val,
        "test": capped(test_all, max_test, seed),
        "ood": capped(ood, max_ood, seed),
    }
    sets = _finish(sets, name, ood_name, transform)
    classes = sorted(int(c) for c in sets["train"].targets.unique())
    return ZeroShotData(
        name=name,
        **sets,
        id_test=sets["test"],
        ood_name=ood_name,
        upstream_classes=classes,
        downstream_classes=classes,
        num_train_classes=len(classes),
        image_shape=tuple(train_all.images.shape[1:]),  # type: ignore[attr-defined]
        info={
            "split": Split.CLOSED.value,
            "val_fraction": float(val_fraction),
            "seed": seed,
            "sizes": {k: len(v) for k, v in sets.items()},
        },
    )


class Split(str, Enum):
    """How the embedded data divide their classes between training and retrieval."""

    #: URL section 3.2: upstream classes for training, disjoint downstream classes retrieved
    ZERO_SHOT = "zero_shot"
    #: LAM section 4 / Table 2: the same classes trained on and retrieved
    CLOSED = "closed"


#: The builder of each :class:`Split` of the embedded data (same keyword arguments).
SPLITS: dict[Split, Callable[..., ZeroShotData]] = {
    Split.ZERO_SHOT: default_zero_shot,
    Split.CLOSED: closed_set,
}


def dml_zero_shot(
    name: str,
    root: str | os.PathLike[str],
    *,
    tune: bool = False,
    val_seed: int | None = None,
    transform: Callable[[Any], Any] | None = None,
    train_transform: Callable[[Any], Any] | None = None,
    ood: str | None = None,
    ood_root: str | os.PathLike[str] | None = None,
    check_files: bool = True,
) -> ZeroShotData:
    """Zero-shot data of CUB-200-2011, CARS196 or SOP with the standard class splits.

    URL Sec. 3.2: train on the train classes, report on the disjoint test classes; tune
    hyper-parameters by training on one half of the train classes and validating on the
    other (``tune=True``: ``train`` = ``"train_noval"``, ``val`` = ``"val"``). For the final
    run (``tune=False``) ``train`` holds all train classes and ``val`` the validation half
    of them (seen in training; for monitoring only). See :mod:`bayesurl.data.dml`.

    Parameters
    ----------
    name : str
        A folder data set (``"cub"``, ``"cars"``, ``"sop"`` or a registered one of kind
        ``"folder"``: its loader takes the splits and keywords of :mod:`bayesurl.data.dml`).
    root : str or PathLike
        Where it lies (see :mod:`bayesurl.data.dml` for the layouts).
    tune : bool
        Hyper-parameter tuning split (class-disjoint ``train`` / ``val``).
    val_seed : int, optional
        Seed of the validation halving (default: upper half by class id).
    transform, train_transform : callable, optional
        Per-item transforms of the PIL images (``train_transform`` for ``train``).
    ood : str, optional
        Name of a data set whose test split is the OOD set, e.g. ``"cars"`` for LAM's CUB (ID)
        vs CARS (OOD) open-set protocol (Warburg et al., 2023, Sec. 4).
    ood_root : str or PathLike, optional
        Its root.
    check_files : bool
        Verify that every listed image exists.

    Returns
    -------
    ZeroShotData
        ``train`` / ``val`` relabelled to ``0..K-1``; ``test`` with the original 0-based class
        ids; ``id_test`` is ``None`` (all train-class images are training data).
    """
    key = str(name).lower()
    folder_sets = dataset_names(DatasetKind.FOLDER)
    if key not in folder_sets:
        raise ValueError(f"`name` must be one of {sorted(folder_sets)}, got {name!r}")
    kw = {"val_seed": val_seed, "check_files": check_files}
    train_split = "train_noval" if tune else "train"
    sets = {
        "train": get_dataset(key, root, train_split, train_transform, relabel=True, **kw),
        "val": get_dataset(key, root, "val", transform, relabel=True, **kw),
        "test": get_dataset(key, root, "test", transform, **kw),
        "ood": None if ood is None else get_dataset(ood, ood_root, "test", transform),
    }
    train_cls = list(sets["train"].split_classes)  # type: ignore[attr-defined]
    return ZeroShotData(
        name=key,
        **sets,
        id_test=None,
        ood_name=ood,
        upstream_classes=train_cls,
        downstream_classes=list(sets["test"].split_classes),  # type: ignore[attr-defined]
        num_train_classes=len(train_cls),
        image_shape=None,
        info={
            "tune": tune,
            "val_seed": val_seed,
            "sizes": {k: None if v is None else len(v) for k, v in sets.items()},
        },
    )
