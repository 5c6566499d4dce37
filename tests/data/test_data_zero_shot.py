"""The embedded default zero-shot data, the fallback, and the registry."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import bayesurl.data.fmnist as fm_mod
from bayesurl.data import (
    DEFAULT_FASHION_MNIST_ROOT,
    ImageTensorDataset,
    ZeroShotOptions,
    available_datasets,
    capped,
    default_transform,
    default_zero_shot,
    digits,
    get_dataset,
    synthetic_ood,
)

REAL = os.path.isfile(os.path.join(DEFAULT_FASHION_MNIST_ROOT, "train-images-idx3-ubyte.gz"))


def _keys(ds):
    return [bytes(im.numpy().tobytes()) for im in ds.images]


def _assert_protocol(d, upstream, downstream):
    assert d.upstream_classes == list(upstream) and d.downstream_classes == list(downstream)
    assert set(upstream).isdisjoint(downstream)
    # train / val / id_test are relabelled to 0..K-1 in upstream order
    k = len(upstream)
    for ds in (d.train, d.val, d.id_test):
        assert set(ds.targets.tolist()) <= set(range(k))
    assert set(d.test.targets.tolist()) == set(downstream)
    assert d.num_train_classes == k
    for ds in (d.train, d.val, d.test, d.id_test, d.ood):
        assert ds.images.dtype == torch.uint8 and ds.images.shape[1:] == d.image_shape


def test_digits_fallback_protocol():
    d = default_zero_shot(force_digits=True)
    assert d.name == "digits" and d.ood_name == "noise" and d.image_shape == (1, 28, 28)
    _assert_protocol(d, range(5), range(5, 10))
    full = digits(size=28)
    up = full.targets < 5
    # train + val + id_test partition the upstream digits exactly (as multisets)
    parts = sorted(_keys(d.train) + _keys(d.val) + _keys(d.id_test))
    assert parts == sorted(_keys(ImageTensorDataset(full.images[up], full.targets[up])))
    assert len(d.test) == int((~up).sum())
    assert len(d.id_test) == pytest.approx(0.2 * int(up.sum()), abs=5)
    assert len(d.val) == pytest.approx(0.1 * (int(up.sum()) - len(d.id_test)), abs=5)
    # labels survive the relabelling: an image's train label is its digit
    lut = {k: int(y) for k, y in zip(_keys(full), full.targets)}
    for key, y in zip(_keys(d.train)[:50], d.train.targets[:50]):
        assert lut[key] == d.upstream_classes[int(y)]


def test_reproducible_caps_seeds_and_val_classes():
    a = default_zero_shot(force_digits=True, max_train=200, max_test=100, max_ood=50, seed=1)
    b = default_zero_shot(force_digits=True, max_train=200, max_test=100, max_ood=50, seed=1)
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.ood.images, b.ood.images)
    assert len(a.train) + len(a.val) == 200 and len(a.test) == 100 and len(a.ood) == 50
    assert torch.bincount(a.train.targets).min() >= 35  # class-balanced cap
    c = default_zero_shot(force_digits=True, class_seed=3, max_ood=10)
    c2 = default_zero_shot(force_digits=True, class_seed=3, max_ood=10)
    assert c.upstream_classes == c2.upstream_classes != [0, 1, 2, 3, 4]
    _assert_protocol(c, c.upstream_classes, c.downstream_classes)
    e = default_zero_shot(force_digits=True, upstream=[1, 3], downstream=[8], max_ood=10)
    _assert_protocol(e, [1, 3], [8])
    v = default_zero_shot(force_digits=True, val_classes=[3, 4], max_ood=10)
    assert v.num_train_classes == 3 and set(v.train.targets.tolist()) == {0, 1, 2}
    assert v.upstream_classes == [0, 1, 2] and v.info["val_classes"] == [3, 4]
    assert set(v.id_test.targets.tolist()) == {0, 1, 2}
    assert set(v.val.targets.tolist()) == {0, 1} and len(v.val) > 0
    with pytest.raises(ValueError, match="val_classes"):
        default_zero_shot(force_digits=True, val_classes=[7])
    with pytest.raises(ValueError, match="disjoint"):
        default_zero_shot(force_digits=True, upstream=[1, 2], downstream=[2, 3])
    with pytest.raises(ValueError, match="max_train"):
        default_zero_shot(force_digits=True, max_train=0)
    with pytest.raises(ValueError, match="val_fraction"):
        default_zero_shot(force_digits=True, val_fraction=1.0)
    z = default_zero_shot(force_digits=True, val_fraction=0.0, max_ood=10)
    assert len(z.val) == 0


def test_options_object_and_keywords_build_the_same_sets():
    """A ZeroShotOptions, the same settings as keywords, and a ZeroShotOptions with fields
    replaced by keywords give the same images and labels; a mistyped setting is refused by
    name, a bad value when the options are built."""
    kw = dict(force_digits=True, max_train=120, max_test=60, max_ood=20, seed=2, class_seed=1)
    by_keywords = default_zero_shot(**kw)
    opts = ZeroShotOptions(**{**kw, "seed": 5, "max_test": 10})
    for d in (
        default_zero_shot(None, ZeroShotOptions(**kw)),
        default_zero_shot(None, opts, seed=2, max_test=60),
    ):
        assert d.upstream_classes == by_keywords.upstream_classes
        for key in ("train", "val", "test", "id_test", "ood"):
            a, b = getattr(d, key), getattr(by_keywords, key)
            assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets), key
    with pytest.raises(TypeError, match="'max_tests'"):
        default_zero_shot(force_digits=True, max_tests=5)
    with pytest.raises(TypeError, match="ZeroShotOptions"):
        default_zero_shot(None, {"force_digits": True})
    with pytest.raises(ValueError, match="max_ood"):
        ZeroShotOptions(max_ood=0)
    # a fraction is only checked where it is used (not beside class-disjoint validation)
    assert ZeroShotOptions(val_classes=[3], val_fraction=1.0).val_fraction == 1.0


def test_capped_is_a_seeded_class_balanced_subset():
    ds = ImageTensorDataset(torch.zeros(30, 2, 2, dtype=torch.uint8), torch.arange(30) % 3)
    assert capped(ds, None) is ds and capped(ds, 30) is ds
    small = capped(ds, 9, seed=4)
    assert torch.bincount(small.targets).tolist() == [3, 3, 3]
    assert torch.equal(small.targets, capped(ds, 9, seed=4).targets)


def test_transforms_and_fallback_warning(tmp_path, monkeypatch):
    d = default_zero_shot(force_digits=True, max_train=50, transform=default_transform(3))
    x, y = d.test[0]
    assert x.shape == (3, 28, 28) and x.dtype == torch.float32
    monkeypatch.setattr(fm_mod, "DEFAULT_FASHION_MNIST_ROOT", str(tmp_path / "none"))
    with pytest.warns(UserWarning, match="digits"):
        f = default_zero_shot(max_train=50)
    assert f.name == "digits"
    with pytest.raises(FileNotFoundError, match="explicit"):
        default_zero_shot(tmp_path / "explicit")


def test_synthetic_ood():
    a = synthetic_ood(10, 28, seed=0)
    assert torch.equal(a.images, synthetic_ood(10, 28, seed=0).images)
    assert a.images.shape == (10, 1, 28, 28) and int(a.images.max()) == 255
    assert int(a.images.amin(dim=(1, 2, 3)).max()) == 0
    # smooth: neighbouring pixels differ far less than in i.i.d. noise (mean |diff| ~ 85)
    assert (a.images.float().diff(dim=-1).abs().mean()) < 30
    with pytest.raises(ValueError):
        synthetic_ood(0)


def test_fashion_mnist_default_on_fabricated_root(tmp_path, fake_fmnist_writer):
    fake_fmnist_writer(str(tmp_path), n_train=100, n_test=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = default_zero_shot(tmp_path)
    assert d.name == "fashion_mnist" and d.ood_name == "digits" and len(d.ood) == 1797
    _assert_protocol(d, range(5), range(5, 10))
    # fabricated images are distinct: no train / val image reappears in the held-out sets
    held = set(_keys(d.id_test)) | set(_keys(d.test))
    assert held.isdisjoint(_keys(d.train) + _keys(d.val))
    assert set(_keys(d.train)).isdisjoint(_keys(d.val))
    assert len(d.train) + len(d.val) == 50 and len(d.test) == 30 and len(d.id_test) == 30


@pytest.mark.skipif(not REAL, reason="Fashion-MNIST files not installed")
def test_real_default_sizes():
    d = default_zero_shot(max_train=3000, max_test=1000)
    assert d.name == "fashion_mnist"
    assert len(d.train) == 2700 and len(d.val) == 300
    assert len(d.test) == 1000 and len(d.id_test) == 1000 and len(d.ood) == 1797
    _assert_protocol(d, range(5), range(5, 10))


def test_registry(tmp_path):
    names = ["cars", "clipart", "cub", "digits", "fashion_mnist", "imagenet", "sop"]
    assert available_datasets() == names
    with pytest.raises(ValueError, match=r"valid names: \['cars', 'clipart', 'cub', 'digits'"):
        get_dataset("nosuch")
    with pytest.raises(FileNotFoundError, match="train"):
        get_dataset("imagenet", tmp_path)  # an upstream ImageFolder: root/train/<class>/*
    assert len(get_dataset("digits", split="all", size=28)) == 1797
    if REAL:
        assert len(get_dataset("Fashion-MNIST", split="test")) == 10000


def test_one_dataset_registry_for_cli_pipeline_and_checkpoints():
    """The CLI, the run pipeline and the checkpoint loader read one table of names."""
    from bayesurl.commands import train, wrap
    from bayesurl.data.registry import DatasetKind, dataset_kind, dataset_names
    from bayesurl.runs.runner import CHECKPOINT_DATASETS

    embedded = ("default", "fashion_mnist", "digits")
    assert dataset_names(DatasetKind.EMBEDDED) == embedded
    assert wrap.DATASETS == CHECKPOINT_DATASETS == embedded
    assert train.DATASETS == (*embedded, "cub", "cars", "sop")
    assert dataset_kind("Fashion-MNIST") == ("fashion_mnist", DatasetKind.EMBEDDED)
    assert dataset_kind("imagenet")[1] is DatasetKind.UPSTREAM
    with pytest.raises(ValueError, match=r"unknown `--dataset` 'imagenet'; valid names: default"):
        dataset_kind("imagenet", argument="--dataset", allowed=train.DATASETS)
