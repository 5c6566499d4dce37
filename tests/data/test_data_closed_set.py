"""LAM's closed-set split (``bayesurl.data.closed_set``, ``data.split = "closed"``).

References: the fabricated IDX arrays themselves (numpy) and the scikit-learn digits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from bayesurl.data import SPLITS, Split, closed_set, default_zero_shot
from bayesurl.runs import load_recipe
from bayesurl.runs.data import build_data


def _rows(images) -> list[bytes]:
    return [np.asarray(im).reshape(-1).tobytes() for im in images]


def test_closed_set_trains_and_retrieves_on_the_same_classes(tmp_path, fake_fmnist_writer):
    ref = fake_fmnist_writer(str(tmp_path), n_train=100, n_test=60)
    d = closed_set(tmp_path)
    (tr_img, tr_lbl), (te_img, te_lbl) = ref["train"], ref["test"]
    # every training image with its own label, in file order; likewise the test images
    assert _rows(d.train.images) == _rows(tr_img)
    assert d.train.targets.tolist() == tr_lbl.astype(int).tolist()
    assert _rows(d.test.images) == _rows(te_img)
    assert d.test.targets.tolist() == te_lbl.astype(int).tolist()
    assert d.id_test is d.test  # the ID side of OOD AUROC is the retrieval set
    assert d.upstream_classes == d.downstream_classes == list(range(10))
    assert d.num_train_classes == 10 and len(d.val) == 0
    # OOD: the 1,797 scikit-learn digits
    assert d.ood_name == "digits" and len(d.ood) == len(load_digits().target)
    assert d.info["split"] == "closed"


def test_closed_set_caps_and_validation_fraction(tmp_path, fake_fmnist_writer):
    fake_fmnist_writer(str(tmp_path), n_train=100, n_test=60)
    d = closed_set(tmp_path, max_train=50, max_test=30, max_ood=20, val_fraction=0.2)
    assert len(d.train) + len(d.val) == 50 and len(d.val) == 10
    assert len(d.test) == 30 and len(d.ood) == 20
    assert set(_rows(d.train.images)).isdisjoint(_rows(d.val.images))
    # class-balanced caps: 5 of each class
    assert np.bincount(d.test.targets.numpy(), minlength=10).tolist() == [3] * 10


def test_digits_fallback_holds_out_a_fifth_of_every_class():
    d = closed_set(force_digits=True, image_size=12, seed=3)
    labels = load_digits().target
    assert len(d.train) + len(d.test) == len(labels)
    assert set(_rows(d.train.images)).isdisjoint(_rows(d.test.images))
    for c in range(10):
        n_c = int((labels == c).sum())
        assert abs(int((d.test.targets == c).sum()) - 0.2 * n_c) <= 1
    assert d.ood_name == "noise" and d.test.images.shape[-1] == 12


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"max_train": 0}, "max_train"), ({"val_fraction": 1.0}, "val_fraction")],
)
def test_closed_set_bad_input_names_the_argument(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        closed_set(force_digits=True, **kwargs)


def test_split_registry_names_both_builders():
    assert SPLITS[Split.CLOSED] is closed_set and SPLITS[Split.ZERO_SHOT] is default_zero_shot
    assert Split("closed") is Split.CLOSED


def test_build_data_assembles_the_closed_split_of_the_recipe():
    cfg = load_recipe("fashion_mnist_closed/deterministic", preset="smoke")
    assert cfg.data.split == "closed"
    data = build_data(cfg)
    assert data.num_classes == len(data.info["upstream_classes"])
    assert data.info["upstream_classes"] == data.info["downstream_classes"]
    assert data.info["split"] == "closed"
    assert torch.equal(data.sets.id_test.images, data.sets.test.images)
    x = data.transform(data.sets.test.images[:4])
    assert x.dtype == torch.float32 and x.shape == (4, 1, 28, 28)


def test_unknown_or_unsupported_split_names_data_split(tmp_path):
    cfg = load_recipe("fashion_mnist_closed/deterministic", ["data.split=open"], preset="smoke")
    with pytest.raises(ValueError, match="data.split.*'open'.*closed"):
        build_data(cfg)
    cfg = load_recipe("cub/ce", ["data.split=closed", f"data.root={tmp_path}"], preset="smoke")
    with pytest.raises(ValueError, match="data.split.*embedded"):
        build_data(cfg)
