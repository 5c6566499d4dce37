"""Data sets by name: ``get_dataset("cub", root, split="test")``, and how each is used.

The one table of data set names is :data:`DATASETS`, a :class:`bayesurl.registry.Registry`
filled by the data sets themselves: each module of ``bayesurl/data/`` that holds a data set
registers it with :func:`register_dataset` and declares what the rest of the library asks of
it, so no other module keeps a list of names or a branch per name (the registry imports every
module of the folder before its first lookup). The CLI (``bayesurl train``
/ ``wrap`` / ``evaluate``), the run pipeline (:func:`bayesurl.runs.data.build_data`), the
class-split protocol (:func:`bayesurl.data.class_splits.split_data`), the report and the
checkpoint loader read the declarations here. The kinds:

* ``DatasetKind.EMBEDDED``: small grayscale sets held in memory; the Fashion-MNIST / digits
  pair runs the zero-shot split of :func:`bayesurl.data.default_zero_shot` (``"default"`` is
  Fashion-MNIST with the digits standing in when it is absent);
* ``DatasetKind.FOLDER``: CUB / CARS / SOP read from a folder with their standard zero-shot
  class splits (:func:`bayesurl.data.dml_zero_shot`);
* ``DatasetKind.UPSTREAM``: an ImageFolder ``root/train`` trained on, evaluated zero-shot
  on the test classes of the folder sets (URL, Kirchhof et al., 2023, section 3.2 /
  appendix B);
* ``DatasetKind.POOL``: many-class RGB image sets held in memory and used through the
  class-split protocol only: ``"clipart"``, the Open Clip Art drawings.

The traits a data set declares (all but ``kind`` optional):

``kind``
    Its :class:`DatasetKind`.
``classes``
    Its class names in label order, or a function of no arguments giving them.
``ood``
    The name of the set its runs score as out-of-distribution (``None``: none).
``pool``
    ``pool(root, seed, image_size) -> (images, held, ood, ood_name)``: every image of the set
    as one :class:`~bayesurl.data.base.ImageTensorDataset`, a boolean ``held`` flag per image
    (held out of training: an official test file or a seeded share), the OOD set and its
    name. A set with a pool can be split by class (:mod:`bayesurl.data.class_splits`).
``split_options``
    Keyword arguments of the embedded split builders
    (:data:`bayesurl.data.zero_shot.SPLITS`) that run this set; an embedded set without them
    runs its pool's first class split.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from torch.utils.data import Dataset

from bayesurl.registry import Registry

__all__ = [
    "DATASETS",
    "DatasetKind",
    "available_datasets",
    "dataset_classes",
    "dataset_kind",
    "dataset_names",
    "get_dataset",
    "pool_datasets",
    "register_dataset",
]


class DatasetKind(str, Enum):
    """How a data set is stored and split (see the module docs)."""

    EMBEDDED = "embedded"
    FOLDER = "folder"
    UPSTREAM = "upstream"
    POOL = "pool"


def _load() -> None:
    """Import every module of ``bayesurl/data``: the shipped data sets register themselves."""
    for module in pkgutil.iter_modules([os.path.dirname(__file__)]):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__package__}.{module.name}")


def _listed(
    names: Sequence[str], kinds: Sequence[DatasetKind] = tuple(DatasetKind)
) -> tuple[str, ...]:
    """``names`` kind by kind (in the order of ``kinds``), within a kind by declaring module
    (alphabetical) and then in registration order: an order that does not depend on which
    module Python happened to import first."""
    order = {n: i for i, n in enumerate(DATASETS.names())}

    def key(name: str) -> tuple[int, str, int]:
        traits = DATASETS.traits(name)
        return kinds.index(traits["kind"]), str(traits.get("module") or ""), order[name]

    return tuple(sorted(names, key=key))


#: Every data set by name (its loader, ``None`` for an alias) with its declared traits.
DATASETS: Registry[Callable[..., Dataset] | None] = Registry("dataset", load=_load)


def register_dataset(
    name: str,
    *,
    kind: DatasetKind | str,
    classes: Sequence[str] | Callable[[], Sequence[str]] | None = None,
    ood: str | None = None,
    replace: bool = False,
    **traits: Any,
) -> Callable[[Any], Any]:
    """Decorator registering a data set's loader under ``name`` with its traits.

    The loader is called as ``loader(root, split, transform, **kwargs)`` by
    :func:`get_dataset`; decorating ``None`` (``register_dataset(...)(None)``) registers a
    name without a loader (an alias the pipeline resolves by its traits).

    Parameters
    ----------
    name : str
        The name users type (lower case; ``-`` is read as ``_``).
    kind : DatasetKind or str
        How the set is stored and split.
    classes : sequence of str or callable, optional
        Class names in label order, or a function giving them.
    ood : str, optional
        The name of its out-of-distribution set.
    replace : bool
        Replace an entry of the same name (else a second registration raises).
    **traits
        ``pool``, ``split_options`` and any further declaration (see the module docs).

    Examples
    --------
    >>> import torch
    >>> from bayesurl.data import ImageTensorDataset
    >>> @register_dataset("tiny", kind="embedded", classes=("a", "b"))
    ... def tiny(root=None, split="all", transform=None):
    ...     x = torch.zeros(4, 1, 8, 8, dtype=torch.uint8)
    ...     return ImageTensorDataset(x, torch.tensor([0, 1, 0, 1]), transform, ["a", "b"])
    >>> len(get_dataset("tiny")), dataset_classes("tiny")
    (4, ('a', 'b'))
    >>> _ = DATASETS.remove("tiny")
    """
    module = sys._getframe(1).f_globals.get("__name__")  # the declaring module: the order
    return DATASETS.register(
        name,
        replace=replace,
        kind=DatasetKind(kind),
        classes=classes,
        ood=ood,
        module=module,
        **traits,
    )


def dataset_names(*kinds: DatasetKind | str) -> tuple[str, ...]:
    """Registered names of the given kinds (all of them without ``kinds``), kind by kind."""
    want = tuple(DatasetKind(k) for k in kinds) or tuple(DatasetKind)
    return _listed(DATASETS.names(kind=want), want)


def pool_datasets() -> tuple[str, ...]:
    """Names of the data sets that declare a ``pool`` (those the class-split protocol splits)."""
    return _listed([e.name for e in DATASETS if e.traits.get("pool") is not None])


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
    valid = allowed if allowed is not None else dataset_names()
    if key not in valid:
        raise ValueError(f"unknown `{argument}` {name!r}; valid names: {', '.join(valid)}")
    return key, DATASETS.traits(key)["kind"]


def dataset_classes(name: str) -> tuple[str, ...]:
    """The class names ``name`` declares, in label order (``()`` when it declares none)."""
    classes = DATASETS.traits(name).get("classes")
    if callable(classes):
        classes = classes()
    return tuple(classes or ())


def available_datasets() -> list[str]:
    """Names accepted by :func:`get_dataset`, sorted."""
    return sorted(e.name for e in DATASETS if e.obj is not None)


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
    name : str
        Which data set: one of :func:`available_datasets` (``"fashion_mnist"``, ``"digits"``,
        ``"cub"``, ``"cars"``, ``"sop"``, ``"imagenet"``, ``"clipart"`` and any registered
        with :func:`register_dataset`).
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
    loader = DATASETS.get(key)
    assert loader is not None
    return loader(root, split, transform, **kwargs)
