"""Thumbnails of the images a report shows, as ``data:`` URIs (no file beside the page).

A run's record (:class:`bayesurl.runs.queries.QueryRecord`) names its images by id: the
report rebuilds the run's data from the settings kept in the record
(:func:`bayesurl.runs.data.build_data`) and reads the downstream test image and the OOD
image of each id; a folder's record names its files. Each thumbnail is a small PNG, the
longer side at most ``size`` pixels (small images keep their size; the page scales them up
without smoothing).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bayesurl.data.fmnist import FASHION_MNIST_CLASSES
from bayesurl.runs.config import BackboneConfig, DataConfig, EstimatorConfig, RunConfig
from bayesurl.runs.data import build_data
from bayesurl.runs.queries import QueryRecord

__all__ = ["ImageSource", "image_source", "png_data_uri"]

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
        Longest side of the thumbnail; smaller images are kept as they are.
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
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class ImageSource:
    """The images of one record's data: ``query(i)`` and ``ood(i)`` give thumbnails.

    Parameters
    ----------
    query, ood : callable
        ``id -> image`` (anything :func:`png_data_uri` takes).
    class_names : dict
        Class id -> name shown under the thumbnails.
    size : int
        Thumbnail side.
    """

    def __init__(
        self,
        query: Callable[[int], Any],
        ood: Callable[[int], Any] | None = None,
        class_names: dict[int, str] | None = None,
        size: int = THUMB_SIZE,
    ) -> None:
        self._query, self._ood = query, ood
        self.class_names = dict(class_names or {})
        self.size = int(size)
        self._cache: dict[tuple[str, int], str] = {}

    def query(self, i: int) -> str:
        """Thumbnail of downstream query ``i``."""
        key = ("q", int(i))
        if key not in self._cache:
            self._cache[key] = png_data_uri(self._query(int(i)), self.size)
        return self._cache[key]

    def ood(self, i: int) -> str | None:
        """Thumbnail of OOD image ``i`` (``None`` without OOD images)."""
        if self._ood is None:
            return None
        key = ("o", int(i))
        if key not in self._cache:
            self._cache[key] = png_data_uri(self._ood(int(i)), self.size)
        return self._cache[key]


def _dataset_source(record: QueryRecord, cache: dict[str, Any], size: int) -> ImageSource:
    """Images of a run: the run's data rebuilt from the settings in its record."""
    cfg = record.meta.get("config")
    if not isinstance(cfg, dict) or "data" not in cfg:
        raise ValueError("the query record keeps no data settings to rebuild its images")
    key = json.dumps(cfg, sort_keys=True, default=str)
    if key not in cache:
        run_cfg = RunConfig(
            dataset=str(record.meta.get("dataset", "fashion_mnist")),
            estimator=EstimatorConfig(name=str(record.meta.get("name", "report"))),
            data=DataConfig(**cfg["data"]),
            backbone=BackboneConfig(**cfg.get("backbone", {})),
        )
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

    def query(i: int) -> Any:
        img, label = test[i]
        if int(label) != int(record.label[i]):
            raise ValueError(
                f"query {i}: the rebuilt data give class {int(label)}, the record "
                f"{int(record.label[i])}: the data changed since the run"
            )
        return img

    names = dict(enumerate(FASHION_MNIST_CLASSES)) if sets.name == "fashion_mnist" else {}
    return ImageSource(query, None if ood is None else (lambda i: ood[i][0]), names, size)


def _folder_source(record: QueryRecord, size: int) -> ImageSource:
    """Images of a folder record: its files (relative to ``meta["root"]``)."""
    root = Path(record.meta.get("root", "."))
    paths = list(record.meta["paths"])
    names = {i: str(c) for i, c in enumerate(record.meta.get("classes") or [])}

    def query(i: int) -> Any:
        with Image.open(root / paths[i]) as im:
            im.load()
            return im.convert("RGB") if im.mode not in ("L", "RGB") else im.copy()

    return ImageSource(query, None, names, size)


def image_source(
    record: QueryRecord, cache: dict[str, Any] | None = None, size: int = THUMB_SIZE
) -> ImageSource:
    """The :class:`ImageSource` of ``record``: its folder's files or its run's data.

    ``cache`` (a dict shared across the records of a benchmark) keeps rebuilt data sets.
    """
    if "paths" in record.meta:
        return _folder_source(record, size)
    return _dataset_source(record, {} if cache is None else cache, size)
