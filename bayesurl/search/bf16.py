"""The bfloat16 candidate pass of the exact search: where the processor multiplies bfloat16
fast, bfloat16 products with a rigorous error bound propose each query's neighbours, float64
re-ranks them and a certificate proves them exact; the rows it cannot certify take the float32
path (:func:`~bayesurl.search.float32.search_exact`). Both give the same neighbours and values
bit for bit (docs/concepts/metrics.rst, "Recall@1 and Recall@k").
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from bayesurl.search.core import (
    PAIR_STEP,
    STATS,
    SearchJob,
    exclude_own,
    fall_back,
    fill_chunk_pairs,
    forcing,
    rank_candidates,
    row_parallel,
)
from bayesurl.search.float32 import search_exact

__all__ = [
    "bf16_rows",
    "float64_slack",
    "low_precision",
    "lowp_applies",
    "lowp_bound",
    "lowp_forced",
    "residual_norms",
    "search_lowp",
    "search_precision",
]

#: Unit roundoff of bfloat16 (8 significant bits): round-to-nearest moves a value by at most
#: this fraction of its magnitude.
_BF16_U = 2.0**-8

#: The window below the running k-th value ``T`` within which items become candidates is
#: ``c + _WINDOW_REL |T|`` (:func:`search_lowp`).
_WINDOW_REL = 2.04 * _BF16_U / (1 - _BF16_U)

#: Gallery columns per tile of the bfloat16 candidate pass, and per block of its gate (a
#: block's maximum decides whether its items are read at all).
_LOWP_COLS = 1024
_LOWP_BLOCK = 32

#: Narrower embeddings keep the float32 path unless forced: at D = 64 the products are a small
#: share of the pass and the candidate bookkeeping outweighs their gain (sampled ECE, N = 35k,
#: S = 10: 1.15x the float32 path's CPU time; ``results/benchmarks/evaluator_precision.txt``).
LOWP_MIN_D = 128

#: Norm bounds of rows, of their bfloat16 copies and of the difference (:func:`residual_norms`)
_Norms = tuple[Tensor, Tensor, Tensor]

#: Forced choice of the search (None: automatic, see :func:`search_precision`).
_FORCE_LOWP: list[bool | None] = [None]


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
    :func:`lowp_bound` assumes it): ``1 + 255 * 2**-9`` would stay ``1`` if every partial
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
    """The candidate pass :func:`~bayesurl.search.knn` and the evaluator's searches use on
    ``device``.

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


def low_precision(enabled: bool | None) -> contextlib.AbstractContextManager[None]:
    """Force the bfloat16 candidate pass on (``True``) or off (``False``) within the context,
    or leave the choice to :func:`search_precision` (``None``); for benchmarks and tests (the
    results are the same either way)."""
    return forcing(_FORCE_LOWP, enabled)


def lowp_forced() -> bool | None:
    """The forced choice of :func:`low_precision` (None: automatic)."""
    return _FORCE_LOWP[0]


def lowp_applies(qn: Tensor, k: int) -> bool:
    """Whether the search of the normalised queries ``qn`` takes the bfloat16 pass."""
    # the same answer on every rank (a rank without queries runs the collective passes too)
    if qn.dtype not in (torch.float32, torch.float64):
        return False
    if qn.device.type not in ("cpu", "cuda"):
        return False
    if _FORCE_LOWP[0] is None and qn.shape[1] < LOWP_MIN_D:
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


def residual_norms(x: Tensor, xb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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


def bf16_rows(
    gn: Tensor,
    qn: Tensor,
    qb: Tensor,
    q_stats: _Norms,
    g_max: list[float],
    contiguous: bool = False,
) -> Tensor:
    """The bfloat16 copy of the gallery chunk ``gn`` (``qb`` when ``gn`` is the queries
    ``qn``), its norm bounds (:func:`residual_norms`) folded into the running maxima ``g_max``
    in place."""
    gb = qb if gn is qn else gn.to(torch.bfloat16)
    if contiguous:
        gb = gb.contiguous()
    if gn.shape[0]:
        stats = q_stats if gn is qn else residual_norms(gn, gb)
        g_max[:] = [max(g, float(v.max())) for g, v in zip(g_max, stats, strict=True)]
    return gb


def lowp_bound(
    q_stats: _Norms,
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


def float64_slack(d: int, q_stats: _Norms, g_max: list[float]) -> Tensor:
    """Per query, the bound on a float64 similarity's own error (Higham's ``gamma_d`` of
    float64, 1 % on top, plus ``1e-300``)."""
    u64 = 2.0**-53
    return (d + 2) * u64 / (1 - (d + 2) * u64) * 1.01 * q_stats[0] * g_max[0] + 1e-300


class _Lists(NamedTuple):
    """The candidate lists of pass 1 of :func:`search_lowp`: ``v`` / ``i`` ``[M, C]``
    (bfloat16 products as float32, global ids; ``-inf`` / -1 where empty), the running limit
    ``floor`` and the largest product pushed out of a list, ``drop`` ``[M]``."""

    v: Tensor
    i: Tensor
    floor: Tensor
    drop: Tensor

    def rows(self, r0: int, r1: int) -> _Lists:
        """The lists of the query rows ``r0 .. r1`` (views: updates reach these lists)."""
        return _Lists(self.v[r0:r1], self.i[r0:r1], self.floor[r0:r1], self.drop[r0:r1])


def search_lowp(job: SearchJob, capacity: int | None = None) -> tuple[Tensor, Tensor]:
    """:func:`~bayesurl.search.float32.search_exact` with a bfloat16 candidate pass.

    1. **Candidates.** The queries and every gallery chunk are rounded to bfloat16 and
       multiplied tile by tile (query blocks split across threads,
       :func:`~bayesurl.search.core.row_parallel`). With ``p`` the bfloat16 products and
       ``e(p) = a + u |p|`` their error bound (:func:`lowp_bound`), each query keeps a
       ``floor``: the running maximum of ``T - W(T)`` over the running k-th largest ``p``
       (``T``; for k = 1 the tile's own maximum counts before its items are read), with
       ``W(T) = 2.04 (a + u |T|) / (1 - u)``, the widest gap two bounds can open. Every item
       with ``p >= floor`` enters the query's candidate list (at most ``capacity``, default
       ``k + max(k, 31)``; ``drop`` keeps the largest ``p`` pushed out). A tile whose row
       maximum lies below the floor costs one ``amax``; in the others only blocks of
       :data:`_LOWP_BLOCK` columns that reach it are read.
    2. **Re-rank.** Each candidate gets its float64 similarity computed as the float32 path
       computes it (:func:`~bayesurl.search.core.pair_sims`: the same bits), and the top-k is
       taken in (similarity descending, id ascending) order. For k = 1 without
       ``exact_values`` a lone candidate whose lower bound ``p - e(p)`` already clears the
       certificate needs no float64 value.
    3. **Certificate.** Every item outside the list has ``p <= E = max(floor, drop)`` (the
       floor only rises), hence an exact similarity ``<= E + u |E| + a``, and a float64 one
       at most ``gamma_d`` (float64) above that. When the k-th re-ranked similarity exceeds
       this strictly, no outside item can enter the top-k or tie with its last member: the
       row is certified. The others (``search_stats()["fallback"]``) run the float32 path;
       collective under ``shards``, as every pass here.
    """
    m = job.qn.shape[0]
    cap = capacity if capacity is not None else job.k + max(job.k, 31)
    # collective: every rank takes the same path
    if job.total(float(m * cap * 12 > job.memory_budget)):
        return search_exact(job)  # candidate lists beyond the budget: the float32 path
    lists, q_stats, g_max = _candidates(job, cap)
    out_v, out_i, certified, keep = _rerank(job, lists, q_stats, g_max)
    fail = (~certified).nonzero().squeeze(1)
    STATS["lowp_queries"] += m
    STATS["certified"] += m - fail.numel()
    STATS["fallback"] += fail.numel()
    STATS["candidates"] += int(keep.sum())
    return fall_back(job, (out_v, out_i), fail, search_exact)


def _candidates(job: SearchJob, cap: int) -> tuple[_Lists, _Norms, list[float]]:
    """Pass 1 of :func:`search_lowp` over every gallery chunk, query blocks on threads: the
    candidate lists, the queries' norm bounds and the gallery's maxima of them."""
    qn, k = job.qn, job.k
    m, d = qn.shape
    dev = qn.device
    qb = qn.to(torch.bfloat16)
    q_stats = residual_norms(qn, qb)
    lists = _Lists(
        v=torch.full((m, cap), -math.inf, dtype=torch.float32, device=dev),
        i=torch.full((m, cap), -1, dtype=torch.long, device=dev),
        floor=torch.full((m,), -math.inf, dtype=torch.float32, device=dev),
        drop=torch.full((m,), -math.inf, dtype=torch.float32, device=dev),
    )
    g_max = [0.0, 0.0, 0.0]
    window = None
    for off, gn in job.gallery():
        gb = bf16_rows(gn, qn, qb, q_stats, g_max)
        if window is None:  # the window of the first chunk (the certificate uses the final bound)
            a, _ = lowp_bound(q_stats, tuple(g_max), d)
            window = (2.04 * a / (1 - _BF16_U) + 1e-12).float()
        si = None if job.self_index is None else job.self_index - off
        gbt = gb.T

        def block(
            r0: int,
            r1: int,
            gbt: Tensor = gbt,
            si: Tensor | None = si,
            off: int = off,
            window: Tensor = window,
        ) -> None:
            _block_candidates(
                qb[r0:r1], gbt, k, None if si is None else si[r0:r1], off, window[r0:r1],
                lists.rows(r0, r1),
            )  # fmt: skip

        with _exact_bf16_reduction():
            row_parallel(m, dev, block)
    return lists, q_stats, g_max


def _rerank(
    job: SearchJob, c: _Lists, q_stats: _Norms, g_max: list[float]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Pass 2 and the certificate of :func:`search_lowp`: the top-k of the candidates by their
    float64 similarities (float64 values and ids), which rows are certified, which
    candidates were kept."""
    k, qn = job.k, job.qn
    m, d = qn.shape
    dev = qn.device
    a, _ = lowp_bound(q_stats, tuple(g_max), d)
    # candidates: every kept item within the window of the final k-th value
    keep = torch.isfinite(c.v) & (c.i >= 0) & (c.v >= c.floor[:, None])
    edge = torch.maximum(c.floor, c.drop).double()
    slack64 = float64_slack(d, q_stats, g_max)
    upper = edge + _BF16_U * 1.01 * edge.abs() + a + slack64
    lone = torch.zeros(m, dtype=torch.bool, device=dev)
    if k == 1 and not job.exact_values:
        # one candidate whose bound alone clears every other item: its id needs no float64
        p = torch.where(keep, c.v, -math.inf).amax(dim=1).double()
        low = p - _BF16_U * 1.01 * p.abs() - a - slack64
        lone = (keep.sum(dim=1) == 1) & (low > upper)
    val = torch.full(c.v.shape, -math.inf, dtype=torch.float64, device=dev)
    val[lone] = torch.where(keep[lone], c.v[lone].double(), -math.inf)
    need = keep & ~lone[:, None]
    for chunk in job.gallery():
        fill_chunk_pairs(val, qn, c.i, need, chunk, PAIR_STEP)
    ids = torch.where(keep, c.i, torch.iinfo(torch.long).max)
    out_v, out_i = rank_candidates(ids, val, k)
    certified = lone | (torch.isfinite(out_v[:, -1]) & (out_v[:, -1] > upper))
    return out_v, out_i, certified, keep


def _block_candidates(
    qb: Tensor,
    gbt: Tensor,
    k: int,
    self_index: Tensor | None,
    offset: int,
    window: Tensor,
    state: _Lists,
) -> None:
    """Pass 1 of :func:`search_lowp` for one block of bfloat16 queries ``qb`` against the
    bfloat16 gallery chunk ``gbt`` ``[D, n]`` (ids ``offset ..``); updates the block's rows
    of the candidate lists, ``floor`` and ``drop`` (``state``) in place."""
    r, n = qb.shape[0], gbt.shape[1]
    if not n:
        return
    floor = state.floor
    cols = min(_LOWP_COLS if qb.device.type == "cpu" else 16 * _LOWP_COLS, n)
    buf = torch.empty(r * cols, dtype=torch.bfloat16, device=qb.device)
    for c0 in range(0, n, cols):
        c1 = min(c0 + cols, n)
        sims = torch.mm(qb, gbt[:, c0:c1], out=buf[: r * (c1 - c0)].view(r, c1 - c0))
        if self_index is not None:
            exclude_own(sims, self_index, c0)
        rmax = sims.amax(dim=1).float()
        if k == 1:  # the tile's own best raises the limit before its items are read
            torch.maximum(floor, rmax - (window + _WINDOW_REL * rmax.abs()), out=floor)
        # two gates: the rows whose maximum reaches their limit, then their blocks of columns
        # that do
        hot = (rmax >= floor).nonzero().squeeze(1)
        if not hot.numel():
            continue
        if k > 1 and hot.numel() * 4 > r:  # early tiles: most rows take part, merge them whole
            new_v = sims.index_select(0, hot).float()
            new_v = new_v.masked_fill_(new_v < floor[hot, None], -math.inf)
            new_i = torch.arange(c0 + offset, c1 + offset, device=qb.device)
            new_i = new_i.expand(hot.numel(), -1)
        else:
            hot, new_v, new_i = _gated_items(sims, hot, floor, c0 + offset)
        _merge(state, hot, new_v, new_i, k, window)


def _gated_items(
    sims: Tensor, hot: Tensor, floor: Tensor, first_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The items of the rows ``hot`` of a bfloat16 tile that reach their row's ``floor``, read
    in blocks of :data:`_LOWP_BLOCK` columns whose maximum does (bfloat16 reductions over short
    runs are slow: float32 there): the rows that have any, and per row its values and global
    ids (``first_id`` the tile's first), padded with ``-inf`` / -1."""
    w = sims.shape[1]
    bw = _LOWP_BLOCK if w % _LOWP_BLOCK == 0 else w
    sub = sims.index_select(0, hot).float()
    blocks = sub.view(hot.numel(), w // bw, bw)
    sr, hb = (blocks.amax(dim=2) >= floor[hot, None]).nonzero(as_tuple=True)
    hr = hot[sr]  # row-major: ascending
    vals = blocks[sr, hb]  # [H, bw]
    ei, ec = (vals >= floor[hr, None]).nonzero(as_tuple=True)
    hot, count = torch.unique_consecutive(hr[ei], return_counts=True)
    width = int(count.max())
    slot = torch.repeat_interleave(torch.arange(hot.numel(), device=sims.device), count)
    pos = torch.arange(ei.numel(), device=sims.device) - (count.cumsum(0) - count)[slot]
    new_v = vals.new_full((hot.numel(), width), -math.inf)
    new_i = torch.full((hot.numel(), width), -1, dtype=torch.long, device=sims.device)
    new_v[slot, pos] = vals[ei, ec]
    new_i[slot, pos] = hb[ei] * bw + ec + first_id
    return hot, new_v, new_i


def _merge(
    state: _Lists, hot: Tensor, new_v: Tensor, new_i: Tensor, k: int, window: Tensor
) -> None:
    """Merge a tile's items into the candidate lists of the rows ``hot`` (the largest value
    pushed out raises ``drop``) and raise their ``floor`` to the new k-th value's limit."""
    cap = state.v.shape[1]
    mv = torch.cat([state.v[hot], new_v], dim=1)
    mi = torch.cat([state.i[hot], new_i], dim=1)
    tv, tj = torch.topk(mv, min(cap + 1, mv.shape[1]), dim=1)
    if tv.shape[1] > cap:  # the largest value pushed out of the list
        state.drop[hot] = torch.maximum(state.drop[hot], tv[:, cap])
    state.v[hot] = tv[:, :cap]
    state.i[hot] = mi.gather(1, tj[:, :cap])
    t = tv[:, k - 1]
    lim = t - (window[hot] + _WINDOW_REL * t.abs())
    state.floor[hot] = torch.maximum(state.floor[hot], lim)
