"""Zero-shot class splits, stratified splits and subsampling against brute-force loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesurl.data import (
    ImageTensorDataset,
    check_disjoint,
    split_classes,
    stratified_split,
    stratified_subsample,
    subset,
    zero_shot_split,
)


def _brute(labels, classes):
    return [i for i, y in enumerate(labels) if y in set(classes)]


def test_explicit_lists_match_loops():
    labels = [3, 0, 7, 3, 9, 1, 0, 7, 7, 2]
    up, down = zero_shot_split(labels, upstream=[0, 3], downstream=[7, 9])
    assert up.tolist() == _brute(labels, [0, 3])
    assert down.tolist() == _brute(labels, [7, 9])
    # one side given: the other is the rest
    up, down = zero_shot_split(torch.tensor(labels), upstream=[0, 3])
    assert down.tolist() == _brute(labels, [1, 2, 7, 9])
    up, down = zero_shot_split(np.array(labels), downstream=[1, 2])
    assert up.tolist() == _brute(labels, [0, 3, 7, 9])


def test_dataset_input_and_subset_keeps_labels():
    imgs = torch.randint(0, 256, (10, 1, 2, 2), dtype=torch.uint8)
    ds = ImageTensorDataset(imgs, torch.tensor([3, 0, 7, 3, 9, 1, 0, 7, 7, 2]))
    up, down = zero_shot_split(ds, upstream=[7, 3])
    sub = subset(ds, up)
    assert set(sub.targets.tolist()) == {3, 7} and len(sub) == 5
    assert set(subset(ds, down).targets.tolist()).isdisjoint({3, 7})


@settings(max_examples=40, deadline=None)
@given(
    labels=st.lists(st.integers(0, 12), min_size=2, max_size=60).filter(lambda l: len(set(l)) > 1),
    seed=st.integers(0, 10_000),
)
def test_seeded_permutation_reproducible_disjoint_covering(labels, seed):
    up, down = zero_shot_split(labels, seed=seed)
    up2, down2 = zero_shot_split(labels, seed=seed)
    assert torch.equal(up, up2) and torch.equal(down, down2)
    y = torch.tensor(labels)
    cu, cd = set(y[up].tolist()), set(y[down].tolist())
    assert cu.isdisjoint(cd) and cu | cd == set(labels)
    assert len(cu) == len(set(labels)) // 2
    assert sorted(up.tolist() + down.tolist()) == list(range(len(labels)))


def test_seed_changes_classes_and_none_is_sorted():
    labels = list(range(20)) * 2
    ups = {
        tuple(sorted(set(torch.tensor(labels)[zero_shot_split(labels, seed=s)[0]].tolist())))
        for s in range(5)
    }
    assert len(ups) > 1
    up, _ = zero_shot_split(labels, n_upstream=3)
    assert set(torch.tensor(labels)[up].tolist()) == {0, 1, 2}


@pytest.mark.parametrize(
    "labels, kwargs, match",
    [
        ([], {}, "empty"),
        ([4, 4, 4], {}, "single class"),
        ([0, 1, 2], {"upstream": [0, 1], "downstream": [1, 2]}, "disjoint"),
        ([0, 1, 2], {"upstream": [0, 5]}, "absent"),
        ([0, 1, 2], {"upstream": [0, 1, 2]}, "`downstream` is empty"),
        ([0, 1, 2], {"upstream": [0, 0]}, "more than once"),
        ([0, 1, 2], {"n_upstream": 3}, "n_upstream"),
        ([0.0, float("nan"), 1.0], {}, "NaN"),
        ([0.5, 1.0], {}, "integer"),
        ([[0, 1], [1, 0]], {}, "1-D"),
    ],
)
def test_bad_inputs(labels, kwargs, match):
    with pytest.raises(ValueError, match=match):
        zero_shot_split(labels, **kwargs)


def test_split_classes_and_check_disjoint():
    a, b = split_classes([5, 1, 9, 3])
    assert (a, b) == ([1, 5], [3, 9])  # first half in the given order
    a, b = split_classes(list(range(10)), 3, seed=1)
    assert len(a) == 3 and set(a) | set(b) == set(range(10)) and not set(a) & set(b)
    assert (a, b) == split_classes(list(range(10)), 3, seed=1)
    with pytest.raises(ValueError, match="at least 2"):
        split_classes([1])
    with pytest.raises(ValueError, match="`up` and `down`"):
        check_disjoint(up=[1, 2], down=[2, 3])


def test_stratified_split_and_subsample():
    y = torch.tensor([0] * 50 + [1] * 30 + [2] * 20)
    keep, held = stratified_split(y, 0.2, seed=0)
    assert sorted(keep.tolist() + held.tolist()) == list(range(100))
    assert torch.bincount(y[held]).tolist() == [10, 6, 4]
    k2, h2 = stratified_split(y, 0.2, seed=0)
    assert torch.equal(held, h2)
    assert not torch.equal(held, stratified_split(y, 0.2, seed=1)[1])
    # tiny classes keep one item on each side
    keep, held = stratified_split([0, 0, 1, 1, 1], 0.01)
    assert torch.bincount(torch.tensor([0, 0, 1, 1, 1])[held]).tolist() == [1, 1]
    sub = stratified_subsample(y, 10, seed=0)
    assert len(sub) == 10 and torch.bincount(y[sub]).tolist() == [5, 3, 2]
    assert len(set(sub.tolist())) == 10
    assert torch.equal(stratified_subsample(y, None), torch.arange(100))
    # largest remainders: 7 of (50, 30, 20) -> exact 3.5, 2.1, 1.4 -> 4, 2, 1
    assert torch.bincount(y[stratified_subsample(y, 7)]).tolist() == [4, 2, 1]
    with pytest.raises(ValueError, match="fraction"):
        stratified_split(y, 1.0)
    with pytest.raises(ValueError, match="empty"):
        stratified_split([], 0.5)
