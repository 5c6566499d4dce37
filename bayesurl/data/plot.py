"""A grid of images with labels, to look at data sets and augmentations."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["plot_images"]


def plot_images(
    images: Tensor,
    labels: Tensor | Sequence[int] | None = None,
    *,
    ncols: int = 8,
    max_images: int = 32,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
):
    """Plot images ``[N, C, H, W]`` (``uint8`` or float, any range) in a grid.

    Used to check the data of the zero-shot protocol (URL Sec. 3.2) and the two-view
    augmentations of InfoNCE / MCInfoNCE (URL Sec. 4.1) by eye. Float images are min-max
    scaled per image; 3-channel images are shown in RGB, others as grayscale (first channel).
    The figure is built without pyplot (no global backend state); save it with
    ``fig.savefig(path)``.

    Parameters
    ----------
    images : Tensor
        ``[N, C, H, W]`` or ``[N, H, W]``.
    labels : Tensor or sequence of int, optional
        Shown above each image.
    ncols : int
        Images per row.
    max_images : int
        Only the first ``max_images`` are drawn.
    class_names : sequence of str, optional
        Names indexed by label.
    title : str, optional
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.figure import Figure

    if not isinstance(images, Tensor) or images.ndim not in (3, 4):
        raise ValueError("`images` must be a tensor [N, C, H, W] or [N, H, W]")
    if images.shape[0] == 0:
        raise ValueError("`images` is empty")
    x = images[:max_images].detach().to("cpu", torch.float64)
    if x.ndim == 3:
        x = x.unsqueeze(1)
    if labels is not None:
        labels = torch.as_tensor(labels).reshape(-1)
        if labels.shape[0] != images.shape[0]:
            raise ValueError(
                f"length mismatch: `images` has {images.shape[0]}, `labels` has {labels.shape[0]}"
            )
    n = x.shape[0]
    ncols = max(1, min(int(ncols), n))
    nrows = -(-n // ncols)
    fig = Figure(figsize=(1.3 * ncols, 1.45 * nrows + (0.4 if title else 0)))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if k >= n:
            continue
        img = x[k]
        lo, hi = img.min(), img.max()
        img = (img - lo) / (hi - lo) if hi > lo else torch.zeros_like(img)
        if img.shape[0] == 3:
            ax.imshow(img.permute(1, 2, 0).numpy())
        else:
            ax.imshow(img[0].numpy(), cmap="gray", vmin=0, vmax=1)
        if labels is not None:
            y = int(labels[k])
            name = class_names[y] if class_names is not None and 0 <= y < len(class_names) else y
            ax.set_title(str(name), fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
