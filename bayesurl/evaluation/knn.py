"""Exact cosine k-nearest-neighbour search, chunked so memory stays bounded.

The retrieval metrics of the URL benchmark (Kirchhof et al., 2023, section 3.1) and of LAM
(Warburg et al., 2023, section 5) compare L2-normalised embeddings by cosine similarity
(docs/concepts/metrics.rst, "Recall@1 and Recall@k"). This module is the one kNN implementation
every metric uses.

Decisions fixed by docs/concepts/metrics.rst:

- self is excluded **by index** (an exact duplicate of query ``i`` is a valid neighbour);
- ties in similarity go to the **lowest gallery index** (deterministic on every device);
- queries are processed in chunks whose ``[B, N]`` similarity block fits a memory budget, so
  ``N = 200k, D = 2048`` never allocates ``N x N``;
- the result does not depend on how the work is cut. A float32 matrix product's
  last bits depend on the block's shape and on the item's position in it (measured: one
  dot product of D = 256 took 4 different values over 42 block shapes and 3 positions), so
  exact duplicates did not always tie, and one process and W ranks could order a near tie
  differently. The search therefore ranks by the block products only where their error bound
  (Higham's ``gamma_D``, :func:`_gemm_slack`) separates the candidates, recomputes the
  others per pair in float64 (exact products, one fixed-order sum: the same bits in any
  layout), and takes the top-k in (that similarity descending, index ascending) order among
  every candidate the bound cannot exclude (:func:`search`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from threadpoolctl import ThreadpoolController
from torch import Tensor

from bayesurl._checks import check_floating, check_int, check_tensor
from bayesurl._optional import require
from bayesurl.distributed import Shards
from bayesurl.evaluation import fused

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "SEARCHES",
    "ExactSearch",
    "FaissSearch",
    "KnnFunc",
    "checked_ids",
    "chunk_rows",
    "fused_search",
    "knn",
    "knn_query",
    "knn_sharded",
    "low_precision",
    "normalize",
    "resolve_search",
    "rank_budget",
    "search_precision",
    "search_stats",
    "stable_topk",
]

#: Default bytes allowed for one chunk of the query-gallery similarity matrix (256 MiB).
DEFAULT_MEMORY_BUDGET = 256 * 2**20

_BACKENDS = ("torch", "faiss")

#: Candidates the floating-point pass keeps beyond ``k``: rows whose near ties reach past them
#: are searched again for every item within the error bound (:func:`search`). One is the
#: cheapest: ``topk(k + 6)`` cost 0.36 s more per rank than ``topk(k + 2)`` at N = 60k, W = 2,
#: more than the window search of the 2 % of rows it spares.
_EXTRA = 1

#: A source of gallery chunks ``(global offset, rows)``; called once per pass over the gallery
#: (``ring_chunks`` is a one-pass collective).
ChunkSource = Callable[[], Iterable[tuple[int, Tensor]]]


def normalize(x: Tensor, *, inplace: bool = False) -> Tensor:
    """L2-normalise the rows of ``x`` (zero rows stay zero), keeping device and dtype.

    Parameters
    ----------
    x : Tensor
        ``[..., D]`` vectors.
    inplace : bool
        Overwrite ``x`` with the result (no second ``[..., D]`` tensor); the values are those
        of the copying form bit for bit (the same norm, clamp and division).

    Returns
    -------
    Tensor
        ``x / ||x||`` along the last dimension (docs/concepts/metrics.rst: cosine similarity); ``x``
        itself when ``inplace``.
    """
    check_floating(x, "x")
    eps = torch.finfo(x.dtype).tiny ** 0.5
    if not inplace:
        return F.normalize(x, dim=-1, eps=eps)
    # torch.nn.functional.normalize's own steps, with the division in place
    return x.div_(x.norm(2, dim=-1, keepdim=True).clamp_min(eps))


def chunk_rows(n_gallery: int, dtype: torch.dtype, memory_budget: int) -> int:
    """Number of query rows whose similarity block to ``n_gallery`` items fits the budget.

    Two ``[B, n_gallery]`` buffers (similarities and a mask or copy) are counted.

    Parameters
    ----------
    n_gallery : int
        Gallery size.
    dtype : torch.dtype
        Floating dtype of the similarities.
    memory_budget : int
        Bytes allowed for one chunk.

    Returns
    -------
    int
        Chunk size, at least 1.
    """
    if memory_budget <= 0:
        raise ValueError(f"`memory_budget` must be positive, got {memory_budget}")
    item = torch.empty((), dtype=dtype).element_size()
    return max(1, int(memory_budget // (2 * item * max(n_gallery, 1))))


def rank_budget(memory_budget: int, shards: Shards) -> int:
    """This rank's share of ``memory_budget`` in a sharded evaluation.

    ``memory_budget`` is what one process's similarity blocks may take; under ``W`` ranks each
    takes ``memory_budget // W``, so the ranks together hold one process's working set and the
    per-rank peak shrinks with ``W`` like the embeddings' shard (one process: unchanged).

    Parameters
    ----------
    memory_budget : int
        Bytes of the single-process similarity block(s).
    shards : Shards
        Row layout of the evaluation (its ``world_size`` is ``W``).

    Returns
    -------
    int
        ``max(1, memory_budget // W)``.
    """
    if memory_budget <= 0:
        raise ValueError(f"`memory_budget` must be positive, got {memory_budget}")
    return max(1, memory_budget // shards.world_size)


def stable_topk(sims: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k along dim 1, ordered by (similarity descending, index ascending).

    ``torch.topk`` does not promise an order among equal values. The common case (no tie at the
    k-th place) is handled with ``topk(k + 1)`` and a stable re-sort of the k winners; rows with
    a tie at the boundary fall back to an exact selection of the lowest tied indices.
    """
    b, n = sims.shape
    if k == 1:
        # torch.max returns the first maximal index (documented), i.e. ties to lowest index.
        v, i = sims.max(dim=1)
        return v[:, None], i[:, None]
    kk = min(k + 1, n)
    vals, idx = torch.topk(sims, kk, dim=1, largest=True, sorted=True)
    if kk > k:
        boundary_tie = vals[:, k - 1] == vals[:, k]
        vals, idx = vals[:, :k], idx[:, :k].clone()
        if bool(boundary_tie.any()):
            rows = boundary_tie.nonzero().squeeze(1)
            sub = sims[rows]
            t = vals[rows, k - 1 : k]
            gt = sub > t
            eq = sub == t
            need = k - gt.sum(dim=1, keepdim=True)
            take = gt | (eq & (eq.cumsum(dim=1) <= need))
            sel = take.nonzero()[:, 1].view(rows.numel(), k)  # ascending index per row
            idx[rows] = sel
            vals[rows] = sub.gather(1, sel)
    # Stable re-sort: first by index ascending, then by value descending (stable).
    order = idx.argsort(dim=1)
    idx, vals = idx.gather(1, order), vals.gather(1, order)
    order = vals.argsort(dim=1, descending=True, stable=True)
    return vals.gather(1, order), idx.gather(1, order)


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
        Bytes allowed for one ``[B, N]`` similarity chunk; sets ``B`` unless ``chunk_size``.
    chunk_size : int, optional
        Explicit number of query rows per chunk.
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
    memory_budget : int
        Bytes allowed for one ``[B, N]`` similarity chunk (default 256 MiB).
    chunk_size : int, optional
        Explicit number of query rows per chunk (overrides ``memory_budget``).
    backend : {"torch", "faiss"}
        See :func:`knn_query`. With faiss, ``k + 1`` items are searched and self is removed
        by index afterwards.

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


def _gemm_slack(d: int, dtype: torch.dtype, device: torch.device) -> float:
    """Bound on ``|computed - exact|`` of the cosine of two L2-normalised rows of length ``d``
    as a matrix product computes it in ``dtype``: Higham's ``gamma_n = n u / (1 - n u)`` for a
    dot product of ``n`` terms (any summation order), times ``sum |q_i g_i| <= ||q|| ||g||``,
    with ``n = d + 4`` and 10 % on top for the rows' own normalisation error. ``u`` is the unit
    roundoff of ``dtype``, or of TF32 / bfloat16 where ``torch.get_float32_matmul_precision``
    lets CUDA use them."""
    u = torch.finfo(dtype).eps / 2
    if device.type == "cuda" and dtype == torch.float32:
        prec = torch.get_float32_matmul_precision()
        u = {"high": 2.0**-11, "medium": 2.0**-8}.get(prec, u)
    nu = (d + 4) * u
    return 1.1 * nu / (1.0 - nu) if nu < 0.5 else math.inf


def _pair_sims(q: Tensor, g: Tensor) -> Tensor:
    """float64 dot products of the row pairs ``(q[p], g[p])``, ``[P]``.

    The products of two float32 (or float64 halves) numbers are exact in float64 and each row
    is summed by the same reduction whatever ``P`` or the rows' origin, so a pair gets the same
    bits in every layout (tested over batch shapes and positions).
    """
    return (q.double() * g.double()).sum(dim=-1)


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
    """Exact top-k of the normalised queries ``qn`` over normalised gallery chunks.

    Where the processor multiplies bfloat16 fast (:func:`search_precision`), a bfloat16
    candidate pass with a rigorous error bound proposes the neighbours, float64 re-ranks them
    and a certificate proves them exact (:func:`_search_lowp`); the rows it cannot certify,
    and every search elsewhere, take the float32 path (:func:`_search_exact`). Both give the
    same neighbours and values bit for bit. Arguments as :func:`_search_exact`.

    On a GPU where the fused kernel works (:func:`bayesurl.evaluation.fused.fused_available`)
    the candidate pass is one fused product-and-select instead (:func:`_search_fused`), with
    the same certificate's guarantee.
    """
    if _fused_applies(qn, k):
        return _search_fused(
            qn, gallery, k, memory_budget, chunk_size, self_index, shards, exact_values
        )
    if _lowp_applies(qn, k):
        return _search_lowp(
            qn, gallery, k, memory_budget, chunk_size, self_index, shards, exact_values
        )
    return _search_exact(
        qn, gallery, k, memory_budget, chunk_size, self_index, shards, exact_values
    )


def _search_exact(
    qn: Tensor,
    gallery: ChunkSource,
    k: int,
    memory_budget: int,
    chunk_size: int | None,
    self_index: Tensor | None,
    shards: Shards | None = None,
    exact_values: bool = True,
) -> tuple[Tensor, Tensor]:
    """Exact top-k of the normalised queries ``qn`` over normalised gallery chunks, float32
    (or ``qn``'s dtype) block products.

    ``gallery()`` yields ``(global offset, rows)`` in ascending offset order (one chunk
    ``(0, gallery)`` in one process; every rank's shard in turn under
    :func:`bayesurl.distributed.ring_chunks`); it is called twice (two passes).
    ``self_index`` ``[M]`` holds the queries' own global ids, excluded by index; ``shards``
    (collective, when active) lets every rank learn whether any rank needs the window search.

    Two passes, so that neither the result nor its ties depend on how the work is cut (one
    process or W ranks, any chunking; docs/concepts/metrics.rst: "ties in similarity go to the
    lowest index"):

    1. the block products keep each query's top ``k + 1`` (:func:`_topk_chunked`; for
       ``k = 1`` on CPU the tiled running maximum of :func:`_top1_tiled`, which also keeps
       the runner-up's value: its top 2). With ``s`` the products' error
       bound (:func:`_gemm_slack`) and ``t`` the k-th value, every item of the true top-k
       has a computed value ``>= t - 2 s``; a row is *complete* when its last kept value lies
       below that;
    2. a row is *clean* when the gaps between its first ``k + 1`` values all exceed ``2 s``:
       its top-k and their order are then certain. A second pass recomputes per pair in
       float64 (:func:`_pair_sims`) the candidates of the complete rows that are not clean
       (near ties among the kept candidates), and for the rows that are not complete (a near
       tie at the k-th place: exact duplicates, crowded neighbours) collects every item with
       a block product ``>= t - 3 s`` and recomputes those; with ``exact_values`` also the
       clean rows' top-k. At N = 20k, D = 256 (random rows) 10 % of the rows are not clean
       and 2 % not complete.
       The pass is skipped when no rank has anything to recompute.

    The top-k is taken in (float64 similarity descending, global index ascending) order and
    returned in ``qn``'s dtype; without ``exact_values`` the clean rows keep the block
    products' values (the neighbours are the same; :func:`bayesurl.evaluation.evaluate`
    reads ids only, and skips most of the recomputation: 0.8 s of a 22 s single-process
    search at N = 60k, D = 256). The running top-k of pass 1 is merged in place per block of
    query rows (:func:`_topk_chunked`).
    """
    m, d = qn.shape
    slack = _gemm_slack(d, qn.dtype, qn.device)
    if k == 1 and qn.device.type == "cpu":
        # one running maximum and runner-up over every chunk's tiles (later chunks hold
        # larger indices, so only a strictly better value replaces the best)
        best_v = torch.full((m,), -math.inf, dtype=qn.dtype)
        best_i = torch.zeros(m, dtype=torch.long)
        second = torch.full((m,), -math.inf, dtype=qn.dtype)
        for off, gn in gallery():
            si = None if self_index is None else self_index - off
            gt = gn.T

            def block(r0: int, r1: int, gt: Tensor = gt, si: Tensor | None = si, off: int = off):
                _top1_tiled(
                    qn[r0:r1], gt, self_index=None if si is None else si[r0:r1],
                    second=second[r0:r1], best=(best_v[r0:r1], best_i[r0:r1]), offset=off,
                )  # fmt: skip

            _row_parallel(m, qn.device, block)
        tau = best_v
        complete = best_v - second > 2 * slack  # the certificate: no item within the bound
        clean = complete
        best_v, best_i = best_v[:, None], best_i[:, None]
    else:
        kk = k + _EXTRA
        # -inf placeholders: they and -inf self entries never reach the first k (k <= N - 1)
        best_v = torch.full((m, kk), -math.inf, dtype=qn.dtype, device=qn.device)
        best_i = torch.full((m, kk), -1, dtype=torch.long, device=qn.device)
        work = qn.new_empty(0)  # similarity block, reused by every gallery chunk
        for off, gn in gallery():
            n_c = gn.shape[0]
            si = None if self_index is None else self_index - off
            rows = chunk_rows(n_c, qn.dtype, memory_budget) if chunk_size is None else chunk_size
            if work.numel() < min(rows, m) * n_c:
                work = qn.new_empty(min(rows, m) * n_c)
            _topk_chunked(qn, gn.T, min(kk, n_c), rows, si, work, best_v, best_i, off)
        del work  # pass 2 allocates its own blocks
        tau = best_v[:, k - 1]
        complete = best_v[:, -1] < tau - 2 * slack
        clean = ((best_v[:, :k] - best_v[:, 1 : k + 1]) > 2 * slack).all(dim=1)
    return _exact_order(
        qn, gallery, k, best_v, best_i, tau, complete, clean, slack, memory_budget,
        self_index, shards, exact_values,
    )  # fmt: skip


#: Unit roundoff of bfloat16 (8 significant bits): round-to-nearest moves a value by at most
#: this fraction of its magnitude.
_BF16_U = 2.0**-8

#: The window below the running k-th value ``T`` within which items become candidates is
#: ``c + _WINDOW_REL |T|`` (:func:`_search_lowp`).
_WINDOW_REL = 2.04 * _BF16_U / (1 - _BF16_U)

#: Query rows per task of the threaded passes: ~30 tasks at M = 60k keep two threads busy to
#: the end; a [2048, 1024] tile stays in the last-level cache.
_TASK_ROWS = 2048

#: Gallery columns per tile of the bfloat16 candidate pass, and per block of its gate (a
#: block's maximum decides whether its items are read at all).
_LOWP_COLS = 1024
_LOWP_BLOCK = 32

#: Narrower embeddings keep the float32 path unless forced: at D = 64 the products are a small
#: share of the pass and the candidate bookkeeping outweighs their gain (sampled ECE, N = 35k,
#: S = 10: 1.15x the float32 path's CPU time; ``results/benchmarks/evaluator_precision.txt``).
_LOWP_MIN_D = 128

#: Forced choice of :func:`search` (None: automatic, see :func:`search_precision`).
_FORCE_LOWP: list[bool | None] = [None]

#: Forced choice of the fused candidate pass (None: automatic, CUDA where the kernel works).
_FORCE_FUSED: list[bool | None] = [None]

#: Counters of :func:`search_stats`.
_STATS = {
    "lowp_queries": 0,
    "certified": 0,
    "fallback": 0,
    "candidates": 0,
    "fused_queries": 0,
    "fused_certified": 0,
}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:  # pragma: no cover - not Linux
        pass
    return set()


def _bf16_accumulates_in_fp32(device: torch.device) -> bool:
    """Whether ``torch.mm`` on bfloat16 sums in float32 and rounds once (the error bound of
    :func:`_lowp_bound` assumes it): ``1 + 255 * 2**-9`` would stay ``1`` if every partial
    sum were rounded to bfloat16."""
    a = torch.full((1, 256), 2.0**-9, dtype=torch.bfloat16, device=device)
    a[0, 0] = 1.0
    b = torch.ones(256, 1, dtype=torch.bfloat16, device=device)
    with _exact_bf16_reduction():
        got = float(torch.mm(a, b))
    return abs(got - (1 + 255 * 2.0**-9)) <= _BF16_U * 1.5


@functools.cache
def _sums_in_fp32(device_type: str) -> bool:
    return _bf16_accumulates_in_fp32(torch.device(device_type))


@functools.cache
def _precision_choice(device_type: str) -> tuple[str, str]:
    if device_type == "cuda":
        if not torch.cuda.is_bf16_supported():
            return "float32", "the GPU has no bfloat16 products"
        reason = f"bfloat16 products on {torch.cuda.get_device_name()}"
    elif device_type == "cpu":
        flags = _cpu_flags()
        fast = sorted(flags & {"avx512_bf16", "amx_bf16", "bf16"})
        if not fast:
            return "float32", "the CPU has no bfloat16 instructions (avx512_bf16, amx_bf16, bf16)"
        if not torch.backends.mkldnn.is_available():
            return "float32", "torch was built without oneDNN (its bfloat16 products)"
        reason = f"CPU flags {', '.join(fast)} (torch {torch.backends.cpu.get_cpu_capability()})"
    else:
        return "float32", f"no bfloat16 candidate pass on {device_type}"
    if not _sums_in_fp32(device_type):
        return "float32", "bfloat16 products do not accumulate in float32"
    return "bfloat16", reason


def search_precision(device: torch.device | str = "cpu") -> tuple[str, str]:
    """The candidate pass :func:`knn` and the evaluator's searches use on ``device``.

    ``"bfloat16"`` where the device multiplies bfloat16 fast (CPU flags ``avx512_bf16`` /
    ``amx_bf16`` / ARM ``bf16``, or a CUDA GPU) and sums its products in float32 (checked once
    per process): bfloat16 products propose the candidates, float64 re-ranks them, and a
    certificate proves every returned neighbour exact; ``"float32"`` otherwise. Embeddings
    narrower than 128 keep the float32 path unless forced (:func:`low_precision`): too little
    to gain there. The results are the same bit for bit either way.

    Parameters
    ----------
    device : torch.device or str
        Device of the embeddings.

    Returns
    -------
    precision : str
        ``"bfloat16"`` or ``"float32"``.
    reason : str
        What decided it (CPU flags, GPU name, or what is missing).
    """
    dev = torch.device(device)
    if _FORCE_LOWP[0] is False:
        return "float32", "forced"
    if _FORCE_LOWP[0] and dev.type in ("cpu", "cuda"):
        if _sums_in_fp32(dev.type):  # the bound's premise holds, fast or not
            return "bfloat16", "forced"
        return "float32", "forced, but bfloat16 products do not accumulate in float32 here"
    return _precision_choice(dev.type)


@contextlib.contextmanager
def low_precision(enabled: bool | None) -> Iterator[None]:
    """Force the bfloat16 candidate pass on (``True``) or off (``False``) within the context,
    or leave the choice to :func:`search_precision` (``None``); for benchmarks and tests (the
    results are the same either way)."""
    if enabled not in (True, False, None):
        raise ValueError(f"`enabled` must be True, False or None, got {enabled!r}")
    old = _FORCE_LOWP[0]
    _FORCE_LOWP[0] = enabled
    try:
        yield
    finally:
        _FORCE_LOWP[0] = old


@contextlib.contextmanager
def fused_search(enabled: bool | None) -> Iterator[None]:
    """Force the fused candidate pass of :mod:`bayesurl.evaluation.fused` on (``True``) or off
    (``False``) within the context, or leave the choice to the search (``None``: on CUDA where
    the kernel passed its self-check, embeddings at least 128 wide); for benchmarks and tests
    (the results are the same either way). Forced on, it still needs a working kernel: a GPU,
    or Triton's interpreter on CPU (``TRITON_INTERPRET=1``); :func:`low_precision` ``(False)``
    turns it off too (the float32 path)."""
    if enabled not in (True, False, None):
        raise ValueError(f"`enabled` must be True, False or None, got {enabled!r}")
    old = _FORCE_FUSED[0]
    _FORCE_FUSED[0] = enabled
    try:
        yield
    finally:
        _FORCE_FUSED[0] = old


def search_stats(reset: bool = False) -> dict[str, int]:
    """Counters of the bfloat16 candidate pass since the last reset: ``lowp_queries`` (rows it
    searched), ``certified`` (rows whose neighbours it proved exact), ``fallback`` (rows sent
    to the float32 pass because the certificate failed) and ``candidates`` (float64 re-ranked
    pairs); of the fused pass (:func:`fused_search`): ``fused_queries`` and
    ``fused_certified`` (its other rows went to the unfused passes, counted there).

    Parameters
    ----------
    reset : bool
        Set the counters to zero after reading them.

    Returns
    -------
    dict
        The counters.
    """
    out = dict(_STATS)
    if reset:
        for key in _STATS:
            _STATS[key] = 0
    return out


def _lowp_applies(qn: Tensor, k: int) -> bool:
    # the same answer on every rank (a rank without queries runs the collective passes too)
    if qn.dtype not in (torch.float32, torch.float64):
        return False
    if qn.device.type not in ("cpu", "cuda"):
        return False
    if _FORCE_LOWP[0] is None and qn.shape[1] < _LOWP_MIN_D:
        return False
    return search_precision(qn.device)[0] == "bfloat16"


@contextlib.contextmanager
def _exact_bf16_reduction() -> Iterator[None]:
    """cuBLAS may reduce bfloat16 products in bfloat16 unless told not to (the bound assumes
    float32 sums); no effect on CPU."""
    flag = torch.backends.cuda.matmul
    old = flag.allow_bf16_reduced_precision_reduction
    flag.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        flag.allow_bf16_reduced_precision_reduction = old


def _row_parallel(m: int, device: torch.device, fn: Callable[[int, int], None]) -> None:
    """``fn(r0, r1)`` over ``[0, m)`` in blocks of :data:`_TASK_ROWS` rows, on
    ``torch.get_num_threads()`` threads that each multiply with one thread (CPU).

    Splitting the queries keeps every thread on its own products, so CPU time does not grow
    with the thread count (each product split across threads waited on its slowest part).
    The blocks write disjoint rows; the torch and BLAS kernels release the GIL.
    """
    step = _TASK_ROWS if device.type == "cpu" else 4 * _TASK_ROWS  # GPU: fewer launches
    blocks = [(r0, min(r0 + step, m)) for r0 in range(0, m, step)]
    threads = min(torch.get_num_threads(), len(blocks)) if device.type == "cpu" else 1
    if threads <= 1:
        for r0, r1 in blocks:
            fn(r0, r1)
        return
    todo = iter(blocks)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        torch.set_num_threads(1)  # this thread's own setting
        while not errors:
            with lock:
                block = next(todo, None)
            if block is None:
                return
            try:
                fn(*block)
            except BaseException as exc:  # re-raised in the calling thread
                errors.append(exc)

    with _blas_libraries().limit(limits=1):
        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    if errors:
        raise errors[0]


def _residual_norms(x: Tensor, xb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Upper bounds (float64) of the norms of ``x``, of its bfloat16 copy ``xb`` and of their
    difference, by row blocks. In ``x``'s dtype the difference is exact (``xb`` is ``x`` with
    fewer significant bits) and a norm is off by at most ``(d + 2)`` units of its roundoff, so
    each norm gets twice that on top."""
    d = x.shape[1]
    grow = 1 + 2 * (d + 2) * torch.finfo(x.dtype).eps
    nx, nb, nr = (torch.empty(x.shape[0], dtype=torch.float64, device=x.device) for _ in "abc")
    for a in range(0, x.shape[0], 4096):
        xs, bs = x[a : a + 4096], xb[a : a + 4096].to(x.dtype)
        nx[a : a + 4096] = xs.norm(dim=1)
        nb[a : a + 4096] = bs.norm(dim=1)
        nr[a : a + 4096] = (xs - bs).norm(dim=1)
    return nx * grow, nb * grow, nr * grow


def _lowp_bound(
    q_stats: tuple[Tensor, Tensor, Tensor],
    g_max: tuple[float, float, float],
    d: int,
    unit: float = 2.0**-24,
) -> tuple[Tensor, Tensor]:
    """Per query ``(a, s)``: the computed bfloat16 product ``p`` of query and any gallery row
    satisfies ``|p - exact| <= a + u |p|`` with ``u`` :data:`_BF16_U`; ``s`` bounds ``|p|``.

    With ``q = qb + rq`` (``qb`` its bfloat16 rounding) and ``x = xb + rx``,
    ``q.x - qb.xb = rq.x + qb.rx``, so ``|q.x - qb.xb| <= ||rq|| ||x|| + ||qb|| ||rx||``
    (Cauchy-Schwarz, with the norms of the actual residuals). The products of two bfloat16
    numbers are exact in float32, their float32 sum is off by at most ``gamma_d ||qb|| ||xb||``
    (Higham, any order), and the one rounding of that sum to bfloat16 by at most ``u |p|``.
    Terms get 1 % on top, plus ``1e-30`` for subnormals flushed to zero. ``unit`` is the
    accumulator's unit roundoff (float32's by default).
    """
    nq, nqb, nrq = q_stats
    gx, gxb, grx = g_max
    gamma = (d + 2) * unit / (1 - (d + 2) * unit)
    a = (nrq * gx + nqb * grx + gamma * nqb * gxb) * 1.01 + 1e-30
    s = nqb * gxb * (1 + gamma) * 1.01
    return a, s


def _search_lowp(
    qn: Tensor,
    gallery: ChunkSource,
    k: int,
    memory_budget: int,
    chunk_size: int | None,
    self_index: Tensor | None,
    shards: Shards | None,
    exact_values: bool,
    capacity: int | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`search` with a bfloat16 candidate pass.

    1. **Candidates.** The queries and every gallery chunk are rounded to bfloat16 and
       multiplied tile by tile (query blocks split across threads, :func:`_row_parallel`).
       With ``p`` the bfloat16 products and ``e(p) = a + u |p|`` their error bound
       (:func:`_lowp_bound`), each query keeps a ``floor``: the running maximum of
       ``T - W(T)`` over the running k-th largest ``p`` (``T``; for k = 1 the tile's own
       maximum counts before its items are read), with ``W(T) = 2.04 (a + u |T|) / (1 - u)``,
       the widest gap two bounds can open. Every item with ``p >= floor`` enters the query's
       candidate list (at most ``capacity``, default ``k + max(k, 31)``; ``drop`` keeps the
       largest ``p`` pushed out). A tile whose row maximum lies below the floor costs one
       ``amax``; in the others only blocks of :data:`_LOWP_BLOCK` columns that reach it are
       read.
    2. **Re-rank.** Each candidate gets its float64 similarity computed as the float32 path
       computes it (:func:`_pair_sims`: the same bits), and the top-k is taken in (similarity
       descending, id ascending) order. For k = 1 without ``exact_values`` a lone candidate
       whose lower bound ``p - e(p)`` already clears the certificate needs no float64 value.
    3. **Certificate.** Every item outside the list has ``p <= E = max(floor, drop)`` (the
       floor only rises), hence an exact similarity ``<= E + u |E| + a``, and a float64 one
       at most ``gamma_d`` (float64) above that. When the k-th re-ranked similarity exceeds
       this strictly, no outside item can enter the top-k or tie with its last member: the
       row is certified. The others (``search_stats()["fallback"]``) run
       :func:`_search_exact`; collective under ``shards``, as every pass here.
    """
    m, d = qn.shape
    dev = qn.device
    cap = capacity if capacity is not None else k + max(k, 31)
    over = float(m * cap * 12 > memory_budget)
    if shards is not None:
        over = shards.sum(over)  # collective: every rank takes the same path
    if over:  # candidate lists beyond the budget: the float32 path
        return _search_exact(
            qn, gallery, k, memory_budget, chunk_size, self_index, shards, exact_values
        )
    qb = qn.to(torch.bfloat16)
    q_stats = _residual_norms(qn, qb)
    cand_v = torch.full((m, cap), -math.inf, dtype=torch.float32, device=dev)
    cand_i = torch.full((m, cap), -1, dtype=torch.long, device=dev)
    floor = torch.full((m,), -math.inf, dtype=torch.float32, device=dev)
    drop = torch.full((m,), -math.inf, dtype=torch.float32, device=dev)
    g_max = [0.0, 0.0, 0.0]
    window = None
    for off, gn in gallery():
        gb = qb if gn is qn else gn.to(torch.bfloat16)
        if gn.shape[0]:
            stats = q_stats if gn is qn else _residual_norms(gn, gb)
            g_max = [max(g, float(v.max())) for g, v in zip(g_max, stats, strict=True)]
        if window is None:  # the window of the first chunk (the certificate uses the final bound)
            a, _ = _lowp_bound(q_stats, tuple(g_max), d)
            window = (2.04 * a / (1 - _BF16_U) + 1e-12).float()
        si = None if self_index is None else self_index - off
        gbt = gb.T

        def block(
            r0: int,
            r1: int,
            gbt: Tensor = gbt,
            si: Tensor | None = si,
            off: int = off,
            window: Tensor = window,
        ) -> None:
            _lowp_candidates(
                qb[r0:r1], gbt, k, None if si is None else si[r0:r1], off, window[r0:r1],
                cand_v[r0:r1], cand_i[r0:r1], floor[r0:r1], drop[r0:r1],
            )  # fmt: skip

        with _exact_bf16_reduction():
            _row_parallel(m, dev, block)
    a, _ = _lowp_bound(q_stats, tuple(g_max), d)
    # candidates: every kept item within the window of the final k-th value
    keep = torch.isfinite(cand_v) & (cand_i >= 0) & (cand_v >= floor[:, None])
    edge = torch.maximum(floor, drop).double()
    u64 = 2.0**-53
    slack64 = (d + 2) * u64 / (1 - (d + 2) * u64) * 1.01 * q_stats[0] * g_max[0] + 1e-300
    upper = edge + _BF16_U * 1.01 * edge.abs() + a + slack64
    lone = torch.zeros(m, dtype=torch.bool, device=dev)
    if k == 1 and not exact_values:
        # one candidate whose bound alone clears every other item: its id needs no float64
        p = torch.where(keep, cand_v, -math.inf).amax(dim=1).double()
        low = p - _BF16_U * 1.01 * p.abs() - a - slack64
        lone = (keep.sum(dim=1) == 1) & (low > upper)
    val = torch.full((m, cap), -math.inf, dtype=torch.float64, device=dev)
    val[lone] = torch.where(keep[lone], cand_v[lone].double(), -math.inf)
    step = 512
    for off, gn in gallery():
        loc = cand_i - off
        mine = keep & ~lone[:, None] & (loc >= 0) & (loc < gn.shape[0])
        r, c = mine.nonzero(as_tuple=True)
        for b0 in range(0, r.numel(), step):
            rr, cc = r[b0 : b0 + step], c[b0 : b0 + step]
            val[rr, cc] = _pair_sims(qn[rr], gn[loc[rr, cc]])
    ids = torch.where(keep, cand_i, torch.iinfo(torch.long).max)
    order = ids.argsort(dim=1)
    ids, val = ids.gather(1, order), val.gather(1, order)
    order = val.argsort(dim=1, descending=True, stable=True)[:, :k]
    out_i, out_v = ids.gather(1, order), val.gather(1, order)
    certified = lone | (torch.isfinite(out_v[:, -1]) & (out_v[:, -1] > upper))
    fail = (~certified).nonzero().squeeze(1)
    _STATS["lowp_queries"] += m
    _STATS["certified"] += m - fail.numel()
    _STATS["fallback"] += fail.numel()
    _STATS["candidates"] += int(keep.sum())
    out_v = out_v.to(qn.dtype)
    n_fail = float(fail.numel()) if shards is None else shards.sum(float(fail.numel()))
    if n_fail:  # collective under shards: every rank enters the float32 pass
        fv, fi = _search_exact(
            qn[fail], gallery, k, memory_budget, chunk_size,
            None if self_index is None else self_index[fail], shards, exact_values,
        )  # fmt: skip
        out_v[fail], out_i[fail] = fv, fi
    return out_v, out_i


def _fused_applies(qn: Tensor, k: int) -> bool:
    # the same answer on every rank: dtype, width and device type are, and so is the kernel's
    # self-check
    force = _FORCE_FUSED[0]
    if force is False or _FORCE_LOWP[0] is False:
        return False
    if qn.dtype not in (torch.float32, torch.float64) or qn.device.type not in ("cpu", "cuda"):
        return False
    if force is None and (qn.device.type != "cuda" or qn.shape[1] < _LOWP_MIN_D):
        return False
    if k >= fused.default_config().keep:  # the certificate needs a kept item past the k-th
        return False
    return fused.fused_available(qn.device)[0]


def _search_fused(
    qn: Tensor,
    gallery: ChunkSource,
    k: int,
    memory_budget: int,
    chunk_size: int | None,
    self_index: Tensor | None,
    shards: Shards | None,
    exact_values: bool,
) -> tuple[Tensor, Tensor]:
    """:func:`search` with the fused candidate pass (:func:`bayesurl.evaluation.fused.fused_topk`).

    1. **Candidates.** One kernel keeps each query's top-K (``K`` the kernel's ``keep``) of
       the products ``p`` of the bfloat16 roundings of queries and gallery, summed in float32,
       over every gallery chunk in one running state. ``|p - exact| <= a`` per query
       (:func:`_lowp_bound` with the accumulator's unit roundoff
       :data:`bayesurl.evaluation.fused.ACCUMULATOR_UNIT`; no rounding of ``p`` itself).
    2. **Re-rank.** ``E``, the K-th kept ``p``, bounds every item that was not kept; a kept
       item whose ``p + a`` lies below ``p_k - a`` (``p_k`` the k-th kept) cannot reach the
       top-k, and the others get their float64 similarity (:func:`_pair_sims`, the float32
       path's bits); the top-k is taken in (similarity descending, id ascending) order. For
       k = 1 without ``exact_values`` a lone candidate needs no float64 value.
    3. **Certificate.** Every item that was not kept has a float64 similarity of at most
       ``E + a + gamma_d`` (float64); the row is certified when its k-th similarity (or the
       lone candidate's lower bound) exceeds that strictly. The other rows take the unfused
       passes of :func:`search` (collective under ``shards``).
    """
    m, d = qn.shape
    dev = qn.device
    cfg = fused.default_config()
    qb = qn.to(torch.bfloat16).contiguous()
    q_stats = _residual_norms(qn, qb)
    best_v = torch.full((m, cfg.keep), -math.inf, dtype=torch.float32, device=dev)
    best_i = torch.full((m, cfg.keep), -1, dtype=torch.long, device=dev)
    g_max = [0.0, 0.0, 0.0]
    for off, gn in gallery():
        gb = qb if gn is qn else gn.to(torch.bfloat16).contiguous()
        if gn.shape[0]:
            stats = q_stats if gn is qn else _residual_norms(gn, gb)
            g_max = [max(g, float(v.max())) for g, v in zip(g_max, stats, strict=True)]
        own = None if self_index is None else self_index - off
        fused.fused_topk(qb, gb, best_v, best_i, own=own, offset=off, config=cfg)
    del qb
    a, _ = _lowp_bound(q_stats, tuple(g_max), d, unit=fused.ACCUMULATOR_UNIT)
    u64 = 2.0**-53
    slack64 = (d + 2) * u64 / (1 - (d + 2) * u64) * 1.01 * q_stats[0] * g_max[0] + 1e-300
    w = a + slack64  # [M]: |float64 similarity - p| <= w
    p = best_v.double()
    keep = torch.isfinite(best_v) & (best_i >= 0)
    upper = p.amin(dim=1) + w  # -inf where fewer than K items exist: every item is kept
    pk = p.topk(k, dim=1).values[:, -1]
    need = keep & (p + w[:, None] >= (pk - w)[:, None])
    lone = torch.zeros(m, dtype=torch.bool, device=dev)
    if k == 1 and not exact_values:
        lone = (need.sum(dim=1) == 1) & (pk - w > upper)
        need &= ~lone[:, None]
    val = torch.full((m, cfg.keep), -math.inf, dtype=torch.float64, device=dev)
    val[lone] = torch.where(keep[lone] & (p[lone] == pk[lone, None]), p[lone], -math.inf)
    step = max(512, memory_budget // (32 * d))  # [step, D] gathers and float64 operands
    for off, gn in gallery():
        loc = best_i - off
        r, c = (need & (loc >= 0) & (loc < gn.shape[0])).nonzero(as_tuple=True)
        for b0 in range(0, r.numel(), step):
            rr, cc = r[b0 : b0 + step], c[b0 : b0 + step]
            val[rr, cc] = _pair_sims(qn[rr], gn[loc[rr, cc]])
    ids = torch.where(need | lone[:, None], best_i, torch.iinfo(torch.long).max)
    order = ids.argsort(dim=1)
    ids, val = ids.gather(1, order), val.gather(1, order)
    order = val.argsort(dim=1, descending=True, stable=True)[:, :k]
    out_i, out_v = ids.gather(1, order), val.gather(1, order)
    certified = lone | (torch.isfinite(out_v[:, -1]) & (out_v[:, -1] > upper))
    fail = (~certified).nonzero().squeeze(1)
    _STATS["fused_queries"] += m
    _STATS["fused_certified"] += m - fail.numel()
    out_v = out_v.to(qn.dtype)
    n_fail = float(fail.numel()) if shards is None else shards.sum(float(fail.numel()))
    if n_fail:  # collective under shards: every rank enters the unfused passes
        rest = _search_lowp if _lowp_applies(qn, k) else _search_exact
        fv, fi = rest(
            qn[fail], gallery, k, memory_budget, chunk_size,
            None if self_index is None else self_index[fail], shards, exact_values,
        )  # fmt: skip
        out_v[fail], out_i[fail] = fv, fi
    return out_v, out_i


def _lowp_candidates(
    qb: Tensor,
    gbt: Tensor,
    k: int,
    self_index: Tensor | None,
    offset: int,
    window: Tensor,
    cand_v: Tensor,
    cand_i: Tensor,
    floor: Tensor,
    drop: Tensor,
) -> None:
    """Pass 1 of :func:`_search_lowp` for one block of bfloat16 queries ``qb`` against the
    bfloat16 gallery chunk ``gbt`` ``[D, n]`` (ids ``offset ..``); updates the candidate lists
    ``cand_v`` / ``cand_i`` ``[R, C]``, the running limit ``floor`` and ``drop`` in place."""
    r, n = qb.shape[0], gbt.shape[1]
    if not n:
        return
    cap = cand_v.shape[1]
    cols = min(_LOWP_COLS if qb.device.type == "cpu" else 16 * _LOWP_COLS, n)
    buf = torch.empty(r * cols, dtype=torch.bfloat16, device=qb.device)
    for c0 in range(0, n, cols):
        c1 = min(c0 + cols, n)
        sims = torch.mm(qb, gbt[:, c0:c1], out=buf[: r * (c1 - c0)].view(r, c1 - c0))
        if self_index is not None:
            own = ((self_index >= c0) & (self_index < c1)).nonzero().squeeze(1)
            sims[own, self_index[own] - c0] = -math.inf
        w = c1 - c0
        bw = _LOWP_BLOCK if w % _LOWP_BLOCK == 0 else w
        rmax = sims.amax(dim=1).float()
        if k == 1:  # the tile's own best raises the limit before its items are read
            torch.maximum(floor, rmax - (window + _WINDOW_REL * rmax.abs()), out=floor)
        lim = floor
        # two gates: the rows whose maximum reaches their limit, then their blocks of bw
        # columns that do (bfloat16 reductions over short runs are slow: float32 there)
        hot = (rmax >= lim).nonzero().squeeze(1)
        if not hot.numel():
            continue
        sub = sims.index_select(0, hot).float()
        if k > 1 and hot.numel() * 4 > r:  # early tiles: most rows take part, merge them whole
            new_v = sub.masked_fill_(sub < lim[hot, None], -math.inf)
            new_i = torch.arange(c0 + offset, c1 + offset, device=qb.device)
            new_i = new_i.expand(hot.numel(), -1)
        else:
            blocks = sub.view(hot.numel(), w // bw, bw)
            sr, hb = (blocks.amax(dim=2) >= lim[hot, None]).nonzero(as_tuple=True)
            hr = hot[sr]  # row-major: ascending
            vals = blocks[sr, hb]  # [H, bw]
            ei, ec = (vals >= lim[hr, None]).nonzero(as_tuple=True)
            hot, count = torch.unique_consecutive(hr[ei], return_counts=True)
            width = int(count.max())
            slot = torch.repeat_interleave(torch.arange(hot.numel(), device=qb.device), count)
            pos = torch.arange(ei.numel(), device=qb.device) - (count.cumsum(0) - count)[slot]
            new_v = vals.new_full((hot.numel(), width), -math.inf)
            new_i = cand_i.new_full((hot.numel(), width), -1)
            new_v[slot, pos] = vals[ei, ec]
            new_i[slot, pos] = hb[ei] * bw + ec + (c0 + offset)
        mv = torch.cat([cand_v[hot], new_v], dim=1)
        mi = torch.cat([cand_i[hot], new_i], dim=1)
        tv, tj = torch.topk(mv, min(cap + 1, mv.shape[1]), dim=1)
        if tv.shape[1] > cap:  # the largest value pushed out of the list
            drop[hot] = torch.maximum(drop[hot], tv[:, cap])
        cand_v[hot] = tv[:, :cap]
        cand_i[hot] = mi.gather(1, tj[:, :cap])
        t = tv[:, k - 1]
        lim = t - (window[hot] + _WINDOW_REL * t.abs())
        floor[hot] = torch.maximum(floor[hot], lim)


def _exact_order(
    qn: Tensor,
    gallery: ChunkSource,
    k: int,
    cand_v: Tensor,
    cand_i: Tensor,
    tau: Tensor,
    complete: Tensor,
    clean: Tensor,
    slack: float,
    memory_budget: int,
    self_index: Tensor | None,
    shards: Shards | None,
    exact_values: bool,
) -> tuple[Tensor, Tensor]:
    """Pass 2 of :func:`search`: float64 similarities of the kept candidates that need them
    (``cand_i``: global ids ``[M, K]`` in pass-1 order, -1 / ``-inf`` placeholders), the
    window search of the rows that are not ``complete``, and the top-k in (similarity
    descending, id ascending) order."""
    m, width = cand_i.shape
    dev = qn.device
    valid = torch.isfinite(cand_v) & (cand_i >= 0)
    need = valid & (complete & ~clean)[:, None]  # near ties among the kept candidates
    if exact_values:
        need[:, :k] |= clean[:, None]
    todo = (~complete).nonzero().squeeze(1)
    thr = tau[todo] - 3 * slack  # the pass-1 bound (2 s) plus this pass's own products' error
    work = float(need.sum()) + float(todo.numel())
    if shards is not None:
        work = shards.sum(work)  # collective: the ranks enter the second pass together
    out_v, out_i = cand_v[:, :k].clone(), cand_i[:, :k].clone()
    if work == 0:  # every row clean, no values asked for
        return out_v, out_i
    val = torch.full((m, width), -math.inf, dtype=torch.float64, device=dev)
    pr, pg, pv = [], [], []  # window pairs: row (of todo), global id, float64 similarity
    block = qn.new_empty(0)  # the window search's similarity block
    step = 512  # pairs recomputed at once: [step, D] float64 operands stay in cache
    for off, gn in gallery():
        n_c = gn.shape[0]
        loc = cand_i - off
        r, c = (need & (loc >= 0) & (loc < n_c)).nonzero(as_tuple=True)
        for a in range(0, r.numel(), step):
            rr, cc = r[a : a + step], c[a : a + step]
            val[rr, cc] = _pair_sims(qn[rr], gn[loc[rr, cc]])
        if not todo.numel():
            continue
        # the block and its bool mask (5 bytes per float32 item) within an eighth of pass 1's
        # block: few rows need it (2 % at N = 60k), and what pass 1 left in the allocator is
        # still resident (a full-budget block raised a rank's peak by 13-26 MiB)
        rows = max(1, chunk_rows(n_c, qn.dtype, memory_budget // 8) * 4 // 5)
        if block.numel() < min(rows, todo.numel()) * n_c:  # one block, reused
            block = qn.new_empty(min(rows, todo.numel()) * n_c)
        for b0 in range(0, todo.numel(), rows):
            t = todo[b0 : b0 + rows]
            sims = torch.mm(qn[t], gn.T, out=block[: t.numel() * n_c].view(t.numel(), n_c))
            if self_index is not None:
                si = self_index[t] - off
                own = ((si >= 0) & (si < n_c)).nonzero().squeeze(1)
                sims[own, si[own]] = -math.inf
            hr, hc = (sims >= thr[b0 : b0 + rows, None]).nonzero(as_tuple=True)
            for a in range(0, hr.numel(), step):
                rr, cc = hr[a : a + step], hc[a : a + step]
                pr.append(rr + b0)
                pg.append(cc + off)
                pv.append(_pair_sims(qn[t[rr]], gn[cc]))
    if exact_values:  # clean rows: pass 1's order is certain, their values recomputed
        rows_c = clean.nonzero().squeeze(1)
        out_v[rows_c] = val[rows_c, :k].to(out_v.dtype)
    tie = (complete & ~clean).nonzero().squeeze(1)
    if tie.numel():  # the top-k of their candidates by the recomputed values, ties to lower id
        ids = torch.where(valid[tie], cand_i[tie], torch.iinfo(torch.long).max)
        vt = val[tie]
        order = ids.argsort(dim=1)
        ids, vt = ids.gather(1, order), vt.gather(1, order)
        order = vt.argsort(dim=1, descending=True, stable=True)[:, :k]
        out_i[tie] = ids.gather(1, order)
        out_v[tie] = vt.gather(1, order).to(out_v.dtype)
    if todo.numel():  # the others: the top-k of every item within the bound
        rr, gg, vv = torch.cat(pr), torch.cat(pg), torch.cat(pv)
        o = gg.argsort(stable=True)
        o = o[vv[o].argsort(descending=True, stable=True)]
        o = o[rr[o].argsort(stable=True)]
        rr, gg, vv = rr[o], gg[o], vv[o]
        counts = torch.bincount(rr, minlength=todo.numel())
        if bool((counts < k).any()):  # pragma: no cover - excluded by the error bound
            raise RuntimeError("internal error: the window search found fewer than k items")
        starts = torch.cumsum(counts, 0) - counts
        pick = (starts[:, None] + torch.arange(k, device=dev)).reshape(-1)
        out_i[todo] = gg[pick].view(-1, k)
        out_v[todo] = vv[pick].view(-1, k).to(out_v.dtype)
    return out_v, out_i


def _topk_chunked(
    qn: Tensor,
    gt: Tensor,
    k: int,
    chunk_size: int,
    self_index: Tensor | None,
    work: Tensor,
    best_v: Tensor,
    best_i: Tensor,
    offset: int,
) -> None:
    """Merge the top-k of ``qn @ gt`` (gallery ids ``offset ..``) into ``best_v`` / ``best_i``.

    Works over ``[chunk_size, N]`` row blocks; ``work`` holds at least
    ``min(chunk_size, M) * N`` elements for the similarity block. ``best_v`` / ``best_i``
    ``[M, K]`` (``K >= k``) hold the running top-K of earlier gallery chunks, all with ids
    below ``offset``, ordered by (similarity descending, id ascending); a stable sort by
    similarity of ``[best, new]`` therefore keeps that order, ties to the lowest id.
    """
    m, n = qn.shape[0], gt.shape[1]
    kk = best_v.shape[1]
    # One preallocated similarity buffer reused by every chunk: a fresh ``[B, N]`` allocation
    # per chunk would page-fault its memory in again on every chunk (measured 20-40 % of the
    # pass on CPU).
    buf = work[: min(chunk_size, m) * n].view(min(chunk_size, m), n)
    for start in range(0, m, chunk_size):
        stop = min(start + chunk_size, m)
        sims = torch.mm(qn[start:stop], gt, out=buf[: stop - start])
        if self_index is not None:
            si = self_index[start:stop]
            own = ((si >= 0) & (si < n)).nonzero().squeeze(1)
            sims[own, si[own]] = -math.inf
        v, i = stable_topk(sims, k)
        bv, bi = best_v[start:stop], best_i[start:stop]
        cv, ci = torch.cat([bv, v], dim=1), torch.cat([bi, i + offset], dim=1)
        order = cv.argsort(dim=1, descending=True, stable=True)[:, :kk]
        torch.gather(cv, 1, order, out=bv)
        torch.gather(ci, 1, order, out=bi)


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
        ranks uses ``memory_budget // W`` (:func:`~bayesurl.evaluation.rank_budget`).
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
    ``memory_budget`` is already this rank's (:func:`rank_budget`). ``inplace`` normalises
    ``x`` itself instead of a copy (a caller that owns ``x`` saves one ``[n_r, D]`` tensor);
    ``exact_values=False`` for a caller that reads the ids only (:func:`search`)."""
    n = sh.n
    if n < 2:
        raise ValueError(f"`embeddings` needs at least 2 points over all ranks, got {n}")
    k = check_int(k, "k", low=1, high=n - 1)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"`chunk_size` must be positive, got {chunk_size}")
    qn = normalize(x, inplace=inplace)
    own = sh.global_ids(x.device)
    return search(qn, lambda: sh.chunks(qn), k, memory_budget, chunk_size, own, sh, exact_values)


def tile_product(q: Tensor, gt: Tensor, out: Tensor) -> Tensor:
    """``q @ gt`` written into the contiguous ``out``.

    On CPU (float32 / float64) the product goes through numpy's BLAS, an OpenBLAS that picks
    its kernel for the processor it runs on, while the MKL inside torch keeps its fastest
    paths for Intel processors (``benchmarks/evaluator.py`` prints both rates). The values may
    differ in their last bits between the two, which the search allows for anyway: it ranks
    by the products only where their error bound (:func:`_gemm_slack`, any summation order)
    separates them. Call it within :func:`blas_threads`.
    """
    if out.device.type == "cpu" and out.dtype in (torch.float32, torch.float64):
        np.matmul(q.detach().numpy(), gt.detach().numpy(), out=out.detach().numpy())
        return out
    return torch.mm(q, gt, out=out)


@functools.cache
def _blas_libraries() -> ThreadpoolController:
    """The BLAS libraries loaded with numpy (found once: a search costs milliseconds)."""
    return ThreadpoolController().select(user_api="blas")


def blas_threads() -> contextlib.AbstractContextManager[object]:
    """numpy's BLAS (:func:`tile_product`) limited to torch's thread count, as a context:
    ``torch.set_num_threads`` and the ranks' ``OMP_NUM_THREADS`` govern the whole search."""
    return _blas_libraries().limit(limits=torch.get_num_threads())


def sim_tiles(
    qn: Tensor,
    gt: Tensor,
    r0: int,
    r1: int,
    cols: int,
    buf: Tensor,
    *,
    self_index: Tensor | None = None,
    col_scale: Tensor | None = None,
) -> Iterator[tuple[int, Tensor]]:
    """Similarity tiles ``(c0, qn[r0:r1] @ gt[:, c0:c0 + cols])`` written into ``buf``.

    ``col_scale`` ``[N]`` multiplies gallery column ``j`` (e.g. inverse norms, so an
    unnormalised gallery needs no normalised copy); ``self_index`` ``[M]`` sets query ``i``'s
    own gallery item ``self_index[i]`` to ``-inf`` (``arange(M)`` when the queries are the
    gallery). Each tile overwrites the previous one.
    """
    n = gt.shape[1]
    si = None if self_index is None else self_index[r0:r1]
    flat = buf.view(-1)
    with blas_threads():
        for c0 in range(0, n, cols):
            c1 = min(c0 + cols, n)
            out = flat[: (r1 - r0) * (c1 - c0)].view(r1 - r0, c1 - c0)  # contiguous
            sims = tile_product(qn[r0:r1], gt[:, c0:c1], out)
            if col_scale is not None:
                sims.mul_(col_scale[c0:c1])
            if si is not None:
                own = ((si >= c0) & (si < c1)).nonzero().squeeze(1)
                sims[own, si[own] - c0] = -math.inf
            yield c0, sims


def _top1_tiled(
    qn: Tensor,
    gt: Tensor,
    rows: int = 4096,
    cols: int = 1024,
    *,
    self_index: Tensor | None = None,
    col_scale: Tensor | None = None,
    second: Tensor | None = None,
    best: tuple[Tensor, Tensor] | None = None,
    offset: int = 0,
) -> tuple[Tensor, Tensor]:
    """Exact 1-NN over cache-sized tiles ``[rows, cols]`` with a running maximum (CPU).

    A whole ``[B, N]`` similarity block is written to memory and read back by the max, which
    makes the pass memory-bound for large N; ``4096 x 1024`` tiles (faiss's blocking) stay in
    cache. Ties go to the lowest index: ``argmax`` returns the first maximal index within a
    tile and a later tile only replaces the running best when strictly greater.
    ``self_index`` and ``col_scale``: see :func:`sim_tiles`.

    ``second`` (``[M]``, ``-inf``) receives the largest value of every item but the best: a
    tile that does not raise a row's best offers its maximum, one that does offers the old
    best and its own second value (``topk(2)`` of the few rows whose best rose, instead of
    their ``argmax``). :func:`search` certifies a row when ``best - second`` exceeds twice
    the error bound and sends the others to its exact window search, so the winner of a tie
    inside a tile (``topk``'s order among equal values) is never kept: the tie makes
    ``second == best``.

    ``best`` (``[M]`` values and int64 ids) is a running maximum of earlier calls, updated in
    place, and ``offset`` the global id of ``gt``'s first column: :func:`search` passes every
    gallery chunk through one running state, later chunks with larger ids.
    """
    m, n = qn.shape[0], gt.shape[1]
    if best is None:
        best_v = torch.full((m,), -math.inf, dtype=qn.dtype)
        best_i = torch.zeros(m, dtype=torch.long)
    else:
        best_v, best_i = best
    buf = torch.empty(min(rows, m) * min(cols, n), dtype=qn.dtype)
    for r0 in range(0, m, rows):
        r1 = min(r0 + rows, m)
        bv, bi = best_v[r0:r1], best_i[r0:r1]
        sv = None if second is None else second[r0:r1]
        tiles = sim_tiles(qn, gt, r0, r1, cols, buf, self_index=self_index, col_scale=col_scale)
        for c0, sims in tiles:
            v = sims.amax(dim=1)  # values only (about 3x faster than max with indices) ...
            rise = v > bv
            up = rise.nonzero().squeeze(1)
            if sv is not None:  # the bound check: the best's runner-up, never a count
                torch.maximum(sv, torch.where(rise, bv, v), out=sv)
            if not up.numel():
                continue
            rows_up = sims.index_select(0, up)  # ... and the index only where the best rose
            if sv is None:
                bv[up] = v[up]
                bi[up] = rows_up.argmax(dim=1) + (offset + c0)
                continue
            tv, ti = torch.topk(rows_up, min(2, rows_up.shape[1]), dim=1)
            if tv.shape[1] > 1:
                sv[up] = torch.maximum(sv[up], tv[:, 1])
            bv[up] = tv[:, 0]
            bi[up] = ti[:, 0] + (offset + c0)
    return best_v[:, None], best_i[:, None]


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


# --------------------------------------------------------------------------- search objects
@runtime_checkable
class KnnFunc(Protocol):
    """A neighbour search with pytorch-metric-learning's ``knn_func`` contract.

    ``search(query, k, reference, ref_includes_query) -> (distances, indices)``: for each row
    of ``query`` the ``k`` nearest rows of ``reference``, nearest first, as ``[M, k]``
    similarities (or distances) and ``[M, k]`` integer ids into ``reference``. With
    ``ref_includes_query`` the query set is the reference set and a query is not its own
    neighbour. :class:`ExactSearch` and :class:`FaissSearch` are two; any callable of this
    shape (a ``pytorch_metric_learning.utils.inference.CustomKNN`` or ``FaissKNN``) is one.
    """

    def __call__(
        self, query: Tensor, k: int, reference: Tensor, ref_includes_query: bool = False
    ) -> tuple[Tensor, Tensor]: ...


class ExactSearch:
    """The exact cosine search of this module as a :class:`KnnFunc` (``search="torch"``).

    Self is excluded by index, ties go to the lowest index, memory is bounded by chunks
    (:func:`knn`, :func:`knn_query`).

    Parameters
    ----------
    memory_budget : int
        Bytes for one similarity chunk when called on its own; inside
        :class:`~bayesurl.evaluation.Evaluator` the evaluator's ``memory_budget`` (shared by
        its ranks) applies.
    """

    name = "torch"

    def __init__(self, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> None:
        self.memory_budget = check_int(memory_budget, "memory_budget", low=1)

    def __call__(
        self, query: Tensor, k: int, reference: Tensor, ref_includes_query: bool = False
    ) -> tuple[Tensor, Tensor]:
        """``(similarities, indices)``, ``[M, k]`` each (see :class:`KnnFunc`)."""
        if ref_includes_query:
            return knn(reference, k, memory_budget=self.memory_budget, backend=self.name)
        return knn_query(query, reference, k, memory_budget=self.memory_budget, backend=self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(memory_budget={self.memory_budget})"


class FaissSearch(ExactSearch):
    """faiss's exact inner-product index (``IndexFlatIP``, CPU, float32) as a
    :class:`KnnFunc` (``search="faiss"``); tie order is faiss's own."""

    name = "faiss"


#: The names ``search=`` accepts, and the object each stands for.
SEARCHES: dict[str, type[ExactSearch]] = {"torch": ExactSearch, "faiss": FaissSearch}


def resolve_search(search: object, name: str = "search") -> KnnFunc:
    """The search object of ``search``: a name of :data:`SEARCHES` or a :class:`KnnFunc`.

    Raises
    ------
    ValueError
        Naming ``name`` for an unknown name or an object that is not callable.
    """
    if isinstance(search, str):
        if search not in SEARCHES:
            raise ValueError(
                f"`{name}` must be one of {tuple(SEARCHES)} or a knn_func object, got {search!r}"
            )
        return SEARCHES[search]()
    if not callable(search):
        raise ValueError(
            f"`{name}` must be a name {tuple(SEARCHES)} or a callable "
            "(query, k, reference, ref_includes_query) -> (distances, indices), got "
            f"{type(search).__name__}"
        )
    return search  # type: ignore[return-value]


def checked_ids(found: object, n: int, k: int, name: str = "search") -> Tensor:
    """The ``[n, k]`` int64 neighbour ids of a search object's answer over ``n`` rows that
    exclude themselves, checked (:class:`KnnFunc`).

    Raises
    ------
    ValueError
        Naming ``name`` when the answer is not ``(distances, indices)`` of that shape, holds
        ids outside ``[0, n)`` or lists a query as its own neighbour.
    """
    if not (isinstance(found, (tuple, list)) and len(found) == 2):
        raise ValueError(f"`{name}` must return (distances, indices), got {type(found).__name__}")
    ids = found[1]
    if not isinstance(ids, Tensor):
        ids = torch.as_tensor(np.asarray(ids))
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
        raise ValueError(f"`{name}` returned indices of dtype {ids.dtype}, expected integers")
    if tuple(ids.shape) != (n, k):
        raise ValueError(
            f"`{name}` returned indices of shape {tuple(ids.shape)}, expected {(n, k)}"
        )
    ids = ids.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ValueError(f"`{name}` returned ids outside [0, {n})")
    if bool((ids == torch.arange(n, device=ids.device)[:, None]).any()):
        raise ValueError(
            f"`{name}` listed a query as its own neighbour with ref_includes_query=True"
        )
    return ids
