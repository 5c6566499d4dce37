"""scikit-learn's bundled handwritten digits (1,797 images, 8x8, 10 classes).

They ship inside scikit-learn, so they are the embedded fallback training set when
Fashion-MNIST is absent and, upsampled to 28x28, the out-of-distribution set for Fashion-MNIST
models (standing in for MNIST in LAM's FashionMNIST-vs-MNIST protocol, Warburg et al., 2023,
Sec. 4).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bayesurl._checks import check_int

from .base import ImageTensorDataset, Transform, synthetic_ood
from .registry import DatasetKind, register_dataset
from .splits import stratified_split

__all__ = ["digits", "load_digits_images", "upsample_uint8"]

_DIGIT_MAX = 16.0  # sklearn digits hold integer intensities 0..16


def upsample_uint8(images: Tensor, size: int, *, max_value: float = 255.0) -> Tensor:
    """Bilinearly resize ``[N, C, H, W]`` images and rescale them to ``uint8`` 0-255.

    Parameters
    ----------
    images : Tensor
        ``[N, C, H, W]`` images with intensities in ``[0, max_value]``.
    size : int
        Output height and width.
    max_value : float
        Intensity that maps to 255.

    Returns
    -------
    Tensor
        ``[N, C, size, size]`` ``uint8``.
    """
    x = images.to(torch.float32) * (255.0 / max_value)
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.round().clamp_(0, 255).to(torch.uint8)


def load_digits_images(size: int = 8) -> tuple[Tensor, Tensor]:
    """All 1,797 digits as ``uint8`` images ``[N, 1, size, size]`` (0-255) and labels ``[N]``."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    imgs = torch.as_tensor(bunch.images, dtype=torch.float32).unsqueeze(1)
    return upsample_uint8(imgs, int(size), max_value=_DIGIT_MAX), torch.as_tensor(
        bunch.target, dtype=torch.int64
    )


def digits(
    root: None = None,
    split: str = "all",
    transform: Transform | None = None,
    *,
    size: int = 8,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> ImageTensorDataset:
    """scikit-learn digits as an in-memory image data set.

    Parameters
    ----------
    root : None
        Must be ``None`` (the data are bundled); present so every loader shares one signature.
    split : {"all", "train", "test"}
        Digits have no official split; ``"train"``/``"test"`` are a seeded stratified split
        holding out ``test_fraction`` of every class.
    transform : callable, optional
        Applied per item to the ``uint8`` image ``[1, size, size]``.
    size : int
        Image side; 8 keeps the originals, 28 upsamples bilinearly so the digits can be
        out-of-distribution data for Fashion-MNIST models.
    test_fraction : float
        Held-out share of every class for ``split="test"``.
    seed : int
        Seed of the train/test split.

    Returns
    -------
    ImageTensorDataset
        ``uint8`` images ``[N, 1, size, size]`` scaled to 0-255, labels ``0..9``.
    """
    if root is not None:
        raise ValueError(
            f"`root` must be None for digits (bundled with scikit-learn), got {root!r}"
        )
    if split not in ("all", "train", "test"):
        raise ValueError(f"`split` must be one of ['all', 'test', 'train'], got {split!r}")
    check_int(size, "size", low=1)
    images, labels = load_digits_images(size)
    if split != "all":
        train_idx, test_idx = stratified_split(labels, test_fraction, seed=seed)
        idx = train_idx if split == "train" else test_idx
        images, labels = images[idx], labels[idx]
    return ImageTensorDataset(
        images, labels, transform, [str(d) for d in range(10)], f"digits{size}/{split}"
    )


def _pool(
    root: None, seed: int, image_size: int | None
) -> tuple[ImageTensorDataset, Tensor, ImageTensorDataset, str]:
    """The digits at 28 px as one pool for the class-split protocol: a seeded stratified 20 %
    held out, seeded noise images as the OOD set (no foreign set ships offline)."""
    images, labels = load_digits_images(28)
    _, held_idx = stratified_split(labels, 0.2, seed=seed)
    held = torch.zeros(len(labels), dtype=torch.bool)
    held[held_idx] = True
    ood = synthetic_ood(len(labels), 28, seed=seed)
    ood.name = "noise/ood"
    return ImageTensorDataset(images, labels, name="digits"), held, ood, "noise"


register_dataset(
    "digits",
    kind=DatasetKind.EMBEDDED,
    classes=tuple(str(d) for d in range(10)),
    ood="noise",
    pool=_pool,
    # the embedded split builders run the digits alone (their Fashion-MNIST fallback)
    split_options={"force_digits": True},
)(digits)
