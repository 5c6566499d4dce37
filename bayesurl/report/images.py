"""Thumbnails of the images a report shows, as ``data:`` URIs (no file beside the page).

A run's record (:class:`bayesurl.runs.queries.QueryRecord`) names its images by id: the
report rebuilds the run's data from the settings kept in the record
(:func:`bayesurl.runs.data.build_data`, always as images: a run on cached frozen features is
rebuilt without the feature store, so the page shows the input image, not its feature
vector) and reads the downstream test image and the OOD image of each id; a folder's record
names its files. Where the record keeps the digest of each image's pixels
(:func:`bayesurl.runs.queries.source_ids`) the rebuilt images are checked against them, else
their classes against the record's. Images that cannot be had back (data moved or changed, a
record without data settings) are not drawn: ``ImageSource.problem`` says why in words,
and the page prints it.

Each thumbnail is a PNG whose longer side is at most ``size`` pixels: larger images are
shrunk, small ones (28 x 28 FashionMNIST) enlarged by a whole factor without smoothing, so
every pixel of the source is a square block of the thumbnail.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from bayesurl.data.folder import file_digest, read_image
from bayesurl.data.registry import DATASETS, dataset_classes
from bayesurl.folder import DEFAULT_MAX_PIXELS
from bayesurl.runs.config import RunConfig
from bayesurl.runs.data import build_data
from bayesurl.runs.queries import QueryRecord, source_ids

__all__ = ["ImageSource", "image_source", "pixel_digest", "png_data_uri"]

#: Default longest thumbnail side in pixels.
THUMB_SIZE = 96


def png_data_uri(image: Any, size: int = THUMB_SIZE) -> str:
    """A ``data:image/png;base64,...`` URI of ``image``.

    Parameters
    ----------
    image : Tensor, ndarray or PIL.Image
        ``uint8`` ``[C, H, W]`` (C = 1 or 3; a tensor of a data set) or ``[H, W]``, or a PIL
        image.
    size : int
        Longest side of the thumbnail: larger images are shrunk to it, smaller ones enlarged
        by the largest whole factor that keeps within it (nearest neighbour: each source pixel
        a block of ``factor x factor`` pixels).
    """
    if not isinstance(image, Image.Image):
        a = np.asarray(image.detach().cpu() if hasattr(image, "detach") else image)
        if a.dtype != np.uint8:
            a = np.clip(a, 0, 255).astype(np.uint8)
        if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
            a = a.transpose(1, 2, 0)
        if a.ndim == 3 and a.shape[-1] == 1:
            a = a[..., 0]
        image = Image.fromarray(a)
    if image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
    if max(image.size) > size:
        image = image.copy()
        image.thumbnail((size, size))
    elif size // max(image.size) > 1:
        f = size // max(image.size)
        image = image.resize((image.width * f, image.height * f), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def pixel_digest(image: Any) -> str:
    """SHA-1 hex digest of a ``uint8`` image tensor's bytes (the feature store's address of an
    image, :func:`bayesurl.features.image_digests`)."""
    a = np.ascontiguousarray(
        np.asarray(image.detach().cpu() if hasattr(image, "detach") else image)
    )
    return hashlib.sha1(a.tobytes()).hexdigest()


class ImageSource:
    """The images of one record's data: ``query(i)`` and ``ood(i)`` give thumbnails.

    Parameters
    ----------
    query, ood : callable or None
        ``id -> image`` (anything :func:`png_data_uri` takes); ``query=None``: no images.
    class_names : dict
        Class id -> name shown under the thumbnails.
    size : int
        Thumbnail side.
    name : callable, optional
        ``(kind, id, image) -> str`` naming the source of a shown image (``kind`` ``"q"`` or
        ``"o"``); the names are collected in ``names`` by thumbnail key.
    problem : str, optional
        Why there are no images (``query`` is then ``None``).

    Attributes
    ----------
    names : dict
        Thumbnail key (``q<id>``, ``o<id>``) -> name of the source image.
    why : dict
        Thumbnail key -> why that image is not drawn (changed or missing since the run).
    problem : str or None
        Why images are missing, in words (``None``: every image was had).
    """

    def __init__(
        self,
        query: Callable[[int], Any] | None,
        ood: Callable[[int], Any] | None = None,
        class_names: dict[int, str] | None = None,
        size: int = THUMB_SIZE,
        *,
        name: Callable[[str, int, Any], str] | None = None,
        problem: str | None = None,
    ) -> None:
        self._query, self._ood, self._name = query, ood, name
        self.class_names = dict(class_names or {})
        self.size = int(size)
        self.problem = problem
        self.names: dict[str, str] = {}
        self.why: dict[str, str] = {}
        self._cache: dict[str, str] = {}

    def _thumb(self, kind: str, fn: Callable[[int], Any] | None, i: int) -> str | None:
        key = f"{kind}{int(i)}"
        if key not in self._cache:
            if fn is None:
                return None
            try:
                image = fn(int(i))
            except (OSError, ValueError) as exc:
                # a file gone or changed since the run: the page says so instead of a picture
                self.problem = self.problem or f"{exc}"
                self.why[key] = f"{exc}"
                return None
            self._cache[key] = png_data_uri(image, self.size)
            if self._name is not None:
                self.names[key] = self._name(kind, int(i), image)
        return self._cache[key]

    def query(self, i: int) -> str | None:
        """Thumbnail of downstream query ``i`` (``None`` when the images are not available)."""
        return self._thumb("q", self._query, i)

    def ood(self, i: int) -> str | None:
        """Thumbnail of OOD image ``i`` (``None`` without OOD images)."""
        return self._thumb("o", self._ood, i)


def _images_config(record: QueryRecord) -> RunConfig:
    """The run's data settings from its record, with the images themselves as the data (a
    frozen-feature run rebuilt without its feature store)."""
    cfg = record.meta.get("config")
    if not isinstance(cfg, dict) or "data" not in cfg:
        raise ValueError("the query record keeps no data settings to rebuild its images")
    return RunConfig.from_dict(
        {
            "dataset": str(record.meta.get("dataset", "fashion_mnist")),
            "estimator": {"name": str(record.meta.get("name", "report"))},
            "data": cfg["data"],
            "backbone": {**cfg.get("backbone", {}), "freeze": False},
        }
    )


def _check_ids(
    name: str, ids: np.ndarray, dataset: Any, what: str, cache: dict[str, Any], key: str
) -> None:
    """Raise unless the rebuilt ``dataset``'s images have the digests the record kept
    (the rebuilt set's ids are computed once per ``key`` and kept in ``cache``)."""
    if key not in cache:
        cache[key] = source_ids([pixel_digest(dataset[i][0]) for i in range(len(dataset))])
    found = cache[key]
    bad = np.flatnonzero(found != ids)
    if bad.size:
        raise ValueError(
            f"{bad.size} of {ids.size} rebuilt {what} images (first: {name} {int(bad[0])}) are "
            "not the images the run scored: the data changed since the run"
        )


def _dataset_source(record: QueryRecord, cache: dict[str, Any], size: int) -> ImageSource:
    """Images of a run: the run's data rebuilt from the settings in its record."""
    run_cfg = _images_config(record)
    # the estimators of a benchmark share their data: one rebuild for all their records
    settings = run_cfg.to_dict()
    key = json.dumps(
        {k: settings[k] for k in ("dataset", "data", "backbone")}, sort_keys=True, default=str
    )
    if key not in cache:
        cache[key] = build_data(run_cfg).sets
    sets = cache[key]
    test, ood = sets.test, sets.ood
    if len(test) != len(record.u):
        raise ValueError(
            f"the rebuilt downstream set holds {len(test)} images, the record {len(record.u)} "
            "queries: the data changed since the run"
        )
    if ood is not None and len(ood) != len(record.ood_u):
        ood = None  # the record kept no OOD u for these images
    if record.source.size:
        _check_ids("query", record.source, test, "query", cache, key + " test ids")
    elif isinstance(getattr(test, "targets", None), torch.Tensor):
        # a record from before the images' ids were kept: the classes of an in-memory set
        # are checked at once (of any other set, image by image as it is read)
        bad = np.flatnonzero(test.targets.cpu().numpy() != record.label)
        if bad.size:
            raise ValueError(
                f"query {int(bad[0])}: the rebuilt data give class "
                f"{int(test.targets[bad[0]])}, the record {int(record.label[bad[0]])}: the "
                "data changed since the run"
            )
    if ood is not None and record.ood_source.size:
        _check_ids("OOD image", record.ood_source, ood, "OOD", cache, key + " ood ids")

    def name(kind: str, i: int, image: Any) -> str:
        which = "test" if kind == "q" else "OOD"
        return f"{sets.name} {which} #{i} sha1:{pixel_digest(image)}"

    def query(i: int) -> Any:
        img, label = test[i]
        if not record.source.size and int(label) != int(record.label[i]):
            # a record from before the images' ids were kept: at least the classes must agree
            raise ValueError(
                f"query {i}: the rebuilt data give class {int(label)}, the record "
                f"{int(record.label[i])}: the data changed since the run"
            )
        return img

    # the class names the data set declares (a folder set's come from its files: none here)
    names = dict(enumerate(dataset_classes(sets.name))) if sets.name in DATASETS else {}
    return ImageSource(
        query, None if ood is None else (lambda i: ood[i][0]), names, size, name=name
    )


def _folder_source(record: QueryRecord, size: int) -> ImageSource:
    """Images of a folder record: its files (relative to ``meta["root"]``), each checked
    against the digest of the file the run scored (where the record keeps them): a file
    changed or gone since the run is not drawn, and the page says which and why."""
    root = Path(record.meta.get("root", "."))
    paths = list(record.meta["paths"])
    names = {i: str(c) for i, c in enumerate(record.meta.get("classes") or [])}
    kept = record.source if record.source.size == len(paths) else None

    def query(i: int) -> Any:
        try:
            data = (root / paths[i]).read_bytes()
        except FileNotFoundError:
            raise ValueError(f"{paths[i]} is missing since the run") from None
        except OSError as exc:
            raise ValueError(f"{paths[i]} cannot be read ({exc.strerror or exc})") from None
        if kept is not None and source_ids([file_digest(data)])[0] != kept[i]:
            raise ValueError(
                f"{paths[i]} changed since the run (its bytes are not those of the image scored)"
            )
        # a file the run decoded is read whatever its size; an unchecked one within the limit
        return read_image(data, None if kept is not None else DEFAULT_MAX_PIXELS, keep_grey=True)

    return ImageSource(query, None, names, size, name=lambda kind, i, image: str(paths[i]))


def image_source(
    record: QueryRecord, cache: dict[str, Any] | None = None, size: int = THUMB_SIZE
) -> ImageSource:
    """The :class:`ImageSource` of ``record``: its folder's files or its run's data.

    ``cache`` (a dict shared across the records of a benchmark) keeps rebuilt data sets.
    Where the images cannot be had back, the source has none and says why
    (``ImageSource.problem``).
    """
    if "paths" in record.meta:
        return _folder_source(record, size)
    try:
        return _dataset_source(record, {} if cache is None else cache, size)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        return ImageSource(None, problem=f"{exc}")
