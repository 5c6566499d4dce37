"""What every pass of the exact search shares: normalisation, chunk sizes, the products' error
bound, float64 pair similarities, cache-sized similarity tiles, threads over query rows, the
search's inputs (:class:`SearchJob`) and the (similarity descending, id ascending) order.

Conventions of docs/concepts/metrics.rst ("Recall@1 and Recall@k"): cosine similarity of
L2-normalised rows, self excluded by index, ties to the lowest gallery index.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import ThreadpoolController
from torch import Tensor

from bayesurl._checks import check_floating
from bayesurl.distributed import Shards

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "PAIR_STEP",
    "ChunkSource",
    "SearchJob",
    "blas_threads",
    "chunk_rows",
    "exclude_own",
    "fall_back",
    "fill_chunk_pairs",
    "forcing",
    "gemm_slack",
    "normalize",
    "pair_sims",
    "rank_budget",
    "rank_candidates",
    "row_parallel",
    "search_stats",
    "sim_tiles",
    "stable_topk",
    "tile_product",
]

#: Default bytes allowed for one chunk of the query-gallery similarity matrix (256 MiB).
DEFAULT_MEMORY_BUDGET = 256 * 2**20

#: Pairs recomputed in float64 at once: ``[PAIR_STEP, D]`` float64 operands stay in cache.
PAIR_STEP = 512

#: Query rows per task of the threaded passes: ~30 tasks at M = 60k keep two threads busy to
#: the end; a [2048, 1024] tile stays in the last-level cache.
_TASK_ROWS = 2048

#: A source of gallery chunks ``(global offset, rows)``; called once per pass over the gallery
#: (``ring_chunks`` is a one-pass collective).
ChunkSource = Callable[[], Iterable[tuple[int, Tensor]]]

#: Counters of :func:`search_stats` (the candidate passes add to them).
STATS = {
    "lowp_queries": 0,
    "certified": 0,
    "fallback": 0,
    "candidates": 0,
    "fused_queries": 0,
    "fused_certified": 0,
}


@dataclass(frozen=True)
class SearchJob:
    """One exact top-k search, as every pass receives it.

    Attributes
    ----------
    qn : Tensor
        ``[M, D]`` L2-normalised queries.
    gallery : ChunkSource
        Yields ``(global offset, rows)`` of the normalised gallery in ascending offset order
        (one chunk ``(0, gallery)`` in one process; every rank's shard in turn under
        :func:`bayesurl.distributed.ring_chunks`); called once per pass.
    k : int
        Neighbours per query.
    memory_budget : int
        Bytes of one similarity block.
    chunk_size : int, optional
        Query rows per block (overrides ``memory_budget``).
    self_index : Tensor, optional
        ``[M]`` the queries' own global ids, excluded by index.
    shards : Shards, optional
        Collective row layout: every rank takes the same passes.
    exact_values : bool
        Return float64-recomputed similarities for every row; ``False`` for a caller that
        reads the ids only (rows whose order is certain keep the block products' values).
    """

    qn: Tensor
    gallery: ChunkSource
    k: int
    memory_budget: int
    chunk_size: int | None = None
    self_index: Tensor | None = None
    shards: Shards | None = None
    exact_values: bool = True

    def total(self, x: float) -> float:
        """``x`` summed over the ranks (collective under ``shards``): every rank learns
        whether any rank needs a pass."""
        return x if self.shards is None else self.shards.sum(x)

    def rows(self, idx: Tensor) -> SearchJob:
        """The same search for the queries ``idx`` only."""
        own = None if self.self_index is None else self.self_index[idx]
        return replace(self, qn=self.qn[idx], self_index=own)


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
    k-th place) is handled with ``topk(k + 1)``; rows with a tie at the boundary fall back to an
    exact selection of the lowest tied indices. A row whose k values strictly decrease is
    already in that order, and a tie of two neighbours is fixed by a swap; only rows with three
    or more equal values in a row are re-sorted stably by index, so a top-``R`` of thousands
    (MAP@R) pays one selection, not three sorts.
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
    else:
        boundary_tie = torch.zeros(b, dtype=torch.bool, device=sims.device)
    vals = vals.contiguous()
    eq = vals[:, 1:] == vals[:, :-1]
    # a run of three or more equal values needs a sort, and the boundary rows hold their
    # winners by index order, not by value
    resort = boundary_tie | (eq[:, 1:] & eq[:, :-1]).any(dim=1)
    # a pair of equal neighbours (the common tie among thousands of float32 similarities) is
    # put in index order by swapping the two
    swap = eq & (idx[:, 1:] < idx[:, :-1]) & ~resort[:, None]
    if bool(swap.any()):
        first = torch.nn.functional.pad(swap, (0, 1))
        second = torch.nn.functional.pad(swap, (1, 0))
        idx = torch.where(first, idx.roll(-1, 1), torch.where(second, idx.roll(1, 1), idx))
    if not bool(resort.any()):
        return vals, idx
    if bool(resort.all()):
        return rank_candidates(idx, vals, k)
    rows = resort.nonzero().squeeze(1)
    vals, idx = vals.clone(), idx.clone()
    vals[rows], idx[rows] = rank_candidates(idx[rows], vals[rows], k)
    return vals, idx


def rank_candidates(ids: Tensor, vals: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The first ``k`` of each row's ``(vals, ids)`` in (value descending, id ascending) order.

    A sort by id, then a stable sort by value; an entry to be ignored carries the largest id
    and ``-inf`` (it sorts last).
    """
    order = ids.argsort(dim=1)
    ids, vals = ids.gather(1, order), vals.gather(1, order)
    order = vals.argsort(dim=1, descending=True, stable=True)[:, :k]
    return vals.gather(1, order), ids.gather(1, order)


def gemm_slack(d: int, dtype: torch.dtype, device: torch.device) -> float:
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


def pair_sims(q: Tensor, g: Tensor) -> Tensor:
    """float64 dot products of the row pairs ``(q[p], g[p])``, ``[P]``.

    The products of two float32 (or float64 halves) numbers are exact in float64 and each row
    is summed by the same reduction whatever ``P`` or the rows' origin, so a pair gets the same
    bits in every layout (tested over batch shapes and positions).
    """
    return (q.double() * g.double()).sum(dim=-1)


def fill_chunk_pairs(
    val: Tensor, qn: Tensor, ids: Tensor, need: Tensor, chunk: tuple[int, Tensor], step: int
) -> None:
    """``val[r, c] = pair_sims(qn[r], gallery row ids[r, c])`` for the pairs of ``need`` whose
    global id lies in ``chunk`` ``(offset, rows)``, ``step`` pairs at a time."""
    off, gn = chunk
    loc = ids - off
    r, c = (need & (loc >= 0) & (loc < gn.shape[0])).nonzero(as_tuple=True)
    for b0 in range(0, r.numel(), step):
        rr, cc = r[b0 : b0 + step], c[b0 : b0 + step]
        val[rr, cc] = pair_sims(qn[rr], gn[loc[rr, cc]])


def fall_back(
    job: SearchJob,
    found: tuple[Tensor, Tensor],
    fail: Tensor,
    rest: Callable[[SearchJob], tuple[Tensor, Tensor]],
) -> tuple[Tensor, Tensor]:
    """A candidate pass's ``found`` ``(values, ids)`` in the queries' dtype, the rows ``fail``
    its certificate left open searched again by ``rest``; collective under ``shards``: every
    rank enters ``rest`` when any rank has such a row."""
    out_v, out_i = found[0].to(job.qn.dtype), found[1]
    if job.total(float(fail.numel())):
        fv, fi = rest(job.rows(fail))
        out_v[fail], out_i[fail] = fv, fi
    return out_v, out_i


def exclude_own(sims: Tensor, own: Tensor, c0: int = 0) -> None:
    """``sims[r, own[r] - c0] = -inf`` for the rows whose own item (global column ``own[r]``)
    is one of the tile's columns ``c0 .. c0 + sims.shape[1]``."""
    hit = ((own >= c0) & (own < c0 + sims.shape[1])).nonzero().squeeze(1)
    sims[hit, own[hit] - c0] = -math.inf


def tile_product(q: Tensor, gt: Tensor, out: Tensor) -> Tensor:
    """``q @ gt`` written into the contiguous ``out``.

    On CPU (float32 / float64) the product goes through numpy's BLAS, an OpenBLAS that picks
    its kernel for the processor it runs on, while the MKL inside torch keeps its fastest
    paths for Intel processors (``benchmarks/evaluator.py`` prints both rates). The values may
    differ in their last bits between the two, which the search allows for anyway: it ranks
    by the products only where their error bound (:func:`gemm_slack`, any summation order)
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


def blas_threads(limit: int | None = None) -> contextlib.AbstractContextManager[object]:
    """numpy's BLAS (:func:`tile_product`) limited to ``limit`` threads, by default torch's
    thread count, as a context: ``torch.set_num_threads`` and the ranks' ``OMP_NUM_THREADS``
    govern the whole search."""
    return _blas_libraries().limit(limits=torch.get_num_threads() if limit is None else limit)


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
                exclude_own(sims, si, c0)
            yield c0, sims


def row_parallel(m: int, device: torch.device, fn: Callable[[int, int], None]) -> None:
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

    with blas_threads(1):
        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    if errors:
        raise errors[0]


@contextlib.contextmanager
def forcing(slot: list[bool | None], enabled: bool | None) -> Iterator[None]:
    """``slot[0] = enabled`` within the context: a pass forced on (``True``) or off
    (``False``), or its choice left to the search (``None``)."""
    if enabled not in (True, False, None):
        raise ValueError(f"`enabled` must be True, False or None, got {enabled!r}")
    old = slot[0]
    slot[0] = enabled
    try:
        yield
    finally:
        slot[0] = old


def search_stats(reset: bool = False) -> dict[str, int]:
    """Counters of the bfloat16 candidate pass since the last reset: ``lowp_queries`` (rows it
    searched), ``certified`` (rows whose neighbours it proved exact), ``fallback`` (rows sent
    to the float32 pass because the certificate failed) and ``candidates`` (float64 re-ranked
    pairs); of the fused pass (:func:`~bayesurl.search.fused_search`): ``fused_queries`` and
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
    out = dict(STATS)
    if reset:
        for key in STATS:
            STATS[key] = 0
    return out
