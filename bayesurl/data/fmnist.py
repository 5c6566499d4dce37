"""Fashion-MNIST from the four original IDX files (Xiao et al., 2017).

Fashion-MNIST is the in-distribution set of LAM's closed-set experiment (Warburg et al., 2023,
Sec. 4, Table 2) and this library's embedded default for the zero-shot protocol of URL
(Kirchhof et al., 2023, Sec. 3.2). The files come from the Debian package
``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``) or any folder in torchvision's
layout (``<root>/FashionMNIST/raw``). Nothing is ever downloaded.
"""

from __future__ import annotations

import os

import torch

from .base import ImageTensorDataset, Transform
from .idx import read_idx
from .registry import DatasetKind, register_dataset
from .sklearn_digits import load_digits_images

__all__ = [
    "DEFAULT_FASHION_MNIST_ROOT",
    "FASHION_MNIST_CLASSES",
    "fashion_mnist",
    "find_fashion_mnist",
]

DEFAULT_FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_HOW_TO_GET = (
    "Install the Debian package (`sudo apt-get install -y dataset-fashion-mnist`, which puts the "
    f"files in {DEFAULT_FASHION_MNIST_ROOT}) or copy the four original IDX files "
    "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
    "t10k-labels-idx1-ubyte.gz; .gz optional) into ROOT or ROOT/FashionMNIST/raw and pass "
    "root=ROOT."
)


def _candidate_dirs(root: str) -> list[str]:
    return [
        root,
        os.path.join(root, "FashionMNIST", "raw"),
        os.path.join(root, "raw"),
        os.path.join(root, "fashion-mnist"),
    ]


def _find_file(folder: str, stem: str) -> str | None:
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def find_fashion_mnist(root: str | os.PathLike[str] | None = None) -> str:
    """Locate the folder holding the Fashion-MNIST IDX files.

    Parameters
    ----------
    root : str or PathLike, optional
        A folder holding the files directly, or in torchvision's ``FashionMNIST/raw`` layout.
        Defaults to ``/usr/share/datasets/fashion-mnist``.

    Returns
    -------
    str
        The folder that holds all four files.

    Raises
    ------
    FileNotFoundError
        Naming the folders searched and how to get the data.
    """
    root = os.fspath(root) if root is not None else DEFAULT_FASHION_MNIST_ROOT
    tried = _candidate_dirs(root)
    stems = [s for pair in _FILES.values() for s in pair]
    for folder in tried:
        if all(_find_file(folder, s) is not None for s in stems):
            return folder
    raise FileNotFoundError(
        f"Fashion-MNIST not found under {root!r} (searched {', '.join(map(repr, tried))}). "
        + _HOW_TO_GET
    )


def fashion_mnist(
    root: str | os.PathLike[str] | None = None,
    split: str = "train",
    transform: Transform | None = None,
) -> ImageTensorDataset:
    """Load Fashion-MNIST into memory (``uint8`` images ``[N, 1, 28, 28]``).

    Parameters
    ----------
    root : str or PathLike, optional
        See :func:`find_fashion_mnist`; defaults to ``/usr/share/datasets/fashion-mnist``.
    split : {"train", "test"}
        The original 60,000-image train file or the 10,000-image t10k file.
    transform : callable, optional
        Applied per item to the ``uint8`` image ``[1, 28, 28]``; see
        :func:`bayesurl.data.default_transform`.

    Returns
    -------
    ImageTensorDataset
        With ``targets`` in ``0..9`` and ``classes`` the ten Fashion-MNIST class names.
    """
    if split not in _FILES:
        raise ValueError(f"`split` must be one of {sorted(_FILES)}, got {split!r}")
    folder = find_fashion_mnist(root)
    img_stem, lbl_stem = _FILES[split]
    images = read_idx(_find_file(folder, img_stem))  # type: ignore[arg-type]
    labels = read_idx(_find_file(folder, lbl_stem))  # type: ignore[arg-type]
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"Fashion-MNIST files in {folder!r} are inconsistent: images {tuple(images.shape)}, "
            f"labels {tuple(labels.shape)}"
        )
    return ImageTensorDataset(
        images, labels.long(), transform, FASHION_MNIST_CLASSES, f"fashion_mnist/{split}"
    )


def _pool(
    root: str | os.PathLike[str] | None, seed: int, image_size: int | None
) -> tuple[ImageTensorDataset, torch.Tensor, ImageTensorDataset, str]:
    """Both files as one pool for the class-split protocol: the t10k file is the held-out
    part, the digits (at 28 px) the OOD set."""
    find_fashion_mnist(root)
    tr, te = fashion_mnist(root, "train"), fashion_mnist(root, "test")
    images = torch.cat([tr.images, te.images])
    labels = torch.cat([tr.targets, te.targets])
    held = torch.cat(
        [torch.zeros(len(tr), dtype=torch.bool), torch.ones(len(te), dtype=torch.bool)]
    )
    d_img, d_lbl = load_digits_images(int(images.shape[-1]))
    ood = ImageTensorDataset(d_img, d_lbl, name="digits/ood")
    return ImageTensorDataset(images, labels, name="fashion_mnist"), held, ood, "digits"


# the embedded default: Fashion-MNIST, or the digits with a warning where it is absent
register_dataset(
    "default",
    kind=DatasetKind.EMBEDDED,
    classes=FASHION_MNIST_CLASSES,
    ood="digits",
    split_options={},
)(None)


register_dataset(
    "fashion_mnist",
    kind=DatasetKind.EMBEDDED,
    classes=FASHION_MNIST_CLASSES,
    ood="digits",
    pool=_pool,
    split_options={},
)(fashion_mnist)
