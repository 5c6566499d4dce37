"""A fused product-and-select for the exact kNN search: one Triton kernel keeps each query's
running top-K of its bfloat16 products over the gallery, block by block, so the ``[B, N]``
similarity block is never written to memory.

The exact search behind :func:`~bayesurl.search.knn` and
:func:`~bayesurl.evaluation.evaluate` uses it on a GPU as its candidate pass
(:func:`search_fused`): the K kept items are re-ranked in float64 and a certificate (the K-th
kept product plus the products' error bound lies strictly below the k-th re-ranked
similarity) proves that no other item can reach the top-k; rows it cannot certify go to the
unfused passes (docs/concepts/metrics.rst, "The exact search on a GPU").

What the kernel computes, for query rows ``i`` of ``qb`` and gallery rows ``j`` of ``gb``
(both bfloat16), with ``p_ij`` the products summed in float32 (exact bfloat16 products, one
float32 accumulator, never rounded to bfloat16):

- the running state ``best_v`` / ``best_i`` ``[M, K]`` becomes the top-K of the state and the
  new items in (``p`` descending, global id ascending) order, as a set (slots unordered);
- item ``j`` is excluded for query ``i`` when ``own[i] == j`` (self excluded by index);
- global ids are ``offset + j``, so gallery chunks with ascending offsets continue one state.

Without CUDA, Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is first
imported) runs the same kernel on CPU tensors; the tests use it. The interpreter of Triton
3.8 multiplies bfloat16 operands wrongly (its ``tl.dot`` reads them as integers), so there the
operands are widened to float32 before the launch: the product of two bfloat16 numbers is
exact in float32 either way.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from bayesurl.search.bf16 import (
    LOWP_MIN_D,
    bf16_rows,
    float64_slack,
    lowp_applies,
    lowp_bound,
    lowp_forced,
    residual_norms,
    search_lowp,
)
from bayesurl.search.core import (
    STATS,
    SearchJob,
    fall_back,
    fill_chunk_pairs,
    forcing,
    rank_candidates,
)
from bayesurl.search.float32 import search_exact

__all__ = [
    "ACCUMULATOR_UNIT",
    "GPU_CONFIG",
    "INTERPRETER_CONFIG",
    "FusedConfig",
    "default_config",
    "fused_applies",
    "fused_available",
    "fused_search",
    "fused_topk",
    "interpreting",
    "search_fused",
]

#: Tensor-core accumulation may truncate instead of rounding to nearest (measured on several
#: NVIDIA generations); the bound of the fused products takes twice float32's unit roundoff
#: of truncation, four times that of rounding, as the accumulator's unit roundoff.
ACCUMULATOR_UNIT = 2.0**-22

#: Forced choice of the fused candidate pass (None: automatic, CUDA where the kernel works).
_FORCE_FUSED: list[bool | None] = [None]


@dataclass(frozen=True)
class FusedConfig:
    """Block sizes and launch settings of the kernel.

    Attributes
    ----------
    keep : int
        K, items kept per query (a power of two, at least 2): the certificate needs the
        k-th neighbour strictly above the K-th kept product plus the bound, so ``k < K``.
    block_m, block_n, block_d : int
        Query rows per program, gallery columns per step, dimensions per ``tl.dot`` (powers
        of two, at least 16).
    num_warps, num_stages : int
        Triton launch settings (ignored by the interpreter).
    """

    keep: int = 8
    block_m: int = 128
    block_n: int = 128
    block_d: int = 64
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("keep", "block_m", "block_n", "block_d"):
            v = getattr(self, name)
            low = 2 if name == "keep" else 16
            if not isinstance(v, int) or v < low or v & (v - 1):
                raise ValueError(f"`{name}` must be a power of two >= {low}, got {v!r}")


#: The GPU's default and the interpreter's (small blocks: numpy runs each program's steps).
GPU_CONFIG = FusedConfig()
INTERPRETER_CONFIG = FusedConfig(keep=8, block_m=64, block_n=256, block_d=128)


@functools.cache
def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1`` before its
    first import); False without Triton."""
    if importlib.util.find_spec("triton") is None:
        return False
    import triton

    knobs = getattr(triton, "knobs", None)  # Triton >= 3.4; older ones read the variable
    if knobs is None:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    return bool(knobs.runtime.interpret)


def default_config() -> FusedConfig:
    """:data:`INTERPRETER_CONFIG` in Triton's interpreter, else :data:`GPU_CONFIG`."""
    return INTERPRETER_CONFIG if interpreting() else GPU_CONFIG


@functools.cache
def _compiled() -> object:
    # imported on first use: Triton is optional (CUDA builds of torch bring it) and its import
    # costs every command that never runs the kernel
    from bayesurl.search._triton_topk import topk_kernel

    return topk_kernel


def fused_topk(
    qb: Tensor,
    gb: Tensor,
    best_v: Tensor,
    best_i: Tensor,
    *,
    own: Tensor | None = None,
    offset: int = 0,
    config: FusedConfig | None = None,
) -> None:
    """Merge the top-K of ``qb @ gb.T`` (float32 sums of bfloat16 products) into the running
    state ``best_v`` / ``best_i`` in place.

    Parameters
    ----------
    qb : Tensor
        ``[M, D]`` bfloat16 queries, rows contiguous.
    gb : Tensor
        ``[N, D]`` bfloat16 gallery rows (global ids ``offset ..``), rows contiguous.
    best_v, best_i : Tensor
        ``[M, K]`` float32 values and int64 global ids of the top-K so far (``-inf`` and a
        negative id where empty; empty slots leave with distinct negative ids), contiguous;
        ``K = config.keep``.
    own : Tensor, optional
        ``[M]`` int64 column of ``gb`` excluded per query (its own item; any value outside
        ``[0, N)`` excludes nothing).
    offset : int
        Global id of ``gb``'s first row.
    config : FusedConfig, optional
        Block sizes (default: :data:`GPU_CONFIG` on CUDA, :data:`INTERPRETER_CONFIG` in the
        interpreter); ``config.keep`` must equal K.
    """
    import triton

    cfg = config or default_config()
    m, d = qb.shape
    n = gb.shape[0]
    if qb.dtype != torch.bfloat16 or gb.dtype != torch.bfloat16:
        raise ValueError(f"`qb` and `gb` must be bfloat16, got {qb.dtype} and {gb.dtype}")
    if gb.shape[1] != d or qb.stride(1) != 1 or gb.stride(1) != 1:
        raise ValueError("`qb` and `gb` need the same width and contiguous rows")
    if best_v.shape != (m, cfg.keep) or best_i.shape != (m, cfg.keep):
        raise ValueError(f"the state must be [{m}, {cfg.keep}], got {tuple(best_v.shape)}")
    if not (best_v.is_contiguous() and best_i.is_contiguous()):
        raise ValueError("the state must be contiguous")
    if m == 0 or n == 0:
        return
    qb, gb = qb.contiguous(), gb.contiguous()  # the kernel's row stride is D
    if own is None:  # a column no query has: nothing excluded
        own = torch.full((m,), -1, dtype=torch.long, device=qb.device)
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if interpreting():  # its tl.dot misreads bfloat16; float32 holds every bfloat16 exactly
        qb, gb, launch = qb.float(), gb.float(), {}
    _compiled()[(triton.cdiv(m, cfg.block_m),)](
        qb, gb, own.to(torch.long).contiguous(), best_v, best_i, m, n, d, int(offset),
        K=cfg.keep, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d, **launch,
    )  # fmt: skip


def _self_check(device: torch.device) -> str | None:
    """Run the kernel on small problems and compare with a float64 reference; None when it
    agrees, else what differed.

    Checked: a sum that float32 keeps and bfloat16 would lose (``1 + 255 * 2**-9``), the
    kept values against the exact products of the bfloat16 inputs within the accumulator's
    bound, the kept ids wherever the reference's values are apart by more than twice that,
    self excluded by index, and two gallery chunks continuing one state.
    """
    cfg = default_config()
    # the sum: a query of ones against [1, 2**-9, ..., 2**-9]
    g = torch.full((1, 256), 2.0**-9, dtype=torch.bfloat16)
    g[0, 0] = 1.0
    q = torch.ones(1, 256, dtype=torch.bfloat16)
    v = torch.full((1, cfg.keep), -math.inf, device=device)
    i = torch.full((1, cfg.keep), -1, dtype=torch.long, device=device)
    fused_topk(q.to(device), g.to(device), v, i, config=cfg)
    if abs(float(v.max()) - (1 + 255 * 2.0**-9)) > 2.0**-16:
        return f"its products are not summed in float32 (got {float(v.max())!r})"
    gen = torch.Generator().manual_seed(0)
    m, n, d = 70, 300, 96  # ragged against every block size
    xb = torch.randn(n, d, generator=gen).to(torch.bfloat16)
    xb[5] = xb[17]  # an exact duplicate
    q, g = xb[:m].to(device), xb.to(device)
    v = torch.full((m, cfg.keep), -math.inf, device=device)
    i = torch.full((m, cfg.keep), -1, dtype=torch.long, device=device)
    own = torch.arange(m, device=device)
    cut = 131  # two chunks with ascending offsets, as the sharded search feeds them
    fused_topk(q, g[:cut], v, i, own=own, offset=0, config=cfg)
    fused_topk(q, g[cut:], v, i, own=own - cut, offset=cut, config=cfg)
    exact = xb[:m].double() @ xb.double().T
    exact[torch.arange(m), torch.arange(m)] = -math.inf
    kk = cfg.keep
    ids = torch.arange(n).expand(m, n)
    order = exact.argsort(dim=1, descending=True, stable=True)[:, : kk + 1]
    ref_v, ref_i = exact.gather(1, order), ids.gather(1, order)
    got_v, got_i = v.cpu().double(), i.cpu()
    o = got_i.argsort(dim=1)  # (value descending, id ascending)
    got_v, got_i = got_v.gather(1, o), got_i.gather(1, o)
    o = got_v.argsort(dim=1, descending=True, stable=True)
    got_v, got_i = got_v.gather(1, o), got_i.gather(1, o)
    norms = xb.double().norm(dim=1)
    tol = 1.01 * (d + 2) * ACCUMULATOR_UNIT * norms[:m, None] * norms.max()
    if not bool(((got_v - ref_v[:, :kk]).abs() <= tol).all()):
        return "its float32 sums differ from the float64 reference beyond their bound"
    if bool((got_i == torch.arange(m)[:, None]).any()):
        return "a query kept itself"
    gaps = ref_v[:, :-1] - ref_v[:, 1:]  # [m, K]: gap to the next item
    before = torch.cat([torch.full((m, 1), math.inf, dtype=gaps.dtype), gaps[:, :-1]], 1)
    clear = torch.minimum(gaps, before) > 2 * tol
    if not bool((got_i[clear] == ref_i[:, :kk][clear]).all()):
        return "its kept ids differ from the float64 reference's top-K"
    return None


@functools.cache
def _available(device_type: str, index: int | None) -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "Triton is not installed"
    if device_type == "cpu" and not interpreting():
        return False, "Triton compiles for GPUs; on CPU only its interpreter (TRITON_INTERPRET=1)"
    if device_type not in ("cpu", "cuda"):
        return False, f"no Triton kernel on {device_type}"
    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    if device_type == "cuda" and not torch.cuda.is_bf16_supported():
        return False, "the GPU has no bfloat16 products"
    try:
        problem = _self_check(device)
    except Exception as exc:  # a compiler or driver failure: the unfused passes run instead
        return False, f"the kernel failed its self-check: {type(exc).__name__}: {exc}"
    if problem is not None:
        return False, f"the kernel failed its self-check: {problem}"
    where = "Triton's interpreter" if device_type == "cpu" else torch.cuda.get_device_name(device)
    return True, f"fused bfloat16 top-K kernel on {where}"


def fused_available(device: torch.device | str) -> tuple[bool, str]:
    """Whether the fused kernel runs correctly on ``device``: Triton present, a CUDA device
    with bfloat16 (or Triton's interpreter on CPU), and a self-check against a float64
    reference passed (run once per device and process).

    Parameters
    ----------
    device : torch.device or str
        Device of the embeddings.

    Returns
    -------
    available : bool
    reason : str
        What decided it.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return _available(dev.type, dev.index)


def fused_search(enabled: bool | None) -> contextlib.AbstractContextManager[None]:
    """Force the fused candidate pass on (``True``) or off (``False``) within the context, or
    leave the choice to the search (``None``: on CUDA where the kernel passed its self-check,
    embeddings at least 128 wide); for benchmarks and tests (the results are the same either
    way). Forced on, it still needs a working kernel: a GPU, or Triton's interpreter on CPU
    (``TRITON_INTERPRET=1``); :func:`~bayesurl.search.low_precision` ``(False)`` turns it off
    too (the float32 path)."""
    return forcing(_FORCE_FUSED, enabled)


def fused_applies(qn: Tensor, k: int) -> bool:
    """Whether the search of the normalised queries ``qn`` takes the fused candidate pass."""
    # the same answer on every rank: dtype, width and device type are, and so is the kernel's
    # self-check
    force = _FORCE_FUSED[0]
    if force is False or lowp_forced() is False:
        return False
    if qn.dtype not in (torch.float32, torch.float64) or qn.device.type not in ("cpu", "cuda"):
        return False
    if force is None and (qn.device.type != "cuda" or qn.shape[1] < LOWP_MIN_D):
        return False
    if k >= default_config().keep:  # the certificate needs a kept item past the k-th
        return False
    return fused_available(qn.device)[0]


def search_fused(job: SearchJob) -> tuple[Tensor, Tensor]:
    """The exact search with the fused candidate pass (:func:`fused_topk`).

    1. **Candidates.** One kernel keeps each query's top-K (``K`` the kernel's ``keep``) of
       the products ``p`` of the bfloat16 roundings of queries and gallery, summed in float32,
       over every gallery chunk in one running state. ``|p - exact| <= a`` per query
       (:func:`~bayesurl.search.bf16.lowp_bound` with the accumulator's unit roundoff
       :data:`ACCUMULATOR_UNIT`; no rounding of ``p`` itself).
    2. **Re-rank.** ``E``, the K-th kept ``p``, bounds every item that was not kept; a kept
       item whose ``p + a`` lies below ``p_k - a`` (``p_k`` the k-th kept) cannot reach the
       top-k, and the others get their float64 similarity
       (:func:`~bayesurl.search.core.pair_sims`, the float32 path's bits); the top-k is taken
       in (similarity descending, id ascending) order. For k = 1 without ``exact_values`` a
       lone candidate needs no float64 value.
    3. **Certificate.** Every item that was not kept has a float64 similarity of at most
       ``E + a + gamma_d`` (float64); the row is certified when its k-th similarity (or the
       lone candidate's lower bound) exceeds that strictly. The other rows take the unfused
       passes (collective under ``shards``).
    """
    m = job.qn.shape[0]
    best_v, best_i, w = _fused_candidates(job)
    out_v, out_i, certified = _fused_rerank(job, best_v, best_i, w)
    fail = (~certified).nonzero().squeeze(1)
    STATS["fused_queries"] += m
    STATS["fused_certified"] += m - fail.numel()
    rest = search_lowp if lowp_applies(job.qn, job.k) else search_exact
    return fall_back(job, (out_v, out_i), fail, rest)


def _fused_candidates(job: SearchJob) -> tuple[Tensor, Tensor, Tensor]:
    """Pass 1 of :func:`search_fused`: the kept ``[M, K]`` products and ids over every gallery
    chunk, and per query the bound ``w`` on ``|float64 similarity - p|``."""
    qn = job.qn
    m, d = qn.shape
    cfg = default_config()
    qb = qn.to(torch.bfloat16).contiguous()
    q_stats = residual_norms(qn, qb)
    best_v = torch.full((m, cfg.keep), -math.inf, dtype=torch.float32, device=qn.device)
    best_i = torch.full((m, cfg.keep), -1, dtype=torch.long, device=qn.device)
    g_max = [0.0, 0.0, 0.0]
    for off, gn in job.gallery():
        gb = bf16_rows(gn, qn, qb, q_stats, g_max, contiguous=True)
        own = None if job.self_index is None else job.self_index - off
        fused_topk(qb, gb, best_v, best_i, own=own, offset=off, config=cfg)
    a, _ = lowp_bound(q_stats, tuple(g_max), d, unit=ACCUMULATOR_UNIT)
    return best_v, best_i, a + float64_slack(d, q_stats, g_max)


def _fused_rerank(
    job: SearchJob, best_v: Tensor, best_i: Tensor, w: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Pass 2 and the certificate of :func:`search_fused`: the top-k of the kept items that
    can reach it by their float64 similarities (values and ids), and which rows are
    certified."""
    qn, k = job.qn, job.k
    m, d = qn.shape
    p = best_v.double()
    keep = torch.isfinite(best_v) & (best_i >= 0)
    upper = p.amin(dim=1) + w  # -inf where fewer than K items exist: every item is kept
    pk = p.topk(k, dim=1).values[:, -1]
    need = keep & (p + w[:, None] >= (pk - w)[:, None])
    lone = torch.zeros(m, dtype=torch.bool, device=qn.device)
    if k == 1 and not job.exact_values:
        lone = (need.sum(dim=1) == 1) & (pk - w > upper)
        need &= ~lone[:, None]
    val = torch.full(best_v.shape, -math.inf, dtype=torch.float64, device=qn.device)
    val[lone] = torch.where(keep[lone] & (p[lone] == pk[lone, None]), p[lone], -math.inf)
    step = max(512, job.memory_budget // (32 * d))  # [step, D] gathers and float64 operands
    for chunk in job.gallery():
        fill_chunk_pairs(val, qn, best_i, need, chunk, step)
    ids = torch.where(need | lone[:, None], best_i, torch.iinfo(torch.long).max)
    out_v, out_i = rank_candidates(ids, val, k)
    certified = lone | (torch.isfinite(out_v[:, -1]) & (out_v[:, -1] > upper))
    return out_v, out_i, certified
