"""A folder of one's own images: with class sub-folders (labelled) or flat (unlabelled).

:func:`scan_image_folder` lists the images (by suffix, sorted, so ids are stable) and reads
the classes from the sub-folder names; :class:`ReadableImages` decodes them lazily
(:func:`read_image`: the header first, so a decompression bomb is refused before its pixels
are decoded; a truncated file, an unreadable header or a mode without an 8-bit meaning is
named) and, where a file cannot be decoded, yields the reason instead of an image so that the
caller can skip it with a warning and list it -- never drop it silently, never raise;
:func:`collate_readable` batches what decoded, with each file's digest, and keeps the list of
what did not.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from bayesurl._checks import check_int
from bayesurl.data.transforms import PilToUint8, to_rgb

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageFolderScan",
    "ReadableImages",
    "collate_readable",
    "file_digest",
    "read_image",
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


#: Pillow's limit is process-wide: a read with it switched off holds this lock
_PIL_LIMIT = threading.Lock()


@contextlib.contextmanager
def _own_pixel_limit() -> Iterator[None]:
    """Pillow's own decompression-bomb check off while a file is opened and decoded: the
    caller checks the header's size against its own limit first (Pillow's would raise a
    foreign error, or only warn, at its own)."""
    from PIL import Image

    with _PIL_LIMIT, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        before = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = before


def read_image(data: bytes, max_pixels: int | None, *, keep_grey: bool = False) -> Any:
    """Decode one image file's bytes into an 8-bit RGB PIL image, defensively.

    The header is read first: an image of more than ``max_pixels`` pixels (width x height) is
    refused before any pixel is decoded (a small PNG can claim 30,000 x 30,000 px). Then the
    pixels are decoded in full (a truncated file fails here, not later) and converted by
    :func:`bayesurl.data.transforms.to_rgb` (transparency on white, 16-bit scaled);
    ``keep_grey`` keeps an 8-bit greyscale image greyscale (mode ``L``, a report's thumbnail).

    Raises
    ------
    ValueError
        Naming the reason: not an image, over the pixel limit, truncated or corrupt, a mode
        with no 8-bit meaning. Every decoder error becomes one.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with _own_pixel_limit():
            im = Image.open(io.BytesIO(data))
        with im:
            w, h = im.size
            if max_pixels is not None and w * h > max_pixels:
                raise ValueError(
                    f"{w} x {h} px = {w * h:,} pixels, over the limit of {max_pixels:,} "
                    "(max_pixels; a decompression bomb, or raise the limit)"
                )
            with _own_pixel_limit():
                im.load()
            return im.copy() if keep_grey and im.mode == "L" else to_rgb(im)
    except ValueError:
        raise
    except UnidentifiedImageError:
        raise ValueError(
            "not an image Pillow can read (unknown format or corrupt header)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this file's problem
        # the bytes were read by the caller: a memory buffer's repr names nothing
        text = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "the file", str(exc))
        text = " ".join(text.split()) or "no message"
        raise ValueError(f"{type(exc).__name__}: {text}") from None


def file_digest(data: bytes) -> str:
    """SHA-1 hex digest of a file's bytes (what the folder road records per image)."""
    return hashlib.sha1(data).hexdigest()


class ReadableImages(Dataset):
    """The images of a scan as ``uint8 [3, size, size]``; an unreadable file gives its error.

    Item ``i`` is ``(image or None, label, i, error or None, digest or None)``, label ``-1``
    without labels, ``digest`` the SHA-1 of the file's bytes (:func:`file_digest`; ``None``
    when the file could not be read at all). Each file is read once; the image is decoded by
    :func:`read_image`, so a decompression bomb, a truncated file, an unreadable header or a
    mode without an 8-bit meaning is an error of that item, never an exception.

    Parameters
    ----------
    scan : ImageFolderScan
    size : int
        Side of the centre crop after resizing the shorter side (:class:`PilToUint8`).
    max_pixels : int or None
        Largest image (width x height) decoded (``None``: no limit).
    """

    def __init__(self, scan: ImageFolderScan, size: int, max_pixels: int | None = None) -> None:
        self.scan = scan
        self.to_uint8 = PilToUint8(size)
        self.max_pixels = None if max_pixels is None else check_int(max_pixels, "max_pixels", low=1)

    def __len__(self) -> int:
        return len(self.scan.paths)

    def __getitem__(self, index: int) -> tuple[Tensor | None, int, int, str | None, str | None]:
        label = -1 if self.scan.labels is None else self.scan.labels[index]
        try:
            data = (self.scan.root / self.scan.paths[index]).read_bytes()
        except OSError as exc:
            return None, label, index, f"{type(exc).__name__}: {exc.strerror or exc}", None
        digest = file_digest(data)
        try:
            return self.to_uint8(read_image(data, self.max_pixels)), label, index, None, digest
        except ValueError as exc:
            return None, label, index, str(exc), digest


def collate_readable(
    items: list[tuple[Tensor | None, int, int, str | None, str | None]],
) -> tuple[Tensor | None, Tensor, Tensor, list[tuple[int, str]], list[str]]:
    """A batch of the decoded items ``(x, labels, ids)`` plus ``[(id, error)]`` of the others
    and the file digests of the decoded ones (in the order of ``ids``)."""
    good = [it for it in items if it[0] is not None]
    bad = [(int(it[2]), str(it[3])) for it in items if it[0] is None]
    if not good:
        empty = torch.empty(0, dtype=torch.int64)
        return None, empty, empty, bad, []
    x = torch.stack([it[0] for it in good])
    y = torch.tensor([it[1] for it in good], dtype=torch.int64)
    ids = torch.tensor([it[2] for it in good], dtype=torch.int64)
    return x, y, ids, bad, [str(it[4]) for it in good]


def folder_summary(scan: ImageFolderScan) -> dict[str, Any]:
    """Sizes of a scan for the result record."""
    return {
        "images": len(scan.paths),
        "labelled": scan.labels is not None,
        "classes": len(scan.classes),
        "ignored_files": len(scan.ignored),
    }
