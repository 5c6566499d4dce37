"""IDX reader against torchvision's reader, on fabricated and (when present) real files."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
import torch
from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

from bayesurl.data import DEFAULT_FASHION_MNIST_ROOT, read_idx

REAL = os.path.isfile(os.path.join(DEFAULT_FASHION_MNIST_ROOT, "train-images-idx3-ubyte.gz"))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_matches_torchvision(tmp_path, idx_writer, dtype, suffix):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((7, 5, 3)) * 50).astype(dtype)
    path = idx_writer(str(tmp_path / f"x-idx3{suffix}"), arr)
    ours = read_idx(path)
    # torchvision's reader takes uncompressed files only: give it a plain copy
    plain = idx_writer(str(tmp_path / "plain-idx3"), arr, compress=False)
    ref = read_sn3_pascalvincent_tensor(plain, strict=False)
    assert ours.dtype == ref.dtype
    assert torch.equal(ours, ref)
    np.testing.assert_array_equal(ours.numpy(), arr)


def test_one_dim_labels(tmp_path, idx_writer):
    lbl = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.uint8)
    path = idx_writer(str(tmp_path / "l.gz"), lbl)
    assert read_idx(path).tolist() == lbl.tolist()


def test_errors(tmp_path, idx_writer):
    with pytest.raises(FileNotFoundError, match="nope"):
        read_idx(tmp_path / "nope.gz")
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x12\x34\x08\x01\x00\x00\x00\x02ab")
    with pytest.raises(ValueError, match="IDX header"):
        read_idx(bad)
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    path = idx_writer(str(tmp_path / "t"), arr)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-1])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(path)
    notgz = tmp_path / "plain.gz"
    notgz.write_bytes(b"not a gzip stream at all")
    with pytest.raises(ValueError, match="not a readable IDX"):
        read_idx(notgz)


@pytest.mark.skipif(not REAL, reason="Fashion-MNIST files not installed")
def test_real_files_match_torchvision(tmp_path):
    for stem, shape in (
        ("t10k-images-idx3-ubyte.gz", (10000, 28, 28)),
        ("t10k-labels-idx1-ubyte.gz", (10000,)),
    ):
        path = os.path.join(DEFAULT_FASHION_MNIST_ROOT, stem)
        ours = read_idx(path)
        assert tuple(ours.shape) == shape
        plain = tmp_path / stem[:-3]
        with gzip.open(path, "rb") as src:
            plain.write_bytes(src.read())
        assert torch.equal(ours, read_sn3_pascalvincent_tensor(str(plain), strict=False))
    labels = read_idx(os.path.join(DEFAULT_FASHION_MNIST_ROOT, "t10k-labels-idx1-ubyte.gz"))
    assert torch.bincount(labels.long()).tolist() == [1000] * 10
