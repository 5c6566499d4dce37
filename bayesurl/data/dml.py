"""The three deep-metric-learning benchmarks of URL: CUB-200-2011, CARS196 and SOP.

URL (Kirchhof et al., 2023, Sec. 3.2) evaluates zero-shot on CUB-200-2011 (Wah et al., 2011),
CARS196 (Krause et al., 2013) and Stanford Online Products (Song et al., 2016) with their
original class splits, which divide the classes into equally sized train and test halves:

* CUB-200-2011: classes 1-100 train, 101-200 test;
* CARS196: classes 1-98 train, 99-196 test;
* SOP: the classes of ``Ebay_train.txt`` (1-11,318) train, ``Ebay_test.txt`` (11,319-22,634) test.

Hyper-parameters are validated on the train classes split in half again (Roth et al., 2020).
Here ``split="val"`` is, by default, the **upper half** of the train classes by class id
(CUB 51-100, CARS 50-98, SOP 5,660-11,318) and ``split="train_noval"`` the lower half; with
``val_seed`` the halves are drawn by a seeded permutation of the train classes instead.
``split="train"`` is the full standard train split and ``"all"`` every image.

Labels are the data set's class ids minus one (so CUB test labels are 100..199); pass
``relabel=True`` for contiguous labels ``0..K-1`` within the chosen split. Images are decoded
lazily with PIL; transforms are passed in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from .base import ImageFileDataset, Transform
from .registry import DatasetKind, register_dataset
from .splits import check_disjoint, split_classes

__all__ = [
    "CARS_TEST_CLASSES",
    "CARS_TRAIN_CLASSES",
    "CUB_TEST_CLASSES",
    "CUB_TRAIN_CLASSES",
    "DML_SPLITS",
    "CUB200",
    "Cars196",
    "StanfordOnlineProducts",
    "select_split_classes",
]

DML_SPLITS = ("train", "val", "train_noval", "test", "all")

#: Standard zero-shot class ids (1-based, as in the data sets' files), URL Sec. 3.2.
CUB_TRAIN_CLASSES = list(range(1, 101))
CUB_TEST_CLASSES = list(range(101, 201))
CARS_TRAIN_CLASSES = list(range(1, 99))
CARS_TEST_CLASSES = list(range(99, 197))


def select_split_classes(
    train_classes: Sequence[int],
    test_classes: Sequence[int],
    split: str,
    val_seed: int | None = None,
) -> list[int]:
    """Classes of ``split`` given the standard train and test classes.

    Parameters
    ----------
    train_classes, test_classes : sequence of int
        The disjoint standard zero-shot class lists (URL Sec. 3.2).
    split : {"train", "val", "train_noval", "test", "all"}
        Which classes; ``"val"``/``"train_noval"`` halve ``train_classes`` (upper/lower half by
        id, or a seeded permutation when ``val_seed`` is given).
    val_seed : int, optional
        Seed of the validation halving.

    Returns
    -------
    list of int
        Sorted classes.
    """
    if split not in DML_SPLITS:
        raise ValueError(f"`split` must be one of {list(DML_SPLITS)}, got {split!r}")
    check_disjoint(train_classes=train_classes, test_classes=test_classes)
    train = sorted(int(c) for c in train_classes)
    test = sorted(int(c) for c in test_classes)
    if split == "train":
        return train
    if split == "test":
        return test
    if split == "all":
        return sorted(train + test)
    if val_seed is None:
        fit, val = train[: len(train) // 2], train[len(train) // 2 :]
    else:
        fit, val = split_classes(train, seed=val_seed)
    return val if split == "val" else fit


def _missing(name: str, path: str, how: str) -> FileNotFoundError:
    return FileNotFoundError(f"{name} not found: {path!r} does not exist. {how}")


def _resolve(root: str | os.PathLike[str], subdirs: Sequence[str], marker: str) -> str | None:
    root = os.fspath(root)
    for sub in ("", *subdirs):
        folder = os.path.join(root, sub) if sub else root
        if os.path.isfile(os.path.join(folder, marker)):
            return folder
    return None


def _read_table(path: str, n_cols: int, header: bool = False) -> list[list[str]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for lineno, line in enumerate(lines, start=1):
        if header and lineno == 1:
            continue
        if not line.strip():
            continue
        parts = line.split(maxsplit=n_cols - 1)
        if len(parts) != n_cols:
            raise ValueError(
                f"{path!r} line {lineno}: expected {n_cols} space-separated fields, got {line!r}"
            )
        rows.append(parts)
    return rows


def _check_ids(class_ids: Sequence[int], allowed: Sequence[int], path: str) -> None:
    bad = sorted(set(class_ids) - set(allowed))
    if bad:
        raise ValueError(
            f"{path!r} holds class ids outside the standard {min(allowed)}-{max(allowed)}: "
            f"{bad[:10]}"
        )


def _int(value: str, path: str) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"{path!r}: expected an integer, got {value!r}") from exc


def _check_images(paths: Sequence[str], name: str) -> None:
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(
            f"{name}: {len(missing)} of {len(paths)} images listed in the metadata are missing, "
            f"e.g. {missing[0]!r}. Is the archive fully extracted?"
        )


class _Listing(NamedTuple):
    """What a data set's metadata list: each image's 1-based class id, image id and path, the
    standard train and test classes, the class names by id and further per-image ids."""

    class_ids: list[int]
    ids: list[int]
    paths: list[str]
    train_classes: Sequence[int]
    test_classes: Sequence[int]
    names: dict[int, str]
    extra: dict[str, list[int]] | None = None


class _FolderSet(ImageFileDataset):
    """A benchmark read from its original layout: found below ``root``, listed by
    :meth:`_read` and cut to ``split``. A subclass says where its marker file lies."""

    HOW_TO_GET = ""
    TITLE = ""  # the data set's name in errors
    KEY = ""  # its short name, the prefix of ``name``
    SUBDIRS: tuple[str, ...] = ()  # where below ``root`` the layout may lie
    MARKER = ""  # the file that marks the layout
    EXPECTED: tuple[str, ...] = ()  # the path below ``root`` an error names when none is found

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str = "train",
        transform: Transform | None = None,
        *,
        val_seed: int | None = None,
        relabel: bool = False,
        check_files: bool = True,
    ) -> None:
        folder = _resolve(root, self.SUBDIRS, self.MARKER)
        if folder is None:
            expected = os.path.join(os.fspath(root), *self.EXPECTED)
            raise _missing(self.TITLE, expected, self.HOW_TO_GET)
        self.root = folder
        self.transform = transform
        self.name = f"{self.KEY}/{split}"
        self._select(self._read(folder), split, val_seed, relabel, check_files)

    def _read(self, folder: str) -> _Listing:
        raise NotImplementedError

    def _select(
        self, listing: _Listing, split: str, val_seed: int | None, relabel: bool, check_files: bool
    ) -> None:
        """Keep the images of ``split``'s classes, labelled as the module docs say."""
        class_ids, names = listing.class_ids, listing.names
        keep_classes = select_split_classes(
            listing.train_classes, listing.test_classes, split, val_seed
        )
        keep = set(keep_classes)
        rows = [i for i, c in enumerate(class_ids) if c in keep]
        sel_paths = [listing.paths[i] for i in rows]
        if check_files:
            _check_images(sel_paths, type(self).__name__)
        zero_based = [class_ids[i] - 1 for i in rows]
        if relabel:
            lut = {c - 1: j for j, c in enumerate(keep_classes)}
            targets = [lut[t] for t in zero_based]
            classes = [names.get(c, str(c)) for c in keep_classes]
        else:
            targets = zero_based
            top = max(names) if names else (max(class_ids) if class_ids else 0)
            classes = [names.get(c, str(c)) for c in range(1, top + 1)]
        ImageFileDataset.__init__(self, sel_paths, targets, self.transform, classes, self.name)
        self.image_ids = [listing.ids[i] for i in rows]
        self.split_classes = [c - 1 for c in keep_classes]
        self.train_classes = [int(c) - 1 for c in sorted(listing.train_classes)]
        self.test_classes = [int(c) - 1 for c in sorted(listing.test_classes)]
        for key, values in (listing.extra or {}).items():
            setattr(self, key, torch.as_tensor([values[i] for i in rows], dtype=torch.int64))


class CUB200(_FolderSet):
    """CUB-200-2011 (Wah et al., 2011) from its original archive layout.

    Expects ``ROOT/CUB_200_2011/`` (or ``ROOT`` itself) with ``images.txt``,
    ``image_class_labels.txt``, ``classes.txt`` and ``images/<class folder>/<file>.jpg``.
    Zero-shot split (URL Sec. 3.2): classes 1-100 train, 101-200 test; see the module docs for
    ``val`` / ``train_noval``.

    Parameters
    ----------
    root : str or PathLike
        Folder holding ``CUB_200_2011`` (or that folder itself).
    split : {"train", "val", "train_noval", "test", "all"}
        Class split.
    transform : callable, optional
        Applied to the RGB ``PIL.Image``.
    val_seed : int, optional
        Seed of the validation halving (default: upper half by class id).
    relabel : bool
        Map the split's classes to ``0..K-1``.
    check_files : bool
        Verify at construction that every listed image exists.
    """

    HOW_TO_GET = (
        "Download CUB_200_2011.tgz from https://www.vision.caltech.edu/datasets/cub_200_2011/ and "
        "extract it so that ROOT/CUB_200_2011/images.txt exists; pass root=ROOT."
    )
    TITLE, KEY = "CUB-200-2011", "cub"
    SUBDIRS, MARKER = ("CUB_200_2011",), "images.txt"
    EXPECTED = ("CUB_200_2011", "images.txt")
    n_classes_train = 100

    def _read(self, folder: str) -> _Listing:
        paths_file = os.path.join(folder, "images.txt")
        labels_file = os.path.join(folder, "image_class_labels.txt")
        classes_file = os.path.join(folder, "classes.txt")
        for f in (labels_file, classes_file):
            if not os.path.isfile(f):
                raise _missing(self.TITLE, f, self.HOW_TO_GET)
        rel = {_int(i, paths_file): p for i, p in _read_table(paths_file, 2)}
        lab = {_int(i, labels_file): _int(c, labels_file) for i, c in _read_table(labels_file, 2)}
        if set(rel) != set(lab):
            raise ValueError(
                f"{paths_file!r} and {labels_file!r} list different image ids "
                f"({len(set(rel) ^ set(lab))} differ)"
            )
        names = {_int(i, classes_file): n for i, n in _read_table(classes_file, 2)}
        ids = sorted(rel)
        class_ids = [lab[i] for i in ids]
        paths = [os.path.join(folder, "images", rel[i]) for i in ids]
        _check_ids(class_ids, CUB_TRAIN_CLASSES + CUB_TEST_CLASSES, labels_file)
        return _Listing(class_ids, ids, paths, CUB_TRAIN_CLASSES, CUB_TEST_CLASSES, names)


class Cars196(_FolderSet):
    """CARS196 (Krause et al., 2013) from the ``cars_annos.mat`` layout.

    Expects ``ROOT/cars_annos.mat`` (or ``ROOT/CARS196/``, ``ROOT/cars196/``,
    ``ROOT/stanford_cars/``) and the images under ``car_ims/`` as listed by the annotations'
    ``relative_im_path``. The file is read with :func:`scipy.io.loadmat`. Zero-shot split
    (URL Sec. 3.2): classes 1-98 train, 99-196 test; the annotations' own ``test`` flag (a
    classification split) is ignored.

    Parameters
    ----------
    root, split, transform, val_seed, relabel, check_files
        As for :class:`CUB200`.
    """

    HOW_TO_GET = (
        "Download car_ims.tgz and cars_annos.mat of the Stanford Cars data set "
        "(https://ai.stanford.edu/~jkrause/cars/car_dataset.html, mirrored on Kaggle) and "
        "extract them so that ROOT/cars_annos.mat and ROOT/car_ims/000001.jpg exist; pass "
        "root=ROOT."
    )
    TITLE, KEY = "CARS196", "cars"
    SUBDIRS, MARKER = ("CARS196", "cars196", "stanford_cars"), "cars_annos.mat"
    EXPECTED = ("cars_annos.mat",)

    def _read(self, folder: str) -> _Listing:
        import numpy as np
        from scipy.io import loadmat

        mat_path = os.path.join(folder, "cars_annos.mat")
        try:
            mat = loadmat(mat_path, squeeze_me=True)
        except Exception as exc:
            raise ValueError(f"{mat_path!r} is not a readable MATLAB file: {exc}") from exc
        if "annotations" not in mat:
            raise ValueError(f"{mat_path!r} has no `annotations` struct")
        annos = np.atleast_1d(mat["annotations"])
        fields = annos.dtype.names or ()
        for field in ("relative_im_path", "class"):
            if field not in fields:
                raise ValueError(f"{mat_path!r}: `annotations` lacks the field {field!r}")
        rel = [str(p) for p in annos["relative_im_path"]]
        class_ids = [int(c) for c in annos["class"]]
        names: dict[int, str] = {}
        if "class_names" in mat:
            names = {i + 1: str(n) for i, n in enumerate(np.atleast_1d(mat["class_names"]))}
        _check_ids(class_ids, CARS_TRAIN_CLASSES + CARS_TEST_CLASSES, mat_path)
        paths = [os.path.join(folder, p) for p in rel]
        ids = list(range(1, len(rel) + 1))
        return _Listing(class_ids, ids, paths, CARS_TRAIN_CLASSES, CARS_TEST_CLASSES, names)


class StanfordOnlineProducts(_FolderSet):
    """Stanford Online Products (Song et al., 2016) from ``Ebay_train.txt`` / ``Ebay_test.txt``.

    Expects ``ROOT/Stanford_Online_Products/`` (or ``ROOT`` itself) holding both lists (header
    ``image_id class_id super_class_id path``) and the images at the listed relative paths.
    Zero-shot split (URL Sec. 3.2): the classes of ``Ebay_train.txt`` train, those of
    ``Ebay_test.txt`` test. ``super_targets`` holds the super-class ids minus one.

    Parameters
    ----------
    root, split, transform, val_seed, relabel, check_files
        As for :class:`CUB200`.
    """

    HOW_TO_GET = (
        "Download Stanford_Online_Products.zip (https://cvgl.stanford.edu/projects/lifted_struct/)"
        " and extract it so that ROOT/Stanford_Online_Products/Ebay_train.txt exists; pass "
        "root=ROOT."
    )
    TITLE, KEY = "Stanford Online Products", "sop"
    SUBDIRS, MARKER = ("Stanford_Online_Products",), "Ebay_train.txt"
    EXPECTED = ("Stanford_Online_Products", "Ebay_train.txt")

    def _read(self, folder: str) -> _Listing:
        tables = {}
        for part in ("train", "test"):
            path = os.path.join(folder, f"Ebay_{part}.txt")
            if not os.path.isfile(path):
                raise _missing(self.TITLE, path, self.HOW_TO_GET)
            tables[part] = [
                (_int(i, path), _int(c, path), _int(s, path), p)
                for i, c, s, p in _read_table(path, 4, header=True)
            ]
        rows = tables["train"] + tables["test"]
        return _Listing(
            class_ids=[r[1] for r in rows],
            ids=[r[0] for r in rows],
            paths=[os.path.join(folder, r[3]) for r in rows],
            train_classes=sorted({r[1] for r in tables["train"]}),
            test_classes=sorted({r[1] for r in tables["test"]}),
            names={},
            extra={"super_targets": [r[2] - 1 for r in rows]},
        )


def _needs_root(cls: type[ImageFileDataset]) -> Callable[..., ImageFileDataset]:
    """The loader of ``cls``: its ``root`` is required (the error says how to get the data)."""

    def load(root: str | os.PathLike[str] | None, split: str, transform: Any, **kw: Any):
        if root is None:
            raise FileNotFoundError(
                f"{cls.__name__} needs `root`: the folder holding the extracted data set. "
                + cls.HOW_TO_GET  # type: ignore[attr-defined]
            )
        return cls(root, split, transform, **kw)

    return load


register_dataset("cub", kind=DatasetKind.FOLDER)(_needs_root(CUB200))
register_dataset("cars", kind=DatasetKind.FOLDER)(_needs_root(Cars196))
register_dataset("sop", kind=DatasetKind.FOLDER)(_needs_root(StanfordOnlineProducts))
