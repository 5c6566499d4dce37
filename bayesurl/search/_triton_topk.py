"""The Triton kernel of :mod:`bayesurl.search.fused` (imported on first use: Triton is
optional). What it computes is documented there, at :func:`~bayesurl.search.fused.fused_topk`.

``Q`` ``[M, D]`` and ``G`` ``[N, D]`` have contiguous rows (stride ``D``); ``OWN`` ``[M]`` holds
each query's excluded column (a value outside ``[0, N)`` excludes nothing). The operands are
multiplied as loaded: bfloat16 on a GPU, float32 in the interpreter (whose ``tl.dot`` misreads
bfloat16; the caller widens them there, exactly).
"""

import triton
import triton.language as tl

__all__ = ["topk_kernel"]


@triton.jit
def topk_kernel(
    Q,
    G,
    OWN,
    BEST_V,
    BEST_I,
    M,
    N,
    D,
    offset,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    slots = tl.arange(0, K)
    state = rows64[:, None] * K + slots[None, :]
    best_v = tl.load(BEST_V + state, mask=row_ok[:, None], other=float("-inf"))
    best_i = tl.load(BEST_I + state, mask=row_ok[:, None], other=-1)
    best_i = tl.where(best_i < 0, -1 - slots[None, :], best_i)  # empty slots: distinct ids
    kth = tl.min(best_v, 1)
    own = tl.load(OWN + rows, mask=row_ok, other=-1)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            d_ok = dims < D
            q = tl.load(
                Q + rows64[:, None] * D + dims[None, :],
                mask=row_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            g = tl.load(
                G + cols.to(tl.int64)[None, :] * D + dims[:, None],
                mask=col_ok[None, :] & d_ok[:, None],
                other=0.0,
            )
            acc = tl.dot(q, g, acc)
        acc = tl.where(col_ok[None, :], acc, float("-inf"))
        acc = tl.where(cols[None, :] == own[:, None], float("-inf"), acc)
        # insert the tile's items that beat a row's K-th kept value, largest first (ties: the
        # lowest column); one pass per inserted item of the busiest row, none for most tiles
        m = tl.max(acc, 1)
        while tl.max((m > kth).to(tl.int32), 0) > 0:
            c = tl.min(tl.where(acc == m[:, None], cols[None, :], N + BLOCK_N), 1)
            take = m > kth  # strictly: an equal value seen earlier has the lower id
            # the slot to replace: the K-th value, the largest id among equal ones (ids are
            # distinct within a row, so one slot)
            at_kth = best_v == kth[:, None]
            last = tl.max(tl.where(at_kth, best_i, -(K + 2)), 1)
            put = at_kth & (best_i == last[:, None]) & take[:, None]
            best_v = tl.where(put, m[:, None], best_v)
            best_i = tl.where(put, (c.to(tl.int64) + offset)[:, None], best_i)
            kth = tl.min(best_v, 1)
            acc = tl.where(cols[None, :] == c[:, None], float("-inf"), acc)
            m = tl.max(acc, 1)
    tl.store(BEST_V + state, best_v, mask=row_ok[:, None])
    tl.store(BEST_I + state, best_i, mask=row_ok[:, None])
