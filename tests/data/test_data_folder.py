"""Scanning and reading a folder of one's own images (bayesurl.data.folder)."""

import hashlib

import pytest
import torch
from PIL import Image

from bayesurl.data.folder import ReadableImages, collate_readable, scan_image_folder


def _img(path, value=128):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 10), (value, 0, 255 - value)).save(path)


def test_labelled_and_flat_layouts(tmp_path):
    for c in ("b", "a"):
        for i in range(2):
            _img(tmp_path / "lab" / c / f"{i}.png")
    (tmp_path / "lab" / "a" / "readme.txt").write_text("x")
    scan = scan_image_folder(tmp_path / "lab")
    assert scan.classes == ["a", "b"]
    assert scan.paths == ["a/0.png", "a/1.png", "b/0.png", "b/1.png"]
    assert scan.labels == [0, 0, 1, 1] and scan.ignored == ["a/readme.txt"]
    _img(tmp_path / "flat" / "x.png")
    _img(tmp_path / "flat" / "y.JPG")
    flat = scan_image_folder(tmp_path / "flat")
    assert flat.labels is None and flat.paths == ["x.png", "y.JPG"]


def test_bad_layouts_are_named(tmp_path):
    with pytest.raises(FileNotFoundError):
        scan_image_folder(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no image"):
        scan_image_folder(tmp_path / "empty")
    _img(tmp_path / "mixed" / "top.png")
    _img(tmp_path / "mixed" / "c" / "sub.png")
    with pytest.raises(ValueError, match="top.png"):
        scan_image_folder(tmp_path / "mixed")
    _img(tmp_path / "deep" / "a" / "b" / "x.png")
    with pytest.raises(ValueError, match="deep"):
        scan_image_folder(tmp_path / "deep")


def test_unreadable_file_gives_its_error_and_the_batch_keeps_the_rest(tmp_path):
    _img(tmp_path / "a.png", 10)
    (tmp_path / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    _img(tmp_path / "c.png", 200)
    data = ReadableImages(scan_image_folder(tmp_path), 8)
    items = [data[i] for i in range(3)]
    assert items[1][0] is None and "not an image" in items[1][3] and items[1][2] == 1
    x, y, ids, bad, digests = collate_readable(items)
    assert x.dtype == torch.uint8 and x.shape == (2, 3, 8, 8)
    assert ids.tolist() == [0, 2] and y.tolist() == [-1, -1] and [i for i, _ in bad] == [1]
    # each decoded image's file digest: the SHA-1 of its bytes
    want = [hashlib.sha1((tmp_path / n).read_bytes()).hexdigest() for n in ("a.png", "c.png")]
    assert digests == want
    # the pixels are the file's: a uniform image stays uniform after resize and crop
    assert x[0, 0].unique().tolist() == [10] and x[1, 2].unique().tolist() == [55]
