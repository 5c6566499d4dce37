"""ImageNet (or any ImageFolder tree) as the upstream set of URL's main benchmark.

URL (Kirchhof et al., 2023, section 3.2 / appendix B) trains on ImageNet and evaluates
zero-shot on the test classes of CUB, CARS and SOP. Here the upstream set is any
``root/<split>/<class>/*`` tree read by torchvision's ``ImageFolder``; the run pipeline
(:func:`bayesurl.runs.data.build_data`) pairs it with the folder data sets found under
``data.downstream_root``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from .registry import DatasetKind, register_dataset

__all__ = ["image_folder"]


@register_dataset("imagenet", kind=DatasetKind.UPSTREAM)
def image_folder(
    root: str | os.PathLike[str] | None, split: str = "train", transform: Any = None, **kw: Any
) -> Dataset:
    """The ImageFolder ``root/split`` (``kw`` go to ``torchvision.datasets.ImageFolder``).

    Raises
    ------
    FileNotFoundError
        Without ``root``, or when ``root`` has no folder ``split``.
    """
    from torchvision.datasets import ImageFolder

    if root is None:
        raise FileNotFoundError("an upstream ImageFolder needs `root` (holding train/<class>/*)")
    folder = Path(root) / split
    if not folder.is_dir():
        raise FileNotFoundError(f"`root` has no folder {str(folder)!r}")
    return ImageFolder(str(folder), transform=transform, **kw)
