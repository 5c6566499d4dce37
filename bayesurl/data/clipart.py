"""Open Clip Art Library drawings: a many-class image set that installs offline.

The Debian package ``openclipart-png`` puts the PNG renderings of the Open Clip Art Library
(public domain, https://openclipart.org) under ``/usr/share/openclipart/png``, in a tree of
category folders (``animals/birds``, ``food/fruit``, ``transportation/roadsigns``, ...). As a
downstream domain for an ImageNet backbone it is a shift from photographs to person-made
drawings, with many more classes than Fashion-MNIST's ten (the URL benchmark compares rankings
over several downstream sets; Kirchhof et al., 2023, section 3).

The data set is fixed by a **manifest** committed with the package
(``clipart_manifest.json.gz``, written by :func:`build_clipart_manifest`), so the classes and
files -- and with them every class split -- do not move when the Debian package changes:

* a **class** is a leaf folder (one without sub-folders) holding at least ``min_count``
  distinct drawings; images in a folder that has sub-folders (``people/*.png`` beside
  ``people/stickmen``) mix its sub-categories and are dropped, and so are the leaf folders
  below the count (the manifest lists both with their counts);
* **near-duplicates** -- the same file under several folders (symbolic links, identical bytes),
  the same icon name in several themes (``printer.png`` in four icon themes, the same playing
  card in four card designs, ``white_c_10.png`` / ``simple_c_10.png``), the same drawing
  at several sizes or colours (equal 256-bit difference hashes of a 16 x 16 greyscale
  thumbnail composited on white) -- are joined into groups (union-find) and **one drawing per
  group is kept**, so no two images of the data set are copies of each other (a query's
  nearest neighbour is never its own copy); the manifest lists every group;
* each class keeps at most ``per_class`` drawings (a seeded pick, the same cap for every
  class);
* files larger than ``max_pixels`` (a few posters of up to 620 megapixels) are not decoded,
  and the folder ``unsorted`` names no category.

:func:`clipart` reads the kept files, checks each against the manifest (size and SHA-1; a
missing or changed file is an error naming it), composites transparency on white, pads to a
square on white (the whole drawing stays visible) and resizes to ``size``: ``uint8`` RGB
images ``[N, 3, size, size]``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import re
import struct
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesurl._checks import check_int

from .base import ImageTensorDataset, Transform
from .fmnist import fashion_mnist
from .registry import DatasetKind, register_dataset
from .sklearn_digits import load_digits_images, upsample_uint8
from .splits import stratified_split
from .transforms import to_rgb

__all__ = [
    "CLIPART_HOW_TO_GET",
    "CLIPART_MANIFEST",
    "DEFAULT_CLIPART_ROOT",
    "build_clipart_manifest",
    "clipart",
    "clear_clipart_cache",
    "clipart_classes",
    "find_clipart",
    "read_clipart_manifest",
    "write_clipart_manifest",
]

DEFAULT_CLIPART_ROOT = "/usr/share/openclipart/png"

#: The manifest committed with the package (classes, kept files, duplicate groups).
CLIPART_MANIFEST = Path(__file__).with_name("clipart_manifest.json.gz")

CLIPART_HOW_TO_GET = (
    "install the Debian package: `sudo apt-get install -y openclipart-png` (or `make data`), "
    f"which puts the PNGs in {DEFAULT_CLIPART_ROOT}"
)

_HASH_SIDE = 16  # the difference hash compares 16 x 17 greyscale pixels: 256 bits

#: Folders that name no category (their drawings are not used).
NOT_A_CATEGORY = ("unsorted",)


def _name_key(path: str) -> str:
    """A file name without what marks a theme or a size: ``white_c_10.png`` in ``.../white``
    and ``bordered_c_10.png`` in ``.../bordered`` are the same card, ``14_ellipse.png`` and
    ``22_ellipse.png`` the same icon at two sizes."""
    p = Path(path)
    stem = p.stem.lower()
    theme = p.parent.name.lower()
    for cut in (f"{theme}_", f"{theme}-"):
        if stem.startswith(cut) and len(stem) > len(cut):
            stem = stem[len(cut) :]
    return re.sub(r"^\d+_(?=\D)", "", stem)


def find_clipart(root: str | os.PathLike[str] | None = None) -> Path:
    """The folder of the Open Clip Art PNG tree.

    Raises
    ------
    FileNotFoundError
        When it is not a folder, with the one line that installs it.
    """
    folder = Path(root if root is not None else DEFAULT_CLIPART_ROOT)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"Open Clip Art not found at {str(folder)!r}: {CLIPART_HOW_TO_GET}, or pass `root`"
        )
    return folder


def _png_size(path: Path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{str(path)!r} is not a PNG file")
    return struct.unpack(">II", head[16:24])


def _difference_hash(rgb: Any) -> str:
    """256-bit difference hash of a greyscale thumbnail (hex); all zeros for a flat one."""
    from PIL import Image

    grey = rgb.convert("L").resize((_HASH_SIDE + 1, _HASH_SIDE), Image.BILINEAR)
    g = np.asarray(grey, dtype=np.int16)
    return np.packbits(g[:, 1:] > g[:, :-1]).tobytes().hex()


def _square_resize(rgb: Any, size: int) -> Any:
    """Pad to a square on white (centred), then resize to ``size`` x ``size``."""
    from PIL import Image

    w, h = rgb.size
    side = max(w, h)
    if w != h:
        canvas = Image.new("RGB", (side, side), (255, 255, 255))
        canvas.paste(rgb, ((side - w) // 2, (side - h) // 2))
        rgb = canvas
    return rgb.resize((size, size), Image.BILINEAR, reducing_gap=2.0)


class _Groups:
    """Union-find over file indices."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def join(self, members: list[int]) -> None:
        roots = sorted({self.find(m) for m in members})
        for r in roots[1:]:
            self.parent[r] = roots[0]


def _class_folders(
    rows: list[dict[str, Any]], group_of: list[int], min_count: int
) -> tuple[list[str], list[str | None], dict[str, list[Any]]]:
    """Which folders are classes, and each file's class folder (``None``: dropped).

    Deepest folders first: a folder none of whose sub-folders became a class is a leaf; with
    at least ``min_count`` distinct drawings (its own and those merged from below) it is a
    class, else its drawings merge into its parent. A folder with a class below it drops its
    own drawings (a mixture of its sub-categories).
    """
    own: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        own[r["folder"]].append(i)
    folders = set(own)
    for f in list(folders):
        parts = Path(f).parts
        folders |= {str(Path(*parts[:k])) for k in range(1, len(parts))}
    assigned = {f: list(own.get(f, [])) for f in folders}
    has_class_below: set[str] = set()
    classes: list[str] = []
    dropped: dict[str, list[Any]] = {}
    home: list[str | None] = [None] * len(rows)
    for f in sorted(folders, key=lambda f: (-len(Path(f).parts), f)):
        parent = str(Path(f).parent)
        members = assigned[f]
        distinct = len({group_of[m] for m in members})
        if f in has_class_below:
            if members:
                dropped[f] = [distinct, "drawings beside class sub-folders (a mixture)"]
        elif distinct >= min_count and f != ".":
            classes.append(f)
            for m in members:
                home[m] = f
        elif parent != f and parent in assigned:
            assigned[parent] += members
        elif members:
            dropped[f] = [distinct, f"fewer than {min_count} distinct drawings"]
        if f in has_class_below or f in classes:
            p = Path(f)
            while str(p.parent) != str(p):
                p = p.parent
                has_class_below.add(str(p))
    # a folder whose drawings merged upward into a dropped folder is recorded there
    return sorted(classes), home, dropped


def _keep_one_per_group(
    rows: list[dict[str, Any]],
    members_of: dict[int, list[int]],
    group_of: list[int],
    home: list[str | None],
) -> tuple[dict[int, int | None], dict[str, list[int]]]:
    """The kept member of each group and the kept files of each class: the member in the
    class that reaches the fewest groups (so small classes keep theirs), ties by path."""
    reach: dict[str, set[int]] = defaultdict(set)
    for i, h in enumerate(home):
        if h is not None:
            reach[h].add(group_of[i])
    keep: dict[int, int | None] = {}
    per_folder: dict[str, list[int]] = defaultdict(list)
    for g, members in members_of.items():
        ok = [m for m in members if home[m] is not None]
        k = min(ok, key=lambda m: (len(reach[home[m]]), rows[m]["path"])) if ok else None
        keep[g] = k
        if k is not None:
            per_folder[home[k]].append(k)  # type: ignore[index]
    return keep, per_folder


def build_clipart_manifest(
    root: str | os.PathLike[str] | None = None,
    *,
    min_count: int = 30,
    per_class: int = 80,
    max_pixels: int = 16_000_000,
    seed: int = 0,
    source: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Scan the PNG tree and fix the data set: classes, kept files, duplicate groups.

    Parameters
    ----------
    root : path-like, optional
        The PNG tree (default :data:`DEFAULT_CLIPART_ROOT`).
    min_count : int
        Distinct drawings a leaf folder needs to be a class.
    per_class : int
        Drawings kept per class at most (a seeded pick).
    max_pixels : int
        Files with more pixels are not decoded (listed as too large).
    seed : int
        Seed of the per-class pick.
    source : str
        What the tree is (e.g. the Debian package and version), recorded in the manifest.
    progress : callable, optional
        ``progress(done, total)`` while decoding.

    Returns
    -------
    dict
        ``settings``, ``source``, ``classes`` (folder names; the class index is the position),
        ``counts`` (distinct drawings per class before the cap), ``files`` (``[path, bytes,
        sha1, class]`` of every kept drawing, sorted by path), ``groups`` (every duplicate
        group of two or more files, the kept one first, ``None`` first where none is kept),
        ``dropped_folders`` (``{folder: [count, reason]}``) and ``excluded``
        (``{path: reason}``).
    """
    base = find_clipart(root)
    if check_int(min_count, "min_count", low=1) > check_int(per_class, "per_class", low=1):
        raise ValueError(
            f"need 1 <= `min_count` <= `per_class`, got min_count={min_count}, "
            f"per_class={per_class}"
        )
    paths, excluded = _png_paths(base)
    rows = _scan(base, paths, int(max_pixels), excluded, progress)
    members_of, group_of = _duplicate_groups(rows)
    classes, home, dropped = _class_folders(rows, group_of, int(min_count))
    classes, home, keep, per_folder = _settle_classes(
        rows, (members_of, group_of), classes, home, dropped, int(min_count)
    )
    files, counts, merges = _pick_files(rows, classes, per_folder, int(per_class), int(seed))
    return {
        "format": 1,
        "source": source,
        "settings": {
            "min_count": int(min_count),
            "per_class": int(per_class),
            "max_pixels": int(max_pixels),
            "seed": int(seed),
            "hash": f"difference hash of a {_HASH_SIDE} x {_HASH_SIDE + 1} greyscale thumbnail",
        },
        "classes": classes,
        "counts": counts,
        "merged": merges,
        "files": files,
        "groups": _listed_groups(rows, members_of, keep, home, classes),
        "dropped_folders": dict(sorted(dropped.items())),
        "excluded": dict(sorted(excluded.items())),
    }


def _png_paths(base: Path) -> tuple[list[str], dict[str, str]]:
    """Every PNG below ``base`` (relative, sorted) outside the folders that name no category,
    and those inside them with the reason they are left out."""
    paths = sorted(
        str(Path(d, f).relative_to(base))
        for d, _, files in os.walk(base)
        for f in files
        if f.lower().endswith(".png")
    )
    excluded: dict[str, str] = {}
    for p in [p for p in paths if Path(p).parts[0] in NOT_A_CATEGORY]:
        excluded[p] = "in a folder that names no category"
    return [p for p in paths if p not in excluded], excluded


def _settle_classes(
    rows: list[dict[str, Any]],
    groups: tuple[dict[int, list[int]], list[int]],
    classes: list[str],
    home: list[str | None],
    dropped: dict[str, list[Any]],
    min_count: int,
) -> tuple[list[str], list[str | None], dict[int, int | None], dict[str, list[int]]]:
    """One drawing kept per duplicate group (:func:`_keep_one_per_group`), the classes the
    kept copies leave below ``min_count`` dropped (into ``dropped``), until every class keeps
    enough: the classes, each file's class, the kept member of each group, each class's files."""
    members_of, group_of = groups
    while True:
        keep, per_folder = _keep_one_per_group(rows, members_of, group_of, home)
        small = sorted(f for f in classes if len(per_folder[f]) < min_count)
        if not small:
            return classes, home, keep, per_folder
        for f in small:  # copies kept in other classes leave it below the count
            dropped[f] = [len(per_folder[f]), f"fewer than {min_count} distinct drawings kept"]
        home = [None if h in small else h for h in home]
        classes = [f for f in classes if f not in small]


def _listed_groups(
    rows: list[dict[str, Any]],
    members_of: dict[int, list[int]],
    keep: dict[int, int | None],
    home: list[str | None],
    classes: list[str],
) -> list[list[str | None]]:
    """Every duplicate group of two or more files as paths, the kept one first (``None``
    where none is kept in a class), sorted by the kept path."""
    listed = []
    for g, members in members_of.items():
        if len(members) < 2:
            continue
        k = keep[g]
        kept = rows[k]["path"] if k is not None and home[k] in classes else None
        listed.append([kept, *sorted(rows[m]["path"] for m in members if m != k)])
    listed.sort(key=lambda g: (g[0] is None, g[0] or "", g[1]))
    return listed


def _scan(
    base: Path,
    paths: list[str],
    max_pixels: int,
    excluded: dict[str, str],
    progress: Callable[[int, int], None] | None,
) -> list[dict[str, Any]]:
    """Decode every file once: its folder, size, SHA-1, real path, name key and difference
    hash (files too large or unreadable go to ``excluded`` with the reason)."""
    from PIL import Image

    rows: list[dict[str, Any]] = []
    for i, p in enumerate(paths):
        if progress is not None:
            progress(i, len(paths))
        full = base / p
        try:
            w, h = _png_size(full)
            if w * h > max_pixels:
                excluded[p] = f"too large ({w} x {h} pixels)"
                continue
            data = full.read_bytes()
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                rgb = to_rgb(im)
        except (OSError, ValueError, SyntaxError) as exc:
            excluded[p] = f"unreadable ({type(exc).__name__}: {exc})"
            continue
        rows.append(
            {
                "path": p,
                "folder": str(Path(p).parent),
                "bytes": len(data),
                "sha1": hashlib.sha1(data).hexdigest(),
                "real": os.path.realpath(full),
                "name": _name_key(p),
                "dhash": _difference_hash(rgb),
            }
        )
    return rows


def _duplicate_groups(rows: list[dict[str, Any]]) -> tuple[dict[int, list[int]], list[int]]:
    """Join files that share a real path, bytes, name key or (non-flat) difference hash: the
    members of each group by its root, and each file's root."""
    groups = _Groups(len(rows))
    flat = "0" * (_HASH_SIDE * _HASH_SIDE // 4)
    for key in ("real", "sha1", "name", "dhash"):
        by: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            if not (key == "dhash" and r[key] == flat):  # flat thumbnails say nothing
                by[r[key]].append(i)
        for members in by.values():
            if len(members) > 1:
                groups.join(members)
    members_of: dict[int, list[int]] = defaultdict(list)
    for i in range(len(rows)):
        members_of[groups.find(i)].append(i)
    return members_of, [groups.find(i) for i in range(len(rows))]


def _pick_files(
    rows: list[dict[str, Any]],
    classes: list[str],
    per_folder: dict[str, list[int]],
    per_class: int,
    seed: int,
) -> tuple[list[list[Any]], dict[str, int], dict[str, list[str]]]:
    """The kept files ``[path, bytes, sha1, class]`` (a seeded pick of ``per_class`` where a
    class has more, sorted by path), the count of each class before the pick and the other
    folders whose copies each class holds."""
    rng = random.Random(seed)
    files = []
    counts: dict[str, int] = {}
    merges: dict[str, list[str]] = {}
    for c, f in enumerate(classes):
        ms = sorted(per_folder[f], key=lambda m: rows[m]["path"])
        counts[f] = len(ms)
        if len(ms) > per_class:
            ms = sorted(rng.sample(ms, per_class), key=lambda m: rows[m]["path"])
        files += [[rows[m]["path"], rows[m]["bytes"], rows[m]["sha1"], c] for m in ms]
        merged = sorted({rows[m]["folder"] for m in per_folder[f]} - {f})
        if merged:
            merges[f] = merged
    files.sort()
    return files, counts, merges


def write_clipart_manifest(manifest: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a manifest as gzipped JSON (one file row per line, reproducible bytes)."""
    from bayesurl.files import atomic_write

    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    atomic_write(path, gzip.compress(text.encode(), mtime=0))


def read_clipart_manifest(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The manifest (default: the one committed with the package)."""
    p = Path(path) if path is not None else CLIPART_MANIFEST
    with gzip.open(p, "rt") as f:
        manifest = json.load(f)
    if manifest.get("format") != 1:
        raise ValueError(f"{str(p)!r} is not a clipart manifest of format 1")
    return manifest


def clipart_classes(manifest: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The class names (folders) in index order."""
    return tuple((manifest or read_clipart_manifest())["classes"])


_CACHE: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def clear_clipart_cache() -> None:
    """Forget the decoded images :func:`clipart` keeps per process (the next call decodes)."""
    _CACHE.clear()


def _load_images(
    base: Path, manifest: dict[str, Any], size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    from PIL import Image

    files = manifest["files"]
    missing = [f[0] for f in files if not (base / f[0]).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of the {len(files)} clipart files of the manifest are missing under "
            f"{str(base)!r} (first: {missing[0]!r}); the tree is not the one the manifest was "
            f"made from ({manifest.get('source') or 'unknown source'}): {CLIPART_HOW_TO_GET}, or "
            "build a manifest of this tree (tools/clipart_manifest.py) and pass `manifest`"
        )
    images = torch.empty((len(files), 3, size, size), dtype=torch.uint8)
    for i, (path, nbytes, sha1, _) in enumerate(files):
        data = (base / path).read_bytes()
        if len(data) != int(nbytes) or hashlib.sha1(data).hexdigest() != sha1:
            raise ValueError(
                f"clipart file {path!r} under {str(base)!r} differs from the manifest "
                f"({len(data)} bytes, expected {nbytes}, or another SHA-1): the tree is not the "
                f"one the manifest was made from ({manifest.get('source') or 'unknown source'})"
            )
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            rgb = _square_resize(to_rgb(im), size)
        images[i] = torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1)
    labels = torch.tensor([int(f[3]) for f in files], dtype=torch.int64)
    return images, labels


def clipart(
    root: str | os.PathLike[str] | None = None,
    split: str = "all",
    transform: Transform | None = None,
    *,
    size: int = 128,
    manifest: str | os.PathLike[str] | dict[str, Any] | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> ImageTensorDataset:
    """Open Clip Art drawings as an in-memory RGB image set (see the module docs).

    Parameters
    ----------
    root : path-like, optional
        The PNG tree (default ``/usr/share/openclipart/png``, Debian ``openclipart-png``).
    split : {"all", "train", "test"}
        Every kept drawing, or a seeded stratified split holding out ``test_fraction`` of
        every class (the drawings have no official split).
    transform : callable, optional
        Per-item transform of the ``uint8`` image ``[3, size, size]``.
    size : int
        Side of the square images.
    manifest : path-like or dict, optional
        The manifest fixing classes and files (default: the committed one).
    test_fraction : float
        Held-out share of every class for ``"train"`` / ``"test"``.
    seed : int
        Seed of the train / test split.

    Returns
    -------
    ImageTensorDataset
        ``uint8`` ``[N, 3, size, size]``, labels ``0..K-1``, ``classes`` the folder names.

    Raises
    ------
    FileNotFoundError
        When the tree is absent (with the line that installs it) or a manifest file is missing.
    ValueError
        On a bad argument or a file that differs from the manifest.
    """
    if split not in ("all", "train", "test"):
        raise ValueError(f"`split` must be one of ['all', 'test', 'train'], got {split!r}")
    check_int(size, "size", low=8)
    base = find_clipart(root)
    man = manifest if isinstance(manifest, dict) else read_clipart_manifest(manifest)
    digest = hashlib.sha1(json.dumps(man["files"]).encode()).hexdigest()
    key = (str(base.resolve()), digest, int(size))
    if key not in _CACHE:  # decoding takes seconds; a process reads each size once
        _CACHE[key] = _load_images(base, man, int(size))
    images, labels = _CACHE[key]
    if split != "all":
        train_idx, test_idx = stratified_split(labels, test_fraction, seed=seed)
        idx = train_idx if split == "train" else test_idx
        images, labels = images[idx], labels[idx]
    return ImageTensorDataset(
        images, labels, transform, list(man["classes"]), f"clipart{int(size)}/{split}"
    )


def _ood(size: int) -> tuple[ImageTensorDataset, str]:
    """The OOD set of the clip art: Fashion-MNIST's test photographs of clothes (the digits
    where it is absent), RGB at ``size``."""
    try:
        ood, name = fashion_mnist(None, "test"), "fashion_mnist"
        images = ood.images.unsqueeze(1) if ood.images.ndim == 3 else ood.images
        images = upsample_uint8(images, size)
    except FileNotFoundError:
        images, _ = load_digits_images(size)
        name = "digits"
    images = images.expand(-1, 3, -1, -1).contiguous()
    labels = torch.zeros(len(images), dtype=torch.int64)
    return ImageTensorDataset(images, labels, name=f"{name}/ood"), name


def _pool(
    root: str | os.PathLike[str] | None, seed: int, image_size: int | None
) -> tuple[ImageTensorDataset, torch.Tensor, ImageTensorDataset, str]:
    """Every kept drawing at ``image_size`` (default 128) as one pool for the class-split
    protocol: a seeded stratified 20 % of each class held out, :func:`_ood` as OOD set."""
    size = int(image_size or 128)
    pool = clipart(root, "all", size=size)
    _, held_idx = stratified_split(pool.targets, 0.2, seed=seed)
    held = torch.zeros(len(pool), dtype=torch.bool)
    held[held_idx] = True
    ood, ood_name = _ood(size)
    return ImageTensorDataset(pool.images, pool.targets, name="clipart"), held, ood, ood_name


register_dataset(
    "clipart", kind=DatasetKind.POOL, classes=clipart_classes, ood="fashion_mnist", pool=_pool
)(clipart)
