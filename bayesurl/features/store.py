"""The one on-disk embedding store (PVU thesis section 5.3).

"Cache everything": once an encoder is frozen, its embeddings are a data source. They are
computed once by :func:`~bayesurl.features.encoding.encode_batches` (the one loop that runs a
frozen encoder over batches, with optional augmentation draws) and written into *shards* of
one format:

.. code-block:: text

    meta.json      {"format", "key", "n", ..., "files": {name: {"bytes", "sha256"}}}
    features.npy   [n, V, D] rows (V: the plain row and / or the augmented views of an item)
    labels.npy     int64 [n] (only when the batches had labels)
    digests.txt    one line per row: the SHA-1 of the image it was encoded from (only when
                   the rows are addressed by image)

The arrays are ``.npy`` files opened with :func:`numpy.load` ``(mmap_mode="r")``, so a store
can be far larger than RAM: a read touches only its own rows. ``meta.json`` is written last,
atomically, with each file's size and SHA-256 (:func:`bayesurl.files.seal`); opening a shard
checks them (:func:`bayesurl.files.unseal`), so a truncated or altered shard is never read.
``key["weights"]`` is the :func:`encoder_fingerprint` of the encoder that wrote it.

Two views of the format:

- :class:`FeatureStore` -- a folder of shards addressed by the SHA-1 of each image's bytes
  (the frozen-feature runs and ``bayesurl folder``: an image already encoded is never encoded
  again, whatever split or call it comes in);
- :class:`EmbeddingCache` -- one shard holding ``passes`` augmentation passes over a loader,
  row ``r`` of pass ``r // n_items`` (the PVU head's training data, one pass per epoch).

Directories written by bayesurl 0.x's ``EmbeddingCache`` (format
``bayesurl.embedding-cache/2``: ``embeddings.bin``, ``labels.bin``) are not read: opening one
raises a ``ValueError`` that names how to rebuild it
(``EmbeddingCache.build(encoder, loader, directory, overwrite=True)``).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bayesurl._checks import check_int
from bayesurl._modules import device_of, eval_mode
from bayesurl.data.batch import iterate, loader_items, unpack_batch
from bayesurl.features.encoding import FrozenEncoder, encode, encode_batches
from bayesurl.files import CorruptedFileError, reuse_or_build, seal, unseal

__all__ = [
    "EmbeddingCache",
    "EmbeddingShard",
    "FeatureStore",
    "encoder_fingerprint",
    "image_digests",
    "write_shard",
    "view_seed",
]

#: The format every shard records in its ``meta.json``.
FORMAT = "bayesurl.embeddings/1"
#: The format of the older ``EmbeddingCache`` directories (raw ``.bin`` files), not read.
_OLD_CACHE_FORMAT = "bayesurl.embedding-cache/2"
_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64}
#: images per extraction batch of :class:`FeatureStore`
EXTRACT_BATCH = 128


def encoder_fingerprint(encoder: nn.Module) -> str:
    """SHA-256 hex digest of an encoder's class, state names, shapes, dtypes and values.

    Two encoders get the same fingerprint exactly when they are of the same class and hold
    bit-identical state (device does not matter), so embeddings stored from one can stand in
    for the other (PVU's "cache everything", thesis section 5.3, assumes the frozen encoder
    that trains the head is the one that filled the cache).

    Parameters
    ----------
    encoder : nn.Module
        The frozen encoder.

    Returns
    -------
    str
        64 hex digits.
    """
    if not isinstance(encoder, nn.Module):
        raise TypeError(f"`encoder` must be an nn.Module, got {type(encoder).__name__}")
    h = hashlib.sha256()
    cls = type(encoder)
    h.update(f"{cls.__module__}.{cls.__qualname__}".encode())
    for name, t in sorted(encoder.state_dict().items()):
        if not isinstance(t, Tensor):
            h.update(f"{name}={t!r}".encode())
            continue
        t = t.detach()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        # bytes of the values (bfloat16 and friends have no numpy dtype: view as raw bytes)
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def image_digests(images: Tensor) -> list[str]:
    """SHA-1 hex digest of each image's bytes (the :class:`FeatureStore`'s address of it)."""
    if len(images) == 0:
        return []
    flat = images.reshape(len(images), -1).contiguous().cpu().numpy()
    return [hashlib.sha1(row.tobytes()).hexdigest() for row in flat]


def write_shard(
    directory: str | os.PathLike[str],
    batches: Iterable[tuple[Tensor, Tensor | None]],
    *,
    dtype: str = "float32",
    digests: list[str] | None = None,
) -> dict[str, Any]:
    """Stream ``(embeddings [B, V, D], labels [B] or None)`` batches into a shard's files.

    Memory holds one batch at a time: ``features.npy`` grows along its first axis (its header,
    written with numpy's room for that axis to grow, is rewritten with the final length).
    Returns ``{"files": [...], "meta": {...}}`` for :func:`bayesurl.files.seal` (or
    :func:`bayesurl.files.reuse_or_build`), which makes it a shard.
    """
    folder = Path(os.fspath(directory))
    if dtype not in _DTYPES:
        raise ValueError(f"unknown `dtype` {dtype!r}; valid: {', '.join(_DTYPES)}")
    np_dtype = np.dtype(_DTYPES[dtype])
    n, shape, has_labels = 0, None, None
    with open(folder / "features.npy", "wb") as f_emb, open(folder / "labels.npy", "wb") as f_lab:
        for emb, y in batches:
            e = emb.numpy().astype(np_dtype, copy=False)
            if shape is None:
                shape, has_labels = e.shape[1:], y is not None
                _npy_header(f_emb, np_dtype, (0, *shape))
                if has_labels:
                    _npy_header(f_lab, np.dtype(np.int64), (0,))
            if e.shape[1:] != shape:
                raise ValueError(f"encoder output changed shape from {shape} to {e.shape[1:]}")
            if (y is not None) != has_labels:
                raise ValueError("some batches have labels and others do not")
            f_emb.write(np.ascontiguousarray(e).tobytes())
            if y is not None:
                if y.ndim != 1 or y.shape[0] != e.shape[0]:
                    raise ValueError(
                        f"labels must be [N] with N = {e.shape[0]}, got {tuple(y.shape)}"
                    )
                f_lab.write(y.cpu().numpy().astype(np.int64).tobytes())
            n += int(e.shape[0])
        if shape is None:
            raise ValueError("`batches` yielded no data")
        f_emb.seek(0)
        _npy_header(f_emb, np_dtype, (n, *shape))
        if has_labels:
            f_lab.seek(0)
            _npy_header(f_lab, np.dtype(np.int64), (n,))
    files = ["features.npy"]
    if has_labels:
        files.append("labels.npy")
    else:
        (folder / "labels.npy").unlink()
    if digests is not None:
        if len(digests) != n:
            raise ValueError(f"`digests` holds {len(digests)} entries for {n} rows")
        (folder / "digests.txt").write_text("\n".join(digests) + "\n")
        files.append("digests.txt")
    return {"files": files, "meta": {"format": FORMAT, "n": n}}


def _npy_header(f: Any, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """Write the ``.npy`` header :func:`numpy.save` writes for an array of ``shape``."""
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
    np.lib.format.write_array_header_1_0(f, {**header, "shape": tuple(int(s) for s in shape)})


class EmbeddingShard:
    """One sealed shard of embeddings, memory-mapped from disk (the format of this module).

    Parameters
    ----------
    directory : str or PathLike
        A folder written by :func:`write_shard` and sealed.
    verify : bool
        Check each file's SHA-256 against ``meta.json`` (sizes are always checked).

    Attributes
    ----------
    features : numpy.ndarray
        ``[n, V, D]`` read-only map.
    labels : numpy.ndarray or None
        ``[n]`` int64 labels.
    digests : list of str or None
        Per row, the SHA-1 of the image it was encoded from.
    meta : dict
        The shard's ``meta.json``; ``meta["key"]`` what its rows depend on.

    Raises
    ------
    FileNotFoundError
        If ``directory`` holds no ``meta.json``.
    CorruptedFileError
        If a file is missing, truncated or altered.
    ValueError
        If it holds an older cache format (the message says how to rebuild it).
    """

    def __init__(self, directory: str | os.PathLike[str], *, verify: bool = True) -> None:
        self.directory = Path(os.fspath(directory))
        self.meta = unseal(self.directory, checksum=verify)
        fmt = self.meta.get("format", FORMAT)  # the first feature shards recorded none
        if fmt == _OLD_CACHE_FORMAT:
            raise ValueError(
                f"`directory` {self.directory} holds an embedding cache of an older bayesurl "
                f"(format {fmt!r}, embeddings.bin), which is no longer read; rebuild it with "
                "EmbeddingCache.build(encoder, loader, directory, overwrite=True)"
            )
        if fmt != FORMAT:
            raise CorruptedFileError(f"{str(self.directory)!r}: unknown format {fmt!r}")
        files = self.meta["files"]
        self.features: np.ndarray = np.load(self.directory / "features.npy", mmap_mode="r")
        self.labels: np.ndarray | None = None
        if "labels.npy" in files:
            self.labels = np.load(self.directory / "labels.npy", mmap_mode="r")
        self.digests: list[str] | None = None
        if "digests.txt" in files:
            self.digests = (self.directory / "digests.txt").read_text().split()
        n = len(self.features)
        for name, got in (("labels", self.labels), ("digests", self.digests)):
            if got is not None and len(got) != n:
                raise CorruptedFileError(f"{self.directory}: {len(got)} {name} for {n} rows")

    @property
    def key(self) -> dict[str, Any]:
        """What the shard's rows depend on (``"weights"``: the encoder's fingerprint)."""
        return dict(self.meta.get("key") or {})

    def __len__(self) -> int:
        return len(self.features)


def _gather(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``array[index]`` read in sorted order (sequential on disk), returned in ``index`` order."""
    order = np.argsort(index, kind="stable")
    out = np.empty((len(index), *array.shape[1:]), dtype=array.dtype)
    out[order] = array[index[order]]
    return out


class EmbeddingCache(EmbeddingShard):
    """Embeddings of ``passes`` augmentation passes over a loader (PVU, thesis section 5.3).

    One shard: row ``r`` is item ``r % n_items`` of pass ``r // n_items``, each pass a fresh
    run over the loader (PVU caches "all epochs including their random augmentations"). Build
    one with :meth:`build`; open an existing one with ``EmbeddingCache(directory)``. A directory
    of the older format (``bayesurl.embedding-cache/2``) raises a ``ValueError`` naming
    :meth:`build` with ``overwrite=True``, which rebuilds it.

    Parameters
    ----------
    directory : str or PathLike
        A directory written by :meth:`build`.
    verify : bool
        Check each file's SHA-256 against ``meta.json`` (sizes are always checked); a
        mismatch raises :class:`~bayesurl.files.CorruptedFileError`.

    Attributes
    ----------
    n_items, passes, dim : int
        Rows per pass, number of passes, embedding dimension.
    embeddings : numpy.ndarray
        ``[passes * n_items, dim]`` read-only map.
    labels : numpy.ndarray or None
        ``[passes * n_items]`` int64 labels.
    encoder_fingerprint : str
        :func:`encoder_fingerprint` of the encoder that wrote the cache.
    input_shape : tuple of int or None
        Shape of one input item the encoder saw.
    """

    def __init__(self, directory: str | os.PathLike[str], *, verify: bool = True) -> None:
        directory = Path(os.fspath(directory))
        if not (directory / "meta.json").exists():
            raise FileNotFoundError(f"no embedding cache in {directory} (meta.json missing)")
        try:
            super().__init__(directory, verify=verify)
            self.n_items = int(self.meta["n_items"])
            self.passes = int(self.meta["passes"])
            fp = self.key["weights"]
            if not isinstance(fp, str):
                raise TypeError(f"encoder fingerprint must be a string, got {fp!r}")
            if self.features.ndim != 3 or self.features.shape[1] != 1:
                raise TypeError(f"features of shape {self.features.shape}, not [n, 1, dim]")
            if len(self) != self.n_items * self.passes:
                raise TypeError(f"{len(self)} rows for {self.passes} x {self.n_items}")
            shape = self.meta.get("input_shape")
        except (KeyError, TypeError, CorruptedFileError) as exc:
            raise CorruptedFileError(
                f"`directory` {directory}: corrupted meta.json or data ({exc}); rebuild it "
                "with EmbeddingCache.build(..., overwrite=True)"
            ) from exc
        self.encoder_fingerprint: str = fp
        self.input_shape = None if shape is None else tuple(int(d) for d in shape)
        self.embeddings: np.ndarray = self.features[:, 0]
        self.dim = int(self.features.shape[-1])
        self.dtype = str(self.features.dtype)

    def __repr__(self) -> str:
        return (
            f"EmbeddingCache({str(self.directory)!r}, passes={self.passes}, "
            f"n_items={self.n_items}, dim={self.dim}, labels={self.labels is not None})"
        )

    @property
    def has_labels(self) -> bool:
        """Whether labels were cached."""
        return self.labels is not None

    def check_encoder(self, encoder: nn.Module) -> None:
        """Refuse a cache written by another encoder (or by this one before it changed).

        Raises
        ------
        ValueError
            If ``encoder``'s :func:`encoder_fingerprint` differs from the recorded one.
        """
        got = encoder_fingerprint(encoder)
        if got != self.encoder_fingerprint:
            raise ValueError(
                f"`cache` {self.directory} was built by a different encoder (fingerprint "
                f"{self.encoder_fingerprint[:12]}..., this encoder: {got[:12]}...): its "
                "embeddings are not this encoder's; rebuild it with "
                "EmbeddingCache.build(encoder, loader, directory, overwrite=True) or fit from the "
                "loader"
            )

    @classmethod
    def build(
        cls,
        encoder: nn.Module,
        loader: Iterable[Any],
        directory: str | os.PathLike[str],
        *,
        passes: int = 1,
        dtype: str = "float32",
        overwrite: bool = False,
        progress: bool = True,
    ) -> EmbeddingCache:
        """Run the frozen ``encoder`` over ``loader`` ``passes`` times and write the cache.

        Each pass draws fresh random augmentations from the loader (PVU caches "all epochs
        including their random augmentations", thesis section 5.3). Batches go through
        :func:`encode_batches` (eval mode, no gradients, the encoder's device) and are streamed
        to disk, so memory holds one batch at a time.

        Parameters
        ----------
        encoder : nn.Module
            Maps inputs to embeddings ``[N, D]``.
        loader : iterable
            Yields ``x`` or ``(x, y)``; every pass must yield the same number of rows.
        directory : str or PathLike
            Created if needed; must not hold a cache unless ``overwrite``.
        passes : int
            Augmentation passes (usually the number of head-training epochs).
        dtype : {"float32", "float16", "float64"}
            Storage type of the embeddings.
        overwrite : bool
            Replace an existing cache (of this or the older format) in ``directory``.
        progress : bool
            Show a tqdm bar per pass.
        """
        check_int(passes, "passes", low=1)
        if dtype not in _DTYPES:
            raise ValueError(f"unknown `dtype` {dtype!r}; valid: {', '.join(_DTYPES)}")
        directory = Path(os.fspath(directory))
        if (directory / "meta.json").exists() and not overwrite:
            raise ValueError(f"`directory` {directory} already holds a cache; pass overwrite=True")
        directory.mkdir(parents=True, exist_ok=True)
        stale = ("meta.json", "features.npy", "labels.npy", "digests.txt", "embeddings.bin")
        for name in (*stale, "labels.bin"):
            (directory / name).unlink(missing_ok=True)
        n_items: list[int] = []
        item_shape: list[int] = []

        def rows() -> Iterator[tuple[Tensor, Tensor | None]]:
            for p in range(int(passes)):
                count = 0
                for e, y in encode_batches(
                    encoder, _shapes(loader, item_shape), progress=progress,
                    desc=f"caching pass {p + 1}/{passes}", total=loader_items(loader),
                ):  # fmt: skip
                    count += len(e)
                    yield e, y
                if n_items and count != n_items[0]:
                    raise ValueError(
                        f"pass {p + 1} yielded {count} rows but pass 1 yielded {n_items[0]}; "
                        "use a loader with a fixed length (drop_last or no sampler change)"
                    )
                if not count:
                    raise ValueError("`loader` yielded no data")
                n_items.append(count)

        built = write_shard(directory, rows(), dtype=dtype)
        meta = {
            **built["meta"],
            "key": {"weights": encoder_fingerprint(encoder)},
            "n_items": n_items[0],
            "passes": int(passes),
            "input_shape": item_shape or None,
        }
        # meta.json is written last and atomically: it exists only over complete data files
        seal(directory, meta, built["files"])
        return cls(directory, verify=False)

    def rows(self, index: np.ndarray | Tensor | range) -> tuple[Tensor, Tensor | None]:
        """Embeddings ``[B, D]`` (float32) and labels ``[B]`` of global rows ``index``."""
        if isinstance(index, Tensor):
            index = index.detach().cpu().numpy()
        idx = np.asarray(index, dtype=np.int64)
        emb = _gather(self.embeddings, idx).astype(np.float32, copy=False)
        lab = None if self.labels is None else torch.from_numpy(_gather(self.labels, idx))
        return torch.from_numpy(emb), lab

    def batches(
        self,
        batch_size: int,
        *,
        pass_index: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> Iterator[tuple[Tensor, Tensor | None]]:
        """Mini-batches ``(embeddings, labels)`` of one pass (``pass_index`` modulo passes)."""
        check_int(batch_size, "batch_size", low=1)
        base = (int(pass_index) % self.passes) * self.n_items
        if shuffle:
            order = torch.randperm(self.n_items, generator=generator).numpy()
        else:
            order = np.arange(self.n_items)
        stop = self.n_items - (self.n_items % batch_size if drop_last else 0)
        for start in range(0, stop, int(batch_size)):
            yield self.rows(base + order[start : start + int(batch_size)])


def _shapes(loader: Iterable[Any], item_shape: list[int]) -> Iterator[Any]:
    """The batches of ``loader``, recording the shape of one input item into ``item_shape``."""
    for batch in loader:
        x, _ = unpack_batch(batch)
        if isinstance(x, Tensor):
            item_shape[:] = list(x.shape[1:])
        yield batch


@dataclass
class FeatureStore:
    """Content-addressed shards of frozen-backbone features (the frozen-feature runs).

    An image is found by the SHA-1 of its bytes (:func:`image_digests`), so the class splits of
    a protocol share one extraction (an image upstream in one split and downstream in another
    is encoded once). Missing images are encoded into a new shard, sealed by
    :func:`bayesurl.files.reuse_or_build`: a corrupted shard is rebuilt, never read. Training
    images get ``views`` rows: row 0 the deterministic transform, rows ``1..views-1`` random
    augmentations drawn once at extraction, view ``v`` of an image seeded by ``seed``, the
    image's digest and ``v`` (:func:`view_seed`): an image's features never depend on which
    images were extracted with it or before it.

    Parameters
    ----------
    directory : str or PathLike
        Root folder; one sub-folder per store key (:meth:`key`), one shard per extraction.
    encoder : FrozenEncoder
        Deterministic encoder (row 0 of every image).
    augment : nn.Module or None
        Random ``uint8`` -> input augmentation of rows ``1..views-1``.
    views : int
        Rows per image when ``augmented`` is asked for (1: no augmentation).
    description : dict
        What the transform and resolution are (JSON-able; part of the key).
    seed : int
        Seed of the augmentations drawn at extraction (with each image's digest and view
        number, :func:`view_seed`).
    progress : bool
        tqdm bar per extraction.
    """

    directory: str | os.PathLike[str]
    encoder: FrozenEncoder
    augment: nn.Module | None
    views: int
    description: dict[str, Any]
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if int(self.views) < 1:
            raise ValueError(f"`views` must be >= 1, got {self.views}")
        if self.views > 1 and self.augment is None:
            raise ValueError("`augment` is required for `views` > 1")
        self.fingerprint = encoder_fingerprint(self.encoder.backbone)
        self.timings: dict[str, float] = {"extract_images": 0.0, "extract_seconds": 0.0}
        # verified shards read once per store object: a caller that streams many small calls
        # (``bayesurl folder``, one call per batch) would otherwise re-verify every shard per call
        self._indices: dict[Path, dict[str, tuple[np.ndarray, int]]] = {}

    def key(self, views: int) -> dict[str, Any]:
        """What the features of one store depend on."""
        return {
            "weights": self.fingerprint,
            "transform": self.description,
            "views": int(views),
            "seed": int(self.seed) if views > 1 else None,
            # rows computed independently of the other images extracted with them (batches of
            # at least MIN_EXTRACT_ROWS, each image's views drawn from its own seed,
            # :func:`view_seed`); shards written before carry no such entries and are not read
            "min_batch": MIN_EXTRACT_ROWS,
            **({"draws": "per-image"} if views > 1 else {}),
        }

    def folder(self, views: int) -> Path:
        """The sub-folder of the shards of ``views`` rows per image."""
        blob = json.dumps(self.key(views), sort_keys=True, default=str).encode()
        return Path(self.directory) / hashlib.sha256(blob).hexdigest()[:16]

    def features(
        self, images: Tensor, *, augmented: bool = False, digests: list[str] | None = None
    ) -> Tensor:
        """Features ``[N, V, F]`` (float32) of ``images`` (``uint8 [N, C, H, W]``).

        ``V = views`` when ``augmented`` else 1. Images not in the store yet are encoded
        into a new sealed shard first. ``digests``: :func:`image_digests` of ``images``,
        when the caller has them already.
        """
        views = int(self.views) if augmented else 1
        if len(images) == 0:
            raise ValueError("`images` is empty: nothing to look up or extract")
        if digests is None:
            digests = image_digests(images)
        elif len(digests) != len(images):
            raise ValueError(f"`digests` holds {len(digests)} entries for {len(images)} `images`")
        folder = self.folder(views)
        if folder not in self._indices:
            self._indices[folder] = _load_shards(folder)
        index = self._indices[folder]
        missing: dict[str, int] = {}
        for i, d in enumerate(digests):
            if d not in index:
                missing.setdefault(d, i)
        if missing:
            shard = self._extract(folder, images[list(missing.values())], list(missing), views)
            _index_shard(EmbeddingShard(shard), index)
        first = next(iter(index.values()))[0]
        out = np.empty((len(images), views, first.shape[-1]), dtype=np.float32)
        by_shard: dict[int, tuple[np.ndarray, list[int], list[int]]] = {}
        for pos, d in enumerate(digests):
            feats, row = index[d]
            by_shard.setdefault(id(feats), (feats, [], []))[1].append(pos)
            by_shard[id(feats)][2].append(row)
        for feats, positions, rows in by_shard.values():
            out[np.asarray(positions)] = _gather(feats, np.asarray(rows))
        return torch.from_numpy(out)

    def _extract(self, folder: Path, images: Tensor, digests: list[str], views: int) -> Path:
        name = hashlib.sha256("".join(digests).encode()).hexdigest()[:16]
        key = {**self.key(views), "images": name}
        # rows are handed to the backbone in batches of at least MIN_EXTRACT_ROWS: CPU kernels
        # pick another algorithm for very small batches (measured: below 16 rows the features
        # differ by ~1e-5), so a short remainder batch would make an image's features depend
        # on how many other images were missing from the store when it was extracted
        padded = _Padded(self.encoder.backbone)

        def build(shard: Path) -> dict[str, Any]:
            t0 = time.perf_counter()
            starts = range(0, len(images), EXTRACT_BATCH)
            chunks = (images[lo : lo + EXTRACT_BATCH] for lo in starts)
            rows = (
                self._encode(x, digests[lo : lo + len(x)], views, padded)
                for lo, x in zip(starts, iterate(
                    chunks, self.progress,
                    f"extracting features ({views} view{'s' if views > 1 else ''} each)",
                    total=len(images),
                ))
            )  # fmt: skip
            built = write_shard(shard, rows, digests=digests)
            self.timings["extract_seconds"] += time.perf_counter() - t0
            self.timings["extract_images"] += len(images) * views
            return built

        reuse_or_build(folder / f"shard-{name}", build, key=key)
        return folder / f"shard-{name}"

    @torch.no_grad()
    def _encode(
        self, images: Tensor, digests: list[str], views: int, backbone: nn.Module
    ) -> tuple[Tensor, None]:
        """Rows ``[B, views, F]`` of one batch: the plain row, then ``views - 1`` augmented
        rows, each image's view ``v`` drawn from its own generator (:func:`view_seed`)."""
        device = device_of(self.encoder)
        x = images.to(device)
        with contextlib.ExitStack() as stack:
            stack.enter_context(eval_mode(self.encoder))
            rows = [encode(backbone, self.encoder.resize(self.encoder.transform(x)))]
            for v in range(1, views):
                drawn = [
                    _draw(self.augment, x[i : i + 1], view_seed(self.seed, d, v))
                    for i, d in enumerate(digests)
                ]
                rows.append(encode(backbone, self.encoder.resize(torch.cat(drawn))))
        return torch.stack(rows, dim=1).float().cpu(), None


#: Smallest batch the store hands to a backbone (short batches are padded, see ``_extract``).
MIN_EXTRACT_ROWS = 32


def view_seed(seed: int, digest: str, view: int) -> int:
    """The seed of augmented view ``view`` of the image with SHA-1 ``digest``.

    A function of the store's ``seed``, the image's content and the view number only, so an
    image gets the same views whatever other images are extracted with it, before it or in
    which order (a run's numbers never depend on the cache's history).
    """
    blob = hashlib.sha256(f"{int(seed)}/{digest}/{int(view)}".encode()).digest()
    return int.from_bytes(blob[:8], "little") & (2**63 - 1)


def _draw(augment: Any, x: Tensor, seed: int) -> Tensor:
    """``augment(x)`` with its randomness drawn from ``seed`` alone.

    An augmentation that takes a ``generator`` (:func:`bayesurl.data.default_augmentation`)
    gets a CPU generator (the same draws on every device); any other draws from torch's
    global generator, seeded in a fork of it.
    """
    gen = torch.Generator().manual_seed(int(seed))
    try:
        takes_generator = "generator" in inspect.signature(augment.forward).parameters
    except (TypeError, ValueError, AttributeError):
        takes_generator = False
    if takes_generator:
        return augment(x, generator=gen)
    # a CUDA generator too: manual_seed reseeds every device's generator
    with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
        torch.manual_seed(int(seed))
        return augment(x)


class _Padded(nn.Module):
    """``module`` run on at least :data:`MIN_EXTRACT_ROWS` rows (repeats of the last row),
    returning the rows it was given."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        if 0 < n < MIN_EXTRACT_ROWS:
            x = torch.cat([x, x[-1:].expand(MIN_EXTRACT_ROWS - n, *x.shape[1:])])
        return self.module(x)[:n]


def _load_shards(folder: Path) -> dict[str, tuple[np.ndarray, int]]:
    """digest -> (the shard's memory-mapped features, row) over every verified shard."""
    index: dict[str, tuple[np.ndarray, int]] = {}
    if not folder.is_dir():
        return index
    for shard in sorted(folder.glob("shard-*")):
        try:
            _index_shard(EmbeddingShard(shard), index)
        except (FileNotFoundError, CorruptedFileError):
            continue  # an unfinished or corrupted shard is rebuilt by the next extraction
    return index


def _index_shard(shard: EmbeddingShard, index: dict[str, tuple[np.ndarray, int]]) -> None:
    """Add the rows of one verified shard to ``index`` (the first shard of a digest wins)."""
    for row, digest in enumerate(shard.digests or []):
        index.setdefault(digest, (shard.features, row))
