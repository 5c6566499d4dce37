"""Tensor transforms for 28x28 grayscale images, batched or per sample.

Every transform accepts one image ``[C, H, W]`` or a batch ``[N, C, H, W]`` (the batch draws
independent random parameters per image), so it serves a DataLoader item by item as well as a
whole in-memory set at once. Device and dtype follow the input.

The augmentations are the SimCLR family used by the self-supervised methods of URL (InfoNCE
and MCInfoNCE take "two random transforms of each image", Kirchhof et al., 2023, Sec. 4.1;
MCInfoNCE, Kirchhof et al., 2023 ICML, Sec. 5): random resized crop, horizontal flip, a small
rotation, and Gaussian pixel noise, composed into one affine resampling per image so that they
stay cheap on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_int

__all__ = [
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "ToFloat",
    "Normalize",
    "RepeatChannels",
    "Resize",
    "RandomResizedCropFlip",
    "GaussianNoise",
    "TwoViews",
    "PilToUint8",
    "default_transform",
    "to_rgb",
    "default_augmentation",
]

#: Pixel mean / std of the Fashion-MNIST train images scaled to [0, 1].
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530


def _batched(x: Tensor, name: str = "x") -> tuple[Tensor, bool]:
    if not isinstance(x, Tensor):
        raise TypeError(f"`{name}` must be a tensor image [C,H,W] or batch [N,C,H,W]")
    if x.ndim == 3:
        return x.unsqueeze(0), True
    if x.ndim == 4:
        return x, False
    raise ValueError(f"`{name}` must be [C,H,W] or [N,C,H,W], got shape {tuple(x.shape)}")


class ToFloat(nn.Module):
    """``uint8`` 0-255 to floating point 0-1 (floating inputs pass through unchanged).

    Parameters
    ----------
    dtype : torch.dtype
        Output dtype for integer inputs.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: Tensor) -> Tensor:
        """Scale integer images to ``[0, 1]``."""
        if x.is_floating_point():
            return x
        return x.to(self.dtype) / 255.0


class Normalize(nn.Module):
    """Per-channel ``(x - mean) / std`` on ``[..., C, H, W]``.

    Parameters
    ----------
    mean, std : float or sequence of float
        One value for all channels or one per channel.
    """

    def __init__(
        self,
        mean: float | Sequence[float] = FASHION_MNIST_MEAN,
        std: float | Sequence[float] = FASHION_MNIST_STD,
    ) -> None:
        super().__init__()
        self.mean = (float(mean),) if isinstance(mean, (int, float)) else tuple(map(float, mean))
        self.std = (float(std),) if isinstance(std, (int, float)) else tuple(map(float, std))
        if any(s <= 0 for s in self.std):
            raise ValueError(f"`std` must be positive, got {self.std}")

    def forward(self, x: Tensor) -> Tensor:
        """Normalise a float image or batch."""
        if not x.is_floating_point():
            raise ValueError(f"`x` must be floating point (apply ToFloat first), got {x.dtype}")
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        return (x - mean) / std


class RepeatChannels(nn.Module):
    """Replicate a single grayscale channel ``channels`` times (e.g. 3 for timm backbones)."""

    def __init__(self, channels: int = 3) -> None:
        super().__init__()
        if channels < 1:
            raise ValueError(f"`channels` must be positive, got {channels}")
        self.channels = int(channels)

    def forward(self, x: Tensor) -> Tensor:
        """``[..., 1, H, W] -> [..., channels, H, W]``."""
        if x.shape[-3] == self.channels:
            return x
        if x.shape[-3] != 1:
            raise ValueError(f"`x` must have 1 channel to repeat, got shape {tuple(x.shape)}")
        reps = [1] * x.ndim
        reps[-3] = self.channels
        return x.repeat(*reps)


class Resize(nn.Module):
    """Bilinear resize of a batch ``[..., C, H, W]`` to ``size x size`` (identity when it already
    has that size): small images to the input size a pretrained backbone was made with.

    Parameters
    ----------
    size : int
        Output side in pixels.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = check_int(size, "size", low=1)

    def forward(self, x: Tensor) -> Tensor:
        """``[N, C, H, W]`` or ``[C, H, W]`` floats -> the same with ``H = W = size``."""
        if x.shape[-1] == self.size and x.shape[-2] == self.size:
            return x
        xb, single = _batched(x)
        out = F.interpolate(xb, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return out[0] if single else out


class RandomResizedCropFlip(nn.Module):
    """Random resized crop + horizontal flip + small rotation as one affine resampling.

    For each image an area share ``s ~ U(scale)`` and aspect ratio ``r ~ logU(ratio)`` give a
    crop of relative size ``(sqrt(s r), sqrt(s / r))`` at a uniform position inside the image;
    it is rotated by ``U(-degrees, degrees)``, mirrored with probability ``flip_p`` and
    resampled bilinearly to the input size (zero padding outside). SimCLR-style views for
    InfoNCE / MCInfoNCE (URL Sec. 4.1).

    Parameters
    ----------
    scale : (float, float)
        Range of the crop's area share.
    ratio : (float, float)
        Range of the crop's aspect ratio.
    flip_p : float
        Probability of a horizontal flip.
    degrees : float
        Maximum absolute rotation in degrees.
    """

    def __init__(
        self,
        scale: tuple[float, float] = (0.5, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip_p: float = 0.5,
        degrees: float = 10.0,
    ) -> None:
        super().__init__()
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"`scale` must satisfy 0 < lo <= hi <= 1, got {scale}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"`ratio` must satisfy 0 < lo <= hi, got {ratio}")
        if not 0 <= flip_p <= 1:
            raise ValueError(f"`flip_p` must be in [0, 1], got {flip_p}")
        self.scale, self.ratio = tuple(scale), tuple(ratio)
        self.flip_p, self.degrees = float(flip_p), float(degrees)

    def sample_theta(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """Draw ``[n, 2, 3]`` affine matrices (output -> input normalised coordinates)."""
        dev = generator.device if generator is not None else torch.device("cpu")
        u = torch.rand(n, 6, generator=generator, device=dev, dtype=torch.float64)
        area = self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 0]
        log_r = (
            math.log(self.ratio[0]) + (math.log(self.ratio[1]) - math.log(self.ratio[0])) * u[:, 1]
        )
        r = log_r.exp()
        w = (area * r).sqrt().clamp(max=1.0)
        h = (area / r).sqrt().clamp(max=1.0)
        cx = (1 - w) * (2 * u[:, 2] - 1)
        cy = (1 - h) * (2 * u[:, 3] - 1)
        flip = torch.where(u[:, 4] < self.flip_p, -1.0, 1.0).to(torch.float64)
        a = math.radians(self.degrees) * (2 * u[:, 5] - 1)
        cos, sin = a.cos(), a.sin()
        theta = torch.stack(
            [
                torch.stack([w * cos * flip, -h * sin, cx], dim=1),
                torch.stack([w * sin * flip, h * cos, cy], dim=1),
            ],
            dim=1,
        )
        return theta

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Augment one float image ``[C, H, W]`` or a batch ``[N, C, H, W]``."""
        xb, single = _batched(x)
        if not xb.is_floating_point():
            raise ValueError(f"`x` must be floating point (apply ToFloat first), got {x.dtype}")
        theta = self.sample_theta(xb.shape[0], generator).to(device=xb.device, dtype=xb.dtype)
        grid = F.affine_grid(theta, list(xb.shape), align_corners=False)
        out = F.grid_sample(xb, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return out[0] if single else out


class GaussianNoise(nn.Module):
    """Add ``N(0, std^2)`` pixel noise and clamp to ``[lo, hi]`` (images in ``[0, 1]``)."""

    def __init__(self, std: float = 0.05, clamp: tuple[float, float] | None = (0.0, 1.0)) -> None:
        super().__init__()
        if std < 0:
            raise ValueError(f"`std` must be non-negative, got {std}")
        self.std = float(std)
        self.clamp = clamp

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Perturb a float image or batch."""
        if self.std == 0:
            return x
        dev = generator.device if generator is not None else x.device
        noise = torch.randn(x.shape, generator=generator, device=dev, dtype=x.dtype)
        out = x + self.std * noise.to(x.device)
        return out.clamp(*self.clamp) if self.clamp is not None else out


class TwoViews:
    """Return two independent draws of ``transform`` of the same input.

    The positive pair of SimCLR-style contrastive methods (InfoNCE / MCInfoNCE, URL Sec. 4.1):
    a data set built with ``transform=TwoViews(aug)`` yields ``((view1, view2), label)``, the
    ``two_view`` batch of :class:`bayesurl.methods.base.Method`. Works on a batch too.

    Parameters
    ----------
    transform : callable
        A random transform.
    """

    def __init__(self, transform: Callable[[Any], Any]) -> None:
        if not callable(transform):
            raise TypeError("`transform` must be callable")
        self.transform = transform

    def __call__(self, x: Any) -> tuple[Any, Any]:
        return self.transform(x), self.transform(x)

    def __repr__(self) -> str:
        return f"TwoViews({self.transform!r})"


#: Pillow modes that carry transparency (composited on white by :func:`to_rgb`).
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


def to_rgb(img: Any) -> Any:
    """A PIL image as 8-bit RGB, its pixels' meaning kept whatever its mode.

    - transparency (``RGBA``, ``LA``, ``PA``, a palette with a transparent colour) is
      composited on white, as an image viewer shows it (its hidden colour, often black, is
      not the picture);
    - 16-bit greyscale (``I;16``, and ``I`` with values in ``0..65535``, e.g. a medical or
      microscopy PNG) is scaled to 8 bits (``>> 8``), not clipped at 255 (which would make it
      almost white);
    - every other mode Pillow can convert (``1``, ``L``, ``P``, ``CMYK``, ``YCbCr`` ...) is
      converted.

    Raises
    ------
    ValueError
        For pixels with no fixed range to map to 8 bits: floating point (mode ``F``) or
        32-bit integers outside ``0..65535``; and for a mode Pillow cannot convert.
    """
    from PIL import Image

    mode = img.mode
    if mode == "P" and "transparency" in img.info:
        mode = "PA"
    if mode in _ALPHA_MODES:
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        canvas.alpha_composite(rgba)
        return canvas.convert("RGB")
    if mode.startswith("I"):
        a = np.asarray(img)
        if a.size and (int(a.min()) < 0 or int(a.max()) > 65535):
            raise ValueError(
                f"32-bit integer pixels (mode {img.mode}) from {int(a.min())} to {int(a.max())}: "
                "no fixed range to map to 8 bits; save the image with 8 or 16 bits"
            )
        return Image.fromarray((a.astype(np.uint32) >> 8).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        raise ValueError(
            "floating-point pixels (mode F) have no fixed range to map to 8 bits; save the "
            "image with 8 or 16 bits"
        )
    try:
        return img.convert("RGB")
    except (ValueError, OSError) as exc:
        raise ValueError(f"cannot convert an image of mode {img.mode} to RGB ({exc})") from None


class PilToUint8:
    """Per-item transform of a folder image: RGB, shorter side to ``size``, centre crop, ``uint8``.

    The one PIL-to-tensor step of the folder data sets (CUB, CARS, SOP, ImageNet): batches stay
    ``uint8`` ``[3, size, size]`` and are normalised / augmented per batch on the training
    device (:func:`default_transform`, :func:`default_augmentation`). The image is converted to
    RGB first (:func:`to_rgb`: transparency on white, 16-bit greyscale scaled to 8 bits), so
    grayscale and palette images are resized like colour ones.

    Parameters
    ----------
    size : int
        Side of the square output (>= 8).
    """

    def __init__(self, size: int) -> None:
        self.size = check_int(size, "size", low=8)

    def __call__(self, img: Any) -> Tensor:
        from torchvision.transforms import functional as TF

        img = TF.center_crop(TF.resize(to_rgb(img), self.size), [self.size, self.size])
        return TF.pil_to_tensor(img)

    def __repr__(self) -> str:
        return f"PilToUint8({self.size})"


def default_transform(
    channels: int = 1,
    *,
    normalize: bool = True,
    mean: float | Sequence[float] = FASHION_MNIST_MEAN,
    std: float | Sequence[float] = FASHION_MNIST_STD,
) -> nn.Sequential:
    """Deterministic evaluation transform for ``uint8`` grayscale images.

    ``uint8 -> float [0, 1] -> (x - mean) / std -> repeat to `channels```.

    Parameters
    ----------
    channels : int
        1 for small CNNs, 3 for timm backbones expecting RGB.
    normalize : bool
        Standardise with ``mean``/``std`` (Fashion-MNIST statistics by default).
    mean, std : float or sequence of float
        Normalisation constants.

    Returns
    -------
    torch.nn.Sequential
        Works on ``[C, H, W]`` and ``[N, C, H, W]``.
    """
    steps: list[nn.Module] = [ToFloat()]
    if normalize:
        steps.append(Normalize(mean, std))
    if channels != 1:
        steps.append(RepeatChannels(channels))
    return nn.Sequential(*steps)


class _Augment(nn.Module):
    def __init__(self, crop: RandomResizedCropFlip, noise: GaussianNoise, post: nn.Module):
        super().__init__()
        self.to_float, self.crop, self.noise, self.post = ToFloat(), crop, noise, post

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        x = self.to_float(x)
        x = self.noise(self.crop(x, generator), generator)
        return self.post(x)


def default_augmentation(
    channels: int = 1,
    *,
    scale: tuple[float, float] = (0.5, 1.0),
    flip_p: float = 0.5,
    degrees: float = 10.0,
    noise_std: float = 0.05,
    normalize: bool = True,
    mean: float | Sequence[float] = FASHION_MNIST_MEAN,
    std: float | Sequence[float] = FASHION_MNIST_STD,
) -> nn.Module:
    """CPU-cheap SimCLR-style augmentation for ``uint8`` grayscale images.

    ``uint8 -> [0, 1] -> random resized crop / flip / rotation -> Gaussian noise -> normalise
    -> repeat channels``. Wrap it in :class:`TwoViews` for contrastive methods.

    Parameters
    ----------
    channels : int
        Output channels.
    scale : (float, float)
        Crop area range.
    flip_p : float
        Horizontal flip probability.
    degrees : float
        Maximum rotation.
    noise_std : float
        Pixel noise std on the ``[0, 1]`` scale.
    normalize, mean, std
        As for :func:`default_transform`.

    Returns
    -------
    torch.nn.Module
        Callable as ``aug(x)`` or ``aug(x, generator)`` on ``[C, H, W]`` or ``[N, C, H, W]``.
    """
    post: list[nn.Module] = []
    if normalize:
        post.append(Normalize(mean, std))
    if channels != 1:
        post.append(RepeatChannels(channels))
    return _Augment(
        RandomResizedCropFlip(scale=scale, flip_p=flip_p, degrees=degrees),
        GaussianNoise(noise_std),
        nn.Sequential(*post),
    )
