"""MAP@R and R-precision against pytorch-metric-learning's ``AccuracyCalculator``, on random,
clustered and tied data (float64), chunked or not, and through the evaluator."""

from __future__ import annotations

import math

import pytest
import torch
from _reference import brute_knn, tie_data
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from bayesurl.evaluation import Evaluator, evaluate
from bayesurl.evaluation import functional as Fm

KEYS = ("mean_average_precision_at_r", "r_precision")


def brute_knn_func(query, k, reference, ref_includes_query=False):
    """PML's knn_func contract over Python loops: cosine, ties to the lowest index."""
    assert ref_includes_query and torch.equal(query, reference)
    ids = torch.tensor(brute_knn(reference, k))
    return torch.zeros(ids.shape, dtype=torch.float64), ids


def pml(x: torch.Tensor, y: torch.Tensor, avg_of_avgs: bool = False) -> dict[str, float]:
    calc = AccuracyCalculator(
        include=KEYS, knn_func=brute_knn_func, avg_of_avgs=avg_of_avgs, device=torch.device("cpu")
    )
    return calc.get_accuracy(x, y)


def random_set() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 6, (120,), generator=g)
    y[7] = 50  # a class of one: left out, as PML does
    return x, y


def clustered_set() -> tuple[torch.Tensor, torch.Tensor]:
    # unequal classes: one of 60 (R = 59), several of 2 to 10
    g = torch.Generator().manual_seed(1)
    y = torch.cat([torch.zeros(60, dtype=torch.long), torch.randint(1, 12, (70,), generator=g)])
    centers = torch.randn(12, 8, generator=g, dtype=torch.float64)
    x = centers[y] + 1.2 * torch.randn(130, 8, generator=g, dtype=torch.float64)
    return x, y


def tied_set() -> tuple[torch.Tensor, torch.Tensor]:
    # exact cosines, many ties across classes, exact duplicates with equal and other labels
    x = tie_data(90, seed=3)
    y = torch.randint(0, 4, (90,), generator=torch.Generator().manual_seed(4))
    x = torch.cat([x, x[:20]])
    y = torch.cat([y, y[:10], (y[10:20] + 1) % 4])
    return x, y


SETS = {"random": random_set, "clustered": clustered_set, "tied": tied_set}


@pytest.mark.parametrize("name", list(SETS))
@pytest.mark.parametrize("avg_of_avgs", [False, True])
def test_equals_pml(name: str, avg_of_avgs: bool) -> None:
    x, y = SETS[name]()
    ref = pml(x, y, avg_of_avgs)
    got_map = Fm.map_at_r(x, y, avg_of_avgs=avg_of_avgs)
    got_rp = Fm.r_precision(x, y, avg_of_avgs=avg_of_avgs)
    assert float(got_map) == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-12)
    assert float(got_rp) == pytest.approx(ref["r_precision"], abs=1e-12)


@pytest.mark.parametrize("name", list(SETS))
def test_chunking_does_not_change_the_values(name: str) -> None:
    x, y = SETS[name]()
    ap, rp = Fm.precision_at_r(x, y)
    ap1, rp1 = Fm.precision_at_r(x, y, memory_budget=1)  # one query per chunk
    assert torch.equal(ap.isnan(), ap1.isnan())
    # the same ranking: only the last bits of the sums (their length follows the chunk) move
    assert torch.allclose(ap, ap1, equal_nan=True, rtol=0, atol=1e-14)
    assert torch.equal(rp.nan_to_num(-1), rp1.nan_to_num(-1))


def test_per_query_values_by_hand() -> None:
    # query 0 (class 0, R = 2): neighbours 1 (cos 0.8, class 0), 2 (0.6, class 1), 3 (0, class 0)
    x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 0])
    ap, rp = Fm.precision_at_r(x, y)
    # ranks of the relevant items in the top 2: only item 1 (rank 1) -> AP@R = 1/2, RP = 1/2
    assert float(ap[0]) == pytest.approx(0.5, abs=0)
    assert float(rp[0]) == pytest.approx(0.5, abs=0)
    assert math.isnan(float(ap[2]))  # alone in class 1


def test_evaluator_reaches_map_at_r_with_intervals() -> None:
    x, y = clustered_set()
    ref = pml(x, y)
    res = evaluate(x, y, include=["r@1", "map@r"], avg_of_avgs=True)
    assert res["map@r"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-12)
    assert res["r_precision"] == pytest.approx(ref["r_precision"], abs=1e-12)
    assert res["map@r_class_avg"] == pytest.approx(pml(x, y, True)[KEYS[0]], abs=1e-12)
    for key in ("map@r", "r_precision", "map@r_class_avg", "r_precision_class_avg"):
        iv = res["intervals"][key]
        assert iv.method == "bootstrap" and iv.low <= res[key] <= iv.high and iv.n == x.shape[0]
    assert "map@r" not in evaluate(x, y)  # asked for: its own ranking costs a second pass


def test_evaluator_notes_lone_queries_and_all_lone() -> None:
    x, y = random_set()
    res = Evaluator(include=["map@r"])(x, y)
    assert any("1 queries alone in their class" in n for n in res["notes"])
    assert res["intervals"]["map@r"].n == x.shape[0] - 1
    res = Evaluator(include=["map@r"])(x[:5], torch.arange(5))
    assert res["map@r"] is None and res["r_precision"] is None
    assert any("every query is alone" in n for n in res["notes"])


def small_classes() -> tuple[torch.Tensor, torch.Tensor]:
    # tied data in classes of at most 11 items: R <= 10, the one search's k
    x = tie_data(120, seed=6)
    y = torch.arange(120) // 11
    y = y[torch.randperm(120, generator=torch.Generator().manual_seed(7))]
    return x, y


def test_small_classes_come_from_the_one_search(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = small_classes()
    ref = pml(x, y)
    own = Evaluator(include=["map@r"])(x, y)  # no search asked for: its own pass

    def no_second_pass(*args, **kwargs):
        raise AssertionError("MAP@R ranked again although the search kept every R")

    monkeypatch.setattr(Fm, "precision_at_r", no_second_pass)
    res = Evaluator(include=["r@1", "recall@k", "map@r"], ks=(1, 10))(x, y)
    for got in (res, own):
        assert got["map@r"] == pytest.approx(ref[KEYS[0]], abs=1e-12)
        assert got["r_precision"] == pytest.approx(ref[KEYS[1]], abs=1e-12)
    with pytest.raises(AssertionError, match="ranked again"):
        Evaluator(include=["r@1", "map@r"], ks=(1, 5))(x, y)  # k = 5 < R = 10
