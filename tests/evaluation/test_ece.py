"""Sampled retrieval ECE: brute-force loops, shortlist vs exact per-draw search."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from _reference import brute_knn

from bayesurl.evaluation import functional as Fm
from bayesurl.search import knn
from bayesurl.search import sampled as Sm


def draws(n: int = 60, s: int = 12, d: int = 5, noise: float = 0.4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    centers = torch.randn(4, d, generator=g, dtype=torch.float64)
    mu = centers[y] + 0.8 * torch.randn(n, d, generator=g, dtype=torch.float64)
    samples = mu + noise * torch.randn(s, n, d, generator=g, dtype=torch.float64)
    return samples, y


def brute_ece(samples: torch.Tensor, y: torch.Tensor, n_bins: int = 10):
    s, n, _ = samples.shape
    per_draw = [[nn[0] for nn in brute_knn(samples[t], 1)] for t in range(s)]
    conf, corr = [], []
    for i in range(n):
        votes = Counter(int(y[per_draw[t][i]]) for t in range(s))
        top = max(votes.values())
        mode = min(lab for lab, c in votes.items() if c == top)  # ties: smallest label
        conf.append(top / s)
        corr.append(mode == int(y[i]))
    edges = np.linspace(0, 1, n_bins + 1)
    ece = 0.0
    for b in range(n_bins):
        lo, hi = edges[b], edges[b + 1]
        idx = [i for i in range(n) if (conf[i] > lo or b == 0) and conf[i] <= hi]
        if idx:
            acc = sum(corr[i] for i in idx) / len(idx)
            cf = sum(conf[i] for i in idx) / len(idx)
            ece += len(idx) / n * abs(acc - cf)
    return ece, per_draw, conf, corr


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_mode_matches_brute_force(seed: int) -> None:
    samples, y = draws(seed=seed)
    ref, per_draw, conf, corr = brute_ece(samples, y)
    nb = Fm.sampled_neighbors(samples, mode="exact")
    assert nb.tolist() == per_draw
    res = Fm.retrieval_ece(samples, y, mode="exact")
    assert float(res.ece) == pytest.approx(ref, abs=1e-12)
    np.testing.assert_allclose(res.confidence.numpy(), conf)
    assert res.correct.tolist() == corr
    assert int(res.bin_count.sum()) == len(y)


@pytest.mark.parametrize("noise", [0.05, 0.4])
def test_shortlist_equals_exact_on_small_data(noise: float) -> None:
    samples, y = draws(noise=noise, seed=3)
    exact = Fm.sampled_neighbors(samples, mode="exact")
    short = Fm.sampled_neighbors(samples, mode="shortlist", shortlist=59)  # L = N - 1
    assert torch.equal(exact, short)
    short8 = Fm.sampled_neighbors(samples, mode="shortlist", shortlist=8, memory_budget=4096)
    agree = (short8 == exact).double().mean()
    assert agree >= (0.99 if noise < 0.1 else 0.8)
    e1 = Fm.retrieval_ece(samples, y, mode="exact")
    e2 = Fm.retrieval_ece(samples, y, shortlist=59)
    assert float(e1.ece) == float(e2.ece)


def test_shortlist_ties_to_lowest_index() -> None:
    # All points identical in every draw: every neighbour ties, lowest index wins.
    samples = torch.ones(3, 5, 2)
    for mode in ("shortlist", "block"):
        nb = Fm.sampled_neighbors(samples, mode=mode, shortlist=3)
        assert nb.tolist() == [[1, 0, 0, 0, 0]] * 3


def test_modal_labels_tie_to_smallest() -> None:
    lab = torch.tensor([[3, 1, 2], [1, 1, 2], [3, 2, 5], [1, 2, 5]])
    mode, count = Fm.modal_labels(lab)
    assert mode.tolist() == [1, 1, 2] and count.tolist() == [2, 2, 2]


def test_bins_right_closed() -> None:
    conf = torch.tensor([0.1, 0.3, 1.0, 0.0], dtype=torch.float64)
    res = Fm.calibration_bins(conf, torch.tensor([True, False, True, True]))
    assert res.bin_count.tolist() == [2, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    assert float(res.ece) == pytest.approx((abs(1 - 0.05) * 2 + 0.3 + 0.0) / 4)
    assert math.isnan(float(res.bin_accuracy[1]))


def test_float32_samples_keep_device_and_dtype() -> None:
    samples, y = draws()
    res = Fm.retrieval_ece(samples.float(), y)
    assert res.ece.dtype == torch.float64 and 0.0 <= float(res.ece) <= 1.0


@pytest.mark.parametrize(
    ("samples", "labels", "kw", "match"),
    [
        (torch.randn(3, 4), torch.arange(4), {}, "samples"),
        (torch.full((2, 4, 3), float("nan")), torch.arange(4), {}, "samples"),
        (torch.randn(2, 4, 3), torch.arange(5), {}, "labels"),
        (torch.randn(2, 1, 3), torch.arange(1), {}, "2 points"),
        (torch.randn(2, 4, 3), torch.arange(4), {"mode": "approx"}, "mode"),
        (torch.randn(2, 4, 3), torch.arange(4), {"shortlist": 0}, "shortlist"),
        (torch.randn(2, 4, 3), torch.arange(4), {"n_bins": 0}, "n_bins"),
    ],
)
def test_bad_input(samples, labels, kw, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Fm.retrieval_ece(samples, labels, **kw)


def test_search_settings_are_drawsearch_fields() -> None:
    """retrieval_ece forwards the per-draw search's settings (DrawSearch's fields) to the same
    search sampled_neighbors runs; an unknown setting is refused by its name."""
    samples, y = draws(n=40, s=5, d=4)
    res = Fm.retrieval_ece(samples, y, mode="block", shortlist=5, block=4, cluster_iters=2)
    nb = Fm.sampled_neighbors(samples, mode="block", shortlist=5, block=4, cluster_iters=2)
    assert torch.equal(res.neighbors, nb)
    with pytest.raises(TypeError, match="shortlst"):
        Fm.retrieval_ece(samples, y, shortlst=5)


def test_adaptive_shortlist_agrees_with_exact() -> None:
    samples, y = draws(n=200, s=10, d=8, noise=0.3, seed=5)
    info: dict[str, float] = {}
    nb = Fm.sampled_neighbors(samples, info=info, tolerance=1e-3)
    exact = Fm.sampled_neighbors(samples, mode="exact")
    assert 1 <= info["shortlist"] <= 199 and 0.0 <= info["miss_rate"] <= 1e-3
    assert float((nb == exact).double().mean()) >= 0.99
    res = Fm.retrieval_ece(samples, y)
    assert res.neighbors is not None and res.neighbors.shape == (10, 200)


def test_choose_shortlist_grows_with_noise() -> None:
    small, _ = draws(n=200, s=8, d=8, noise=0.05, seed=6)
    large, _ = draws(n=200, s=8, d=8, noise=1.5, seed=6)
    l_small, _ = Fm.choose_shortlist(small)
    l_large, info = Fm.choose_shortlist(large)
    assert l_small < l_large
    assert info["pilot_pairs"] == 8 * 200
    with pytest.raises(ValueError, match="tolerance"):
        Fm.choose_shortlist(small, tolerance=1.0)


@pytest.mark.parametrize("block", [1, 4, 16, 200])
def test_block_equals_exact_with_ties_and_duplicates(block: int) -> None:
    samples, _ = draws(n=40, s=6, d=4, noise=0.3, seed=7)
    samples[:, 5] = samples[:, 3]  # exact duplicates in every draw
    samples[:, 17] = samples[:, 3]
    samples[2, :] = 1.0  # one draw where every similarity ties
    samples[4, 8] = 0.0  # a zero vector
    ref = torch.tensor([[nn[0] for nn in brute_knn(z, 1)] for z in samples])
    exact = Fm.sampled_neighbors(samples, mode="exact")
    assert torch.equal(exact, ref)
    full = Fm.sampled_neighbors(samples, mode="block", shortlist=39, block=block)
    assert torch.equal(full, ref)
    assert full[2].tolist() == [1] + [0] * 39


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_agreement_at_least_shortlist(seed: int) -> None:
    samples, y = draws(n=150, s=8, d=6, noise=0.6, seed=seed)
    exact = Fm.sampled_neighbors(samples, mode="exact")
    short = Fm.sampled_neighbors(samples, mode="shortlist", shortlist=3)
    blk = Fm.sampled_neighbors(samples, mode="block", shortlist=3, block=8, memory_budget=4096)
    hit_s, hit_b = short == exact, blk == exact
    assert bool((hit_b | ~hit_s).all())  # a pair right in shortlist mode stays right
    assert float(hit_b.double().mean()) > float(hit_s.double().mean())
    res = Fm.retrieval_ece(samples, y, mode="block", shortlist=3, block=8)
    assert torch.equal(res.neighbors, blk)


def test_block_bad_input() -> None:
    samples, y = draws(n=20, s=2)
    with pytest.raises(ValueError, match="block"):
        Fm.sampled_neighbors(samples, mode="block", block=0)


def test_automatic_shortlist_falls_back_to_exact_when_it_cannot_reach_tolerance():
    # very diffuse draws around 600 means: no shortlist up to the cap of 256 candidates holds
    # 1 - tolerance of the per-draw neighbours, so the search must be exact
    from bayesurl.evaluation import evaluate
    from bayesurl.evaluation.functional import choose_shortlist, sampled_neighbors

    g = torch.Generator().manual_seed(0)
    mean = torch.nn.functional.normalize(
        torch.randn(600, 8, generator=g, dtype=torch.float64), dim=-1
    )
    s = torch.nn.functional.normalize(
        mean + 2.0 * torch.randn(6, 600, 8, generator=g, dtype=torch.float64), dim=-1
    )
    L, pilot = choose_shortlist(s, tolerance=1e-3)
    assert pilot["miss_rate"] > 1e-3  # the premise of the test
    info: dict = {}
    got = sampled_neighbors(s, tolerance=1e-3, info=info)
    exact = sampled_neighbors(s, mode="exact")
    assert torch.equal(got, exact) and info["fallback_exact"] == 1.0
    labels = torch.randint(0, 5, (600,), generator=g)
    res = evaluate(None, labels, samples=s)
    ref = evaluate(None, labels, samples=s, ece_mode="exact")
    assert res["ece"] == ref["ece"]
    assert any("searched every draw exactly" in n for n in res["notes"])


def test_sddmm_matches_dense_products() -> None:
    # the sparse kernel evaluates exactly the kept (row, col) dot products
    g = torch.Generator().manual_seed(0)
    z = torch.randn(30, 7, generator=g, dtype=torch.float64)
    cand = torch.stack([torch.randperm(30, generator=g)[:5] for _ in range(30)])
    keep = torch.rand(30, 5, generator=g) < 0.6
    keep[:, 0] = True
    crow, col, row = Sm._sparse_pattern(cand, keep)
    vals = Sm._sddmm(crow, col, z, z)
    ref = [float(z[i] @ z[c]) for i in range(30) for c in sorted(cand[i][keep[i]].tolist())]
    assert row.tolist() == [i for i in range(30) for _ in range(int(keep[i].sum()))]
    assert torch.allclose(vals, torch.tensor(ref, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("query_block", [1, 7, 64, None])
def test_nn_sparse_query_blocks_match_loops(query_block: int | None) -> None:
    # per draw, the best kept candidate by cosine, ties to the lowest index (exact duplicates
    # give exact ties), for any cut of the queries into cache-sized blocks
    g = torch.Generator().manual_seed(2)
    s = torch.randn(3, 40, 6, generator=g, dtype=torch.float64)
    s[:, 17] = s[:, 5]
    s[:, 33] = 2.0 * s[:, 5]  # same direction: a cosine tie with 5 and 17
    cand = torch.stack([torch.randperm(40, generator=g)[:9] for _ in range(40)])
    cand[:, :3] = torch.tensor([5, 17, 33])
    cand = torch.where(cand == torch.arange(40)[:, None], (cand + 1) % 40, cand)
    keep = torch.rand(40, 9, generator=g) < 0.7
    keep[:, :3] = True
    pattern = Sm._sparse_pattern(cand, keep)
    got = Sm._nn_sparse(s, pattern, False, query_block=query_block)
    for t in range(3):
        zn = Fm.normalize(s[t])
        for i in range(40):
            kept = sorted(set(cand[i][keep[i]].tolist()))
            best, arg = -math.inf, -1
            for c in kept:
                sim = float(zn[i] @ zn[c])
                if sim > best + 1e-12:
                    best, arg = sim, c
            assert int(got[t, i]) == arg, (t, i)


def test_margin_cut_keeps_the_winners() -> None:
    samples, _ = draws(n=300, s=12, d=16, noise=0.2, seed=9)
    exact = Fm.sampled_neighbors(samples, mode="exact")
    full_info: dict[str, float] = {}
    full = Fm.sampled_neighbors(samples, shortlist=64, margin=math.inf, info=full_info)
    assert full_info["kept_per_query"] == 64.0
    cut_info: dict[str, float] = {}
    cut = Fm.sampled_neighbors(samples, shortlist=64, margin=0.5, info=cut_info)
    zero = Fm.sampled_neighbors(samples, shortlist=64, margin=0.0)
    assert 1.0 <= cut_info["kept_per_query"] < 64.0
    # margin 0 keeps only the mean-space nearest neighbour in every draw
    assert torch.equal(zero, zero[:1].expand_as(zero))
    # a cut can only lose winners the full shortlist finds
    ok_full, ok_cut = full == exact, cut == exact
    assert not bool((ok_cut & ~ok_full).any())
    assert float(ok_cut.double().mean()) >= 0.95
    # given candidates: their mean cosines come from the sparse pass, same result
    mean = Fm.mean_from_samples(samples)
    _, cand = knn(mean, 64)
    given = Fm.sampled_neighbors(samples, shortlist=64, margin=0.5, candidates=cand)
    assert torch.equal(given, cut)
    with pytest.raises(ValueError, match="margin"):
        Fm.sampled_neighbors(samples, margin=-1.0)


def test_adaptive_margin_prunes_easy_queries() -> None:
    samples, _ = draws(n=400, s=10, d=16, noise=0.05, seed=2)
    info: dict[str, float] = {}
    nb = Fm.sampled_neighbors(samples, info=info, tolerance=1e-3)
    exact = Fm.sampled_neighbors(samples, mode="exact")
    assert info["kept_per_query"] < info["shortlist"]
    assert float((nb == exact).double().mean()) >= 0.99


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_single_non_finite_entry_is_counted(bad: float) -> None:
    samples, y = draws(n=20, s=3, d=4)
    samples[1, 7, 2] = bad
    for mode in ("shortlist", "exact", "block"):
        with pytest.raises(ValueError, match="1 non-finite values"):
            Fm.retrieval_ece(samples, y, mode=mode)
    with pytest.raises(ValueError, match="1 non-finite"):
        Fm.choose_shortlist(samples)


@pytest.mark.parametrize("tile", [None, (40, 32), (7, 150)])
@pytest.mark.parametrize("margin", [0.3, 0.8, 5.0])
def test_threshold_pattern_matches_brute_force(margin: float, tile: tuple[int, int] | None) -> None:
    # the adaptive path's single threshold pass keeps every pair within the margin (loops),
    # capped at the L most similar per row; tiles with a running maximum (several column
    # tiles per row, diagonal split across tiles) give the same pattern
    samples, _ = draws(n=150, s=6, d=6, noise=0.3, seed=4)
    res = Sm.resultant(samples)
    mean, sigma = Fm.normalize(res), Sm._spread(res)
    L = 12
    crow, col, row = Sm._margin_pattern(
        mean, sigma, margin, L, memory_budget=40 * 150 * 8, tile=tile
    )
    sims = (mean @ mean.T).tolist()
    for i in range(150):
        others = [c for c in range(150) if c != i]
        top = max(sims[i][c] for c in others)
        within = [
            c
            for c in others
            if top - sims[i][c] <= margin * math.sqrt(float(sigma[i]) ** 2 + float(sigma[c]) ** 2)
        ]
        if len(within) > L:  # the L most similar, ties to the lower index
            within = sorted(sorted(within, key=lambda c: (-sims[i][c], c))[:L])
        got = col[crow[i] : crow[i + 1]].tolist()
        assert got == within, i
        assert row[crow[i] : crow[i + 1]].tolist() == [i] * len(got)
    if margin == 5.0:  # every row hits the cap
        assert int(crow[-1]) == 150 * L


def test_fallback_with_given_embeddings_reports_the_exact_pass_not_the_rejected_shortlist():
    """With `x` given (not the samples' mean) the search plans its own shortlist; when that
    pilot misses more than the tolerance the ECE is the exact pass's, and no field reports the
    rejected shortlist or its miss rate (once: 599 candidates and a 37 % "miss rate")."""
    from bayesurl.evaluation import evaluate

    g = torch.Generator().manual_seed(0)
    mean = torch.nn.functional.normalize(
        torch.randn(600, 8, generator=g, dtype=torch.float64), dim=-1
    )
    s = torch.nn.functional.normalize(
        mean + 2.0 * torch.randn(6, 600, 8, generator=g, dtype=torch.float64), dim=-1
    )
    labels = torch.randint(0, 5, (600,), generator=g)
    res = evaluate(mean, labels, samples=s)
    ref = evaluate(mean, labels, samples=s, ece_mode="exact")
    assert res["ece"] == ref["ece"]
    assert not any(k.startswith("ece_") for k in res), res
    assert any("searched every draw exactly" in n for n in res["notes"])
    # an ECE that keeps its shortlist reports a miss rate within the tolerance
    tight = torch.nn.functional.normalize(
        mean + 0.01 * torch.randn(6, 600, 8, generator=g, dtype=torch.float64), dim=-1
    )
    for x in (mean, None):
        ok = evaluate(x, labels, samples=tight, tolerance=1e-3)
        assert 0.0 <= ok["ece_shortlist_miss_rate"] <= 1e-3 and ok["ece_shortlist"] >= 1
