"""Exact chunked kNN against a brute-force float64 reference."""

from __future__ import annotations

import math

import pytest
import torch
from _reference import brute_knn, tie_data
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesurl.search import knn, knn_query, normalize
from bayesurl.search.core import chunk_rows, stable_topk


@pytest.fixture
def data() -> torch.Tensor:
    return tie_data()


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_brute_force_with_ties(data: torch.Tensor, k: int, dtype: torch.dtype) -> None:
    ref = brute_knn(data, k)
    _, idx = knn(data.to(dtype), k, chunk_size=13)
    assert idx.tolist() == ref


@pytest.mark.parametrize("chunk", [1, 2, 7, 59, 1000])
def test_chunked_equals_unchunked(chunk: int) -> None:
    x = torch.randn(97, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    v0, i0 = knn(x, 5, chunk_size=10_000)
    v1, i1 = knn(x, 5, chunk_size=chunk)
    assert torch.equal(i0, i1)
    torch.testing.assert_close(v0, v1, rtol=0, atol=1e-12)  # BLAS paths differ by ulps


def test_memory_budget_sets_chunk() -> None:
    # two [B, n_gallery] buffers per chunk (similarities + mask/copy, the documented count):
    # 256 MiB / (2 * 4 bytes * 200k) = 167.8 -> the largest B that fits is 167
    budget, n = 256 * 2**20, 200_000
    for dtype in (torch.float16, torch.float32, torch.float64):
        item = torch.empty((), dtype=dtype).element_size()
        b = chunk_rows(n, dtype, budget)
        assert 2 * item * n * b <= budget < 2 * item * n * (b + 1), dtype
    assert chunk_rows(n, torch.float32, budget) == 167
    assert chunk_rows(n, torch.float32, 1) == 1  # never 0 rows
    x = torch.randn(50, 4)
    assert torch.equal(knn(x, 2, memory_budget=1)[1], knn(x, 2)[1])


def test_float64_stays_float64() -> None:
    x = torch.randn(20, 3, dtype=torch.float64)
    v, i = knn(x, 2)
    assert v.dtype == torch.float64 and i.dtype == torch.long and v.device == x.device


def test_duplicate_is_valid_neighbour() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert knn(x, 1)[1][:, 0].tolist() == [2, 0, 0]


def test_constant_embeddings_ties_to_lowest_index() -> None:
    x = torch.ones(6, 3)
    assert knn(x, 2)[1].tolist() == [[1, 2], [0, 2], [0, 1], [0, 1], [0, 1], [0, 1]]


def test_query_gallery_variant() -> None:
    g = torch.Generator().manual_seed(2)
    q, gal = torch.randn(9, 4, generator=g), torch.randn(30, 4, generator=g)
    _, idx = knn_query(q, gal, 3, chunk_size=2)
    qn = q / q.norm(dim=1, keepdim=True)
    gn = gal / gal.norm(dim=1, keepdim=True)
    ref = torch.argsort(-(qn.double() @ gn.double().T), dim=1, stable=True)[:, :3]
    assert torch.equal(idx, ref)


def test_faiss_backend_agrees() -> None:
    pytest.importorskip("faiss")
    x = torch.randn(200, 8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(knn(x, 3, backend="faiss")[1], knn(x, 3)[1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"embeddings": torch.randn(1, 3)}, "embeddings"),
        ({"embeddings": torch.randn(5)}, "embeddings"),
        ({"embeddings": torch.tensor([[0.0, float("nan")], [1.0, 1.0]])}, "embeddings"),
        ({"embeddings": torch.randn(5, 3), "k": 5}, "k"),
        ({"embeddings": torch.randn(5, 3), "backend": "annoy"}, "backend"),
    ],
)
def test_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        knn(**kwargs)


def test_query_dim_mismatch() -> None:
    with pytest.raises(ValueError, match="gallery"):
        knn_query(torch.randn(3, 4), torch.randn(5, 3))


@pytest.mark.parametrize(("rows", "cols"), [(3, 4), (5, 2), (64, 64)])
def test_tiled_top1_matches_brute_force_with_ties(rows: int, cols: int) -> None:
    # tiles smaller than the data: the diagonal crosses tile borders, ties span tiles
    from bayesurl.search.float32 import top1_tiled

    g = torch.Generator().manual_seed(3)
    x = torch.randn(13, 4, generator=g, dtype=torch.float64)
    x[7] = x[2]  # exact duplicates: ties to the lowest index
    x[11] = x[2]
    x[5] = 2.0 * x[9]  # same direction: cosine tie
    qn = normalize(x)
    v, i = top1_tiled(qn, qn.T, rows=rows, cols=cols, self_index=torch.arange(13))
    ref = brute_knn(x, 1)
    assert i[:, 0].tolist() == [r[0] for r in ref]
    sims = qn @ qn.T
    assert torch.allclose(v[:, 0], sims[torch.arange(13), i[:, 0]])
    assert torch.equal(knn(x, 1)[1], i)  # the public k = 1 path uses it on CPU
    _, j = top1_tiled(qn, qn.T, rows=rows, cols=cols)
    assert j[:, 0].tolist() == [r[0] for r in brute_knn(x, 1, exclude_self=False)]


@pytest.mark.parametrize(("rows", "cols"), [(3, 4), (5, 2), (64, 64)])
def test_tiled_top1_subset_queries_and_column_scale(rows: int, cols: int) -> None:
    # queries drawn from an unnormalised gallery: self excluded by `self_index`, cosines via
    # `col_scale` = inverse norms; brute-force loops over the gallery as the reference
    from bayesurl.search.float32 import top1_tiled

    g = torch.Generator().manual_seed(8)
    z = torch.randn(17, 5, generator=g, dtype=torch.float64) * torch.rand(17, 1, generator=g)
    z[12] = 3.0 * z[4]  # cosine tie with 4 for every query: the lower index wins
    q = torch.tensor([4, 0, 16, 9, 12, 5])
    v, i = top1_tiled(
        normalize(z[q]), z.T, rows=rows, cols=cols, self_index=q,
        col_scale=1.0 / z.norm(dim=1),
    )  # fmt: skip
    zn = normalize(z)
    for a, qi in enumerate(q.tolist()):
        best, arg = -math.inf, -1
        for c in range(17):
            sim = float(zn[qi] @ zn[c])
            if c != qi and sim > best + 1e-12:
                best, arg = sim, c
        assert int(i[a, 0]) == arg, (qi, int(i[a, 0]), arg)
        assert math.isclose(float(v[a, 0]), best, rel_tol=1e-9)


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("gallery_rows", [1, 4, 11, 59])
def test_search_over_gallery_chunks_matches_brute_force(data, k, gallery_rows) -> None:
    """The in-place per-row-block merge of the gallery chunks (the ring pass of the sharded
    search): cut anywhere, ties and duplicates across cuts go to the lowest id."""
    from bayesurl.search.exact import search

    x = normalize(data.double())
    n = x.shape[0]
    chunks = [(o, x[o : o + gallery_rows]) for o in range(0, n, gallery_rows)]
    for q0, q1 in ((0, n), (5, 17)):  # all queries, or a shard of them (global self ids)
        v, i = search(x[q0:q1], lambda: chunks, k, 2**12, 3, torch.arange(q0, q1))
        assert i.tolist() == brute_knn(data, k)[q0:q1], (q0, q1)
        ref = torch.gather(x[q0:q1] @ x.T, 1, i)
        torch.testing.assert_close(v, ref, rtol=0, atol=1e-12)


def test_rank_budget_splits_the_budget_over_the_ranks() -> None:
    from bayesurl.distributed import Shards
    from bayesurl.search import rank_budget

    assert rank_budget(256 * 2**20, Shards.local(10)) == 256 * 2**20
    assert rank_budget(256 * 2**20, Shards((5, 5))) == 128 * 2**20
    assert rank_budget(10, Shards((1, 0, 2))) == 3
    assert rank_budget(1, Shards((1, 1))) == 1  # never 0
    with pytest.raises(ValueError, match="memory_budget"):
        rank_budget(0, Shards((1, 1)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normalize_inplace_is_the_copying_form_bit_for_bit(dtype) -> None:
    """``normalize(x, inplace=True)`` overwrites ``x`` with exactly F.normalize's values."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(257, 19, generator=g, dtype=dtype) * torch.logspace(-20, 20, 257)[:, None]
    x[3] = 0.0  # zero rows stay zero
    want = torch.nn.functional.normalize(x, dim=-1, eps=torch.finfo(dtype).tiny ** 0.5)
    y = x.clone()
    out = normalize(y, inplace=True)
    assert out.data_ptr() == y.data_ptr()
    assert torch.equal(y, want) and torch.equal(normalize(x), want)
    assert bool((y[3] == 0).all())


def _float_ties(seed: int = 0) -> torch.Tensor:
    """float32 rows with exact duplicates (groups of 8 and 3), scaled copies (cosine ties)
    and near duplicates a few ulps apart: the block products' last bits decide their order
    unless the search recomputes them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 24, generator=g)
    x[[17, 40, 41, 99, 150, 151, 230, 299]] = x[5].clone()
    x[[64, 65, 201]] = x[200].clone()
    x[120] = 2.0 * x[121]
    x[180] = x[181] * (1 + 2e-7)
    return x


def _fsum_knn(x: torch.Tensor, k: int) -> list[list[int]]:
    """Brute force: the float32-normalised rows' cosines summed exactly (math.fsum) in float64,
    self excluded, ties to the lowest index."""
    xn = normalize(x).double().tolist()
    out = []
    for i, q in enumerate(xn):
        sims = [(-math.fsum(a * b for a, b in zip(q, g)), j) for j, g in enumerate(xn) if j != i]
        out.append([j for _, j in sorted(sims)[:k]])
    return out


@pytest.mark.parametrize("k", [1, 3, 10])
def test_search_is_layout_independent_on_float_data(k) -> None:
    """Ids and similarities are the same bits whatever the query blocks and gallery chunks
    (one process, or the chunks a ring pass brings), and the ids are the exactly-summed brute
    force's: exact duplicates tie and go to the lowest index. Fails on block products alone."""
    from bayesurl.search.exact import search

    x = _float_ties()
    ref = _fsum_knn(x, k)
    xn = normalize(x)
    n = x.shape[0]
    results = []
    for budget in (2**20, 2**14, 3000):
        results.append(knn(x, k, memory_budget=budget))
    for rows in (1, 7, 64):
        for g_rows in (5, 64, 300):
            chunks = [(o, xn[o : o + g_rows]) for o in range(0, n, g_rows)]
            results.append(search(xn, lambda c=chunks: c, k, 2**20, rows, torch.arange(n)))
    for v, i in results:
        assert i.tolist() == ref
        assert torch.equal(v, results[0][0]) and torch.equal(i, results[0][1])
    # the duplicates' similarity to each other is exactly 1 in float64 terms, the same bits
    assert float(results[0][0][5, 0]) == float(results[0][0][17, 0])


def test_top1_second_is_the_runner_up_value() -> None:
    """``second`` is the largest value of every item but the best (self excluded), to float32
    accuracy: duplicate groups have their runner-up within the error bound of the best (never
    certified), and every row the search certifies has a unique winner."""
    from bayesurl.search.core import gemm_slack
    from bayesurl.search.float32 import top1_tiled

    x = _float_ties(1)
    xn = normalize(x)
    second = torch.full((300,), -math.inf, dtype=xn.dtype)
    v, i = top1_tiled(xn, xn.T, rows=37, cols=16, self_index=torch.arange(300), second=second)
    for q in range(300):  # loops: the largest value among the other items
        vals = sorted((float(xn[q] @ xn[j]) for j in range(300) if j != q), reverse=True)
        assert math.isclose(float(v[q, 0]), vals[0], rel_tol=0, abs_tol=1e-5), q
        assert math.isclose(float(second[q]), vals[1], rel_tol=0, abs_tol=1e-5), q
    slack = gemm_slack(24, torch.float32, torch.device("cpu"))
    certified = v[:, 0] - second > 2 * slack
    assert not certified[[5, 17, 64, 200]].any()  # groups of duplicates: tied winners
    assert certified[[120, 121]].all()  # a pair of scaled copies: one clear winner each
    assert int(certified.sum()) > 250


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(2, 40),
    k=st.integers(2, 45),
    levels=st.integers(1, 200),
    excluded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_stable_topk_equals_a_full_stable_sort(rows, cols, k, levels, excluded, seed) -> None:
    """``stable_topk`` against the definition (a stable sort by value descending, so equal
    values keep ascending index): few ``levels`` give runs of equal values inside and at the
    k-th place (the re-sort), many give rows with ties of two only (the swap) or none, mixed in
    one batch; ``-inf`` (excluded items) too. NaN never reaches it: the embeddings are checked
    finite."""
    g = torch.Generator().manual_seed(seed)
    sims = torch.randint(0, levels, (rows, cols), generator=g).double() / levels
    sims[0] += torch.rand(cols, generator=g, dtype=torch.float64) * 1e-3  # a row without ties
    if excluded:
        sims[torch.rand(rows, cols, generator=g) < 0.2] = -torch.inf
    kk = min(k, cols)
    order = torch.sort(sims, dim=1, descending=True, stable=True).indices[:, :kk]
    vals, idx = stable_topk(sims, k)
    assert idx.tolist() == order.tolist()
    assert torch.equal(vals, sims.gather(1, order)) and vals.is_contiguous()


def test_stable_topk_puts_a_tie_of_two_in_index_order() -> None:
    """A row whose only ties are pairs (the case among thousands of float32 similarities),
    each pair placed by ``torch.topk`` in either order: the lower index comes first."""
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        v = torch.randperm(300, generator=g).double()
        v[torch.randperm(300, generator=g)[:40]] += 0.5  # 0.5 apart: no value collides yet
        v[1::7] = v[0::7][: v[1::7].numel()]  # pairs of equal values, never three
        sims = v[torch.randperm(300, generator=g)][None].repeat(3, 1)
        order = torch.sort(sims, dim=1, descending=True, stable=True).indices[:, :120]
        assert stable_topk(sims, 120)[1].tolist() == order.tolist()
