"""Adding a data set of each kind takes its own file and a recipe, nothing else.

Each test registers a throwaway data set the way a data set's module does
(:func:`bayesurl.data.registry.register_dataset`), writes a throwaway recipe file, uses the set
through the roads its kind serves (``get_dataset``; the class-split protocol for a set with a
pool; ``build_data`` of a :class:`~bayesurl.runs.config.RunConfig` read from the recipe) and
removes it again. No other module of the library is edited or patched: the registry's
declarations are all the roads read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from bayesurl.data import ImageFileDataset, ImageTensorDataset, as_tensors, get_dataset
from bayesurl.data.class_splits import class_splits, split_data
from bayesurl.data.dml import select_split_classes
from bayesurl.data.registry import (
    DATASETS,
    available_datasets,
    dataset_classes,
    dataset_kind,
    dataset_names,
    pool_datasets,
    register_dataset,
)
from bayesurl.data.zero_shot import dml_zero_shot
from bayesurl.runs.config import load_recipe
from bayesurl.runs.data import build_data


@pytest.fixture
def registered():
    """Names registered by a test, removed afterwards (the registry is process-wide)."""
    names: list[str] = []
    yield names
    for name in names:
        DATASETS.remove(name)
    assert not set(names) & set(DATASETS.names())


def _recipe(tmp_path: Path, name: str, backbone: str, **data: object) -> Path:
    """The data set's recipe file: the base estimators, its data and backbone settings."""
    lines = ['inherit = "estimators"', "", "[data]", f'name = "{name}"']
    lines += [f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in data.items()]
    lines += ["", "[backbone]", f'name = "{backbone}"', "embed_dim = 8"]
    lines += ["kwargs = { width = 4, num_features = 16 }" if backbone == "small_convnet" else ""]
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _images(n_classes: int, per_class: int, channels: int, side: int, seed: int):
    """Class ``c`` is a flat grey/colour level plus seeded noise: ``uint8`` images, labels."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n_classes).repeat_interleave(per_class)
    level = (labels.float() * 255 / max(n_classes - 1, 1)).view(-1, 1, 1, 1)
    x = level + 20 * torch.randn(len(labels), channels, side, side, generator=g)
    return x.clamp(0, 255).to(torch.uint8), labels


def _held_pool(images, labels, name, ood_name, seed):
    held = torch.zeros(len(labels), dtype=torch.bool)
    held[seed % 2 :: 4] = True  # a quarter of every class held out
    ood_x = torch.full((10, *images.shape[1:]), 128, dtype=torch.uint8)
    ood = ImageTensorDataset(ood_x, torch.zeros(10, dtype=torch.int64), name=f"{ood_name}/ood")
    return ImageTensorDataset(images, labels, name=name), held, ood, ood_name


# -- embedded: a small in-memory grayscale set ----------------------------------------------


def test_an_embedded_set_is_one_registration(registered, tmp_path):
    classes = ("ring", "bar", "dot", "cross")
    images, labels = _images(4, 12, channels=1, side=12, seed=0)

    def tiny(root=None, split="all", transform=None):
        return ImageTensorDataset(images, labels, transform, list(classes), f"tiny/{split}")

    def pool(root, seed, image_size):
        return _held_pool(images, labels, "tiny_embedded", "grey", seed)

    register_dataset("tiny_embedded", kind="embedded", classes=classes, ood="grey", pool=pool)(tiny)
    registered.append("tiny_embedded")

    assert "tiny_embedded" in available_datasets()
    assert "tiny_embedded" in dataset_names("embedded")
    assert dataset_kind("Tiny-Embedded") == ("tiny_embedded", "embedded")
    assert dataset_classes("tiny_embedded") == classes
    assert len(get_dataset("tiny_embedded")) == 48

    # an embedded set without split options runs its pool's first class split: 0-1 -> 2-3
    cfg = load_recipe(f"{_recipe(tmp_path, 'tiny_embedded', 'small_convnet')}/ce")
    data = build_data(cfg, progress=False)
    assert data.name == "tiny_embedded" and data.num_classes == 2
    assert data.info["upstream_classes"] == [0, 1] and data.info["downstream_classes"] == [2, 3]
    assert data.info["ood"] == "grey" and data.channels == 1
    x, y = as_tensors(data.sets.test)
    assert torch.equal(x, images[labels >= 2]) and torch.equal(y, labels[labels >= 2])
    # grayscale: normalised to float, one channel as the backbone asks
    assert data.transform(x[:2]).shape == (2, 1, 12, 12)


# -- pool: many classes in memory, used through the class-split protocol --------------------


def test_a_pool_set_is_one_registration(registered, tmp_path):
    images, labels = _images(12, 8, channels=3, side=16, seed=1)

    def pool(root, seed, image_size):
        return _held_pool(images, labels, "tiny_pool", "flat", seed)

    @register_dataset(
        "tiny_pool", kind="pool", classes=[f"k{i}" for i in range(12)], ood="flat", pool=pool
    )
    def tiny_pool(root=None, split="all", transform=None):
        return ImageTensorDataset(images, labels, transform, name=f"tiny_pool/{split}")

    registered.append("tiny_pool")
    assert "tiny_pool" in pool_datasets() and "tiny_pool" in dataset_names("pool")

    split = class_splits(2, num_classes=12, n_val=2, seed=3)[1]
    sets = split_data(split, dataset="tiny_pool")
    held = torch.zeros(len(labels), dtype=torch.bool)
    held[0::4] = True
    up = torch.isin(labels, torch.tensor(split.upstream))
    assert len(sets.train) == int((up & ~held).sum()) and len(sets.id_test) == int(
        (up & held).sum()
    )
    assert sorted(set(sets.test.targets.tolist())) == list(split.downstream)
    assert sets.ood_name == "flat" and len(sets.ood) == 10
    tune = split_data(split, dataset="tiny_pool", stage="tune")
    assert sorted(set(tune.test.targets.tolist())) == list(split.val)

    # the run pipeline: a named class split, and without one the first split
    recipe = _recipe(tmp_path, "tiny_pool", "small_convnet")
    cfg = load_recipe(f"{recipe}/ce", [("data.class_split", split.to_dict())])
    data = build_data(cfg, progress=False)
    assert data.info["downstream_classes"] == list(split.downstream)
    assert len(data.sets.test) == len(sets.test)
    first = build_data(load_recipe(f"{recipe}/ce", ["backbone.kwargs.in_chans=3"]), progress=False)
    assert first.info["upstream_classes"] == list(range(6))
    assert first.channels == 3  # a pool's images take the backbone's channels


# -- folder: a tree of images read from disk with a standard zero-shot class split ----------


def _tree(root: Path, n_classes: int = 6, per_class: int = 3) -> Path:
    g = torch.Generator().manual_seed(0)
    for c in range(n_classes):
        for i in range(per_class):
            px = torch.full((10, 10, 3), 40.0 * c) + 10 * torch.randn(10, 10, 3, generator=g)
            path = root / f"class{c:02d}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(px.clamp(0, 255).to(torch.uint8).numpy()).save(path)
    return root


def test_a_folder_set_is_one_registration(registered, tmp_path):
    @register_dataset("tiny_folder", kind="folder")
    def tiny_folder(root, split, transform=None, *, val_seed=None, relabel=False, **_):
        """Lower half of the class folders train, upper half test (the DML convention)."""
        folders = sorted(p for p in Path(root).iterdir() if p.is_dir())
        ids = list(range(1, len(folders) + 1))
        half = len(ids) // 2
        keep = select_split_classes(ids[:half], ids[half:], split, val_seed)
        paths, targets = [], []
        for j, c in enumerate(keep):
            files = sorted((folders[c - 1]).glob("*.png"))
            paths += [str(f) for f in files]
            targets += [j if relabel else c - 1] * len(files)
        ds = ImageFileDataset(paths, targets, transform, [f.name for f in folders], split)
        ds.split_classes = [c - 1 for c in keep]
        return ds

    registered.append("tiny_folder")
    root = _tree(tmp_path / "tree")
    assert "tiny_folder" in dataset_names("folder")
    assert len(get_dataset("tiny_folder", root, "test")) == 9

    zs = dml_zero_shot("tiny_folder", root)
    assert zs.upstream_classes == [0, 1, 2] and zs.downstream_classes == [3, 4, 5]

    cfg = load_recipe(
        f"{_recipe(tmp_path, 'tiny_folder', 'small_convnet', root=str(root), image_size=10)}/ce"
    )
    data = build_data(cfg, progress=False)
    assert data.name == "tiny_folder" and data.num_classes == 3 and data.channels == 3
    x, y = as_tensors(data.sets.test)
    assert x.shape == (9, 3, 10, 10) and x.dtype == torch.uint8
    assert sorted(set(y.tolist())) == [3, 4, 5]


def test_a_name_taken_twice_is_refused(registered):
    with pytest.raises(ValueError, match="registered twice"):
        register_dataset("clipart", kind="pool")(lambda *a, **k: None)
