"""Data sets by name: ``get_dataset("cub", root, split="test")``.

A registry instead of if-chains (ARCHITECTURE.md); the names are the data sets of the URL
benchmark (Kirchhof et al., 2023, Sec. 3.2) plus the embedded Fashion-MNIST / digits pair.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from .dml import CUB200, Cars196, StanfordOnlineProducts
from .fmnist import fashion_mnist
from .sklearn_digits import digits

__all__ = ["available_datasets", "get_dataset"]


def _needs_root(cls: type) -> Callable[..., Dataset]:
    def build(root: str | os.PathLike[str] | None, split: str, transform: Any, **kw: Any):
        if root is None:
            raise FileNotFoundError(
                f"{cls.__name__} needs `root`: the folder holding the extracted data set. "
                + cls.HOW_TO_GET
            )
        return cls(root, split, transform, **kw)

    return build


_REGISTRY: dict[str, Callable[..., Dataset]] = {
    "fashion_mnist": fashion_mnist,
    "digits": digits,
    "cub": _needs_root(CUB200),
    "cars": _needs_root(Cars196),
    "sop": _needs_root(StanfordOnlineProducts),
}


def available_datasets() -> list[str]:
    """Names accepted by :func:`get_dataset`, sorted."""
    return sorted(_REGISTRY)


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
    name : {"fashion_mnist", "digits", "cub", "cars", "sop"}
        Which data set.
    root : str or PathLike, optional
        Where it lies. Fashion-MNIST defaults to ``/usr/share/datasets/fashion-mnist``; digits
        are bundled with scikit-learn; CUB / CARS / SOP need it.
    split : str
        ``"train"``/``"test"`` for Fashion-MNIST; ``"all"``/``"train"``/``"test"`` for digits;
        ``"train"``/``"val"``/``"train_noval"``/``"test"``/``"all"`` for the class splits of
        CUB / CARS / SOP (URL Sec. 3.2; see :mod:`bayesurl.data.dml`).
    transform : callable, optional
        Per-item transform.
    **kwargs
        Passed to the loader (e.g. ``size=28`` for digits, ``val_seed`` / ``relabel`` for the
        folder data sets).

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
    if key not in _REGISTRY:
        raise ValueError(f"unknown dataset `name` {name!r}; valid names: {available_datasets()}")
    return _REGISTRY[key](root, split, transform, **kwargs)
