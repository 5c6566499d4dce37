"""The clipart data set: classes, caps and duplicate groups of a manifest, the checks of the
files against it, the missing-package line, the committed class list and its class splits.

A synthetic tree (random block drawings written as PNGs) is the independent reference: which
folders must become classes, which files are copies of one another and which pixels must be
white are known by construction.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bayesurl.data import clipart as cm
from bayesurl.data.class_splits import class_splits, split_data
from bayesurl.data.registry import DatasetKind, available_datasets, dataset_kind

INSTALLED = Path(cm.DEFAULT_CLIPART_ROOT).is_dir()

#: The committed class list: changing the manifest changes every class split, so it is pinned.
CLASSES = (
    "animals/birds", "animals/bugs", "animals/mammals", "buildings/homes", "computer/buttons",
    "computer/hardware", "computer/icons/etiquette-theme", "computer/icons/flat-theme/action",
    "computer/icons/flat-theme/applications", "computer/icons/lemon-theme/actions",
    "computer/icons/lemon-theme/apps", "computer/icons/lemon-theme/devices",
    "computer/icons/lemon-theme/filesystems", "computer/icons/lemon-theme/mimetypes",
    "education", "electronics", "food/beverages", "food/desserts", "food/fruit", "geography",
    "office", "people/clothing", "people/smilies", "people/stickmen", "plants/flowers",
    "recreation/games/cards/bordered", "recreation/holiday", "recreation/music",
    "recreation/party", "recreation/sports", "recreation/toys", "shapes/arrows",
    "shapes/jigsaw", "shapes/stars", "signs_and_symbols/flags/africa",
    "signs_and_symbols/flags/america", "signs_and_symbols/flags/asia",
    "signs_and_symbols/flags/europe/france", "signs_and_symbols/flags/oceania",
    "signs_and_symbols/flags/semaphore", "signs_and_symbols/led",
    "signs_and_symbols/map_symbols", "signs_and_symbols/weather", "special/patterns",
    "tools/weapons", "transportation/aiga-symbols", "transportation/boating",
    "transportation/roadsigns", "transportation/vehicles",
)  # fmt: skip


def _drawing(seed: int, scale: int = 4, alpha: bool = False) -> Image.Image:
    """A random 16 x 17 block drawing (levels 16 apart, so its difference hash is stable
    under a change of size), upscaled ``scale`` times."""
    rng = np.random.default_rng(seed)
    grid = rng.integers(0, 16, (16, 17))
    for j in range(1, 17):  # no two equal neighbours: every bit of the hash is clear-cut
        same = grid[:, j] == grid[:, j - 1]
        grid[same, j] = (grid[same, j] + 1) % 16
    grid = (grid * 16).astype(np.uint8)
    rgb = np.stack([grid, grid[::-1], 255 - grid], axis=-1)
    big = np.kron(rgb, np.ones((scale, scale, 1), dtype=np.uint8))
    im = Image.fromarray(big, "RGB")
    if alpha:
        a = np.zeros(big.shape[:2], dtype=np.uint8)
        a[: big.shape[0] // 2] = 255  # the lower half is transparent
        im = Image.fromarray(np.dstack([big, a]), "RGBA")
    return im


def _tree(root: Path) -> Path:
    """a/x: 5 drawings, one transparent; a/y: 4 drawings plus a byte copy of a/x/d0, the
    same drawing as a/x/d1 at twice the size, and a/x/d2's file name; a/z: 2 drawings (below
    the count: merged into a, which has classes below, so dropped); b: 6 drawings (capped);
    unsorted: 4 (no category)."""
    folders = {"a/x": range(0, 5), "a/y": range(10, 14), "a/z": range(20, 22), "b": range(30, 36)}
    folders["unsorted"] = range(40, 44)
    for folder, seeds in folders.items():
        (root / folder).mkdir(parents=True)
        for s in seeds:
            _drawing(s, alpha=s == 4).save(root / folder / f"d{s}.png")
    (root / "a/y/copy.png").write_bytes((root / "a/x/d0.png").read_bytes())
    _drawing(1, scale=8).save(root / "a/y/big1.png")
    _drawing(50).save(root / "a/y/d2.png")  # another drawing, the name of a/x/d2.png
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return _tree(tmp_path_factory.mktemp("clipart"))


@pytest.fixture(scope="module")
def manifest(tree):
    return cm.build_clipart_manifest(tree, min_count=4, per_class=5, seed=0, source="test")


def test_classes_drops_and_merges_follow_the_folder_rules(manifest):
    assert manifest["classes"] == ["a/x", "a/y", "b"]
    dropped = manifest["dropped_folders"]
    assert dropped["a"][1].startswith("drawings beside class sub-folders")
    assert dropped["a"][0] == 2  # the two drawings of a/z, merged into a
    assert "a/z" not in manifest["classes"] and "unsorted" not in manifest["classes"]
    assert set(manifest["excluded"]) == {f"unsorted/d{s}.png" for s in range(40, 44)}


def test_duplicates_are_grouped_and_one_of_each_group_is_kept(manifest):
    groups = {frozenset(g[1:]) | {g[0]} for g in manifest["groups"]}
    assert {"a/x/d0.png", "a/y/copy.png"} in groups  # identical bytes
    assert {"a/x/d1.png", "a/y/big1.png"} in groups  # the same drawing at twice the size
    assert {"a/x/d2.png", "a/y/d2.png"} in groups  # the same file name in two folders
    kept = {f[0] for f in manifest["files"]}
    assert all(g[0].startswith("a/x/") for g in manifest["groups"])
    for g in manifest["groups"]:
        assert g[0] in kept and not kept & set(g[1:]), g
    # brute force: no two kept files share bytes or a thumbnail hash
    assert len({f[2] for f in manifest["files"]}) == len(manifest["files"])


def test_caps_are_seeded_and_the_same_for_every_class(tree, manifest):
    per = Counter(f[3] for f in manifest["files"])
    # distinct drawings kept: a/y's three copies stay with a/x, the class that reaches fewer
    assert manifest["counts"] == {"a/x": 5, "a/y": 4, "b": 6}
    assert per == {0: 5, 1: 4, 2: 5}  # b capped at per_class
    again = cm.build_clipart_manifest(tree, min_count=4, per_class=5, seed=0, source="test")
    other = cm.build_clipart_manifest(tree, min_count=4, per_class=5, seed=3, source="test")
    assert again["files"] == manifest["files"]
    picks = [sorted(f[0] for f in m["files"] if f[3] == 2) for m in (manifest, other)]
    assert all(len(p) == 5 for p in picks)
    with pytest.raises(ValueError, match="min_count"):
        cm.build_clipart_manifest(tree, min_count=6, per_class=5)


def test_images_are_composited_on_white_and_square(tree, manifest, tmp_path):
    cm.write_clipart_manifest(manifest, tmp_path / "m.json.gz")
    assert cm.read_clipart_manifest(tmp_path / "m.json.gz") == json.loads(json.dumps(manifest))
    ds = cm.clipart(tree, manifest=manifest, size=17)
    assert ds.images.shape == (len(manifest["files"]), 3, 17, 17)
    assert ds.images.dtype == torch.uint8 and ds.classes == ["a/x", "a/y", "b"]
    assert ds.targets.tolist() == [f[3] for f in manifest["files"]]
    i = [f[0] for f in manifest["files"]].index("a/x/d4.png")
    # a 64 x 68 drawing, padded on white to 68 x 68 and scaled to 17: its transparent lower
    # half (rows 32..63 of 68, plus the 2-row pads) is white
    lower = ds.images[i, :, 10:, :]
    assert (lower[:, :-1] == 255).all()
    assert (ds.images[i, :, 2:7, 1:-1] != 255).any()
    train, test = cm.clipart(tree, "train", manifest=manifest, size=17), None
    test = cm.clipart(tree, "test", manifest=manifest, size=17)
    assert len(train) + len(test) == len(ds)


def test_a_changed_or_missing_file_is_a_clear_error(tree, manifest, tmp_path):
    import shutil

    copy = tmp_path / "tree"
    shutil.copytree(tree, copy)
    _drawing(99).save(copy / "b/d30.png")
    with pytest.raises(ValueError, match=r"'b/d30.png'.*differs from the manifest"):
        cm.clipart(copy, manifest=manifest, size=12)
    (copy / "b/d30.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of the 14 .* missing.*'b/d30.png'"):
        cm.clipart(copy, manifest=manifest, size=12)


def test_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cm, "DEFAULT_CLIPART_ROOT", str(tmp_path / "nope"))
    for call in (lambda: cm.find_clipart(tmp_path / "nope"), lambda: cm.clipart(tmp_path / "no")):
        with pytest.raises(
            FileNotFoundError, match=re.escape("apt-get install -y openclipart-png")
        ):
            call()


def test_the_committed_manifest_pins_the_classes_caps_and_groups():
    man = cm.read_clipart_manifest()
    assert cm.clipart_classes() == CLASSES
    per = Counter(f[3] for f in man["files"])
    assert sorted(per) == list(range(len(CLASSES)))
    assert all(30 <= per[c] <= 80 for c in per), per
    assert all(per[c] == min(80, man["counts"][CLASSES[c]]) for c in per)
    kept = [f[0] for f in man["files"]]
    assert len(set(kept)) == len(kept) == len(set(f[2] for f in man["files"]))
    seen = set(kept)
    for g in man["groups"]:
        assert not seen & set(g[1:]), g  # at most one file of a group is in the data set
    assert "openclipart-png" in man["source"]


def test_registry_names_clipart_as_a_pool_set():
    assert "clipart" in available_datasets()
    assert dataset_kind("clipart") == ("clipart", DatasetKind.POOL)


def test_fixed_validation_classes_are_never_downstream():
    val = (2, 16, 24, 26, 48)
    splits = class_splits(20, num_classes=49, seed=0, val_classes=val)
    rest = [c for c in range(49) if c not in val]
    ups = set()
    for i, sp in enumerate(splits):
        assert sp.index == i and sp.val == val
        assert set(val) <= set(sp.upstream) and not set(val) & set(sp.downstream)
        assert sorted((*sp.upstream, *sp.downstream)) == list(range(49))
        assert len(sp.downstream) == 22 and len(sp.upstream) == 27
        ups.add(sp.upstream)
        if i % 2:  # complementary pairs over the classes outside the validation ones
            prev = splits[i - 1]
            assert sorted((*prev.downstream, *sp.downstream)) == rest
    assert len(ups) == 20
    assert splits[0].downstream == tuple(rest[22:])
    with pytest.raises(ValueError, match="val_classes"):
        class_splits(2, num_classes=10, val_classes=[3, 12])


@pytest.mark.skipif(not INSTALLED, reason="openclipart-png is not installed")
def test_split_data_of_clipart_keeps_classes_apart_with_fashion_or_digits_as_ood():
    sp = class_splits(2, num_classes=len(CLASSES), val_classes=(2, 16, 24, 26, 48))[1]
    zs = split_data(sp, dataset="clipart", image_size=16, max_ood=50)
    assert zs.train.images.shape[1:] == (3, 16, 16) and zs.ood.images.shape[1:] == (3, 16, 16)
    assert set(zs.test.targets.tolist()) == set(sp.downstream)
    assert zs.ood_name in ("fashion_mnist", "digits") and len(zs.ood) == 50
    tune = split_data(sp, stage="tune", dataset="clipart", image_size=16)
    assert set(tune.test.targets.tolist()) == set(sp.val)
