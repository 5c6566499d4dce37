"""Dataset containers shared by every loader of :mod:`bayesurl.data`.

Two kinds of data sets appear in the zero-shot protocol (URL, Sec. 3.2): small image sets held in
memory as one ``uint8`` tensor (Fashion-MNIST, digits) and large folder data sets whose images
are decoded lazily with PIL (CUB-200-2011, CARS196, Stanford Online Products). Both expose
``targets`` (an ``int64`` tensor) and ``classes`` so that the class-split helpers in
:mod:`bayesurl.data.splits` work on either.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from .._checks import check_ndim, check_same_length

__all__ = [
    "ImageTensorDataset",
    "ImageFileDataset",
    "LabeledSubset",
    "as_tensors",
    "subset",
    "get_targets",
    "synthetic_ood",
]

Transform = Callable[[Any], Any]


class ImageTensorDataset(Dataset):
    """Images held in memory as one ``uint8`` tensor ``[N, C, H, W]`` with integer labels.

    Item ``i`` is ``(transform(images[i]), targets[i])``. Without a transform the image is
    returned as ``float32`` in ``[0, 1]`` so that the default collate works. Transforms from
    :mod:`bayesurl.data.transforms` accept a single image ``[C, H, W]`` as well as a batch
    ``[N, C, H, W]``, so the whole set can also be transformed at once
    (``transform(ds.images)``) for fast in-memory training.

    Parameters
    ----------
    images : Tensor
        ``[N, H, W]`` or ``[N, C, H, W]`` ``uint8`` images (0-255).
    targets : Tensor
        ``[N]`` integer labels.
    transform : callable, optional
        Applied to one ``uint8`` image ``[C, H, W]``.
    classes : sequence of str, optional
        Class names indexed by label value.
    name : str
        Name shown in ``repr``.
    """

    def __init__(
        self,
        images: Tensor,
        targets: Tensor,
        transform: Transform | None = None,
        classes: Sequence[str] | None = None,
        name: str = "images",
    ) -> None:
        if not isinstance(images, Tensor):
            raise TypeError(f"`images` must be a tensor, got {type(images).__name__}")
        check_ndim(images, "images", (3, 4))
        if images.dtype != torch.uint8:
            raise ValueError(f"`images` must be uint8 (0-255), got {images.dtype}")
        targets = torch.as_tensor(targets)
        check_ndim(targets, "targets", 1)
        if targets.is_floating_point() or targets.is_complex():
            raise ValueError(f"`targets` must hold integer labels, got {targets.dtype}")
        check_same_length(("images", images), ("targets", targets))
        self.images = images.unsqueeze(1) if images.ndim == 3 else images
        self.targets = targets.to(torch.int64)
        self.transform = transform
        self.classes = list(classes) if classes is not None else None
        self.name = name

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = self.images[index]
        img = self.transform(img) if self.transform is not None else img.float().div_(255.0)
        return img, int(self.targets[index])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one stored image."""
        return tuple(self.images.shape[1:])  # type: ignore[return-value]

    def with_transform(self, transform: Transform | None) -> ImageTensorDataset:
        """Same images and labels (shared memory) with another transform."""
        return ImageTensorDataset(self.images, self.targets, transform, self.classes, self.name)

    def __repr__(self) -> str:
        n_cls = int(self.targets.unique().numel()) if len(self) else 0
        return (
            f"ImageTensorDataset(name={self.name!r}, n={len(self)}, "
            f"image_shape={self.image_shape}, n_classes={n_cls})"
        )


class ImageFileDataset(Dataset):
    """Images on disk, decoded lazily with PIL (converted to RGB), with integer labels.

    Item ``i`` is ``(transform(PIL image), targets[i])``; without a transform the PIL image is
    returned (as torchvision's folder data sets do).

    Parameters
    ----------
    paths : sequence of str
        Absolute image paths.
    targets : Tensor or sequence of int
        ``[N]`` integer labels.
    transform : callable, optional
        Applied to the ``PIL.Image`` (e.g. a torchvision transform).
    classes : sequence of str, optional
        Class names indexed by label value.
    name : str
        Name shown in ``repr``.
    """

    def __init__(
        self,
        paths: Sequence[str],
        targets: Tensor | Sequence[int],
        transform: Transform | None = None,
        classes: Sequence[str] | None = None,
        name: str = "images",
    ) -> None:
        targets = torch.as_tensor(targets, dtype=torch.int64)
        check_ndim(targets, "targets", 1)
        if len(paths) != targets.shape[0]:
            raise ValueError(
                f"length mismatch: `paths` has {len(paths)}, `targets` has {targets.shape[0]}"
            )
        self.paths = [os.fspath(p) for p in paths]
        self.targets = targets
        self.transform = transform
        self.classes = list(classes) if classes is not None else None
        self.name = name

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        with Image.open(self.paths[index]) as im:
            img = im.convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[index])

    def with_transform(self, transform: Transform | None) -> ImageFileDataset:
        """Shallow copy (same paths and labels) with another transform."""
        out = copy.copy(self)
        out.transform = transform
        return out

    def __repr__(self) -> str:
        n_cls = int(self.targets.unique().numel()) if len(self) else 0
        return f"{type(self).__name__}(name={self.name!r}, n={len(self)}, n_classes={n_cls})"


def get_targets(data: Any, name: str = "labels_or_dataset") -> Tensor:
    """Integer labels of a data set (its ``targets``) or of a label array.

    Parameters
    ----------
    data : Dataset, Tensor, array or sequence
        A data set with a ``targets`` attribute (every set of :mod:`bayesurl.data`,
        torchvision's MNIST-style sets) or the labels themselves.
    name : str
        Argument name used in error messages.

    Returns
    -------
    Tensor
        ``[N]`` ``int64`` labels on the CPU (index bookkeeping only).
    """
    raw = getattr(data, "targets", data)
    if isinstance(raw, Dataset):
        raise ValueError(f"`{name}` is a dataset without a `targets` attribute")
    t = torch.as_tensor(raw)
    check_ndim(t, name, 1)
    if t.is_floating_point():
        if bool(torch.isnan(t).any()):
            raise ValueError(f"`{name}` contains NaN labels")
        if bool((t != t.round()).any()):
            raise ValueError(f"`{name}` must hold integer labels, got non-integer floats")
    elif t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold integer labels, got {t.dtype}")
    return t.to(device="cpu", dtype=torch.int64)


def _apply_label_map(targets: Tensor, label_map: dict[int, int]) -> Tensor:
    """Vectorised ``label_map[t]`` for every ``t`` (every label must be a key)."""
    keys = torch.tensor(sorted(label_map), dtype=torch.int64)
    values = torch.tensor([label_map[int(k)] for k in keys], dtype=torch.int64)
    pos = torch.searchsorted(keys, targets).clamp_(max=max(len(keys) - 1, 0))
    return values[pos]


class LabeledSubset(Dataset):
    """A view of ``dataset`` at ``indices`` that keeps (and optionally remaps) the labels.

    Unlike :class:`torch.utils.data.Subset` it exposes ``targets`` for the subset, so splits,
    samplers and evaluators can read the labels without loading images.

    Parameters
    ----------
    dataset : Dataset
        Base data set returning ``(x, label)``.
    indices : Tensor or sequence of int
        Positions in ``dataset``.
    label_map : dict of int to int, optional
        Maps base labels to new ones (e.g. contiguous ``0..K-1`` for a classifier); every label
        of the subset must be a key.
    """

    def __init__(
        self,
        dataset: Dataset,
        indices: Tensor | Sequence[int],
        label_map: dict[int, int] | None = None,
    ) -> None:
        idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        n = len(dataset)  # type: ignore[arg-type]
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(f"`indices` out of range for a dataset of length {n}")
        self.dataset = dataset
        self.indices = idx
        base_targets = getattr(dataset, "targets", None)
        targets = None if base_targets is None else torch.as_tensor(base_targets)[idx]
        if label_map is not None and targets is not None:
            missing = sorted(set(targets.unique().tolist()) - set(label_map))
            if missing:
                raise ValueError(f"`label_map` has no entry for labels {missing[:10]}")
            targets = _apply_label_map(targets.to(torch.int64), label_map)
        self.label_map = dict(label_map) if label_map is not None else None
        self.targets = targets
        self.classes = getattr(dataset, "classes", None) if label_map is None else None
        self.transform = getattr(dataset, "transform", None)

    def __len__(self) -> int:
        return int(self.indices.numel())

    def __getitem__(self, index: int) -> tuple[Any, int]:
        x, y = self.dataset[int(self.indices[index])]
        if self.label_map is not None:
            y = self.label_map[int(y)]
        return x, y

    def with_transform(self, transform: Transform | None) -> LabeledSubset:
        """The same view of the base data set with another transform.

        Needs a base data set with ``with_transform`` (every set of :mod:`bayesurl.data`).
        """
        base = getattr(self.dataset, "with_transform", None)
        if base is None:
            raise ValueError(
                f"the base `dataset` {type(self.dataset).__name__} has no with_transform"
            )
        return LabeledSubset(base(transform), self.indices, self.label_map)

    def __repr__(self) -> str:
        return f"LabeledSubset(n={len(self)}, of={self.dataset!r})"


def subset(
    dataset: Dataset,
    indices: Tensor | Sequence[int],
    *,
    relabel: bool | dict[int, int] = False,
) -> Dataset:
    """Restrict a data set to ``indices``, keeping its labels.

    In-memory sets (:class:`ImageTensorDataset`) are indexed directly and stay in-memory sets
    (so ``.images`` remains available for batched training); other sets become a
    :class:`LabeledSubset` view.

    Parameters
    ----------
    dataset : Dataset
        Data set with ``targets``.
    indices : Tensor or sequence of int
        Positions to keep, e.g. from :func:`bayesurl.data.zero_shot_split`.
    relabel : bool or dict
        ``True`` maps the subset's classes, in increasing order, to ``0..K-1`` (what a
        classifier head over the upstream classes needs, URL Sec. 3.2); a dict gives the map.

    Returns
    -------
    Dataset
        The restricted data set.
    """
    idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
    label_map: dict[int, int] | None
    if relabel is True:
        classes = torch.as_tensor(dataset.targets)[idx].unique().tolist()  # type: ignore[attr-defined]
        label_map = {int(c): i for i, c in enumerate(classes)}
    elif isinstance(relabel, dict):
        label_map = {int(k): int(v) for k, v in relabel.items()}
    else:
        label_map = None
    if isinstance(dataset, ImageTensorDataset):
        n = len(dataset)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(f"`indices` out of range for a dataset of length {n}")
        targets = dataset.targets[idx]
        classes = dataset.classes
        if label_map is not None:
            missing = sorted(set(targets.unique().tolist()) - set(label_map))
            if missing:
                raise ValueError(f"`relabel` has no entry for labels {missing[:10]}")
            contiguous = sorted(label_map.values()) == list(range(len(label_map)))
            if classes is not None and contiguous and all(0 <= k < len(classes) for k in label_map):
                order = sorted(label_map.items(), key=lambda kv: kv[1])
                classes = [classes[k] for k, _ in order]
            else:
                classes = None
            targets = _apply_label_map(targets, label_map)
        return ImageTensorDataset(
            dataset.images[idx], targets, dataset.transform, classes, dataset.name
        )
    return LabeledSubset(dataset, idx, label_map)


def as_tensors(
    dataset: Dataset,
    transform: Transform | None = None,
    *,
    batch_size: int = 4096,
) -> tuple[Tensor, Tensor]:
    """Materialise a whole data set as ``(x [N, ...], y [N])`` tensors.

    For an :class:`ImageTensorDataset` the transform is applied to batches of
    ``batch_size`` stored images at once (the transforms of :mod:`bayesurl.data.transforms`
    are batch-aware), which is far faster than item by item; other data sets are read item
    by item and stacked. Handy for small in-memory experiments and for embedding an
    evaluation set (URL Sec. 3.2: every downstream image is a query).

    Parameters
    ----------
    dataset : Dataset
        Returns ``(x, label)`` items with tensor ``x``.
    transform : callable, optional
        Overrides the data set's own transform; without either, in-memory images become
        ``float32`` in ``[0, 1]``.
    batch_size : int
        Images transformed per call for in-memory sets.

    Returns
    -------
    x, y : Tensor
        Stacked inputs and ``int64`` labels.
    """
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError("`dataset` is empty")
    if isinstance(dataset, ImageTensorDataset):
        t = transform if transform is not None else dataset.transform
        if t is None:
            return dataset.images.float().div_(255.0), dataset.targets.clone()
        parts = [t(dataset.images[i : i + batch_size]) for i in range(0, len(dataset), batch_size)]
        return torch.cat(parts), dataset.targets.clone()
    xs, ys = [], []
    for i in range(len(dataset)):  # type: ignore[arg-type]
        x, y = dataset[i]
        xs.append(transform(x) if transform is not None else x)
        ys.append(int(y))
    return torch.stack(xs), torch.tensor(ys, dtype=torch.int64)


def synthetic_ood(n: int, size: int = 28, *, seed: int = 0) -> ImageTensorDataset:
    """Seeded smooth-noise images, the offline OOD set of data sets with no foreign set.

    Uniform noise on a grid a quarter of the side, bilinearly upsampled and min-max scaled
    to 0-255 per image (:mod:`bayesurl.data.zero_shot`).

    Parameters
    ----------
    n : int
        Number of images.
    size : int
        Image side.
    seed : int
        Seed of the noise.

    Returns
    -------
    ImageTensorDataset
        ``uint8`` ``[n, 1, size, size]`` with label ``-1``.
    """
    if n < 1 or size < 1:
        raise ValueError(f"`n` and `size` must be positive, got n={n}, size={size}")
    gen = torch.Generator().manual_seed(int(seed))
    coarse = max(2, (int(size) + 3) // 4)
    x = torch.rand(n, 1, coarse, coarse, generator=gen)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    lo = x.amin(dim=(1, 2, 3), keepdim=True)
    hi = x.amax(dim=(1, 2, 3), keepdim=True)
    x = (x - lo) / (hi - lo).clamp_min(1e-12) * 255.0
    return ImageTensorDataset(
        x.round().to(torch.uint8), torch.full((n,), -1, dtype=torch.int64), name="noise"
    )
