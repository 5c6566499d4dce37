"""Exact cosine k-nearest-neighbour search, chunked so memory stays bounded: the entry points.

The retrieval metrics of the URL benchmark (Kirchhof et al., 2023, section 3.1) and of LAM
(Warburg et al., 2023, section 5) compare L2-normalised embeddings by cosine similarity
(docs/concepts/metrics.rst, "Recall@1 and Recall@k"). This module is the one kNN implementation
every metric uses.

Decisions fixed by docs/concepts/metrics.rst:

- self is excluded **by index** (an exact duplicate of query ``i`` is a valid neighbour);
- ties in similarity go to the **lowest gallery index** (deterministic on every device);
- queries are processed in chunks whose ``[B, N]`` similarity block fits a memory budget, so
  ``N = 200k, D = 2048`` never allocates ``N x N``;
- the result does not depend on how the work is cut (one process or W ranks, any chunking):
  the passes rank by the block products only where their error bound separates the
  candidates and recompute the others in float64 (:mod:`bayesurl.search.float32`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from bayesurl._checks import check_floating, check_int, check_tensor
from bayesurl._optional import require
from bayesurl.distributed import Shards
from bayesurl.search.bf16 import lowp_applies, search_lowp
from bayesurl.search.core import (
    DEFAULT_MEMORY_BUDGET,
    ChunkSource,
    SearchJob,
    normalize,
    rank_budget,
)
from bayesurl.search.float32 import search_exact
from bayesurl.search.fused import fused_applies, search_fused

__all__ = [
    "knn",
    "knn_query",
    "knn_sharded",
    "neighbor_ids",
    "search",
    "search_shards",
]

_BACKENDS = ("torch", "faiss")


def _check_backend(backend: str) -> None:
    if backend not in _BACKENDS:
        raise ValueError(f"`backend` must be one of {_BACKENDS}, got {backend!r}")


def _faiss_search(q: Tensor, g: Tensor, k: int) -> tuple[Tensor, Tensor]:
    faiss = require("faiss", "`backend='faiss'`")
    if q.device.type != "cpu":
        raise ValueError("`backend='faiss'` runs on CPU tensors only; use backend='torch'")
    gn = normalize(g).to(torch.float32).contiguous().numpy()
    qn = normalize(q).to(torch.float32).contiguous().numpy()
    index = faiss.IndexFlatIP(gn.shape[1])
    index.add(gn)
    d, i = index.search(qn, k)
    return torch.from_numpy(d).to(q.dtype), torch.from_numpy(i).long()


def knn_query(
    queries: Tensor,
    gallery: Tensor,
    k: int = 1,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    chunk_size: int | None = None,
    backend: str = "torch",
) -> tuple[Tensor, Tensor]:
    """Exact cosine kNN of ``queries`` among a separate ``gallery``.

    Parameters
    ----------
    queries : Tensor
        ``[M, D]`` query embeddings.
    gallery : Tensor
        ``[N, D]`` gallery embeddings (same device and dtype as ``queries``).
    k : int
        Number of neighbours, ``1 <= k <= N``.
    memory_budget : int
        Bytes allowed for one ``[B, N]`` similarity chunk (default 256 MiB); sets ``B`` unless
        ``chunk_size``.
    chunk_size : int, optional
        Explicit number of query rows per chunk (overrides ``memory_budget``).
    backend : {"torch", "faiss"}
        ``"torch"`` (exact, device of the inputs, ties to lowest index) or ``"faiss"``
        (``IndexFlatIP`` on CPU float32; tie order is faiss's own).

    Returns
    -------
    similarities : Tensor
        ``[M, k]`` cosine similarities, descending.
    indices : Tensor
        ``[M, k]`` gallery indices (int64); ties to the lowest index.

    Notes
    -----
    Cosine similarity of L2-normalised vectors, as in the URL benchmark (section 3.1) and
    docs/concepts/metrics.rst.
    """
    q = check_tensor(queries, "queries", ndim=2, min_points=1)
    g = check_tensor(gallery, "gallery", ndim=2, min_points=1)
    check_floating(q, "queries")
    check_floating(g, "gallery")
    if q.shape[1] != g.shape[1]:
        raise ValueError(
            f"`queries` has dimension {q.shape[1]} but `gallery` has dimension {g.shape[1]}"
        )
    return _knn(q, g, k, memory_budget, chunk_size, backend, exclude_self=False)


def knn(
    embeddings: Tensor,
    k: int = 1,
    *,
    exclude_self: bool = True,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    chunk_size: int | None = None,
    backend: str = "torch",
) -> tuple[Tensor, Tensor]:
    """Exact cosine kNN of every item among the same set, self excluded by index.

    Parameters
    ----------
    embeddings : Tensor
        ``[N, D]`` embeddings (any floating dtype; computations keep it).
    k : int
        Number of neighbours, ``1 <= k <= N - 1`` (``<= N`` without ``exclude_self``).
    exclude_self : bool
        Remove item ``i`` from its own candidates by index (docs/concepts/metrics.rst, "Recall@1 and
        Recall@k"): an exact duplicate at another index stays a valid neighbour.
    memory_budget, chunk_size, backend
        As :func:`knn_query`. With faiss, ``k + 1`` items are searched and self is removed by
        index afterwards.

    Returns
    -------
    similarities : Tensor
        ``[N, k]`` cosine similarities, descending.
    indices : Tensor
        ``[N, k]`` int64 neighbour indices; ties go to the lowest index.

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> knn(x, 1)[1].squeeze(1).tolist()
    [1, 0, 0]
    """
    x = check_tensor(embeddings, "embeddings", ndim=2, min_points=2 if exclude_self else 1)
    return _knn(x, x, k, memory_budget, chunk_size, backend, exclude_self=exclude_self)


def neighbor_ids(embeddings: Tensor, k: int, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """The ids of :func:`knn` (self excluded) for a caller that reads no similarity: the
    second pass then recomputes only the rows whose order the first could not certify."""
    x = check_tensor(embeddings, "embeddings", ndim=2, min_points=2)
    return _knn(x, x, k, memory_budget, None, "torch", exclude_self=True, exact_values=False)[1]


def _knn(
    q: Tensor,
    g: Tensor,
    k: int,
    memory_budget: int,
    chunk_size: int | None,
    backend: str,
    exclude_self: bool,
    exact_values: bool = True,
) -> tuple[Tensor, Tensor]:
    _check_backend(backend)
    if not q.is_floating_point():
        raise ValueError(f"embeddings must be floating point, got {q.dtype}")
    n = g.shape[0]
    k_max = n - 1 if exclude_self else n
    k = check_int(k, "k", low=1, high=k_max)
    if g.dtype != q.dtype or g.device != q.device:
        raise ValueError(
            f"`queries` ({q.dtype}, {q.device}) and `gallery` ({g.dtype}, {g.device}) must "
            "share dtype and device"
        )
    if backend == "faiss":
        return _faiss_knn(q, g, k, exclude_self)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"`chunk_size` must be positive, got {chunk_size}")
    qn = normalize(q)
    gn = qn if g is q else normalize(g)
    self_index = torch.arange(q.shape[0], device=q.device) if exclude_self else None
    return search(
        qn, lambda: [(0, gn)], k, memory_budget, chunk_size, self_index, None, exact_values
    )


def search(
    qn: Tensor,
    gallery: ChunkSource,
    k: int,
    memory_budget: int,
    chunk_size: int | None,
    self_index: Tensor | None,
    shards: Shards | None = None,
    exact_values: bool = True,
) -> tuple[Tensor, Tensor]:
    """Exact top-k of the normalised queries ``qn`` over normalised gallery chunks (the
    arguments: :class:`~bayesurl.search.core.SearchJob`).

    Where the processor multiplies bfloat16 fast (:func:`~bayesurl.search.search_precision`),
    a bfloat16 candidate pass with a rigorous error bound proposes the neighbours, float64
    re-ranks them and a certificate proves them exact
    (:func:`~bayesurl.search.bf16.search_lowp`); the rows it cannot certify, and every search
    elsewhere, take the float32 path (:func:`~bayesurl.search.float32.search_exact`). On a
    GPU where the fused kernel works (:func:`~bayesurl.search.fused.fused_available`) the
    candidate pass is one fused product-and-select instead
    (:func:`~bayesurl.search.fused.search_fused`), with the same certificate's guarantee. All
    give the same neighbours and values bit for bit.
    """
    job = SearchJob(qn, gallery, k, memory_budget, chunk_size, self_index, shards, exact_values)
    if fused_applies(qn, k):
        return search_fused(job)
    if lowp_applies(qn, k):
        return search_lowp(job)
    return search_exact(job)


def knn_sharded(
    embeddings: Tensor,
    k: int = 1,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    chunk_size: int | None = None,
    group: dist.ProcessGroup | None = None,
) -> tuple[Tensor, Tensor]:
    """Exact cosine kNN of this rank's items among every rank's items, self excluded by index.

    Collective over ``group`` (the default process group when None): each rank passes its
    contiguous shard of the ``[N, D]`` embeddings (rank ``r`` holds rows ``offset_r ..
    offset_r + n_r``, ``n_r`` may be 0) and gets its queries' neighbours as **global** row
    ids. The shards travel past every rank in bounded chunks
    (:func:`bayesurl.distributed.ring_chunks`), so no rank holds all ``N x D``; the
    per-chunk results are merged with the single-process tie rule (similarity descending,
    lowest global index first). Without an initialised group it is :func:`knn` itself (one
    chunk, the ``W = 1`` case of the same code). Conventions of docs/concepts/metrics.rst.

    Parameters
    ----------
    embeddings : Tensor
        ``[n_r, D]`` this rank's rows (floating point, same D and dtype on every rank).
    k : int
        Neighbours, ``1 <= k <= N - 1`` for the global ``N``.
    memory_budget : int
        Bytes of the similarity blocks of **one process** (default 256 MiB); each of the ``W``
        ranks uses ``memory_budget // W`` (:func:`~bayesurl.search.rank_budget`).
    chunk_size : int, optional
        See :func:`knn`.
    group : ProcessGroup, optional
        Process group of the shards.

    Returns
    -------
    similarities : Tensor
        ``[n_r, k]`` cosine similarities, descending.
    indices : Tensor
        ``[n_r, k]`` int64 global neighbour ids; ties go to the lowest id.
    """
    x = check_tensor(embeddings, "embeddings", ndim=2, min_points=0)
    if not x.is_floating_point():
        raise ValueError(f"embeddings must be floating point, got {x.dtype}")
    sh = Shards.of(x.shape[0], x.device, group)
    return search_shards(x, k, sh, rank_budget(memory_budget, sh), chunk_size)


def search_shards(
    x: Tensor,
    k: int,
    sh: Shards,
    memory_budget: int,
    chunk_size: int | None,
    *,
    inplace: bool = False,
    exact_values: bool = True,
) -> tuple[Tensor, Tensor]:
    """:func:`knn_sharded` on validated rows ``x`` with the row layout ``sh``;
    ``memory_budget`` is already this rank's (:func:`~bayesurl.search.rank_budget`).
    ``inplace`` normalises ``x`` itself instead of a copy (a caller that owns ``x`` saves one
    ``[n_r, D]`` tensor); ``exact_values=False`` for a caller that reads the ids only
    (:func:`search`)."""
    n = sh.n
    if n < 2:
        raise ValueError(f"`embeddings` needs at least 2 points over all ranks, got {n}")
    k = check_int(k, "k", low=1, high=n - 1)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"`chunk_size` must be positive, got {chunk_size}")
    qn = normalize(x, inplace=inplace)
    own = sh.global_ids(x.device)
    return search(qn, lambda: sh.chunks(qn), k, memory_budget, chunk_size, own, sh, exact_values)


def _faiss_knn(q: Tensor, g: Tensor, k: int, exclude_self: bool) -> tuple[Tensor, Tensor]:
    if not exclude_self:
        return _faiss_search(q, g, k)
    v, i = _faiss_search(q, g, min(k + 1, g.shape[0]))
    own = i == torch.arange(q.shape[0])[:, None]
    # Drop self where faiss returned it, else the last column.
    drop = torch.where(own.any(dim=1), own.int().argmax(dim=1), torch.full_like(i[:, 0], k))
    keep = torch.ones_like(i, dtype=torch.bool)
    keep[torch.arange(i.shape[0]), drop] = False
    return v[keep].view(-1, k), i[keep].view(-1, k)
