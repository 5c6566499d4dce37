"""Neighbour ids remembered by the content of the embeddings they were searched for.

Several rows of a benchmark score one embedding with different uncertainties: PVU, post-hoc
TaU and laplace-torch Laplace wrap the CE net and keep its embedding, and the two free
baselines of a frozen backbone both retrieve with its features. The exact kNN search
(``N^2 D`` multiply-adds) is the evaluation's main cost, so :class:`NeighborMemo` keeps the
ids of each search under a content hash of the embedding (shape, dtype and bytes) and hands
them back to :func:`~bayesurl.evaluation.evaluate` (``neighbors=``) when the same tensor comes
again, bit for bit. Nothing else is assumed: a different tensor is a different key.

Entries live in memory (the last ``max_entries``) and, with ``folder``, on disk as sealed
folders (:func:`bayesurl.files.seal`, read back with ``weights_only=True``; the last
``max_disk_entries`` written are kept), so the workers of a stored sweep share them; a missing,
truncated or altered entry is a miss (with a warning), never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
from torch import Tensor

from bayesurl._checks import check_int, check_integer, check_tensor
from bayesurl.files import CorruptedFileError, atomic_open, seal, unseal

__all__ = ["NeighborMemo"]

_FILE = "neighbors.pt"
#: part of every key: a change to the search's order or tie rule must not reuse older ids
_SEARCH = "exact-cosine-ties-to-lowest-index-v1"


class NeighborMemo:
    """Search results of :func:`~bayesurl.evaluation.evaluate` by embedding content.

    Parameters
    ----------
    folder : path-like, optional
        Where entries are also kept on disk (one sealed folder per key); ``None``: in memory
        only.
    max_entries : int
        Entries kept in memory (least recently used dropped first).
    max_disk_entries : int
        Entries kept in ``folder`` (the oldest written removed first): about 2.8 MB each for
        35,000 queries and 10 neighbours, so a 40-split sweep keeps the last few splits' only.

    Examples
    --------
    >>> import torch
    >>> from bayesurl.evaluation import evaluate
    >>> x, y = torch.randn(60, 8), torch.arange(60) % 3
    >>> memo = NeighborMemo()
    >>> first = evaluate(x, y, uncertainties=torch.rand(60), return_neighbors=True)
    >>> memo.put(x, first["neighbors"])
    >>> again = evaluate(x, y, uncertainties=torch.rand(60), neighbors=memo.get(x))
    >>> again["r@1"] == first["r@1"]
    True
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        max_entries: int = 4,
        max_disk_entries: int = 64,
    ):
        self.folder = None if folder is None else Path(os.fspath(folder))
        self.max_entries = check_int(max_entries, "max_entries", low=1)
        self.max_disk_entries = check_int(max_disk_entries, "max_disk_entries", low=1)
        self._memory: OrderedDict[str, Tensor] = OrderedDict()
        #: lookups answered (from memory or disk) and missed, for reports and tests
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(embeddings: Tensor, backend: str = "torch") -> str:
        """Hex digest of the search backend and the embedding's shape, dtype and bytes."""
        x = check_tensor(embeddings, "embeddings", ndim=2, finite=False)
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{_SEARCH}|{backend}|{x.dtype}|{tuple(x.shape)}|".encode())
        flat = x.detach().cpu().contiguous().reshape(-1)
        h.update(flat.view(torch.uint8).numpy().data if flat.numel() else b"")
        return h.hexdigest()

    def get(self, embeddings: Tensor, backend: str = "torch") -> Tensor | None:
        """The ids stored for ``embeddings`` (``[N, k]`` int64 on the CPU), or ``None``."""
        return self.lookup(self.key(embeddings, backend), embeddings.shape[0])

    def put(self, embeddings: Tensor, neighbors: Tensor, backend: str = "torch") -> None:
        """Keep the ids ``[N, k]`` that the search of ``embeddings`` returned.

        An entry with at least as many columns is kept as it is (its first ``k`` columns are
        the same ids).
        """
        self.store(self.key(embeddings, backend), neighbors, embeddings.shape[0])

    def lookup(self, key: str, rows: int) -> Tensor | None:
        """:meth:`get` by a :meth:`key` already computed (the hash reads every byte once)."""
        hit = self._memory.get(key)
        if hit is None and self.folder is not None:
            hit = self._load(key, rows)
            if hit is not None:
                self._remember(key, hit)
        if hit is None:
            self.misses += 1
            return None
        self._memory.move_to_end(key)
        self.hits += 1
        return hit

    def store(self, key: str, neighbors: Tensor, rows: int) -> None:
        """:meth:`put` by a :meth:`key` already computed, for ``rows`` queries."""
        nb = check_tensor(neighbors, "neighbors", ndim=2, finite=False)
        check_integer(nb, "neighbors", "integer ids")
        if nb.shape[0] != rows:
            raise ValueError(
                f"length mismatch: `neighbors` has {nb.shape[0]} rows, expected {rows}"
            )
        old = self._memory.get(key)
        if old is not None and old.shape[1] >= nb.shape[1]:
            return
        nb = nb.detach().to("cpu", torch.long).contiguous()
        self._remember(key, nb)
        if self.folder is not None:
            entry = self.folder / key
            with atomic_open(entry / _FILE, "wb") as fh:
                torch.save(nb, fh)
            seal(entry, {"key": key, "rows": nb.shape[0], "k": nb.shape[1]}, [_FILE])
            self._prune()

    def _prune(self) -> None:
        """Remove the oldest entries beyond ``max_disk_entries`` (another worker may be
        removing them too)."""
        assert self.folder is not None
        entries = []
        for p in self.folder.iterdir():
            with contextlib.suppress(OSError):
                if p.is_dir():
                    entries.append((p.stat().st_mtime, p))
        for _, p in sorted(entries)[: max(0, len(entries) - self.max_disk_entries)]:
            shutil.rmtree(p, ignore_errors=True)

    def _remember(self, key: str, nb: Tensor) -> None:
        self._memory[key] = nb
        self._memory.move_to_end(key)
        while len(self._memory) > self.max_entries:
            self._memory.popitem(last=False)

    def _load(self, key: str, rows: int) -> Tensor | None:
        assert self.folder is not None
        entry = self.folder / key
        try:
            meta = unseal(entry)
            nb = torch.load(entry / _FILE, map_location="cpu", weights_only=True)
            ok = (
                meta.get("key") == key
                and isinstance(nb, Tensor)
                and nb.dtype == torch.long
                and tuple(nb.shape) == (rows, meta.get("k"))
            )
            if not ok:
                raise CorruptedFileError(f"{str(entry)!r} does not hold [{rows}, k] int64 ids")
        except FileNotFoundError:
            return None
        except (CorruptedFileError, RuntimeError, OSError, ValueError) as exc:
            warnings.warn(f"searching again: {exc}", UserWarning, stacklevel=3)
            return None
        return nb
