"""A fused product-and-select for the exact kNN search: one Triton kernel keeps each query's
running top-K of its bfloat16 products over the gallery, block by block, so the ``[B, N]``
similarity block is never written to memory.

The exact search behind :func:`~bayesurl.evaluation.knn` and
:func:`~bayesurl.evaluation.evaluate` uses it on a GPU as its candidate pass: the K kept
items are re-ranked in float64 and a certificate (the K-th kept product plus the products'
error bound lies strictly below the k-th re-ranked similarity) proves that no other item can
reach the top-k; rows it cannot certify go to the unfused passes (docs/concepts/metrics.rst,
"The exact search on a GPU").

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
operands are widened to float32 first: the product of two bfloat16 numbers is exact in
float32 either way.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "ACCUMULATOR_UNIT",
    "GPU_CONFIG",
    "INTERPRETER_CONFIG",
    "FusedConfig",
    "default_config",
    "fused_available",
    "fused_topk",
    "interpreting",
]

#: Tensor-core accumulation may truncate instead of rounding to nearest (measured on several
#: NVIDIA generations); the bound of the fused products takes twice float32's unit roundoff
#: of truncation, four times that of rounding, as the accumulator's unit roundoff.
ACCUMULATOR_UNIT = 2.0**-22


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
    from bayesurl.evaluation._triton_topk import topk_kernel

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
    own_t = best_i if own is None else own.to(torch.long).contiguous()  # any pointer if unused
    grid = (triton.cdiv(m, cfg.block_m),)
    launch = {} if interpreting() else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    _compiled()[grid](
        qb, gb, own_t, best_v, best_i, m, n, d, int(offset), qb.stride(0), gb.stride(0),
        K=cfg.keep, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
        HAS_OWN=own is not None, UPCAST=interpreting(), **launch,
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
