"""Data sets by name: ``get_dataset("cub", root, split="test")``, and how each is used.

The one list of data set names (a registry instead of if-chains): the data
sets of the URL benchmark (Kirchhof et al., 2023, Sec. 3.2), the embedded Fashion-MNIST /
digits pair and ImageNet as an upstream-only set. The CLI (``bayesurl train`` / ``wrap`` /
``evaluate``), the run pipeline (:func:`bayesurl.runs.data.build_data`) and the checkpoint
loader read their names and kinds here:

* ``DatasetKind.EMBEDDED``: 28 x 28 grayscale sets held in memory, with the zero-shot
  split of :func:`bayesurl.data.default_zero_shot`; ``"default"`` is Fashion-MNIST with the
  digits standing in when it is absent;
* ``DatasetKind.FOLDER``: CUB / CARS / SOP read from a folder with their standard zero-shot
  class splits (:func:`bayesurl.data.dml_zero_shot`);
* ``DatasetKind.UPSTREAM``: an ImageFolder ``root/train`` trained on, evaluated zero-shot
  on the test classes of the folder sets (URL section 3.2 / appendix B);
* ``DatasetKind.POOL``: many-class image sets held in memory and used through the
  class-split protocol only (:func:`bayesurl.data.class_splits.split_data`): ``"clipart"``,
  the Open Clip Art drawings (:mod:`bayesurl.data.clipart`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from .clipart import clipart
from .dml import CUB200, Cars196, StanfordOnlineProducts
from .fmnist import fashion_mnist
from .sklearn_digits import digits

__all__ = [
    "DATASETS",
    "DatasetKind",
    "DatasetSpec",
    "available_datasets",
    "dataset_kind",
    "dataset_names",
    "get_dataset",
]


class DatasetKind(str, Enum):
    """How a data set is stored and split (see the module docs)."""

    EMBEDDED = "embedded"
    FOLDER = "folder"
    UPSTREAM = "upstream"
    POOL = "pool"


def _needs_root(cls: type) -> Callable[..., Dataset]:
    def build(root: str | os.PathLike[str] | None, split: str, transform: Any, **kw: Any):
        if root is None:
            raise FileNotFoundError(
                f"{cls.__name__} needs `root`: the folder holding the extracted data set. "
                + cls.HOW_TO_GET
            )
        return cls(root, split, transform, **kw)

    return build


def _image_folder(root: str | os.PathLike[str] | None, split: str, transform: Any, **kw: Any):
    from torchvision.datasets import ImageFolder

    if root is None:
        raise FileNotFoundError("an upstream ImageFolder needs `root` (holding train/<class>/*)")
    folder = Path(root) / split
    if not folder.is_dir():
        raise FileNotFoundError(f"`root` has no folder {str(folder)!r}")
    return ImageFolder(str(folder), transform=transform, **kw)


@dataclass(frozen=True)
class DatasetSpec:
    """One registered data set: its kind and its loader (``None``: an alias without one)."""

    kind: DatasetKind
    loader: Callable[..., Dataset] | None


#: Every data set by name, in the order the CLI lists them.
DATASETS: dict[str, DatasetSpec] = {
    "default": DatasetSpec(DatasetKind.EMBEDDED, None),
    "fashion_mnist": DatasetSpec(DatasetKind.EMBEDDED, fashion_mnist),
    "digits": DatasetSpec(DatasetKind.EMBEDDED, digits),
    "cub": DatasetSpec(DatasetKind.FOLDER, _needs_root(CUB200)),
    "cars": DatasetSpec(DatasetKind.FOLDER, _needs_root(Cars196)),
    "sop": DatasetSpec(DatasetKind.FOLDER, _needs_root(StanfordOnlineProducts)),
    "imagenet": DatasetSpec(DatasetKind.UPSTREAM, _image_folder),
    "clipart": DatasetSpec(DatasetKind.POOL, clipart),
}


def dataset_names(*kinds: DatasetKind | str) -> tuple[str, ...]:
    """Registered names of the given kinds (all of them without ``kinds``), in table order."""
    want = {DatasetKind(k) for k in kinds}
    return tuple(n for n, spec in DATASETS.items() if not want or spec.kind in want)


def dataset_kind(
    name: str, *, argument: str = "name", allowed: tuple[str, ...] | None = None
) -> tuple[str, DatasetKind]:
    """The normalised name (lower case, ``-`` -> ``_``) and kind of a data set.

    Parameters
    ----------
    name : str
        A data set name.
    argument : str
        The argument named in the error (``"--dataset"``, ``"data.name"``).
    allowed : tuple of str, optional
        The names this caller accepts (default: every registered one).

    Raises
    ------
    ValueError
        For a name outside ``allowed``, listing the valid ones.
    """
    key = str(name).lower().replace("-", "_")
    valid = allowed if allowed is not None else tuple(DATASETS)
    if key not in valid:
        raise ValueError(f"unknown `{argument}` {name!r}; valid names: {', '.join(valid)}")
    return key, DATASETS[key].kind


def available_datasets() -> list[str]:
    """Names accepted by :func:`get_dataset`, sorted."""
    return sorted(n for n, spec in DATASETS.items() if spec.loader is not None)


def get_dataset(
    name: str,
    root: str | os.PathLike[str] | None = None,
    split: str = "train",
    transform: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> Dataset:
    """Load a data set by name.

    Parameters
    ----------
    name : {"fashion_mnist", "digits", "cub", "cars", "sop", "imagenet", "clipart"}
        Which data set.
    root : str or PathLike, optional
        Where it lies. Fashion-MNIST defaults to ``/usr/share/datasets/fashion-mnist``, clipart
        to ``/usr/share/openclipart/png``; digits are bundled with scikit-learn; CUB / CARS /
        SOP need it.
    split : str
        ``"train"``/``"test"`` for Fashion-MNIST; ``"all"``/``"train"``/``"test"`` for digits
        and clipart;
        ``"train"``/``"val"``/``"train_noval"``/``"test"``/``"all"`` for the class splits of
        CUB / CARS / SOP (URL Sec. 3.2; see :mod:`bayesurl.data.dml`); the sub-folder of
        ``root`` for ``"imagenet"``.
    transform : callable, optional
        Per-item transform.
    **kwargs
        Passed to the loader (e.g. ``size=28`` for digits or ``size=128`` for clipart,
        ``val_seed`` / ``relabel`` for the folder data sets).

    Returns
    -------
    Dataset
        With ``targets`` and ``classes``.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the valid ones) or split.
    FileNotFoundError
        When the data are missing; the message names the path and how to get the data.
    """
    key = str(name).lower().replace("-", "_")
    if key not in available_datasets():
        raise ValueError(f"unknown dataset `name` {name!r}; valid names: {available_datasets()}")
    loader = DATASETS[key].loader
    assert loader is not None
    return loader(root, split, transform, **kwargs)
