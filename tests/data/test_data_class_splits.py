"""The benchmark's class-split protocol: distinct complementary splits, class-disjoint
validation, all downstream images as the retrieval set (checked by counting labels)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from bayesurl.data import find_fashion_mnist
from bayesurl.data.class_splits import ClassSplit, class_splits, split_data
from bayesurl.data.sklearn_digits import load_digits_images


def test_class_splits_protocol():
    splits = class_splits(6, seed=0)
    assert splits[0].upstream == (0, 1, 2, 3, 4) and splits[0].downstream == (5, 6, 7, 8, 9)
    ups = [s.upstream for s in splits]
    assert len(set(ups)) == 6  # distinct
    for s in splits:
        assert set(s.upstream).isdisjoint(s.downstream)
        assert set(s.upstream) | set(s.downstream) == set(range(10))
        assert set(s.val) < set(s.upstream) and len(s.val) == 2
    for j in range(3):  # complementary pairs
        assert splits[2 * j + 1].upstream == splits[2 * j].downstream
    down_count = Counter(c for s in splits for c in s.downstream)
    assert set(down_count.values()) == {3}  # every class downstream equally often
    assert [s.to_dict() for s in class_splits(6, seed=0)] == [s.to_dict() for s in splits]
    assert [s.upstream for s in class_splits(6, seed=1)][2:] != ups[2:]
    odd = class_splits(3, num_classes=10, n_upstream=4, n_val=1, seed=2)
    assert all(len(s.upstream) == 4 for s in odd) and len({s.upstream for s in odd}) == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_splits": 0}, "n_splits"),
        ({"n_splits": 2, "n_upstream": 10}, "n_upstream"),
        ({"n_splits": 2, "n_val": 5}, "n_val"),
        ({"n_splits": 2, "n_val": 0}, "n_val"),
        ({"n_splits": 5, "num_classes": 4, "n_upstream": 3, "n_val": 1}, "distinct"),
    ],
)
def test_class_splits_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        class_splits(**kwargs)


def _digit_counts():
    _, y = load_digits_images(28)
    return Counter(y.tolist())


def test_split_data_final_stage_digits():
    split = class_splits(2, seed=0)[1]  # 5-9 upstream, 0-4 downstream
    data = split_data(split, dataset="digits")
    counts = _digit_counts()
    assert data.upstream_classes == list(split.upstream)
    assert data.num_train_classes == 5
    # every image of the downstream classes is in the retrieval set
    assert len(data.test) == sum(counts[c] for c in split.downstream)
    assert set(data.test.targets.tolist()) == set(split.downstream)
    # train + held-out upstream images are all upstream images, disjoint
    assert len(data.train) + len(data.id_test) == sum(counts[c] for c in split.upstream)
    assert set(data.train.targets.tolist()) == set(range(5))  # relabelled
    tr = {bytes(x.numpy()) for x in data.train.images}
    assert not any(bytes(x.numpy()) in tr for x in data.id_test.images[:50])
    assert data.ood_name == "noise" and len(data.ood) == sum(counts.values())
    assert data.info["split"]["index"] == 1 and data.info["stage"] == "final"


def test_split_data_tune_stage_is_class_disjoint():
    split = class_splits(1, seed=0)[0]
    data = split_data(split, stage="tune", dataset="digits", max_train=300, max_ood=50)
    fit = [c for c in split.upstream if c not in split.val]
    assert data.upstream_classes == fit and data.num_train_classes == 3
    assert set(data.test.targets.tolist()) == set(split.val)
    assert len(data.train) == 300 and len(data.ood) == 50
    assert len(data.test) == sum(_digit_counts()[c] for c in split.val)
    assert set(data.id_test.targets.tolist()) == set(range(3))


def test_split_data_rejects():
    split = class_splits(1)[0]
    with pytest.raises(ValueError, match="stage"):
        split_data(split, stage="val", dataset="digits")
    with pytest.raises(ValueError, match="dataset"):
        split_data(split, dataset="cifar")
    with pytest.raises(ValueError, match="max_test"):
        split_data(split, dataset="digits", max_test=0)
    bad = ClassSplit(index=0, upstream=(0, 11), downstream=(1,), val=(0,))
    with pytest.raises(ValueError, match="11"):
        split_data(bad, dataset="digits")


def test_split_data_fashion_mnist_uses_all_downstream_images():
    try:
        find_fashion_mnist(None)
    except FileNotFoundError:
        pytest.skip("Fashion-MNIST not installed")
    split = class_splits(1)[0]
    data = split_data(split, max_train=1000)
    assert len(data.test) == 35_000  # 6,000 train + 1,000 test images x 5 classes
    assert len(data.id_test) == 5_000 and len(data.train) == 1000
    assert len(data.ood) == 1797
    assert torch.equal(data.test.targets.unique(), torch.arange(5, 10))
