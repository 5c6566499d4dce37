"""Fashion-MNIST and digits loaders against torchvision / scikit-learn / a brute-force resize."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import bayesurl.data.fmnist as fm_mod
from bayesurl.data import (
    DEFAULT_FASHION_MNIST_ROOT,
    ImageTensorDataset,
    digits,
    fashion_mnist,
    find_fashion_mnist,
    subset,
    upsample_uint8,
)

REAL = os.path.isfile(os.path.join(DEFAULT_FASHION_MNIST_ROOT, "train-images-idx3-ubyte.gz"))


def test_fashion_mnist_torchvision_layout_matches_torchvision(tmp_path, fake_fmnist_writer):
    from torchvision.datasets import FashionMNIST

    raw = tmp_path / "FashionMNIST" / "raw"
    truth = fake_fmnist_writer(str(raw), gz=False)  # torchvision's raw/ holds unpacked files
    for split in ("train", "test"):
        ds = fashion_mnist(tmp_path, split)
        imgs, lbls = truth[split]
        assert ds.images.shape == (len(lbls), 1, 28, 28) and ds.images.dtype == torch.uint8
        np.testing.assert_array_equal(ds.images[:, 0].numpy(), imgs)
        assert ds.targets.tolist() == lbls.tolist()
        ref = FashionMNIST(str(tmp_path), train=split == "train", download=False)
        assert torch.equal(ds.images[:, 0], ref.data)
        assert torch.equal(ds.targets, ref.targets)
    # flat layout (the Debian package's) works as well
    fake_fmnist_writer(str(tmp_path / "flat"))
    assert find_fashion_mnist(tmp_path / "flat") == str(tmp_path / "flat")


def test_fashion_mnist_item_and_transform(tmp_path, fake_fmnist_writer):
    truth = fake_fmnist_writer(str(tmp_path))
    ds = fashion_mnist(tmp_path, "train")
    x, y = ds[3]
    assert x.dtype == torch.float32 and x.shape == (1, 28, 28)
    torch.testing.assert_close(
        x[0], torch.as_tensor(truth["train"][0][3], dtype=torch.float32) / 255
    )
    assert y == int(truth["train"][1][3])
    ds2 = ds.with_transform(lambda im: im.sum())
    assert ds2[3][0] == int(truth["train"][0][3].astype(np.int64).sum())


def test_fashion_mnist_missing_root(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="apt-get install -y dataset-fashion-mnist") as e:
        fashion_mnist(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(e.value)
    monkeypatch.setattr(fm_mod, "DEFAULT_FASHION_MNIST_ROOT", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="gone"):
        fashion_mnist()
    with pytest.raises(ValueError, match="split"):
        fashion_mnist(tmp_path, "validation")


@pytest.mark.skipif(not REAL, reason="Fashion-MNIST files not installed")
def test_real_fashion_mnist():
    ds = fashion_mnist(split="test")
    assert len(ds) == 10000 and ds.image_shape == (1, 28, 28)
    assert torch.bincount(ds.targets).tolist() == [1000] * 10
    assert ds.classes[9] == "Ankle boot"


def test_digits_match_sklearn():
    ref = load_digits()
    ds = digits(split="all")
    assert len(ds) == 1797 and ds.images.shape == (1797, 1, 8, 8)
    expected = np.round(ref.images * 255.0 / 16.0).astype(np.uint8)
    np.testing.assert_array_equal(ds.images[:, 0].numpy(), expected)
    assert ds.targets.tolist() == ref.target.tolist()


def _bilinear_loop(img: np.ndarray, size: int) -> np.ndarray:
    """Brute-force bilinear resize with half-pixel centres and edge clamping (float64)."""
    h, w = img.shape
    out = np.zeros((size, size))
    for i in range(size):
        for j in range(size):
            y = max((i + 0.5) * h / size - 0.5, 0.0)
            x = max((j + 0.5) * w / size - 0.5, 0.0)
            y0, x0 = min(int(np.floor(y)), h - 1), min(int(np.floor(x)), w - 1)
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            dy, dx = y - y0, x - x0
            out[i, j] = (
                img[y0, x0] * (1 - dy) * (1 - dx)
                + img[y0, x1] * (1 - dy) * dx
                + img[y1, x0] * dy * (1 - dx)
                + img[y1, x1] * dy * dx
            )
    return out


def test_digits_upsampled_match_bruteforce_bilinear():
    ref = load_digits()
    ds = digits(split="all", size=28)
    assert ds.images.shape == (1797, 1, 28, 28)
    for k in (0, 17, 1796):
        want = _bilinear_loop(ref.images[k].astype(np.float64), 28) * 255.0 / 16.0
        got = ds.images[k, 0].numpy().astype(np.float64)
        assert np.abs(got - np.round(want)).max() <= 1  # rounding of float32 vs float64
    assert int(ds.images.max()) <= 255 and int(ds.images.max()) >= 250


def test_digits_split_disjoint_stratified():
    tr, te = digits(split="train", seed=3), digits(split="test", seed=3)
    assert len(tr) + len(te) == 1797
    assert set(tr.targets.tolist()) == set(te.targets.tolist()) == set(range(10))
    counts = torch.bincount(te.targets).double() / torch.bincount(digits().targets).double()
    assert torch.all((counts - 0.2).abs() < 0.02)
    # the multiset of images is preserved (nothing dropped, nothing duplicated)
    key = lambda d: sorted(bytes(im.numpy().tobytes()) for im in d.images)  # noqa: E731
    assert sorted(key(tr) + key(te)) == key(digits())
    again = digits(split="test", seed=3)
    assert torch.equal(again.images, te.images)
    with pytest.raises(ValueError, match="split"):
        digits(split="val")
    with pytest.raises(ValueError, match="root"):
        digits("/some/where")


def test_image_tensor_dataset_checks_and_subset():
    imgs = torch.randint(0, 256, (6, 4, 4), dtype=torch.uint8)
    with pytest.raises(ValueError, match="images"):
        ImageTensorDataset(imgs.float(), torch.arange(6))
    with pytest.raises(ValueError, match="length mismatch"):
        ImageTensorDataset(imgs, torch.arange(5))
    with pytest.raises(ValueError, match="targets"):
        ImageTensorDataset(imgs, torch.arange(6.0))
    ds = ImageTensorDataset(
        imgs, torch.tensor([7, 3, 7, 5, 3, 5]), classes=[str(i) for i in range(8)]
    )
    sub = subset(ds, [0, 1, 3], relabel=True)
    assert sub.targets.tolist() == [2, 0, 1] and sub.classes == ["3", "5", "7"]
    assert torch.equal(sub.images, ds.images[[0, 1, 3]])
    with pytest.raises(ValueError, match="relabel"):
        subset(ds, [0, 1], relabel={7: 0})
    with pytest.raises(ValueError, match="out of range"):
        subset(ds, [6])


def test_upsample_uint8_identity_and_range():
    x = torch.randint(0, 17, (3, 1, 8, 8))
    assert torch.equal(upsample_uint8(x, 8, max_value=16.0), (x * 255.0 / 16).round().byte())


def test_as_tensors_batched_equals_itemwise(cub_root):
    from bayesurl.data import CUB200, as_tensors, default_transform

    ds = digits(split="test", size=28, transform=default_transform(3))
    x, y = as_tensors(ds)
    ref = torch.stack([ds[i][0] for i in range(len(ds))])
    torch.testing.assert_close(x, ref)
    assert torch.equal(y, ds.targets) and x.shape == (len(ds), 3, 28, 28)
    x0, _ = as_tensors(ds.with_transform(None))
    torch.testing.assert_close(x0, ds.images.float() / 255)
    from torchvision.transforms.functional import pil_to_tensor

    sub = subset(CUB200(cub_root[0], "test"), [0, 5, 9])
    xf, yf = as_tensors(sub, pil_to_tensor)
    assert xf.shape == (3, 3, 4, 5) and yf.tolist() == sub.targets.tolist()
    with pytest.raises(ValueError, match="empty"):
        as_tensors(subset(ds, []))
