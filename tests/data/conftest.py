"""Fabricated data trees in the original on-disk layouts (tiny images, written per test)."""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import pytest

_CODES = {
    np.uint8: 0x08,
    np.int8: 0x09,
    np.int16: 0x0B,
    np.int32: 0x0C,
    np.float32: 0x0D,
    np.float64: 0x0E,
}


def write_idx(path: str, arr: np.ndarray, compress: bool | None = None) -> str:
    """Write ``arr`` in IDX format (big endian), gzip'ed when the path ends in .gz."""
    code = _CODES[arr.dtype.type]
    header = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    payload = arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    compress = path.endswith(".gz") if compress is None else compress
    opener = gzip.open if compress else open
    with opener(path, "wb") as fh:
        fh.write(header + payload)
    return path


def write_fake_fmnist(
    folder: str, n_train: int = 40, n_test: int = 20, seed: int = 0, gz: bool = True
) -> dict:
    """Four IDX files of random 28x28 images and labels 0..9 into ``folder``."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    out = {}
    for split, n, stem in (("train", n_train, "train"), ("test", n_test, "t10k")):
        imgs = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        lbls = (np.arange(n) % 10).astype(np.uint8)
        rng.shuffle(lbls)
        ext = ".gz" if gz else ""
        write_idx(os.path.join(folder, f"{stem}-images-idx3-ubyte{ext}"), imgs)
        write_idx(os.path.join(folder, f"{stem}-labels-idx1-ubyte{ext}"), lbls)
        out[split] = (imgs, lbls)
    return out


@pytest.fixture
def idx_writer():
    """The IDX writer, for tests that fabricate files."""
    return write_idx


@pytest.fixture
def fake_fmnist_writer():
    """Writer of four small fabricated Fashion-MNIST IDX files."""
    return write_fake_fmnist


@pytest.fixture
def cars_mat_writer():
    """Writer of a cars_annos.mat file."""
    return write_cars_mat


def _tiny_image(path: str, value: int) -> None:
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    arr = np.full((4, 5, 3), value % 256, dtype=np.uint8)
    Image.fromarray(arr).save(path)


@pytest.fixture(scope="session")
def cub_root(tmp_path_factory) -> tuple[str, dict[str, int]]:
    """ROOT/CUB_200_2011 with 200 classes x 2 images; returns (ROOT, {abs path: class id})."""
    root = str(tmp_path_factory.mktemp("cubroot"))
    base = os.path.join(root, "CUB_200_2011")
    os.makedirs(base)
    truth, img_lines, lbl_lines, cls_lines = {}, [], [], []
    image_id = 0
    for c in range(1, 201):
        folder = f"{c:03d}.Bird_{c}"
        cls_lines.append(f"{c} {folder}")
        for k in range(2):
            image_id += 1
            rel = f"{folder}/Bird_{c}_{k}.jpg"
            _tiny_image(os.path.join(base, "images", rel), c)
            img_lines.append(f"{image_id} {rel}")
            lbl_lines.append(f"{image_id} {c}")
            truth[os.path.join(base, "images", rel)] = c
    for name, lines in (
        ("images.txt", img_lines),
        ("image_class_labels.txt", lbl_lines),
        ("classes.txt", cls_lines),
    ):
        with open(os.path.join(base, name), "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return root, truth


def write_cars_mat(path: str, rel_paths: list[str], classes: list[int], n_names: int = 196):
    from scipy.io import savemat

    dt = [
        (f, "O")
        for f in ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")
    ]
    annos = np.zeros((1, len(rel_paths)), dtype=dt)
    for i, (p, c) in enumerate(zip(rel_paths, classes)):
        annos[0, i] = (p, 1, 1, 4, 3, c, i % 2)
    names = np.array([f"Car model {c}" for c in range(1, n_names + 1)], dtype=object)
    savemat(path, {"annotations": annos, "class_names": names.reshape(1, -1)})


@pytest.fixture(scope="session")
def cars_root(tmp_path_factory) -> tuple[str, dict[str, int]]:
    """ROOT/cars_annos.mat + ROOT/car_ims with 196 classes x 2 images."""
    root = str(tmp_path_factory.mktemp("carsroot"))
    rel_paths, classes, truth = [], [], {}
    i = 0
    for c in range(1, 197):
        for _ in range(2):
            i += 1
            rel = f"car_ims/{i:06d}.jpg"
            _tiny_image(os.path.join(root, rel), c)
            rel_paths.append(rel)
            classes.append(c)
            truth[os.path.join(root, rel)] = c
    write_cars_mat(os.path.join(root, "cars_annos.mat"), rel_paths, classes)
    return root, truth


@pytest.fixture(scope="session")
def sop_root(tmp_path_factory) -> tuple[str, dict[str, int]]:
    """ROOT/Stanford_Online_Products with 12 train and 12 test classes (ids 1-12 / 13-24)."""
    root = str(tmp_path_factory.mktemp("soproot"))
    base = os.path.join(root, "Stanford_Online_Products")
    truth, i = {}, 0
    for part, cls_range in (("train", range(1, 13)), ("test", range(13, 25))):
        lines = ["image_id class_id super_class_id path"]
        for c in cls_range:
            sup = 1 + (c - 1) // 6
            for k in range(2):
                i += 1
                rel = f"super{sup}_final/{c}_{k}.JPG"
                _tiny_image(os.path.join(base, rel), c)
                lines.append(f"{i} {c} {sup} {rel}")
                truth[os.path.join(base, rel)] = c
        with open(os.path.join(base, f"Ebay_{part}.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return root, truth
