"""On-disk, memory-mapped cache of frozen-encoder embeddings (PVU, thesis section 5.3).

"Cache everything": once the encoder is frozen, the uncertainty head only needs the
representations ``e(x)`` of every training step, so they are computed once for all epochs,
including their random augmentations (one *pass* over the loader per epoch), and the head is
trained from disk. The PVU paper reports 180x faster head training on GPU.

Layout of a cache directory::

    meta.json        {"format", "n_items", "passes", "dim", "dtype", "has_labels",
                      "encoder_fingerprint", "input_shape",
                      "files": {name: {"bytes", "sha256"}}}
    embeddings.bin   raw [passes * n_items, dim] array (row r = pass r // n_items)
    labels.bin       raw int64 [passes * n_items] (only with labels)

Both arrays are opened with :class:`numpy.memmap`, so the cache can be far larger than RAM:
a batch reads only its own rows. ``meta.json`` is written last, atomically, with each array's
size and SHA-256 (:func:`bayesurl.files.seal`); opening a cache checks them
(:func:`bayesurl.files.unseal`), so a truncated or altered cache raises
:class:`~bayesurl.files.CorruptedFileError` (a ``ValueError``) instead of being read.

``encoder_fingerprint`` (:func:`encoder_fingerprint`: a SHA-256 of the encoder's class and
state dict) ties the cache to the encoder that wrote it: a PVU head is trained only from
embeddings of its own encoder (:meth:`EmbeddingCache.check_encoder`).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bayesurl._modules import eval_mode
from bayesurl.data.batch import unpack_batch
from bayesurl.files import CorruptedFileError, seal, unseal
from bayesurl.posthoc.base import device_of, encode, iterate

__all__ = ["EmbeddingCache", "encoder_fingerprint"]

_FORMAT = "bayesurl.embedding-cache/2"
_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64}


def encoder_fingerprint(encoder: nn.Module) -> str:
    """SHA-256 hex digest of an encoder's class, state names, shapes, dtypes and values.

    Two encoders get the same fingerprint exactly when they are of the same class and hold
    bit-identical state (device does not matter), so embeddings cached from one can stand in for
    the other (PVU's "cache everything", thesis section 5.3, assumes the frozen encoder that
    trains the head is the one that filled the cache).

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


class EmbeddingCache:
    """Embeddings of ``passes`` augmentation passes over a dataset, memory-mapped from disk.

    Build one with :meth:`build`; open an existing one with ``EmbeddingCache(directory)``.

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
    embeddings : numpy.memmap
        ``[passes * n_items, dim]`` read-only map.
    labels : numpy.memmap or None
        ``[passes * n_items]`` int64 labels.
    encoder_fingerprint : str or None
        :func:`encoder_fingerprint` of the encoder that wrote the cache (``None`` for a cache
        written before fingerprints were recorded).
    """

    def __init__(self, directory: str | os.PathLike, *, verify: bool = True) -> None:
        self.directory = Path(directory)
        if not (self.directory / "meta.json").exists():
            raise FileNotFoundError(f"no embedding cache in {self.directory} (meta.json missing)")
        try:
            meta = unseal(self.directory, checksum=verify)
            if meta.get("format") != _FORMAT:
                raise ValueError(
                    f"format {meta.get('format')!r} is not {_FORMAT!r} (an older bayesurl?)"
                )
            self.n_items = int(meta["n_items"])
            self.passes = int(meta["passes"])
            self.dim = int(meta["dim"])
            self.dtype = str(meta["dtype"])
            has_labels = bool(meta["has_labels"])
            fp = meta.get("encoder_fingerprint")
            if fp is not None and not isinstance(fp, str):
                raise ValueError(f"encoder_fingerprint must be a string, got {fp!r}")
            self.encoder_fingerprint: str | None = fp
            shape = meta.get("input_shape")
            #: shape of one input item the encoder saw (None when not recorded)
            self.input_shape = None if shape is None else tuple(int(d) for d in shape)
            np_dtype = _DTYPES[self.dtype]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptedFileError(
                f"`directory` {self.directory}: corrupted meta.json or data ({exc}); rebuild it "
                "with EmbeddingCache.build(..., overwrite=True)"
            ) from exc
        rows = self.passes * self.n_items
        self.embeddings = self._map("embeddings.bin", np_dtype, (rows, self.dim))
        self.labels = self._map("labels.bin", np.int64, (rows,)) if has_labels else None

    def _map(self, name: str, dtype: Any, shape: tuple[int, ...]) -> np.memmap:
        path = self.directory / name
        if not path.exists():
            raise FileNotFoundError(f"embedding cache {self.directory} lacks {name}")
        want = int(np.prod(shape)) * np.dtype(dtype).itemsize
        got = path.stat().st_size
        if got != want:
            raise ValueError(
                f"`directory` {self.directory}: {name} has {got} bytes, meta.json implies {want} "
                "(truncated or corrupted cache)"
            )
        if want == 0:
            return np.zeros(shape, dtype=dtype)  # type: ignore[return-value]
        return np.memmap(path, dtype=dtype, mode="r", shape=shape)

    def __len__(self) -> int:
        return self.passes * self.n_items

    def __repr__(self) -> str:
        return (
            f"EmbeddingCache({str(self.directory)!r}, passes={self.passes}, "
            f"n_items={self.n_items}, dim={self.dim}, labels={self.labels is not None})"
        )

    def check_encoder(self, encoder: nn.Module) -> None:
        """Refuse a cache written by another encoder (or by this one before it changed).

        Raises
        ------
        ValueError
            If ``encoder``'s :func:`encoder_fingerprint` differs from the recorded one.

        Warns
        -----
        UserWarning
            If the cache records no fingerprint (written by an older version): the embeddings'
            provenance cannot be checked.
        """
        if self.encoder_fingerprint is None:
            warnings.warn(
                f"embedding cache {self.directory} records no encoder fingerprint (written by an "
                "older bayesurl): cannot check that it holds this encoder's embeddings; rebuild "
                "it with EmbeddingCache.build(..., overwrite=True) to record one",
                UserWarning,
                stacklevel=3,
            )
            return
        got = encoder_fingerprint(encoder)
        if got != self.encoder_fingerprint:
            raise ValueError(
                f"`cache` {self.directory} was built by a different encoder (fingerprint "
                f"{self.encoder_fingerprint[:12]}..., this encoder: {got[:12]}...): its "
                "embeddings are not this encoder's; rebuild it with "
                "EmbeddingCache.build(encoder, loader, directory, overwrite=True) or fit from the "
                "loader"
            )

    @property
    def has_labels(self) -> bool:
        """Whether labels were cached."""
        return self.labels is not None

    @classmethod
    def build(
        cls,
        encoder: nn.Module,
        loader: Iterable[Any],
        directory: str | os.PathLike,
        *,
        passes: int = 1,
        dtype: str = "float32",
        overwrite: bool = False,
        progress: bool = True,
    ) -> EmbeddingCache:
        """Run the frozen ``encoder`` over ``loader`` ``passes`` times and write the cache.

        Each pass draws fresh random augmentations from the loader (PVU caches "all epochs
        including their random augmentations", thesis section 5.3). Batches are streamed to
        disk, so memory holds one batch at a time. The encoder runs in eval mode under
        ``torch.no_grad`` and on the device of its parameters; inputs are moved there.

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
            Replace an existing cache in ``directory``.
        progress : bool
            Show a tqdm bar per pass.
        """
        if int(passes) < 1:
            raise ValueError(f"`passes` must be >= 1, got {passes}")
        if dtype not in _DTYPES:
            raise ValueError(f"unknown `dtype` {dtype!r}; valid: {', '.join(_DTYPES)}")
        directory = Path(directory)
        if (directory / "meta.json").exists() and not overwrite:
            raise ValueError(f"`directory` {directory} already holds a cache; pass overwrite=True")
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("meta.json", "embeddings.bin", "labels.bin"):
            (directory / name).unlink(missing_ok=True)
        device = device_of(encoder)
        n_items, dim, has_labels, item_shape = None, None, None, None
        np_dtype = _DTYPES[dtype]
        with (
            eval_mode(encoder),
            open(directory / "embeddings.bin", "wb") as f_emb,
            open(directory / "labels.bin", "wb") as f_lab,
            torch.no_grad(),
        ):
            for p in range(int(passes)):
                rows = 0
                for batch in iterate(loader, progress, f"caching pass {p + 1}/{passes}"):
                    x, y = unpack_batch(batch)
                    if not isinstance(x, Tensor):
                        raise ValueError(
                            "the cache needs single-view batches x or (x, y), got a pair of "
                            "views; cache each view's loader separately"
                        )
                    e = encode(encoder, x.to(device))
                    item_shape = list(x.shape[1:])
                    if dim is None:
                        dim, has_labels = int(e.shape[1]), y is not None
                    if e.shape[1] != dim:
                        raise ValueError(f"encoder output changed dimension to {e.shape[1]}")
                    if (y is not None) != has_labels:
                        raise ValueError("some batches have labels and others do not")
                    f_emb.write(e.detach().cpu().numpy().astype(np_dtype, copy=False).tobytes())
                    if y is not None:
                        if y.ndim != 1 or y.shape[0] != e.shape[0]:
                            raise ValueError(
                                f"labels must be [N] with N = {e.shape[0]}, got {tuple(y.shape)}"
                            )
                        f_lab.write(y.cpu().numpy().astype(np.int64).tobytes())
                    rows += int(e.shape[0])
                if n_items is None:
                    n_items = rows
                elif rows != n_items:
                    raise ValueError(
                        f"pass {p + 1} yielded {rows} rows but pass 1 yielded {n_items}; "
                        "use a loader with a fixed length (drop_last or no sampler change)"
                    )
        if not n_items:
            raise ValueError("`loader` yielded no data")
        if not has_labels:
            (directory / "labels.bin").unlink()
        meta = {
            "format": _FORMAT,
            "n_items": n_items,
            "passes": int(passes),
            "dim": dim,
            "dtype": dtype,
            "has_labels": bool(has_labels),
            "encoder_fingerprint": encoder_fingerprint(encoder),
            "input_shape": item_shape,
        }
        # meta.json is written last and atomically: it exists only over complete data files
        seal(directory, meta, ["embeddings.bin", *(["labels.bin"] if has_labels else [])])
        return cls(directory, verify=False)

    def rows(self, index: np.ndarray | Tensor) -> tuple[Tensor, Tensor | None]:
        """Embeddings ``[B, D]`` (float32) and labels ``[B]`` of global rows ``index``."""
        idx = np.asarray(index, dtype=np.int64)
        order = np.argsort(idx, kind="stable")  # sorted reads are sequential on disk
        inv = np.empty_like(order)
        inv[order] = np.arange(len(order))
        emb = np.asarray(self.embeddings[idx[order]], dtype=np.float32)[inv]
        lab = None if self.labels is None else np.asarray(self.labels[idx[order]])[inv]
        return torch.from_numpy(emb), None if lab is None else torch.from_numpy(lab)

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
        if int(batch_size) < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
        base = (int(pass_index) % self.passes) * self.n_items
        if shuffle:
            order = torch.randperm(self.n_items, generator=generator).numpy()
        else:
            order = np.arange(self.n_items)
        stop = self.n_items - (self.n_items % batch_size if drop_last else 0)
        for start in range(0, stop, int(batch_size)):
            yield self.rows(base + order[start : start + int(batch_size)])
