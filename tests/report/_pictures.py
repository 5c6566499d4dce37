"""Checks that every thumbnail of a written report is a picture of the image it names.

The reference images are read here independently of bayesurl's data pipeline: FashionMNIST from
its IDX files with numpy (gzip), the OOD digits from scikit-learn resized as the data page
documents (bilinear to 28 x 28, 0-16 -> 0-255), folder images with PIL. Each is found by the
SHA-1 of its pixels, the name the report gives it (``sha1:<hex>``) and the id the run's record
keeps (its first 8 bytes).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
#: Thumbnails smaller than this (either side) are not pictures a person can read.
MIN_SIDE = 16
#: Pixel standard deviation (0-255) below which a thumbnail is a flat square.
MIN_STD = 8.0


def model(html: str) -> dict:
    """The JSON model embedded in a report page."""
    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def decode(uri: str) -> np.ndarray:
    """A ``data:image/png;base64`` URI as a uint8 array (``[H, W]`` or ``[H, W, 3]``)."""
    head, _, data = uri.partition(",")
    assert head == "data:image/png;base64", head
    with Image.open(io.BytesIO(base64.b64decode(data))) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("L") if im.mode in ("L", "P", "1") else im.convert("RGB"))


def _sha1(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()


def idx_images(path: Path) -> np.ndarray:
    raw = gzip.open(path).read()
    n, h, w = (int.from_bytes(raw[i : i + 4], "big") for i in (4, 8, 12))
    return np.frombuffer(raw, np.uint8, offset=16).reshape(n, h, w)


@lru_cache(maxsize=1)
def dataset_images() -> dict[str, np.ndarray]:
    """SHA-1 of the pixels -> image, over all 70,000 FashionMNIST images and the 1,797 digits
    at 28 x 28."""
    from sklearn.datasets import load_digits

    out = {}
    for name in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        for img in idx_images(FASHION_MNIST / name):
            out[_sha1(img)] = img
    d = torch.as_tensor(load_digits().images, dtype=torch.float32)[:, None] * (255.0 / 16.0)
    d = F.interpolate(d, size=(28, 28), mode="bilinear", align_corners=False)
    for img in d.round().clamp(0, 255).to(torch.uint8)[:, 0].numpy():
        out[_sha1(img)] = img
    return out


def enlarged(src: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``src`` with each pixel repeated into a block, to ``shape`` (a whole factor)."""
    f = shape[0] // src.shape[0]
    assert f >= 1 and shape[:2] == (src.shape[0] * f, src.shape[1] * f), (src.shape, shape)
    return np.repeat(np.repeat(src, f, axis=0), f, axis=1)


def assert_pictures(
    html: str,
    records: list | None = None,
    folder: Path | None = None,
) -> dict:
    """Every ``data:`` PNG of ``html`` is a plot or a thumbnail; every thumbnail is a picture
    (both sides >= 16 px, pixel spread) equal to the source image it names.

    ``records``: the runs' query records, whose ids of the shown images must agree with the
    names; ``folder``: the root of a folder run's images (names are paths below it).
    Returns the model.
    """
    m = model(html)
    uris = re.findall(r"data:image/png;base64,[A-Za-z0-9+/=]+", html)
    assert m["thumbs"], "the report shows no thumbnails"
    assert len(uris) == len(m["thumbs"]) + len(m["plots"])
    pictures = {key: decode(uri) for key, uri in m["thumbs"].items()}
    for key, a in pictures.items():
        assert min(a.shape[:2]) >= MIN_SIDE, (key, a.shape)
        assert a.std() > MIN_STD, (key, float(a.std()))
    assert set(m.get("sources", ())) == set(m["thumbs"]), "a thumbnail without its source's name"
    for e in m["estimators"]:
        assert e["images"] is None, e["images"]
    for key, a in pictures.items():
        name = m["sources"][key]
        if folder is not None:
            with Image.open(folder / name) as im:
                src = np.asarray(im.convert("L") if im.mode == "L" else im.convert("RGB"))
        else:
            digest = re.search(r"sha1:([0-9a-f]{40})", name).group(1)
            src = dataset_images().get(digest)
            assert src is not None, f"{key}: {name} is no FashionMNIST image nor digit"
            i = int(key[1:])
            for rec in records or []:
                ids = rec.source if key[0] == "q" else rec.ood_source
                assert int(ids[i]) == int(digest[:16], 16), (key, name)
        np.testing.assert_array_equal(a, enlarged(src, a.shape), err_msg=f"{key} {name}")
    return m
