"""Sampling-aware 1-NN search: the nearest neighbour of every query within each posterior draw.

The retrieval ECE of LAM (Warburg et al. 2023, section 5; docs/concepts/metrics.rst, "Calibration:
ECE for retrieval") needs the 1-NN of every query in each of S posterior draws, S exact searches
done naively. This module holds the search strategies behind
:func:`~bayesurl.evaluation.functional.retrieval_ece`: the exact per-draw search, the
adaptive shortlist (a pilot chooses the shortlist length and a per-query margin, one
threshold pass over the mean embeddings keeps each query's candidates, and one sparse sampled
matrix product per draw compares them), and the clustered block search (:class:`DrawSearch`).
Ties go to the lowest gallery index in every mode, as in :func:`bayesurl.search.knn`.

The shards of a ``torch.distributed`` job run the same code with their own queries.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from tqdm.auto import tqdm

from bayesurl._checks import check_int, check_tensor
from bayesurl.distributed import RowExchange, Shards
from bayesurl.search.core import DEFAULT_MEMORY_BUDGET, chunk_rows, normalize, sim_tiles
from bayesurl.search.exact import search

__all__ = ["DrawSearch", "choose_shortlist", "neighbors_per_draw", "sampled_neighbors"]

_MODES = ("shortlist", "block", "exact")


@dataclass(frozen=True)
class DrawSearch:
    """How :func:`sampled_neighbors` finds the 1-NN of every query within each posterior draw
    (LAM, section 4: embeddings sampled from the weight posterior); the settings of one
    search, resolved once.

    ``mode="exact"`` runs one exact chunked search per draw (S full searches).

    ``mode="shortlist"`` (default) searches the ``L`` nearest neighbours of the mean embedding
    (:func:`~bayesurl.evaluation.functional.mean_from_samples`) once, then for every draw
    compares each query only with its candidates: one sparse sampled matrix product
    (``torch.sparse.sampled_addmm``) per draw evaluates exactly the kept (query, candidate)
    cosines, reading the draw in place, so S draws cost about ``S * nnz * D`` with ``nnz <= N *
    L`` and no gathered copies. Each query keeps those of its L candidates whose gap in mean
    cosine to its best candidate is at most ``margin`` times the pair's draw spread
    ``sqrt(sigma_i^2 + sigma_c^2)`` (``sigma^2 = 2 (1 - R)``, see :func:`choose_shortlist`):
    well-separated queries keep one or two candidates, ambiguous ones up to L. Ties go to the
    lowest gallery index in every mode, so the modes agree whenever a draw's true neighbour is
    kept. ``shortlist=None`` (default) chooses L and the margin with :func:`choose_shortlist` so
    that the estimated fraction of (draw, query) pairs whose neighbour is not kept is at most
    ``tolerance`` (expected agreement with the exact mode about ``1 - tolerance``), and searches
    every draw exactly when no shortlist up to the cap is that accurate; the adaptive path then
    needs no top-L search: one threshold pass over the mean embeddings (the cost of a top-1
    search) keeps every candidate within the margin, at most L per query. An integer fixes L
    (and keeps all L unless ``margin`` is given).

    ``mode="block"`` uses the full L-shortlists but orders the queries by a few spherical
    k-means iterations on the mean embeddings (about ``N / block`` centroids), cuts them into
    blocks of ``block`` queries and searches each block, for all draws at once, with one dense
    batched GEMM against the union of its members' shortlists. With ``L = N - 1`` it equals the
    exact mode. It only pays off when the shortlists of nearby queries overlap strongly.

    Cost (``benchmarks/evaluator.py``, CPU, 2 threads): the threshold pass costs about one
    exact pass, the pilot about 0.2, and the S sparse products grow as ``S * N * kept * D``
    against ``N^2 * D`` for a pass, so the ratio to one pass falls with N: at N = 55k, D = 512,
    S = 100 and about 38 kept candidates per query the whole ECE is 2.3-2.8 exact passes; at
    N = 8k, D = 128 it is about 20.

    Attributes
    ----------
    mode : {"shortlist", "block", "exact"}
        Search strategy.
    shortlist : int, optional
        Shortlist length L (clipped to ``N - 1``); ``None`` chooses it (and the margin)
        adaptively.
    tolerance : float
        Miss-rate target of the adaptive choice.
    margin : float, optional
        Per-query cut of the shortlist mode (see above); ``None``: the adaptive choice's when
        ``shortlist`` is None, else no cut. ``inf`` keeps all L.
    memory_budget : int
        Bytes per chunk of similarities (exact mode, kNN of the mean, pilot).
    progress : bool
        Show a tqdm bar over the draws (over the query blocks in block mode).
    block : int
        Queries per block of ``mode="block"``.
    cluster_iters : int
        k-means iterations that order the queries in ``mode="block"``.
    """

    mode: str = "shortlist"
    shortlist: int | None = None
    tolerance: float = 1e-3
    margin: float | None = None
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    progress: bool = False
    block: int = 32
    cluster_iters: int = 4


def checked_samples(samples: object, check_values: bool = True) -> Tensor:
    """Validated ``[S, N, D]`` draws; ``check_values=False`` leaves the finiteness check to
    :func:`checked_resultant` (one pass over the draws instead of two)."""
    s = check_tensor(samples, "samples", ndim=3, finite=False)
    if s.shape[0] < 1:
        raise ValueError("`samples` needs at least 1 draw, got 0")
    if not s.is_floating_point():
        raise ValueError(f"`samples` must be floating point, got {s.dtype}")
    if s.dtype in (torch.float16, torch.bfloat16):  # as `evaluate`: the kernels need float32
        s = s.float()
    if check_values and not all(bool(torch.isfinite(z).all()) for z in s):
        _raise_non_finite(s)
    return s


def _raise_non_finite(s: Tensor) -> None:
    bad = sum(int((~torch.isfinite(z)).sum()) for z in s)  # per draw: no [S, N, D] temporary
    raise ValueError(f"`samples` contains {bad} non-finite values of {s.numel()} entries")


def checked_resultant(s: Tensor) -> Tensor:
    """Mean resultant of the normalised draws; raises if a draw has a non-finite entry
    (a NaN or inf entry makes its row's normalised draw, hence the resultant, non-finite)."""
    res = resultant(s)
    if not bool(torch.isfinite(res).all()):
        _raise_non_finite(s)
    return res


def resultant(s: Tensor) -> Tensor:
    acc = torch.zeros_like(s[0])
    for z in s:
        acc += normalize(z)
    return acc / s.shape[0]


def _gather(z: Tensor, idx: Tensor) -> Tensor:
    """Rows ``z[idx]`` for a 2-D index, via ``index_select`` (faster than advanced indexing)."""
    return z.index_select(0, idx.reshape(-1)).view(*idx.shape, z.shape[1])


def _cluster_order(mean: Tensor, block: int, iters: int, memory_budget: int) -> Tensor:
    """Query order that puts queries with similar mean embeddings next to each other.

    A few spherical k-means iterations with about ``N / block`` centroids (cost about
    ``iters / block`` exact passes), then a stable sort by cluster id.
    """
    n = mean.shape[0]
    k = max(1, n // block)
    gen = torch.Generator().manual_seed(0)
    cent = mean[torch.randperm(n, generator=gen)[:k].to(mean.device)]
    rows = max(1, int(memory_budget // (2 * mean.element_size() * k)))
    assign = torch.empty(n, dtype=torch.long, device=mean.device)
    for it in range(iters + 1):
        for start in range(0, n, rows):
            assign[start : start + rows] = (mean[start : start + rows] @ cent.T).argmax(dim=1)
        if it == iters:
            break
        acc = torch.zeros_like(cent).index_add_(0, assign, mean)
        cent = torch.where(acc.norm(dim=1, keepdim=True) > 0, normalize(acc), cent)
    return torch.argsort(assign, stable=True)


def _nn_in_blocks(
    s: Tensor,
    cand: Tensor,
    order: Tensor,
    block: int,
    memory_budget: int,
    progress: bool,
) -> Tensor:
    """1-NN per draw of every query among the union of its block's shortlists.

    Queries are taken ``block`` at a time in ``order``; each block is searched with one dense
    batched GEMM ``[S', B, D] x [S', D, |U|]`` against the union ``U`` (sorted ascending) of
    its members' shortlists, so ties go to the lowest gallery index through ``max``'s
    first-maximum rule. Similarities are ``<z_q, z_u> / ||z_u||``: the query norm is
    constant along the argmax, so no normalised copy of the draws is made.
    """
    n_draws, n, d = s.shape
    dev, item = s.device, s.element_size()
    eps = torch.finfo(s.dtype).tiny ** 0.5
    inv = torch.empty(n_draws, n, dtype=s.dtype, device=dev)
    for t in range(n_draws):
        inv[t] = s[t].norm(dim=1).clamp_min(eps).reciprocal()
    out = torch.empty(n_draws, n, dtype=torch.long, device=dev)
    # Flat scratch buffers reused by every block (no per-block page faults on CPU).
    m_max = min(n, block * cand.shape[1])
    per_draw_max = (block + m_max) * d + block * m_max
    size = min(n_draws * per_draw_max, max(per_draw_max, memory_budget // item))
    buf = torch.empty(size, dtype=s.dtype, device=dev)
    starts = range(0, n, block)
    for start in tqdm(starts, disable=not progress, desc="1-NN per block", leave=False):
        q = order[start : start + block]
        b = q.numel()
        u = torch.unique(cand[q])  # sorted ascending
        m = u.numel()
        self_mask = q[:, None] == u[None, :]
        sc = min(n_draws, buf.numel() // ((b + m) * d + b * m))
        for t0 in range(0, n_draws, sc):
            t1 = min(t0 + sc, n_draws)
            w = t1 - t0
            qq = buf[: w * b * d].view(w, b, d)
            gg = buf[w * b * d : w * (b + m) * d].view(w, m, d)
            ss = buf[w * (b + m) * d : w * ((b + m) * d + b * m)].view(w, b, m)
            torch.index_select(s[t0:t1], 1, q, out=qq)
            torch.index_select(s[t0:t1], 1, u, out=gg)
            torch.bmm(qq, gg.transpose(1, 2), out=ss)
            ss.mul_(inv[t0:t1, u][:, None, :])
            ss.masked_fill_(self_mask, -torch.inf)
            out[t0:t1, q] = u[ss.max(dim=2).indices]
    return out


def _spread(resultant: Tensor) -> Tensor:
    """Per-point draw spread ``sigma_i^2 = mean_s ||z_si - m_i||^2 = 2 (1 - R_i)`` (unit draws
    ``z_si``, unit mean ``m_i``, mean resultant length ``R_i``), as a float32/64 vector."""
    return (2.0 * (1.0 - resultant.norm(dim=-1).clamp(0.0, 1.0))).sqrt()


def choose_shortlist(
    samples: Tensor,
    *,
    tolerance: float = 1e-3,
    max_shortlist: int = 256,
    pilot_draws: int = 8,
    pilot_queries: int | None = None,
    seed: int = 0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    resultant: Tensor | None = None,
    shards: Shards | None = None,
) -> tuple[int, dict[str, float]]:
    """Shortlist length L and per-query margin whose estimated miss rate is at most ``tolerance``.

    A pilot searches ``pilot_queries`` random queries exactly in ``pilot_draws`` draws (cost
    ``pilot_draws * pilot_queries / N`` exact passes, about an eighth of a pass for large N) and
    records, for each draw's true 1-NN ``w`` of query ``i``, its rank in the query's
    mean-embedding ordering and its margin ``(m_i1 - m_iw) / sqrt(sigma_i^2 + sigma_w^2)``:
    the gap in mean cosine to the query's best candidate, in units of the two points' draw
    spread (``sigma^2 = 2 (1 - R)``, R the mean resultant length).

    L is the smallest power of two with ``P(rank >= L) <= tolerance / 2`` (capped at
    ``max_shortlist``); the margin ``info["margin"]`` is the smallest value that keeps all but
    a ``tolerance`` fraction of the pilot's winners (those ranked below L count as lost).
    :func:`sampled_neighbors` then compares each query, in every draw, only with those of its L
    mean-space neighbours whose margin is at most that value: easy queries keep one or two
    candidates, ambiguous ones many. The expected agreement with the exact mode is about
    ``1 - tolerance``.

    Parameters
    ----------
    samples : Tensor
        ``[S, N, D]`` draws.
    tolerance : float
        Allowed fraction of (draw, query) pairs whose 1-NN falls outside the shortlist.
    max_shortlist : int
        Upper bound on L.
    pilot_draws : int
        Draws of the pilot.
    pilot_queries : int, optional
        Queries of the pilot (default ``min(N, max(1024, N // 64))``).
    seed : int
        Seed of the pilot's query subset.
    memory_budget : int
        Bytes per similarity chunk.
    resultant : Tensor, optional
        The draws' checked mean resultant, when the caller has validated the draws.
    shards : Shards, optional
        With ``shards`` the draws and ``resultant`` hold this rank's rows only: the pilot
        queries are drawn from the global ids (the same on every rank), each rank searches its
        own ones over every rank's rows, and the ranks and margins are gathered, so every rank
        returns the single-process choice (collective).

    Returns
    -------
    L : int
        Chosen shortlist length.
    info : dict
        ``miss_rate`` (pilot estimate with both cuts), ``margin``, ``pilot_pairs``,
        ``rank_q999``.
    """
    if resultant is None:
        samples = checked_samples(samples, check_values=False)
        resultant = checked_resultant(samples)
    sh = Shards.local(samples.shape[1]) if shards is None else shards
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"`tolerance` must lie in [0, 1), got {tolerance}")
    n = sh.n
    q_n = min(n, max(1024, n // 64)) if pilot_queries is None else min(n, pilot_queries)
    qg = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:q_n]
    n_loc = samples.shape[1]
    qg = qg[(qg >= sh.offset) & (qg < sh.offset + n_loc)].to(samples.device)  # this rank's
    draws = min(pilot_draws, samples.shape[0])
    rank, margin = _pilot(samples, resultant, qg, draws, sh, memory_budget)
    return _shortest_within(rank, margin, tolerance, min(max_shortlist, n - 1))


def _shortest_within(
    rank: Tensor, margin: Tensor, tolerance: float, cap: int
) -> tuple[int, dict[str, float]]:
    """L and the margin of :func:`choose_shortlist` from the pilot winners' ranks and margins."""
    L = 1
    while L < cap and float((rank >= L).double().mean()) > tolerance / 2:
        L *= 2
    L = min(L, cap)
    margin = torch.where(rank >= L, torch.inf, margin)
    lost = int(tolerance * margin.numel())  # pilot winners the margin may lose
    kept = torch.sort(margin).values[: margin.numel() - lost]
    k = float(kept[-1]) if kept.numel() else 0.0
    if not k < torch.inf:  # the cap loses too many: keep all L (the miss rate shows it)
        k = torch.inf
    info = {
        "miss_rate": float(((rank >= L) | (margin > k)).double().mean()),
        "margin": k,
        "pilot_pairs": float(rank.numel()),
        "rank_q999": float(torch.quantile(rank.double(), 0.999)),
    }
    return L, info


def _pilot(
    s: Tensor, res: Tensor, qg: Tensor, draws: int, sh: Shards, memory_budget: int
) -> tuple[Tensor, Tensor]:
    """The pilot of :func:`choose_shortlist` for this rank's pilot queries (global ids ``qg``):
    every rank's pilot winners' ranks in their query's mean-embedding order and their margins
    (float64), gathered over the ranks, flat."""
    q = qg - sh.offset
    mean = normalize(res)
    sigma = _spread(res)
    sigma_all = sh.gather(sigma)
    # each pilot draw's exact 1-NN (tiled on CPU, ties to the lowest global index)
    wins = [_draw_nn(normalize(s[t]), q, qg, memory_budget, sh) for t in range(draws)]
    win = torch.stack(wins, dim=1)  # [P, T] global ids
    mq = mean[q]
    top = torch.full((q.numel(),), -torch.inf, dtype=mean.dtype, device=mean.device)
    m_win = torch.zeros(win.shape, dtype=mean.dtype, device=mean.device)
    for r0, r1, c0, sims in _tiles(mq, sh.chunks(mean), qg, memory_budget):
        torch.maximum(top[r0:r1], sims.amax(dim=1), out=top[r0:r1])
        w = win[r0:r1] - c0
        rr, tt = ((w >= 0) & (w < sims.shape[1])).nonzero(as_tuple=True)
        m_win[r0 + rr, tt] = sims[rr, w[rr, tt]]
    # rank of each winner in the query's mean-embedding order (a second pass: needs m_win)
    rank = torch.zeros(win.shape, dtype=torch.long, device=mean.device)
    for r0, r1, _, sims in _tiles(mq, sh.chunks(mean), qg, memory_budget):
        for t in range(win.shape[1]):
            rank[r0:r1, t] += (sims > m_win[r0:r1, t : t + 1]).sum(dim=1)
    scale = (sigma[q][:, None] ** 2 + sigma_all[win] ** 2).sqrt()
    margin = sh.gather(_margin(top[:, None] - m_win, scale).reshape(-1)).double()
    return sh.gather(rank.reshape(-1)), margin


def _tiles(
    qn: Tensor,
    gallery_chunks: Iterable[tuple[int, Tensor]],
    self_index: Tensor | None,
    memory_budget: int,
) -> Iterator[tuple[int, int, int, Tensor]]:
    """``(r0, r1, global c0, qn[r0:r1] @ gallery[c0:c0 + cols].T)`` over every gallery chunk.

    Cache-sized ``4096 x 1024`` tiles on CPU (as the exact top-1 search), whole row blocks
    within ``memory_budget`` elsewhere; ``self_index`` (global ids of the queries) masks each
    query's own item with ``-inf``. Each tile overwrites the previous one.
    """
    m = qn.shape[0]
    for off, g in gallery_chunks:
        n_c = g.shape[0]
        if qn.device.type == "cpu":
            rows, cols = 4096, 1024
        else:
            rows, cols = chunk_rows(n_c, qn.dtype, memory_budget), n_c
        buf = torch.empty(min(rows, m), min(cols, n_c), dtype=qn.dtype, device=qn.device)
        si = None if self_index is None else self_index - off
        for r0 in range(0, m, rows):
            r1 = min(r0 + rows, m)
            for c0, sims in sim_tiles(qn, g.T, r0, r1, cols, buf, self_index=si):
                yield r0, r1, off + c0, sims


def _margin(gap: Tensor, scale: Tensor) -> Tensor:
    """``gap / scale`` with ``0 / 0 = 0`` and ``gap / 0 = inf`` (identical draws)."""
    safe = scale.clamp_min(torch.finfo(scale.dtype).tiny)
    out = gap.clamp_min(0.0) / safe
    return torch.where(scale > 0, out, torch.where(gap > 0, torch.inf, 0.0))


def _sparse_pattern(cand: Tensor, keep: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """CSR ``(crow, col, row)`` of the kept candidates, columns ascending within each row."""
    n = cand.shape[0]
    col_sorted, perm = cand.sort(dim=1)
    k = keep.gather(1, perm)
    lengths = k.sum(dim=1)
    crow = torch.zeros(n + 1, dtype=torch.long, device=cand.device)
    crow[1:] = lengths.cumsum(0)
    row = torch.repeat_interleave(torch.arange(n, device=cand.device), lengths)
    return crow, col_sorted[k], row


def _sddmm(crow: Tensor, col: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``(a @ b.T)[row, col]`` at the CSR pattern only (``torch.sparse.sampled_addmm``)."""
    n = crow.numel() - 1
    with warnings.catch_warnings():  # "sparse CSR support is in beta state"
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta")
        pattern = torch.sparse_csr_tensor(
            crow, col, torch.zeros(col.numel(), dtype=a.dtype, device=a.device),
            (n, b.shape[0]), check_invariants=False,
        )  # fmt: skip
    return torch.sparse.sampled_addmm(pattern, a, b.mT, beta=0.0).values()


def _margin_pattern(
    mean: Tensor,
    sigma: Tensor,
    margin: float,
    cap: int,
    memory_budget: int,
    tile: tuple[int, int] | None = None,
    shards: Shards | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """CSR ``(crow, col, row)`` of every candidate within ``margin`` of its query's best.

    One exact pass over the mean embeddings (as the top-1 search, no top-L selection):
    candidate ``c`` of query ``i`` is kept when ``(m_i1 - m_ic) / sqrt(sigma_i^2 +
    sigma_c^2) <= margin``, self excluded; a row with more than ``cap`` such candidates keeps
    the ``cap`` most similar of them (the pilot's L). Columns ascend within each row.

    On CPU (or with ``tile``) the pass runs over cache-sized ``[rows, cols]`` tiles with a
    running row maximum, like the tiled top-1 of :func:`~bayesurl.search.float32.top1_tiled`:
    each tile keeps the pairs above the running maximum minus the largest possible slack (a
    superset, since the running maximum only grows), and the exact per-pair test runs once the
    row's true best is known. Elsewhere whole ``[B, N]`` blocks within ``memory_budget``.

    With ``shards`` ``mean`` and ``sigma`` are this rank's rows: the rows of the pattern are
    this rank's queries, its columns global ids, and every rank's rows pass by in chunks
    (the superset is pruned with the running maxima after each chunk).
    """
    n_loc = mean.shape[0]
    sh = Shards.local(n_loc) if shards is None else shards
    dev = mean.device
    if tile is None and mean.device.type == "cpu":
        tile = (4096, 1024)
    rows, cols = (chunk_rows(sh.n, mean.dtype, memory_budget), sh.n) if tile is None else tile
    sigma_all = sh.gather(sigma)
    best, parts = _margin_superset(mean, sigma, sigma_all.max(), margin, (rows, cols), sh)
    all_rows, all_cols = [], []
    for part, r0 in zip(parts, range(0, n_loc, rows), strict=True):
        r1 = min(r0 + rows, n_loc)
        rr, cc = _kept_pairs(part, best[r0:r1], sigma[r0:r1], sigma_all, margin, cap, sh.n)
        all_rows.append(rr + r0)
        all_cols.append(cc)
    empty = torch.empty(0, dtype=torch.long, device=dev)
    row = torch.cat(all_rows) if all_rows else empty
    crow = torch.zeros(n_loc + 1, dtype=torch.long, device=dev)
    crow[1:] = torch.bincount(row, minlength=n_loc).cumsum(0)
    return crow, torch.cat(all_cols) if all_cols else empty, row


#: Pairs ``(rows within the block, global columns, mean cosines)`` of one query block, in parts
_Pairs = list[tuple[Tensor, Tensor, Tensor]]


def _margin_superset(
    mean: Tensor,
    sigma: Tensor,
    sig_max: Tensor,
    margin: float,
    tile: tuple[int, int],
    sh: Shards,
) -> tuple[Tensor, list[_Pairs]]:
    """The tiled pass of :func:`_margin_pattern`: every row's best mean cosine and, per block
    of ``tile[0]`` query rows, a superset of the pairs within ``margin`` (each tile keeps
    those above the running maximum minus the row's largest possible slack)."""
    n_loc, dev = mean.shape[0], mean.device
    rows, cols = tile
    buf = torch.empty(min(rows, n_loc), min(cols, sh.n), dtype=mean.dtype, device=dev)
    own = sh.global_ids(dev)  # self excluded by index
    starts = list(range(0, n_loc, rows))
    best = torch.full((n_loc,), -torch.inf, dtype=mean.dtype, device=dev)
    slack = margin * (sigma**2 + sig_max**2).sqrt()  # largest allowed gap of each row
    parts: list[_Pairs] = [[] for _ in starts]
    for off, g in sh.chunks(mean):
        for b, r0 in enumerate(starts):
            r1 = min(r0 + rows, n_loc)
            bb, sl = best[r0:r1], slack[r0:r1]
            for c0, sims in sim_tiles(mean, g.T, r0, r1, cols, buf, self_index=own - off):
                top = sims.amax(dim=1)  # values only: about 3x faster than max with indices
                torch.maximum(bb, top, out=bb)
                thr = bb - sl
                hit = (top >= thr).nonzero().squeeze(1)  # rows with a pair to keep in this tile
                sub = sims.index_select(0, hit)
                rr, cc = (sub >= thr[hit, None]).nonzero(as_tuple=True)
                parts[b].append((hit[rr], cc + c0 + off, sub[rr, cc]))
            if sh.active:  # bound the superset: prune with the maxima known so far
                rr, cc, vals = (torch.cat(p) for p in zip(*parts[b]))
                ok = vals >= (bb - sl)[rr]
                parts[b] = [(rr[ok], cc[ok], vals[ok])]
    return best, parts


def _kept_pairs(
    part: _Pairs,
    best: Tensor,
    sigma: Tensor,
    sigma_all: Tensor,
    margin: float,
    cap: int,
    n: int,
) -> tuple[Tensor, Tensor]:
    """The pairs of one query block within ``margin`` of their row's ``best``, at most ``cap``
    per row (the most similar, ties to the lower index), row-major with ascending columns."""
    rr, cc, vals = (torch.cat(p) for p in zip(*part))
    sq = sigma**2
    ok = _margin(best[rr] - vals, (sq[rr] + sigma_all[cc] ** 2).sqrt()) <= margin
    rr, cc, vals = rr[ok], cc[ok], vals[ok]
    # row-major, columns ascending (tiles arrive column block by column block)
    o = torch.argsort(rr * n + cc)
    rr, cc, vals = rr[o], cc[o], vals[o]
    counts = torch.bincount(rr, minlength=best.shape[0])
    if bool((counts > cap).any()):  # the cap most similar (ties to lower index)
        over = (counts[rr] > cap).nonzero().squeeze(1)  # entries of over-full rows only
        o = torch.argsort(-vals[over], stable=True)  # (rr, cc) ascend: ties keep lower
        o = o[torch.argsort(rr[over][o], stable=True)]
        ro = rr[over][o]  # ascending: each row's first entry is found by searchsorted
        rank = torch.arange(ro.numel(), device=rr.device) - torch.searchsorted(ro, ro)
        keep = torch.ones_like(rr, dtype=torch.bool)
        keep[over[o[rank >= cap]]] = False  # order kept: row-major, ascending columns
        rr, cc = rr[keep], cc[keep]
    return rr, cc


def _extend(col: Tensor, n_loc: int, sh: Shards) -> tuple[Tensor, RowExchange | None, Tensor]:
    """Global column ids -> ids into ``[own rows; fetched rows]`` (collective when sharded).

    Returns the local column ids, the exchange that fetches the other ranks' rows (None with
    one rank) and the global id of every local row.
    """
    own = sh.global_ids(col.device)
    if not sh.active:
        return col, None, own
    lo, hi = sh.offset, sh.offset + n_loc
    remote = (col < lo) | (col >= hi)
    ex = RowExchange(col[remote], sh)
    col_ext = col - lo
    col_ext[remote] = n_loc + torch.searchsorted(ex.ids, col[remote])
    return col_ext, ex, torch.cat([own, ex.ids])


def _rows(z: Tensor, ex: RowExchange | None) -> Tensor:
    """This rank's rows of ``z`` followed by the rows ``ex`` fetches (collective)."""
    return z if ex is None else torch.cat([z, ex.fetch(z)])


def _query_blocks(
    pattern: tuple[Tensor, Tensor, Tensor], n: int, block: int, n_cand: int | None = None
) -> list[tuple[int, int, Tensor, Tensor, Tensor, Tensor]]:
    """The kept pairs cut into query blocks ``[q0, q1)``, each as the CSR of its transpose
    (rows = candidates ascending, columns = the block's queries): ``(q0, q1, crow_t,
    local query, query, candidate)`` per stored pair (local: ``query - q0``). ``n`` queries,
    ``n_cand`` candidate rows (default ``n``)."""
    crow, col, row = pattern
    n_cand = n if n_cand is None else n_cand
    out = []
    for q0 in range(0, n, block):
        q1 = min(q0 + block, n)
        lo, hi = int(crow[q0]), int(crow[q1])  # rows are contiguous in CSR order
        r, c = row[lo:hi], col[lo:hi]
        o = torch.argsort(c * (q1 - q0) + (r - q0))  # candidate-major, queries ascending
        c, r = c[o], r[o]
        crow_t = torch.zeros(n_cand + 1, dtype=torch.long, device=col.device)
        crow_t[1:] = torch.bincount(c, minlength=n_cand).cumsum(0)
        out.append((q0, q1, crow_t, r - q0, r, c))
    return out


def _nn_sparse(
    s: Tensor,
    pattern: tuple[Tensor, Tensor, Tensor],
    progress: bool,
    query_block: int | None = None,
    shards: Shards | None = None,
) -> Tensor:
    """1-NN per draw of every query among its kept candidates (sparse SDDMMs per draw).

    Per draw ``z``, the kept (query, candidate) similarities ``<z_i, z_c> / ||z_c||`` are
    computed without gathering candidate rows (``sampled_addmm`` reads ``z`` in place), the
    maximum per query taken with ``scatter_reduce``; ties go to the lowest index. ``pattern``
    is the CSR ``(crow, col, row)`` of the kept pairs (:func:`_sparse_pattern`,
    :func:`_margin_pattern`).

    On CPU the queries are cut into blocks of ``query_block`` rows (default: 8 MiB of the
    draw, 4096 rows at D = 512 in float32) that stay in the last-level cache, and each block's
    product runs candidate-major (the transposed pattern), so the draw's rows are read in
    ascending order instead of at random: 2.3x faster per draw at N = 56k, D = 512 with about
    40 candidates per query (``benchmarks/evaluator.py``).

    With ``shards`` the rows of ``s`` and of the pattern are this rank's queries and the
    columns global ids: the candidates other ranks own are fetched once per draw
    (:class:`~bayesurl.distributed.RowExchange`, only the rows some local query keeps), and
    the result holds global ids.
    """
    n_draws, n_loc, d = s.shape
    sh = Shards.local(n_loc) if shards is None else shards
    crow, col, row = pattern
    col_ext, ex, glob = _extend(col, n_loc, sh)
    n_ext = glob.numel()
    if query_block is None:
        query_block = max(1, (8 * 2**20) // (d * s.element_size())) if s.is_cpu else n_loc
    blocks = _query_blocks((crow, col_ext, row), n_loc, query_block, n_ext)
    empty = torch.empty(0, dtype=torch.long, device=s.device)
    query = torch.cat([b[4] for b in blocks]) if blocks else empty
    cand = torch.cat([b[5] for b in blocks]) if blocks else empty
    cand_id = glob[cand]  # global ids: ties go to the lowest
    eps = torch.finfo(s.dtype).tiny ** 0.5
    out = torch.empty(n_draws, n_loc, dtype=torch.long, device=s.device)
    big = torch.full((n_loc,), sh.n, dtype=torch.long, device=s.device)
    for t in tqdm(range(n_draws), disable=not progress, desc="1-NN per draw", leave=False):
        z = s[t]
        ze = _rows(z, ex)
        inv = ze.norm(dim=1).clamp_min(eps).reciprocal()
        parts = [_sddmm(crow_t, loc, ze, z[q0:q1]) for q0, q1, crow_t, loc, _, _ in blocks]
        v = (torch.cat(parts) if parts else inv[:0]).mul_(inv[cand])
        best = torch.full((n_loc,), -torch.inf, dtype=v.dtype, device=v.device)
        best = best.scatter_reduce(0, query, v, reduce="amax")
        win = torch.where(v == best[query], cand_id, sh.n)
        out[t] = big.scatter_reduce(0, query, win, reduce="amin")
    return out


def sampled_neighbors(
    samples: Tensor,
    *,
    mode: str = "shortlist",
    shortlist: int | None = None,
    candidates: Tensor | None = None,
    tolerance: float = 1e-3,
    margin: float | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    info: dict[str, float] | None = None,
    progress: bool = False,
    block: int = 32,
    cluster_iters: int = 4,
) -> Tensor:
    """1-NN index of every query within each posterior draw, self excluded by index.

    The default compares each query, in every draw, only with the few of its mean-space
    neighbours that a pilot finds can win (at most ``tolerance`` of the per-draw neighbours
    missed); ``mode="exact"`` searches every draw in full.

    Parameters
    ----------
    samples : Tensor
        ``[S, N, D]`` draws (LAM, section 4: embeddings sampled from the weight posterior).
    mode, shortlist, tolerance, margin, memory_budget, progress, block, cluster_iters
        The search (:class:`DrawSearch`: the modes, what each setting does and their cost).
    candidates : Tensor, optional
        ``[N, >=L]`` precomputed kNN of the mean embedding (e.g. the one already computed for
        R@1); used when it has at least L columns.
    info : dict, optional
        Filled with ``shortlist`` (the L used), ``margin``, ``kept_per_query`` (mean number of
        candidates compared per query and draw) and the pilot's estimates.

    Returns
    -------
    Tensor
        ``[S, N]`` int64 neighbour indices.
    """
    s = checked_samples(samples, check_values=mode == "exact")
    search = DrawSearch(
        mode=mode, shortlist=shortlist, tolerance=tolerance, margin=margin,
        memory_budget=memory_budget, progress=progress, block=block, cluster_iters=cluster_iters,
    )  # fmt: skip
    return neighbors_per_draw(s, search, candidates=candidates, info=info)


def neighbors_per_draw(
    s: Tensor,
    search: DrawSearch,
    *,
    candidates: Tensor | None = None,
    info: dict[str, float] | None = None,
    resultant: Tensor | None = None,
    shards: Shards | None = None,
) -> Tensor:
    """:func:`sampled_neighbors` on validated draws (``resultant``: their checked mean
    resultant, when the caller already has it).

    With ``shards``, ``s``, ``resultant`` and ``candidates`` hold this rank's
    queries only, every search runs over every rank's rows (collective) and the result is
    ``[S, n_r]`` global ids; the shortlist, margin and exact fallback are chosen from the
    gathered pilot, so every rank takes the single-process decisions. ``mode="block"`` is
    single-process only.
    """
    sh = Shards.local(s.shape[1]) if shards is None else shards
    if sh.n < 2:
        raise ValueError(f"`samples` needs at least 2 points, got {sh.n}")
    if search.mode == "exact":
        return _exact_per_draw(s, search, sh)
    if search.mode not in _MODES:
        raise ValueError(f"`mode` must be 'shortlist', 'block' or 'exact', got {search.mode!r}")
    if search.mode == "block" and sh.active:
        raise ValueError("`mode='block'` runs in one process only; use 'shortlist' or 'exact'")
    if search.margin is not None and not search.margin >= 0.0:
        raise ValueError(f"`margin` must be >= 0 or None, got {search.margin!r}")
    res = checked_resultant(s) if resultant is None else resultant
    plan = _shortlist_plan(s, res, search, sh, info)
    if plan is None:  # no shortlist up to the cap is accurate enough: exact searches
        return _exact_per_draw(s, search, sh)
    L, margin = plan
    mean = normalize(res)
    cut = margin is not None and margin < torch.inf
    if search.mode == "shortlist" and candidates is None and cut:
        # no top-L search: one threshold pass keeps each query's candidates within the margin
        pattern = _margin_pattern(mean, _spread(res), margin, L, search.memory_budget, shards=sh)
        if info is not None:
            kept = sh.sum(float(pattern[1].numel())) / sh.n
            info.update(margin=float(margin), kept_per_query=kept)
        return _nn_sparse(s, pattern, search.progress, shards=sh)
    cand, m_sims = _shortlists(mean, candidates, L, search.memory_budget, sh)
    if search.mode == "block":
        block = check_int(search.block, "block", low=1)
        order = _cluster_order(mean, block, search.cluster_iters, search.memory_budget)
        return _nn_in_blocks(s, cand, order, block, search.memory_budget, search.progress)
    keep = torch.ones(cand.shape, dtype=torch.bool, device=cand.device)
    if cut:
        cand, keep = _within_margin(mean, res, cand, m_sims, margin, sh)
    if info is not None:
        info.update(margin=float(torch.inf if margin is None else margin))
        info.update(kept_per_query=sh.sum(float(keep.sum())) / sh.n)
    return _nn_sparse(s, _sparse_pattern(cand, keep), search.progress, shards=sh)


def _exact_per_draw(s: Tensor, search: DrawSearch, sh: Shards) -> Tensor:
    """One exact search per draw (``mode="exact"``): ``[S, n_r]`` global ids."""
    n_draws, n_loc, _ = s.shape
    own = sh.global_ids(s.device)
    bar = partial(
        tqdm, total=n_draws, disable=not search.progress, desc="1-NN per draw", leave=False
    )
    out = torch.empty(n_draws, n_loc, dtype=torch.long, device=s.device)
    for t, z in enumerate(bar(s)):
        zn = normalize(z)
        out[t] = _draw_nn(zn, None, own, search.memory_budget, sh)
    return out


def _draw_nn(
    zn: Tensor, rows: Tensor | None, own: Tensor, memory_budget: int, sh: Shards
) -> Tensor:
    """The exact 1-NN global id of the queries ``zn[rows]`` (every row when None; global ids
    ``own``) among every rank's rows of the normalised draw ``zn``: ids only, so the rows the
    first pass certifies get no float64 values."""
    q = zn if rows is None else zn[rows]
    return search(q, partial(sh.chunks, zn), 1, memory_budget, None, own, sh, False)[1][:, 0]


def _shortlist_plan(
    s: Tensor, res: Tensor, search: DrawSearch, sh: Shards, info: dict[str, float] | None
) -> tuple[int, float | None] | None:
    """The shortlist length L and the margin of the shortlist modes: given, or chosen by the
    pilot (:func:`choose_shortlist`); None when the pilot finds no L within the tolerance."""
    margin = search.margin
    if search.shortlist is None:
        L, pilot = choose_shortlist(
            s, tolerance=search.tolerance, memory_budget=search.memory_budget,
            resultant=res, shards=sh,
        )  # fmt: skip
        if pilot["miss_rate"] > search.tolerance:
            if info is not None:
                info.update(
                    pilot, shortlist=float(sh.n - 1), fallback_exact=1.0,
                    rejected_shortlist=float(L),
                )  # fmt: skip
            return None
        if margin is None:
            margin = pilot["margin"]
    else:
        L, pilot = min(check_int(search.shortlist, "shortlist", low=1), sh.n - 1), {}
    if info is not None:
        info.update(pilot, shortlist=float(L))
    return L, margin


def _shortlists(
    mean: Tensor, candidates: Tensor | None, L: int, memory_budget: int, sh: Shards
) -> tuple[Tensor, Tensor | None]:
    """Each query's L nearest mean embeddings (global ids) and their cosines: the first L
    columns of ``candidates`` when it has that many (cosines None), else searched."""
    n_loc = mean.shape[0]
    if candidates is not None:
        c = check_tensor(candidates, "candidates", ndim=2).long()
        if c.shape[0] != n_loc:
            raise ValueError(f"`candidates` must have {n_loc} rows, got {tuple(c.shape)}")
        if c.shape[1] >= L:
            return c[:, :L].to(mean.device), None
    own = sh.global_ids(mean.device)
    m_sims, cand = search(mean, partial(sh.chunks, mean), L, memory_budget, None, own, sh)
    return cand, m_sims


def _within_margin(
    mean: Tensor, res: Tensor, cand: Tensor, m_sims: Tensor | None, margin: float, sh: Shards
) -> tuple[Tensor, Tensor]:
    """The candidates ``cand`` (reordered when their mean cosines ``m_sims`` are computed here)
    and which of them lie within ``margin`` of their query's best (:func:`choose_shortlist`)."""
    n_loc = mean.shape[0]
    if m_sims is None:  # given candidates: their mean cosines, one sparse pass
        keep = torch.ones(cand.shape, dtype=torch.bool, device=cand.device)
        crow, col, _ = _sparse_pattern(cand, keep)
        width = cand.shape[1]  # every candidate kept: `width` per row (a rank may have none)
        cand = col.view(n_loc, width)  # ascending per row; the order does not matter below
        col_ext, ex, _ = _extend(col, n_loc, sh)
        m_sims = _sddmm(crow, col_ext, mean, _rows(mean, ex)).view(n_loc, width)
    sigma = _spread(res)
    scale = (sigma[:, None] ** 2 + sh.gather(sigma)[cand] ** 2).sqrt()
    gap = m_sims.max(dim=1, keepdim=True).values - m_sims
    return cand, _margin(gap, scale) <= margin
