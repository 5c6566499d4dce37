"""Reused searches: evaluate(neighbors=...) and NeighborMemo against a fresh search."""

from __future__ import annotations

import os

import pytest
import torch

from bayesurl.evaluation import NeighborMemo, evaluate
from bayesurl.evaluation import functional as Fm


def _data(n: int = 120, d: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(4, d, generator=g, dtype=torch.float64)[y]
    x = x + torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, y, torch.rand(n, generator=g, dtype=torch.float64)


def _brute_knn(x: torch.Tensor, k: int) -> torch.Tensor:
    """k nearest by cosine, self excluded, ties to the lower index: Python loops."""
    rows = x.tolist()
    unit = [[v / sum(w * w for w in r) ** 0.5 for v in r] for r in rows]
    out = []
    for i, q in enumerate(unit):
        sims = [(-sum(a * b for a, b in zip(q, g)), j) for j, g in enumerate(unit) if j != i]
        out.append([j for _, j in sorted(sims)[:k]])
    return torch.tensor(out)


def _same(a: dict, b: dict) -> None:
    for key in a:
        if key not in ("neighbors", "notes"):
            assert a[key] == b[key], key


def test_given_neighbors_give_the_searched_metrics_for_any_uncertainty():
    x, y, u = _data()
    first = evaluate(x, y, uncertainties=u, return_neighbors=True)
    nb = first["neighbors"]
    assert torch.equal(nb, _brute_knn(x, nb.shape[1]))  # the search's ids and order
    other_u = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(5))
    _same(
        evaluate(x, y, uncertainties=other_u), evaluate(x, y, uncertainties=other_u, neighbors=nb)
    )
    _same(first, evaluate(x, y, uncertainties=u, neighbors=nb.int()))
    # the ids are used, not searched again: wrong ids change the metrics
    wrong = torch.roll(nb, 1, dims=0)
    wrong[wrong == torch.arange(x.shape[0])[:, None]] = 0
    wrong[0] = torch.arange(1, nb.shape[1] + 1)
    res = evaluate(x, y, uncertainties=u, neighbors=wrong)
    assert res["r@1"] != first["r@1"]
    assert res["r@1"] == pytest.approx(float((y[wrong[:, 0]] == y).double().mean()))


def test_too_few_columns_search_again():
    x, y, u = _data()
    first = evaluate(x, y, uncertainties=u, return_neighbors=True)
    res = evaluate(
        x, y, uncertainties=u, neighbors=first["neighbors"][:, :2], return_neighbors=True
    )
    _same(first, res)
    assert torch.equal(res["neighbors"], first["neighbors"])


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (lambda nb: nb[:-1], "rows"),
        (lambda nb: nb.float(), "integer"),
        (lambda nb: nb > 0, "integer"),
        (lambda nb: nb[:, 0], "neighbors"),
        (lambda nb: nb + 1000, "outside"),
        (lambda nb: torch.arange(nb.shape[0])[:, None].expand_as(nb), "own neighbour"),
    ],
)
def test_bad_neighbors_name_the_argument(bad, match):
    x, y, u = _data()
    nb = evaluate(x, y, return_neighbors=True)["neighbors"]
    with pytest.raises(ValueError, match=match):
        evaluate(x, y, uncertainties=u, neighbors=bad(nb))


def test_memo_is_keyed_by_content(tmp_path):
    x, y, _ = _data()
    nb = evaluate(x, y, return_neighbors=True)["neighbors"]
    memo = NeighborMemo(tmp_path)
    assert memo.get(x) is None
    memo.put(x, nb)
    assert torch.equal(memo.get(x.clone()), nb)
    assert memo.get(x.float()) is None  # another dtype
    assert memo.get(x[:-1]) is None  # another shape
    bumped = x.clone()
    bumped[7, 3] = torch.nextafter(bumped[7, 3], torch.tensor(10.0, dtype=x.dtype))
    assert memo.get(bumped) is None  # one ulp of one entry
    assert memo.get(x, backend="faiss") is None  # another search
    assert (memo.hits, memo.misses) == (1, 5)
    # on disk: a new memo (another worker) finds it
    assert torch.equal(NeighborMemo(tmp_path).get(x), nb)
    assert NeighborMemo(tmp_path).get(bumped) is None


def test_memo_keeps_the_wider_entry(tmp_path):
    x, y, _ = _data()
    nb = evaluate(x, y, return_neighbors=True)["neighbors"]
    memo = NeighborMemo(tmp_path)
    memo.put(x, nb)
    memo.put(x, nb[:, :3])
    assert memo.get(x).shape == nb.shape
    assert NeighborMemo(tmp_path).get(x).shape == nb.shape


def test_memory_holds_the_last_entries_only():
    memo = NeighborMemo(max_entries=2)
    xs = [_data(seed=s)[0] for s in range(3)]
    for x in xs:
        memo.put(x, torch.zeros(x.shape[0], 1, dtype=torch.long) + 1)
    assert memo.get(xs[0]) is None
    assert memo.get(xs[1]) is not None and memo.get(xs[2]) is not None
    with pytest.raises(ValueError, match="max_entries"):
        NeighborMemo(max_entries=0)


def test_a_corrupted_entry_is_a_miss_not_read(tmp_path):
    x, y, _ = _data()
    nb = evaluate(x, y, return_neighbors=True)["neighbors"]
    NeighborMemo(tmp_path).put(x, nb)
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    data = (entry / "neighbors.pt").read_bytes()
    (entry / "neighbors.pt").write_bytes(data[:-7] + b"garbage")
    with pytest.warns(UserWarning, match="searching again"):
        assert NeighborMemo(tmp_path).get(x) is None
    memo = NeighborMemo(tmp_path)  # overwritten by the next search
    with pytest.warns(UserWarning):
        assert memo.get(x) is None
    memo.put(x, nb)
    assert torch.equal(NeighborMemo(tmp_path).get(x), nb)


def test_bad_put_names_the_argument():
    x, _, _ = _data()
    with pytest.raises(ValueError, match="neighbors"):
        NeighborMemo().put(x, torch.zeros(x.shape[0] - 1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="neighbors"):
        NeighborMemo().put(x, torch.zeros(x.shape[0], 2))
    with pytest.raises(ValueError, match="integer ids"):
        NeighborMemo().put(x, torch.zeros(x.shape[0], 2, dtype=torch.bool))


def test_r_at_1_of_given_neighbors_matches_functional():
    x, y, u = _data(seed=3)
    nb = evaluate(x, y, return_neighbors=True)["neighbors"]
    res = evaluate(x, y, uncertainties=u, neighbors=nb)
    assert res["r@1"] == pytest.approx(float(Fm.r_at_1(x, y)[0]))
    assert res["r_auroc"] == pytest.approx(float(Fm.r_auroc(u, Fm.r_at_1(x, y)[1])))


def test_disk_keeps_the_last_entries_only(tmp_path):
    memo = NeighborMemo(tmp_path, max_disk_entries=2)
    xs = [_data(seed=s)[0] for s in range(3)]
    for i, x in enumerate(xs):
        memo.put(x, torch.ones(x.shape[0], 1, dtype=torch.long))
        entry = tmp_path / NeighborMemo.key(x)
        os.utime(entry, (i, i))  # written in this order, whatever the clock's resolution
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NeighborMemo.key(x) for x in xs[1:])
    fresh = NeighborMemo(tmp_path)
    assert fresh.get(xs[0]) is None and fresh.get(xs[2]) is not None
    with pytest.raises(ValueError, match="max_disk_entries"):
        NeighborMemo(tmp_path, max_disk_entries=0)
