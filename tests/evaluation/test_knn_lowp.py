"""The bfloat16 candidate pass of the exact kNN: certified results equal the float32 path and
a brute-force float64 search bit for bit, ties included, and the fallback triggers where the
certificate fails."""

from __future__ import annotations

import math

import pytest
import torch
from _reference import brute_knn, tie_data
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesurl.search import bf16 as B
from bayesurl.search import (
    knn,
    knn_query,
    low_precision,
    normalize,
    search_precision,
    search_stats,
)
from bayesurl.search.core import SearchJob
from bayesurl.search.exact import neighbor_ids

# the forced candidate pass needs bfloat16 products summed in float32 (any speed)
pytestmark = pytest.mark.skipif(
    not B._sums_in_fp32("cpu"), reason="bfloat16 products here do not sum in float32"
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _pairwise64(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """float64 similarities of the search's normalised rows, one product and one fixed-order
    sum per pair (exact duplicates tie exactly)."""
    qn, gn = normalize(q).double(), normalize(g).double()
    return torch.stack([(row[None, :] * gn).sum(dim=1) for row in qn])


def _brute(q: torch.Tensor, g: torch.Tensor, k: int, exclude_self: bool) -> torch.Tensor:
    """Top-k by (float64 similarity descending, index ascending), a Python sort per row."""
    sims = _pairwise64(q, g).tolist()
    out = []
    for i, row in enumerate(sims):
        order = sorted((-s, j) for j, s in enumerate(row) if not (exclude_self and j == i))
        out.append([j for _, j in order[:k]])
    return torch.tensor(out)


def _both(x: torch.Tensor, k: int, **kw: object) -> tuple[tuple, tuple, dict[str, int]]:
    with low_precision(False):
        ref = knn(x, k, **kw)
    search_stats(reset=True)
    with low_precision(True):
        got = knn(x, k, **kw)
    return ref, got, search_stats(reset=True)


def _assert_same(ref: tuple, got: tuple) -> None:
    assert torch.equal(got[1], ref[1])
    assert got[0].dtype == ref[0].dtype
    assert torch.equal(got[0], ref[0])  # values bit for bit (float64 re-rank of both)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_random_rows_equal_fp32_path_and_brute_force(k: int, dtype: torch.dtype) -> None:
    x = torch.randn(700, 48, generator=_gen(0), dtype=dtype)
    ref, got, stats = _both(x, k)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, k, True))
    assert stats["lowp_queries"] == 700 and stats["certified"] + stats["fallback"] == 700
    assert stats["certified"] > 600  # the candidate pass does the work


@pytest.mark.parametrize("k", [1, 3, 7])
def test_exact_ties_lowest_index(k: int) -> None:
    x = tie_data(80)  # every cosine exact: real ties everywhere
    ref, got, _ = _both(x.float(), k)
    _assert_same(ref, got)
    assert got[1].tolist() == brute_knn(x, k)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_duplicates_and_near_ties_inside_bf16_error(k: int) -> None:
    g = _gen(1)
    base = torch.randn(150, 32, generator=g)
    # near copies: 1e-4 relative perturbations vanish in bfloat16 (8 bits) but not in
    # float32, so the candidate pass sees ties the re-rank must order
    near = base[:60] * (1 + 1e-4 * torch.randn(60, 32, generator=g))
    x = torch.cat([base, base[:40], near])[torch.randperm(250, generator=g)]
    xb = normalize(x).bfloat16()
    assert bool((xb[None, :60] == xb[:60, None]).all(-1).sum() > 60)  # bf16 collisions exist
    ref, got, _ = _both(x, k)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, k, True))


def test_d2048_float64() -> None:
    x = torch.randn(160, 2048, generator=_gen(2), dtype=torch.float64)
    x[80:100] = x[:20]  # duplicates
    ref, got, _ = _both(x, 3)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, 3, True))


@pytest.mark.parametrize("n", [2, 3, 5])
def test_tiny_n_and_largest_k(n: int) -> None:
    x = torch.randn(n, 6, generator=_gen(n))
    ref, got, _ = _both(x, n - 1)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, n - 1, True))
    with low_precision(True), pytest.raises(ValueError, match="`k`"):
        knn(x, n)  # k > N - 1 with self excluded


def test_query_gallery_without_self() -> None:
    g = _gen(3)
    gal = torch.randn(900, 40, generator=g)
    q = torch.cat([torch.randn(50, 40, generator=g), gal[:30]])  # 30 exact matches
    with low_precision(False):
        ref = knn_query(q, gal, 5)
    with low_precision(True):
        got = knn_query(q, gal, 5)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(q, gal, 5, False))
    with low_precision(True), pytest.raises(ValueError, match="`k`"):
        knn_query(q, gal[:4], 5)  # k > N


def test_matches_faiss() -> None:
    faiss = pytest.importorskip("faiss")
    x = torch.randn(1200, 64, generator=_gen(4))
    with low_precision(True):
        _, got = knn(x, 1)
    xn = normalize(x).numpy()
    index = faiss.IndexFlatIP(64)
    index.add(xn)
    _, i = index.search(xn, 2)
    assert torch.equal(got[:, 0], torch.from_numpy(i[:, 1]).long())  # no ties in random data


def test_fallback_triggers_and_is_counted() -> None:
    # 40 exact copies of each row: 39 tied neighbours exceed the candidate list (k + 31), so
    # the certificate cannot exclude an item pushed out, and every row falls back
    x = torch.randn(25, 8, generator=_gen(5)).repeat(40, 1)
    ref, got, stats = _both(x, 1)
    _assert_same(ref, got)
    assert stats["fallback"] == 1000 and stats["certified"] == 0
    assert torch.equal(got[1], _brute(x, x, 1, True))


@pytest.mark.parametrize("k", [1, 3])
def test_forced_fallback_with_small_capacity(k: int) -> None:
    x = torch.randn(400, 16, generator=_gen(6))
    x[200:260] = x[:60]  # duplicates crowd a short list
    qn = normalize(x)
    own = torch.arange(400)
    search_stats(reset=True)
    got = B.search_lowp(SearchJob(qn, lambda: [(0, qn)], k, 2**28, None, own), capacity=k)
    stats = search_stats(reset=True)
    with low_precision(False):
        ref = knn(x, k)
    _assert_same(ref, got)
    assert stats["fallback"] > 0 and stats["certified"] > 0


def test_bound_holds() -> None:
    """|bfloat16 product - exact| <= a + u |p| for every pair (the certificate's premise)."""
    g = _gen(7)
    for d in (3, 64, 2048):
        q = normalize(torch.randn(64, d, generator=g))
        x = normalize(torch.randn(300, d, generator=g))
        x[:10] *= 0  # zero rows stay zero
        qb, xb = q.bfloat16(), x.bfloat16()
        qs, xs = B.residual_norms(q, qb), B.residual_norms(x, xb)
        a, _ = B.lowp_bound(qs, tuple(float(v.max()) for v in xs), d)
        p = torch.mm(qb, xb.T).double()
        exact = q.double() @ x.double().T
        err = (p - exact).abs()
        assert bool((err <= a[:, None] + B._BF16_U * p.abs()).all())
        assert float((err / (a[:, None] + B._BF16_U * p.abs())).max()) > 0.05  # not vacuous


def test_threads_same_result_and_caller_setting_kept() -> None:
    x = torch.randn(5000, 24, generator=_gen(8))  # several row tasks
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with low_precision(True):
            two = knn(x, 2)
        with low_precision(False):
            ref2 = knn(x, 1)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        with low_precision(True):
            one = knn(x, 2)
        with low_precision(False):
            ref1 = knn(x, 1)
    finally:
        torch.set_num_threads(old)
    _assert_same(one, two)
    _assert_same(ref1, ref2)
    assert torch.equal(two[1][:, :1], ref1[1])


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(3, 60),
    d=st.integers(1, 9),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_small_integer_rows_property(n: int, d: int, k: int, seed: int) -> None:
    """Rows of small integers: many exact ties and collinear items."""
    x = torch.randint(-2, 3, (n, d), generator=_gen(seed)).float()
    x[x.abs().sum(1) == 0, 0] = 1.0  # no zero rows (their cosine ties everything at 0)
    k = min(k, n - 1)
    ref, got, _ = _both(x, k)
    _assert_same(ref, got)
    assert torch.equal(got[1], _brute(x, x, k, True))


def test_precision_report_and_switch() -> None:
    precision, reason = search_precision("cpu")
    assert precision in ("bfloat16", "float32") and reason
    with low_precision(False):
        assert search_precision("cpu") == ("float32", "forced")
    with pytest.raises(ValueError, match="enabled"):
        with low_precision("yes"):  # type: ignore[arg-type]
            pass
    assert not math.isnan(float(search_stats()["fallback"]))


def test_ids_only_search_equal() -> None:
    """The evaluator's ids-only search (no float64 for a lone certified candidate)."""
    g = _gen(9)
    x = torch.randn(3000, 96, generator=g)
    x[2000:2100] = x[:100]  # duplicates: two candidates, re-ranked in float64
    with low_precision(False):
        ref = neighbor_ids(x, 1)
    with low_precision(True):
        got = neighbor_ids(x, 1)
    assert torch.equal(got, ref)
    assert torch.equal(got, _brute(x, x, 1, True))
