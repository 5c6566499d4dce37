"""CUB-200-2011 / CARS196 / SOP on fabricated trees in the original layouts."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from bayesurl.data import CUB200, Cars196, StanfordOnlineProducts, get_dataset

SPLITS = ("train", "val", "train_noval", "test", "all")


def _labels_by_path(ds):
    return {p: int(t) for p, t in zip(ds.paths, ds.targets)}


def _check_tree(cls, root, truth, train_ids, test_ids):
    sets = {s: cls(root, s) for s in SPLITS}
    # every image's label is its fabricated class id minus one
    for ds in sets.values():
        for path, label in _labels_by_path(ds).items():
            assert label == truth[path] - 1
    cls_of = {s: set(ds.targets.tolist()) for s, ds in sets.items()}
    assert cls_of["train"] == {c - 1 for c in train_ids}
    assert cls_of["test"] == {c - 1 for c in test_ids}
    assert cls_of["train"].isdisjoint(cls_of["test"])
    assert cls_of["all"] == cls_of["train"] | cls_of["test"]
    assert len(sets["all"]) == len(truth)
    # validation: upper half of the train classes; the lower half is train_noval
    train_sorted = sorted(cls_of["train"])
    half = len(train_sorted) // 2
    assert cls_of["val"] == set(train_sorted[half:])
    assert cls_of["train_noval"] == set(train_sorted[:half])
    assert len(sets["val"]) + len(sets["train_noval"]) == len(sets["train"])
    # seeded validation halves: reproducible, a partition of the train classes, not the default
    a = set(cls(root, "val", val_seed=5).targets.tolist())
    b = set(cls(root, "train_noval", val_seed=5).targets.tolist())
    assert a == set(cls(root, "val", val_seed=5).targets.tolist())
    assert a.isdisjoint(b) and a | b == cls_of["train"] and len(a) == len(train_sorted) - half
    assert a != cls_of["val"]
    # relabel gives contiguous labels in class order
    rel = cls(root, "test", relabel=True)
    assert sorted(set(rel.targets.tolist())) == list(range(len(test_ids)))
    assert torch.equal(rel.targets, sets["test"].targets - min(test_ids) + 1)
    return sets


def test_cub(cub_root):
    root, truth = cub_root
    sets = _check_tree(CUB200, root, truth, range(1, 101), range(101, 201))
    assert sets["train"].classes[0] == "001.Bird_1"
    # the CUB_200_2011 folder itself is accepted as root
    assert len(CUB200(os.path.join(root, "CUB_200_2011"), "test")) == 200
    img, y = CUB200(root, "test", transform=lambda im: im.size)[0]
    assert img == (5, 4) and y == 100


def test_cars(cars_root):
    root, truth = cars_root
    sets = _check_tree(Cars196, root, truth, range(1, 99), range(99, 197))
    assert sets["test"].classes[98] == "Car model 99"
    img, y = sets["train"][0]
    assert img.mode == "RGB" and img.size == (5, 4) and y == 0


def test_sop(sop_root):
    root, truth = sop_root
    sets = _check_tree(StanfordOnlineProducts, root, truth, range(1, 13), range(13, 25))
    sup = sets["all"].super_targets
    assert torch.equal(sup, (sets["all"].targets) // 6)


def test_registry_names(cub_root, cars_root, sop_root):
    for name, (root, _) in (("cub", cub_root), ("cars", cars_root), ("sop", sop_root)):
        assert len(get_dataset(name, root, split="test")) > 0
        with pytest.raises(FileNotFoundError, match="root"):
            get_dataset(name, None)


@pytest.mark.parametrize(
    "cls, marker",
    [
        (CUB200, "CUB_200_2011/images.txt"),
        (Cars196, "cars_annos.mat"),
        (StanfordOnlineProducts, "Ebay_train.txt"),
    ],
)
def test_missing_root_names_path_and_source(tmp_path, cls, marker):
    with pytest.raises(FileNotFoundError) as err:
        cls(tmp_path / "absent")
    msg = str(err.value)
    assert str(tmp_path / "absent") in msg and marker in msg and "Download" in msg


def test_missing_image_and_corrupted_metadata(cub_root, cars_mat_writer, tmp_path):
    src, _ = cub_root
    root = tmp_path / "cub"
    shutil.copytree(src, root)
    base = root / "CUB_200_2011"
    victim = next((base / "images").rglob("*.jpg"))
    victim.unlink()
    with pytest.raises(FileNotFoundError, match="1 of .* images .* missing"):
        CUB200(root, "all")
    assert len(CUB200(root, "all", check_files=False)) == 400
    (base / "image_class_labels.txt").write_text("1 1\n2\n")
    with pytest.raises(ValueError, match="image_class_labels.txt.* line 2"):
        CUB200(root, "all")
    (base / "image_class_labels.txt").write_text("1 1\n2 x\n")
    with pytest.raises(ValueError, match="integer"):
        CUB200(root, "all")
    (base / "image_class_labels.txt").write_text("1 201\n")
    with pytest.raises(ValueError, match="different image ids|outside the standard"):
        CUB200(root, "all")
    # CARS: a class id outside 1-196 and a garbage .mat
    cars = tmp_path / "cars"
    cars.mkdir()
    cars_mat_writer(str(cars / "cars_annos.mat"), ["car_ims/1.jpg"], [197])
    with pytest.raises(ValueError, match="outside the standard 1-196"):
        Cars196(cars, check_files=False)
    (cars / "cars_annos.mat").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cars_annos.mat"):
        Cars196(cars)


def test_bad_split_and_loader(cub_root):
    root, _ = cub_root
    with pytest.raises(ValueError, match="split"):
        CUB200(root, "validation")
    from torch.utils.data import DataLoader
    from torchvision.transforms.functional import pil_to_tensor

    ds = CUB200(root, "val", transform=pil_to_tensor)
    xb, yb = next(iter(DataLoader(ds, batch_size=8)))
    assert xb.shape == (8, 3, 4, 5) and yb.tolist() == ds.targets[:8].tolist()
    assert xb[0, 0, 0, 0].item() == pytest.approx(51, abs=3)  # JPEG of value 51 (class 51)


def test_dml_zero_shot(cub_root, cars_root):
    from bayesurl.data import dml_zero_shot

    root, truth = cub_root
    d = dml_zero_shot("cub", root, ood="cars", ood_root=cars_root[0])
    assert d.num_train_classes == 100 and d.upstream_classes == list(range(100))
    assert d.downstream_classes == list(range(100, 200))
    assert set(d.train.targets.tolist()) == set(range(100))
    assert set(d.val.targets.tolist()) == set(range(50))  # relabelled upper half 51-100
    assert {truth[p] for p in d.val.paths} == set(range(51, 101))
    assert len(d.ood) == 196 * 2 // 2 and d.id_test is None
    t = dml_zero_shot("cub", root, tune=True)
    assert {truth[p] for p in t.train.paths} == set(range(1, 51))
    assert set(t.train.targets.tolist()) == set(range(50)) and t.num_train_classes == 50
    assert {truth[p] for p in t.val.paths}.isdisjoint({truth[p] for p in t.train.paths})
    t2 = t.with_transform(lambda im: im.size, train_transform=lambda im: "train")
    assert t2.train[0][0] == "train" and t2.test[0][0] == (5, 4) and t2.ood is None
    assert "50 upstream -> 100 downstream" in t.summary()
    with pytest.raises(ValueError, match="name"):
        dml_zero_shot("digits", root)
