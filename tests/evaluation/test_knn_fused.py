"""The fused product-and-select of the exact kNN (Triton kernel, run here by Triton's CPU
interpreter): the kernel's kept top-K against a float64 reference, ties to the lowest index
and self excluded by index; and the search through it, certified or fallen back, equal to the
float32 path and to a brute-force float64 search bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
from _reference import brute_knn, tie_data
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesurl.evaluation import evaluate
from bayesurl.search import bf16 as B
from bayesurl.search import fused as F
from bayesurl.search import (
    fused_search,
    knn,
    knn_query,
    low_precision,
    normalize,
    search_stats,
)
from bayesurl.search.exact import neighbor_ids, search

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    not F.interpreting(), reason="Triton's interpreter is off (TRITON_INTERPRET=1 not set)"
)

CFG = F.default_config()
K = CFG.keep


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _state(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((m, K), -math.inf), torch.full((m, K), -1, dtype=torch.long)


def _ref_topk(q: torch.Tensor, g: torch.Tensor, own: torch.Tensor | None, keep: int):
    """float64 products of the bfloat16 rows, the top-``keep`` by (value descending, index
    ascending) per row, a Python sort."""
    sims = (q.double() @ g.double().T).tolist()
    out_v, out_i = [], []
    for r, row in enumerate(sims):
        order = sorted((-v, j) for j, v in enumerate(row) if own is None or j != int(own[r]))[:keep]
        out_v.append([-v for v, _ in order])
        out_i.append([j for _, j in order])
    return out_v, out_i


def _sorted_state(v: torch.Tensor, i: torch.Tensor) -> tuple[list, list]:
    """The kernel's slots (unordered) in (value descending, id ascending) order."""
    rows_v, rows_i = [], []
    for vr, ir in zip(v.tolist(), i.tolist()):
        pairs = sorted((-a, b) for a, b in zip(vr, ir) if b >= 0)
        rows_v.append([-a for a, _ in pairs])
        rows_i.append([b for _, b in pairs])
    return rows_v, rows_i


@pytest.mark.parametrize("chunks", [1, 3])
def test_kernel_exact_ties_lowest_index(chunks: int) -> None:
    """Small-integer rows: every float32 sum is exact, so ties are real ties; the kept set is
    exactly the reference top-K (ties to the lowest index), self excluded by index, also when
    the gallery comes in chunks with ascending offsets."""
    g = _gen(0)
    m, n, d = 90, 300, 40
    x = torch.randint(-2, 3, (n, d), generator=g).to(torch.bfloat16)
    x[100:140] = x[:40]  # exact duplicates of some queries (a valid neighbour at another id)
    q = x[:m]
    own = torch.arange(m)
    v, i = _state(m)
    cuts = [0, *sorted(torch.randperm(n - 1, generator=g)[: chunks - 1].add(1).tolist()), n]
    for a, b in zip(cuts[:-1], cuts[1:]):
        F.fused_topk(q, x[a:b], v, i, own=own - a, offset=a)
    ref_v, ref_i = _ref_topk(q, x, own, K)
    got_v, got_i = _sorted_state(v, i)
    assert got_i == ref_i
    assert got_v == ref_v  # exact: integer sums


def test_kernel_values_within_bound_random() -> None:
    """Random rows: kept values within the accumulator's bound of the exact products of the
    bfloat16 inputs, kept ids the reference's where the values are apart."""
    g = _gen(1)
    m, n, d = 64, 520, 200  # ragged against the block sizes
    x = torch.randn(n, d, generator=g).to(torch.bfloat16)
    v, i = _state(m)
    F.fused_topk(x[:m], x, v, i, own=torch.arange(m))
    ref_v, ref_i = _ref_topk(x[:m], x, torch.arange(m), K + 1)
    got_v, got_i = _sorted_state(v, i)
    norms = x.double().norm(dim=1)
    for r in range(m):
        tol = 1.01 * (d + 2) * F.ACCUMULATOR_UNIT * float(norms[r] * norms.max())
        assert max(abs(a - b) for a, b in zip(got_v[r], ref_v[r][:K])) <= tol
        gaps = [ref_v[r][j] - ref_v[r][j + 1] for j in range(K)]
        if min(gaps) > 2 * tol:
            assert got_i[r] == ref_i[r][:K]


def test_kernel_query_gallery_and_fewer_items_than_slots() -> None:
    g = _gen(2)
    q = torch.randn(20, 32, generator=g).to(torch.bfloat16)
    gal = torch.randn(5, 32, generator=g).to(torch.bfloat16)  # N = 5 < K slots
    v, i = _state(20)
    F.fused_topk(q, gal, v, i)  # no own index: nothing excluded
    ref_v, ref_i = _ref_topk(q, gal, None, K)
    got_v, got_i = _sorted_state(v, i)
    assert got_i == ref_i
    assert bool((i[:, :] >= 0).sum(dim=1).eq(5).all())
    assert bool(torch.isinf(v).sum(dim=1).eq(K - 5).all())  # the empty slots stay empty


def test_kernel_bad_input() -> None:
    x = torch.randn(8, 16).to(torch.bfloat16)
    v, i = _state(8)
    with pytest.raises(ValueError, match="bfloat16"):
        F.fused_topk(x.float(), x, v, i)
    with pytest.raises(ValueError, match="state"):
        F.fused_topk(x, x, v[:, :2].contiguous(), i[:, :2].contiguous())
    with pytest.raises(ValueError, match="power of two"):
        F.FusedConfig(keep=6)


def test_self_check_passes_in_the_interpreter() -> None:
    ok, reason = F.fused_available("cpu")
    assert ok, reason
    assert F._self_check(torch.device("cpu")) is None


# ---------------------------------------------------------------------------- the search


def _both(x: torch.Tensor, k: int, **kw: object) -> tuple[tuple, tuple, dict[str, int]]:
    with low_precision(False):
        ref = knn(x, k, **kw)
    search_stats(reset=True)
    with fused_search(True):
        got = knn(x, k, **kw)
    return ref, got, search_stats(reset=True)


def _brute(q: torch.Tensor, g: torch.Tensor, k: int, exclude_self: bool) -> torch.Tensor:
    """Top-k by (float64 similarity of the normalised rows descending, index ascending)."""
    qn, gn = normalize(q).double(), normalize(g).double()
    sims = torch.stack([(row[None, :] * gn).sum(dim=1) for row in qn]).tolist()
    out = []
    for i, row in enumerate(sims):
        order = sorted((-s, j) for j, s in enumerate(row) if not (exclude_self and j == i))
        out.append([j for _, j in order[:k]])
    return torch.tensor(out)


def _assert_same(ref: tuple, got: tuple) -> None:
    assert torch.equal(got[1], ref[1])
    assert got[0].dtype == ref[0].dtype
    assert torch.equal(got[0], ref[0])  # values bit for bit (float64 re-rank of both)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_search_random_rows_equal_fp32_path_and_brute_force(k: int, dtype: torch.dtype) -> None:
    x = torch.randn(400, 48, generator=_gen(3), dtype=dtype)
    ref, got, stats = _both(x, k)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, k, True))
    assert stats["fused_queries"] == 400
    assert stats["fused_certified"] > 350  # the fused pass does the work


@pytest.mark.parametrize("k", [1, 3])
def test_search_exact_ties_lowest_index(k: int) -> None:
    x = tie_data(120)  # every cosine exact: real ties everywhere
    ref, got, stats = _both(x.float(), k)
    _assert_same(ref, got)
    assert got[1].tolist() == brute_knn(x, k)
    assert stats["fused_certified"] < stats["fused_queries"]  # ties: certificate refused


@pytest.mark.parametrize("k", [1, 2])
def test_search_duplicates_and_near_ties_inside_bf16_error(k: int) -> None:
    g = _gen(4)
    base = torch.randn(150, 32, generator=g)
    # 1e-4 relative perturbations vanish in bfloat16 but not in float32: the kernel sees ties
    # the float64 re-rank must order
    near = base[:60] * (1 + 1e-4 * torch.randn(60, 32, generator=g))
    x = torch.cat([base, base[:40], near])[torch.randperm(250, generator=g)]
    ref, got, _ = _both(x, k)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, k, True))


def test_search_fallback_when_ties_fill_the_slots() -> None:
    # 12 exact copies of every row: the K kept items all tie, the certificate cannot exclude
    # the copies pushed out, and every row goes to the unfused passes
    x = torch.randn(20, 24, generator=_gen(5)).repeat(12, 1)
    ref, got, stats = _both(x, 1)
    _assert_same(ref, got)
    assert stats["fused_queries"] == 240 and stats["fused_certified"] == 0
    assert torch.equal(got[1], _brute(x, x, 1, True))


def test_search_zero_rows_and_ids_only() -> None:
    g = _gen(6)
    x = torch.randn(300, 130, generator=g)
    x[50:55] = 0  # zero rows: every cosine 0, ties to the lowest index
    x[200:230] = x[:30]
    with low_precision(False):
        ref = neighbor_ids(x, 1)
    search_stats(reset=True)
    with fused_search(True):
        got = neighbor_ids(x, 1)
    assert torch.equal(got, ref)
    assert torch.equal(got, _brute(x, x, 1, True))
    assert search_stats()["fused_queries"] == 300


def test_search_query_gallery_without_self() -> None:
    g = _gen(7)
    gal = torch.randn(500, 40, generator=g)
    q = torch.cat([torch.randn(30, 40, generator=g), gal[:20]])  # 20 exact matches
    with low_precision(False):
        ref = knn_query(q, gal, 2)
    with fused_search(True):
        got = knn_query(q, gal, 2)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(q, gal, 2, False))


def test_search_sharded_chunks_equal_one_chunk() -> None:
    """The gallery in chunks (as a sharded search feeds them): one running state, the same
    neighbours as one chunk and as the float32 path."""
    g = _gen(8)
    x = torch.randn(350, 64, generator=g)
    x[300:320] = x[10:30]
    qn = normalize(x)
    own = torch.arange(350)
    chunks = [(0, qn[:100]), (100, qn[100:101]), (101, qn[101:350])]
    with fused_search(True):
        one = search(qn, lambda: [(0, qn)], 2, 2**28, None, own)
        many = search(qn, lambda: chunks, 2, 2**28, None, own)
    with low_precision(False):
        ref = search(qn, lambda: [(0, qn)], 2, 2**28, None, own)
    _assert_same(ref, one)
    _assert_same(ref, many)


def test_bound_holds_for_the_kernels_sums() -> None:
    """|fused product - exact| <= a (the certificate's premise), and not vacuously."""
    g = _gen(9)
    for d in (3, 64, 300):
        q = normalize(torch.randn(40, d, generator=g))
        x = normalize(torch.randn(200, d, generator=g))
        x[:5] *= 0
        qb, xb = q.bfloat16(), x.bfloat16()
        qs, xs = B.residual_norms(q, qb), B.residual_norms(x, xb)
        a, _ = B.lowp_bound(qs, tuple(float(v.max()) for v in xs), d, F.ACCUMULATOR_UNIT)
        v, i = _state(40)
        F.fused_topk(qb, xb, v, i)
        exact = q.double() @ x.double().T
        kept = exact.gather(1, i)
        err = (v.double() - kept).abs()
        assert bool((err <= a[:, None]).all())
        assert float((err / a[:, None]).max()) > 0.05


def test_evaluate_equal_with_and_without_fused() -> None:
    g = _gen(10)
    x = torch.randn(40, 96, generator=g)[torch.randint(0, 40, (400,), generator=g)]
    x = x + 0.5 * torch.randn(400, 96, generator=g)
    y = torch.randint(0, 5, (400,), generator=g)
    u = torch.rand(400, generator=g)
    with low_precision(False):
        ref = evaluate(x, y, uncertainties=u, include=["r@1", "r_auroc"])
    with fused_search(True):
        got = evaluate(x, y, uncertainties=u, include=["r@1", "r_auroc"])
    assert got["r@1"] == ref["r@1"] and got["r_auroc"] == ref["r_auroc"]


def test_switch_and_automatic_choice() -> None:
    x = normalize(torch.randn(10, 256))
    assert not F.fused_applies(x, 1)  # automatic: CUDA only
    with fused_search(True):
        assert F.fused_applies(x, 1)
        assert not F.fused_applies(x, K)  # the certificate needs a kept item past k
        with low_precision(False):  # the float32 path, fused off
            assert not F.fused_applies(x, 1)
    with pytest.raises(ValueError, match="enabled"):
        with fused_search("yes"):  # type: ignore[arg-type]
            pass


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(3, 50),
    d=st.integers(1, 9),
    k=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_small_integer_rows_property(n: int, d: int, k: int, seed: int) -> None:
    """Rows of small integers: many exact ties and collinear items."""
    x = torch.randint(-2, 3, (n, d), generator=_gen(seed)).float()
    x[x.abs().sum(1) == 0, 0] = 1.0
    k = min(k, n - 1)
    ref, got, _ = _both(x, k)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, k, True))


def test_search_more_near_copies_than_slots() -> None:
    """K + 4 near copies of each row, equal in bfloat16 but not in float32: the kernel keeps
    the K lowest ids of the tie, the float64 nearest may be one it dropped, and only the
    certificate (refusing such rows) keeps the result exact."""
    g = _gen(11)
    base = torch.randn(12, 64, generator=g)
    copies = base.repeat_interleave(K + 4, 0)
    x = copies * (1 + 3e-5 * torch.randn(copies.shape, generator=g))
    x = x[torch.randperm(x.shape[0], generator=g)]
    assert bool((normalize(x).bfloat16()[None] == normalize(x).bfloat16()[:, None]).all(-1).sum()
                > 2 * x.shape[0])  # fmt: skip
    ref, got, stats = _both(x, 1)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, 1, True))
    assert stats["fused_certified"] < stats["fused_queries"]
