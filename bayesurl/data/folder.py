"""A folder of one's own images: with class sub-folders (labelled) or flat (unlabelled).

:func:`scan_image_folder` lists the images (by suffix, sorted, so ids are stable) and reads
the classes from the sub-folder names; :class:`ReadableImages` decodes them lazily and, where
a file cannot be decoded, yields its error instead of an image so that the caller can skip it
with a warning and count it -- never drop it silently; :func:`collate_readable` batches what
decoded and keeps the list of what did not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from bayesurl.data.transforms import PilToUint8

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageFolderScan",
    "ReadableImages",
    "collate_readable",
    "scan_image_folder",
]

#: File suffixes read as images (lower case); other files are counted and ignored.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


@dataclass
class ImageFolderScan:
    """The images of a folder.

    Attributes
    ----------
    root : Path
    paths : list of str
        Image paths relative to ``root``, sorted.
    labels : list of int or None
        Class index of each image (``None``: a flat folder without labels).
    classes : list of str
        Sub-folder names by class index (empty without labels).
    ignored : list of str
        Files that are not images by their suffix.
    """

    root: Path
    paths: list[str]
    labels: list[int] | None
    classes: list[str]
    ignored: list[str]


def scan_image_folder(root: str | os.PathLike[str]) -> ImageFolderScan:
    """List the images of ``root``: ``root/<class>/<image>`` or ``root/<image>``.

    Raises
    ------
    FileNotFoundError
        If ``root`` is not a folder.
    ValueError
        If it holds no image, or images both at the top and in sub-folders (naming one of each),
        or images deeper than one sub-folder.
    """
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"`images` {str(base)!r} is not a folder")
    files = sorted(p for p in base.rglob("*") if p.is_file() and not p.name.startswith("."))
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    ignored = [str(p.relative_to(base)) for p in files if p.suffix.lower() not in IMAGE_SUFFIXES]
    if not images:
        raise ValueError(f"`images` {str(base)!r} holds no image ({', '.join(IMAGE_SUFFIXES)})")
    depth = {len(p.relative_to(base).parts) for p in images}
    if depth - {1, 2}:
        deep = next(p for p in images if len(p.relative_to(base).parts) > 2)
        raise ValueError(
            f"`images`: {str(deep)!r} lies more than one sub-folder deep; use DIR/<class>/<image> "
            "or DIR/<image>"
        )
    if depth == {1, 2}:
        top = next(p for p in images if len(p.relative_to(base).parts) == 1)
        sub = next(p for p in images if len(p.relative_to(base).parts) == 2)
        raise ValueError(
            f"`images` mixes images at the top ({top.name!r}) and in class sub-folders "
            f"({str(sub.relative_to(base))!r}); use one layout"
        )
    rel = [str(p.relative_to(base)) for p in images]
    if depth == {1}:
        return ImageFolderScan(base, rel, None, [], ignored)
    classes = sorted({p.relative_to(base).parts[0] for p in images})
    index = {c: i for i, c in enumerate(classes)}
    labels = [index[p.relative_to(base).parts[0]] for p in images]
    return ImageFolderScan(base, rel, labels, classes, ignored)


class ReadableImages(Dataset):
    """The images of a scan as ``uint8 [3, size, size]``; an unreadable file gives its error.

    Item ``i`` is ``(image or None, label, i, error or None)``, label ``-1`` without labels.

    Parameters
    ----------
    scan : ImageFolderScan
    size : int
        Side of the centre crop after resizing the shorter side (:class:`PilToUint8`).
    """

    def __init__(self, scan: ImageFolderScan, size: int) -> None:
        self.scan = scan
        self.to_uint8 = PilToUint8(size)

    def __len__(self) -> int:
        return len(self.scan.paths)

    def __getitem__(self, index: int) -> tuple[Tensor | None, int, int, str | None]:
        from PIL import Image

        label = -1 if self.scan.labels is None else self.scan.labels[index]
        try:
            with Image.open(self.scan.root / self.scan.paths[index]) as im:
                im.load()
                return self.to_uint8(im), label, index, None
        except (OSError, ValueError, SyntaxError) as exc:  # PIL's errors for broken files
            return None, label, index, f"{type(exc).__name__}: {exc}"


def collate_readable(
    items: list[tuple[Tensor | None, int, int, str | None]],
) -> tuple[Tensor | None, Tensor, Tensor, list[tuple[int, str]]]:
    """A batch of the decoded items ``(x, labels, ids)`` plus ``[(id, error)]`` of the others."""
    good = [it for it in items if it[0] is not None]
    bad = [(int(it[2]), str(it[3])) for it in items if it[0] is None]
    if not good:
        empty = torch.empty(0, dtype=torch.int64)
        return None, empty, empty, bad
    x = torch.stack([it[0] for it in good])
    y = torch.tensor([it[1] for it in good], dtype=torch.int64)
    ids = torch.tensor([it[2] for it in good], dtype=torch.int64)
    return x, y, ids, bad


def folder_summary(scan: ImageFolderScan) -> dict[str, Any]:
    """Sizes of a scan for the result record."""
    return {
        "images": len(scan.paths),
        "labelled": scan.labels is not None,
        "classes": len(scan.classes),
        "ignored_files": len(scan.ignored),
    }
