"""Tensor transforms: exact identities, references by hand, batch/per-sample agreement."""

from __future__ import annotations

import pickle

import pytest
import torch

from bayesurl.data import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    GaussianNoise,
    Normalize,
    RandomResizedCropFlip,
    RepeatChannels,
    ToFloat,
    TwoViews,
    default_augmentation,
    default_transform,
)


def _imgs(n=4, c=1, s=28, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, c, s, s), generator=g, dtype=torch.uint8)


def test_default_transform_matches_formula():
    x = _imgs()
    t = default_transform()
    want = (x.double() / 255 - FASHION_MNIST_MEAN) / FASHION_MNIST_STD
    torch.testing.assert_close(t(x).double(), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(t(x[1]), t(x)[1])  # per sample == batched
    t3 = default_transform(3)
    out = t3(x)
    assert out.shape == (4, 3, 28, 28) and torch.equal(out[:, 0], out[:, 2])
    assert default_transform(normalize=False)(x).max() <= 1.0


def test_dtype_and_validation():
    x = _imgs().double() / 255
    assert ToFloat()(x) is x
    assert Normalize(0.5, 0.25)(x).dtype == torch.float64
    torch.testing.assert_close(Normalize([0.5], [0.25])(x), (x - 0.5) / 0.25)
    with pytest.raises(ValueError, match="std"):
        Normalize(0.0, 0.0)
    with pytest.raises(ValueError, match="floating"):
        Normalize()(_imgs())
    with pytest.raises(ValueError, match="1 channel"):
        RepeatChannels(3)(torch.zeros(2, 2, 4, 4))
    with pytest.raises(ValueError, match=r"\[C,H,W\]"):
        RandomResizedCropFlip()(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="scale"):
        RandomResizedCropFlip(scale=(0.0, 1.0))


def test_crop_identity_and_flip_are_exact():
    x = _imgs(3).double() / 255
    ident = RandomResizedCropFlip(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip_p=0.0, degrees=0.0)
    torch.testing.assert_close(ident(x), x, atol=1e-12, rtol=0)
    flip = RandomResizedCropFlip(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip_p=1.0, degrees=0.0)
    torch.testing.assert_close(flip(x), torch.flip(x, dims=[-1]), atol=1e-12, rtol=0)


def _sample_loop(img, theta):
    """Brute-force affine resampling: bilinear, zero padding, half-pixel centres (float64)."""
    c, h, w = img.shape
    out = torch.zeros_like(img)
    for i in range(h):
        for j in range(w):
            xn, yn = (2 * j + 1) / w - 1, (2 * i + 1) / h - 1
            sx = theta[0, 0] * xn + theta[0, 1] * yn + theta[0, 2]
            sy = theta[1, 0] * xn + theta[1, 1] * yn + theta[1, 2]
            px, py = ((sx + 1) * w - 1) / 2, ((sy + 1) * h - 1) / 2
            x0, y0 = int(torch.floor(px)), int(torch.floor(py))
            for yy, wy in ((y0, 1 - (py - y0)), (y0 + 1, py - y0)):
                for xx, wx in ((x0, 1 - (px - x0)), (x0 + 1, px - x0)):
                    if 0 <= yy < h and 0 <= xx < w:
                        out[:, i, j] += wy * wx * img[:, yy, xx]
    return out


def test_crop_flip_rotation_match_bruteforce_sampler():
    x = _imgs(3, c=2, s=9).double() / 255
    aug = RandomResizedCropFlip(scale=(0.3, 0.9), flip_p=0.5, degrees=30.0)
    out = aug(x, torch.Generator().manual_seed(4))
    thetas = aug.sample_theta(3, torch.Generator().manual_seed(4))
    for k in range(3):
        torch.testing.assert_close(out[k], _sample_loop(x[k], thetas[k]), atol=1e-10, rtol=0)
    # the crop area share lies in `scale`: |det| of the linear part = w * h = area
    dets = torch.linalg.det(aug.sample_theta(500, torch.Generator().manual_seed(0))[:, :, :2])
    assert dets.abs().min() >= 0.3 - 1e-9 and dets.abs().max() <= 0.9 + 1e-9
    assert (dets < 0).any() and (dets > 0).any()  # some flipped, some not


def test_seeded_batch_and_independent_views():
    x = _imgs(8)
    aug = default_augmentation()
    a = aug(x, torch.Generator().manual_seed(1))
    b = aug(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (8, 1, 28, 28) and a.dtype == torch.float32
    c = aug(x, torch.Generator().manual_seed(2))
    assert not torch.equal(a, c)
    v1, v2 = TwoViews(aug)(x)
    assert v1.shape == v2.shape == (8, 1, 28, 28) and not torch.equal(v1, v2)
    single = aug(x[0])
    assert single.shape == (1, 28, 28)
    assert default_augmentation(3)(x).shape == (8, 3, 28, 28)


def test_noise_statistics_and_clamp():
    x = torch.full((64, 1, 28, 28), 0.5, dtype=torch.float64)
    out = GaussianNoise(0.1)(x, torch.Generator().manual_seed(0))
    assert out.dtype == torch.float64
    assert (out - 0.5).std().item() == pytest.approx(0.1, rel=0.05)
    assert GaussianNoise(5.0)(x).min() >= 0 and GaussianNoise(5.0)(x).max() <= 1


def test_picklable():
    for t in (default_transform(3), default_augmentation(), TwoViews(default_augmentation())):
        t2 = pickle.loads(pickle.dumps(t))
        assert type(t2) is type(t)
    with pytest.raises(TypeError):
        TwoViews(3)


def test_plot_images(tmp_path):
    from bayesurl.data import plot_images

    x = _imgs(10)
    fig = plot_images(x, torch.arange(10) % 3, ncols=4, class_names=["a", "b", "c"], title="t")
    drawn = [ax for ax in fig.axes if ax.images]
    assert len(fig.axes) == 12 and len(drawn) == 10
    assert [ax.get_title() for ax in drawn[:4]] == ["a", "b", "c", "a"]
    # grayscale pixels are min-max scaled per image
    shown = drawn[0].images[0].get_array()
    ref = x[0, 0].double()
    torch.testing.assert_close(
        torch.as_tensor(shown.data), (ref - ref.min()) / (ref.max() - ref.min())
    )
    rgb = plot_images(default_transform(3)(x[:2]))
    assert rgb.axes[0].images[0].get_array().shape == (28, 28, 3)
    fig.savefig(tmp_path / "grid.png")
    assert (tmp_path / "grid.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="length mismatch"):
        plot_images(x, [1, 2])
    with pytest.raises(ValueError, match="empty"):
        plot_images(x[:0])
