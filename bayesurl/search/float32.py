"""The float32 path of the exact search: block products in the queries' dtype, a bound on their
error, and a float64 second pass wherever the bound cannot separate the candidates.

A float32 matrix product's last bits depend on the block's shape and on the item's position in
it (measured: one dot product of D = 256 took 4 different values over 42 block shapes and 3
positions), so exact duplicates did not always tie, and one process and W ranks could order a
near tie differently. The search therefore ranks by the block products only where their error
bound (Higham's ``gamma_D``, :func:`~bayesurl.search.core.gemm_slack`) separates the
candidates, recomputes the others per pair in float64 (exact products, one fixed-order sum: the
same bits in any layout), and takes the top-k in (that similarity descending, index ascending)
order among every candidate the bound cannot exclude (docs/concepts/metrics.rst, "Recall@1 and
Recall@k").
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from bayesurl.search.core import (
    PAIR_STEP,
    SearchJob,
    chunk_rows,
    exclude_own,
    fill_chunk_pairs,
    gemm_slack,
    pair_sims,
    rank_candidates,
    row_parallel,
    sim_tiles,
    stable_topk,
)

__all__ = ["FirstPass", "exact_order", "search_exact", "top1_tiled"]

#: Candidates the floating-point pass keeps beyond ``k``: rows whose near ties reach past them
#: are searched again for every item within the error bound. One is the cheapest:
#: ``topk(k + 6)`` cost 0.36 s more per rank than ``topk(k + 2)`` at N = 60k, W = 2, more than
#: the window search of the 2 % of rows it spares.
_EXTRA = 1

#: Pairs of the window search found in one gallery pass: rows (of the window rows), global
#: ids and float64 similarities.
_Found = tuple[list[Tensor], list[Tensor], list[Tensor]]


class FirstPass(NamedTuple):
    """What the block products leave to :func:`exact_order`.

    ``v`` / ``i`` ``[M, K]`` the kept candidates (values and global ids in pass-1 order, -1 /
    ``-inf`` placeholders), ``tau`` ``[M]`` the k-th kept value, ``complete`` the rows whose
    kept list reaches below ``tau - 2 slack`` (no item outside it can enter the top-k),
    ``clean`` the rows whose top-k and order are certain, ``slack`` the products' error bound.
    """

    v: Tensor
    i: Tensor
    tau: Tensor
    complete: Tensor
    clean: Tensor
    slack: float


def search_exact(job: SearchJob) -> tuple[Tensor, Tensor]:
    """Exact top-k of ``job``'s queries over its gallery chunks, float32 (or the queries'
    dtype) block products.

    Two passes, so that neither the result nor its ties depend on how the work is cut (one
    process or W ranks, any chunking; docs/concepts/metrics.rst: "ties in similarity go to the
    lowest index"):

    1. the block products keep each query's top ``k + 1`` (:func:`_topk_chunked`; for
       ``k = 1`` on CPU the tiled running maximum of :func:`top1_tiled`, which also keeps
       the runner-up's value: its top 2). With ``s`` the products' error
       bound (:func:`~bayesurl.search.core.gemm_slack`) and ``t`` the k-th value, every item
       of the true top-k has a computed value ``>= t - 2 s``; a row is *complete* when its
       last kept value lies below that;
    2. a row is *clean* when the gaps between its first ``k + 1`` values all exceed ``2 s``:
       its top-k and their order are then certain. A second pass (:func:`exact_order`)
       recomputes per pair in float64 (:func:`~bayesurl.search.core.pair_sims`) the
       candidates of the complete rows that are not clean (near ties among the kept
       candidates), and for the rows that are not complete (a near tie at the k-th place:
       exact duplicates, crowded neighbours) collects every item with a block product
       ``>= t - 3 s`` and recomputes those; with ``exact_values`` also the clean rows' top-k.
       At N = 20k, D = 256 (random rows) 10 % of the rows are not clean and 2 % not
       complete. The pass is skipped when no rank has anything to recompute.

    The top-k is taken in (float64 similarity descending, global index ascending) order and
    returned in the queries' dtype; without ``exact_values`` the clean rows keep the block
    products' values (the neighbours are the same; :func:`bayesurl.evaluation.evaluate`
    reads ids only, and skips most of the recomputation: 0.8 s of a 22 s single-process
    search at N = 60k, D = 256).
    """
    qn = job.qn
    slack = gemm_slack(qn.shape[1], qn.dtype, qn.device)
    if job.k == 1 and qn.device.type == "cpu":
        return exact_order(job, _top1_pass(job, slack))
    return exact_order(job, _topk_pass(job, slack))


def _top1_pass(job: SearchJob, slack: float) -> FirstPass:
    """Pass 1 for ``k = 1`` on CPU: one running maximum and runner-up over every chunk's tiles
    (later chunks hold larger indices, so only a strictly better value replaces the best); a
    row is certain when no item lies within twice the bound of its best."""
    qn, own = job.qn, job.self_index
    m = qn.shape[0]
    best_v = torch.full((m,), -math.inf, dtype=qn.dtype)
    best_i = torch.zeros(m, dtype=torch.long)
    second = torch.full((m,), -math.inf, dtype=qn.dtype)
    for off, gn in job.gallery():
        si = None if own is None else own - off
        gt = gn.T

        def block(r0: int, r1: int, gt: Tensor = gt, si: Tensor | None = si, off: int = off):
            top1_tiled(
                qn[r0:r1], gt, self_index=None if si is None else si[r0:r1],
                second=second[r0:r1], best=(best_v[r0:r1], best_i[r0:r1]), offset=off,
            )  # fmt: skip

        row_parallel(m, qn.device, block)
    complete = best_v - second > 2 * slack  # the certificate: no item within the bound
    return FirstPass(best_v[:, None], best_i[:, None], best_v, complete, complete, slack)


def _topk_pass(job: SearchJob, slack: float) -> FirstPass:
    """Pass 1 in blocks of query rows: each query's running top ``k + 1`` over every chunk
    (:func:`_topk_chunked`, merged in place)."""
    qn, k = job.qn, job.k
    m = qn.shape[0]
    kk = k + _EXTRA
    # -inf placeholders: they and -inf self entries never reach the first k (k <= N - 1)
    best_v = torch.full((m, kk), -math.inf, dtype=qn.dtype, device=qn.device)
    best_i = torch.full((m, kk), -1, dtype=torch.long, device=qn.device)
    work = qn.new_empty(0)  # similarity block, reused by every gallery chunk (freed on return)
    for off, gn in job.gallery():
        n_c = gn.shape[0]
        si = None if job.self_index is None else job.self_index - off
        rows = job.chunk_size
        if rows is None:
            rows = chunk_rows(n_c, qn.dtype, job.memory_budget)
        if work.numel() < min(rows, m) * n_c:
            work = qn.new_empty(min(rows, m) * n_c)
        _topk_chunked(qn, gn.T, min(kk, n_c), rows, si, work, best_v, best_i, off)
    tau = best_v[:, k - 1]
    complete = best_v[:, -1] < tau - 2 * slack
    clean = ((best_v[:, :k] - best_v[:, 1 : k + 1]) > 2 * slack).all(dim=1)
    return FirstPass(best_v, best_i, tau, complete, clean, slack)


def exact_order(job: SearchJob, first: FirstPass) -> tuple[Tensor, Tensor]:
    """Pass 2 of :func:`search_exact`: float64 similarities of the kept candidates that need
    them, the window search of the rows that are not ``complete``, and the top-k in
    (similarity descending, id ascending) order."""
    k = job.k
    m, width = first.i.shape
    valid = torch.isfinite(first.v) & (first.i >= 0)
    need = valid & (first.complete & ~first.clean)[:, None]  # near ties among the kept
    if job.exact_values:
        need[:, :k] |= first.clean[:, None]
    todo = (~first.complete).nonzero().squeeze(1)
    thr = first.tau[todo] - 3 * first.slack  # the pass-1 bound (2 s) plus pass 2's own error
    # collective: the ranks enter the second pass together
    work = job.total(float(need.sum()) + float(todo.numel()))
    out_v, out_i = first.v[:, :k].clone(), first.i[:, :k].clone()
    if work == 0:  # every row clean, no values asked for
        return out_v, out_i
    val = torch.full((m, width), -math.inf, dtype=torch.float64, device=job.qn.device)
    found: _Found = ([], [], [])
    block = job.qn.new_empty(0)  # the window search's similarity block
    for chunk in job.gallery():
        fill_chunk_pairs(val, job.qn, first.i, need, chunk, PAIR_STEP)
        if todo.numel():
            block = _window_pairs(job, todo, thr, chunk, block, found)
    if job.exact_values:  # clean rows: pass 1's order is certain, their values recomputed
        rows_c = first.clean.nonzero().squeeze(1)
        out_v[rows_c] = val[rows_c, :k].to(out_v.dtype)
    tie = (first.complete & ~first.clean).nonzero().squeeze(1)
    if tie.numel():  # the top-k of their candidates by the recomputed values, ties to lower id
        ids = torch.where(valid[tie], first.i[tie], torch.iinfo(torch.long).max)
        tv, ti = rank_candidates(ids, val[tie], k)
        out_i[tie] = ti
        out_v[tie] = tv.to(out_v.dtype)
    if todo.numel():  # the others: the top-k of every item within the bound
        wv, wi = _window_topk(found, todo.numel(), k)
        out_i[todo] = wi
        out_v[todo] = wv.to(out_v.dtype)
    return out_v, out_i


def _window_pairs(
    job: SearchJob,
    todo: Tensor,
    thr: Tensor,
    chunk: tuple[int, Tensor],
    block: Tensor,
    found: _Found,
) -> Tensor:
    """Append to ``found`` every item of ``chunk`` whose block product reaches the row's
    ``thr``, for the query rows ``todo``, with its float64 similarity; returns the similarity
    block (``block``, or a larger one reused by the next chunk)."""
    qn = job.qn
    off, gn = chunk
    n_c = gn.shape[0]
    # the block and its bool mask (5 bytes per float32 item) within an eighth of pass 1's
    # block: few rows need it (2 % at N = 60k), and what pass 1 left in the allocator is
    # still resident (a full-budget block raised a rank's peak by 13-26 MiB)
    rows = max(1, chunk_rows(n_c, qn.dtype, job.memory_budget // 8) * 4 // 5)
    if block.numel() < min(rows, todo.numel()) * n_c:  # one block, reused
        block = qn.new_empty(min(rows, todo.numel()) * n_c)
    for b0 in range(0, todo.numel(), rows):
        t = todo[b0 : b0 + rows]
        sims = torch.mm(qn[t], gn.T, out=block[: t.numel() * n_c].view(t.numel(), n_c))
        if job.self_index is not None:
            exclude_own(sims, job.self_index[t] - off)
        hr, hc = (sims >= thr[b0 : b0 + rows, None]).nonzero(as_tuple=True)
        for a in range(0, hr.numel(), PAIR_STEP):
            rr, cc = hr[a : a + PAIR_STEP], hc[a : a + PAIR_STEP]
            found[0].append(rr + b0)
            found[1].append(cc + off)
            found[2].append(pair_sims(qn[t[rr]], gn[cc]))
    return block


def _window_topk(found: _Found, rows: int, k: int) -> tuple[Tensor, Tensor]:
    """The top-k per window row of the pairs ``found`` in (similarity descending, global id
    ascending) order: values (float64) and ids, ``[rows, k]``."""
    rr, gg, vv = (torch.cat(part) for part in found)
    o = gg.argsort(stable=True)
    o = o[vv[o].argsort(descending=True, stable=True)]
    o = o[rr[o].argsort(stable=True)]
    rr, gg, vv = rr[o], gg[o], vv[o]
    counts = torch.bincount(rr, minlength=rows)
    if bool((counts < k).any()):  # pragma: no cover - excluded by the error bound
        raise RuntimeError("internal error: the window search found fewer than k items")
    starts = torch.cumsum(counts, 0) - counts
    pick = (starts[:, None] + torch.arange(k, device=rr.device)).reshape(-1)
    return vv[pick].view(-1, k), gg[pick].view(-1, k)


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
            exclude_own(sims, self_index[start:stop])
        v, i = stable_topk(sims, k)
        bv, bi = best_v[start:stop], best_i[start:stop]
        cv, ci = torch.cat([bv, v], dim=1), torch.cat([bi, i + offset], dim=1)
        order = cv.argsort(dim=1, descending=True, stable=True)[:, :kk]
        torch.gather(cv, 1, order, out=bv)
        torch.gather(ci, 1, order, out=bi)


def top1_tiled(
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
    ``self_index`` and ``col_scale``: see :func:`~bayesurl.search.core.sim_tiles`.

    ``second`` (``[M]``, ``-inf``) receives the largest value of every item but the best: a
    tile that does not raise a row's best offers its maximum, one that does offers the old
    best and its own second value (``topk(2)`` of the few rows whose best rose, instead of
    their ``argmax``). :func:`search_exact` certifies a row when ``best - second`` exceeds
    twice the error bound and sends the others to its exact window search, so the winner of a
    tie inside a tile (``topk``'s order among equal values) is never kept: the tie makes
    ``second == best``.

    ``best`` (``[M]`` values and int64 ids) is a running maximum of earlier calls, updated in
    place, and ``offset`` the global id of ``gt``'s first column: :func:`search_exact` passes
    every gallery chunk through one running state, later chunks with larger ids.
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
