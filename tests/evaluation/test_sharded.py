"""Sharded evaluation over torch.distributed (issue 16): 2 and 3 gloo processes give the
single-process metrics, ties and duplicates across shard borders and an empty rank included."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from _sharded_worker import CASES, data, run_case, worker
from hypothesis import given
from hypothesis import strategies as st

from bayesurl.distributed import RowExchange, Shards, shard_range
from bayesurl.evaluation import evaluate, knn


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(sizes: list[int], ood_sizes: list[int], ring_rows: int, tmp_path) -> list[dict]:
    mp.start_processes(
        worker,
        args=(sizes, ood_sizes, ring_rows, _free_port(), str(tmp_path)),
        nprocs=len(sizes),
        join=True,
        start_method="fork",
    )
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(len(sizes))]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "sizes, ood_sizes, ring_rows",
    # uneven shards; a rank with no queries / no OOD rows; shards sent whole or in 4-row chunks
    [([23, 18], [4, 5], 10**6), ([15, 0, 26], [0, 9, 0], 4)],
    ids=["W2", "W3-empty-rank-chunked"],
)
def test_sharded_evaluate_equals_one_process(sizes, ood_sizes, ring_rows, tmp_path) -> None:
    n = sum(sizes)
    d = data(n=n)
    everything = slice(0, None)
    ref = {name: run_case(name, d, everything, everything) for name in CASES}
    ranks = _spawn(sizes, ood_sizes, ring_rows, tmp_path)
    for name in CASES:
        for r, out in enumerate(ranks):
            # exact equality, NaN (empty reliability bins) equal to NaN
            got, want = (json.dumps(x, sort_keys=True) for x in (out["results"][name], ref[name]))
            assert got == want, (name, r)
    # the exact cases really see ties: several neighbours at the best similarity
    sims = (
        torch.nn.functional.normalize(d["x"], dim=1)
        @ torch.nn.functional.normalize(d["x"], dim=1).T
    )
    sims.fill_diagonal_(-2)
    assert int((sims == sims.max(dim=1, keepdim=True).values).sum(dim=1).gt(1).sum()) > 5
    assert "ece_shortlist" in ref["shortlist"]
    # neighbour ids themselves (global, ties to the lowest id), against the 1-process kNN
    lo = 0
    for r, out in enumerate(ranks):
        for k, nb in out["knn"].items():
            assert torch.equal(nb, knn(d["x"], k)[1][lo : lo + sizes[r]]), (r, k)
        lo += sizes[r]


def test_distributed_needs_a_process_group() -> None:
    d = data()
    with pytest.raises(ValueError, match="process group"):
        evaluate(d["x"], d["y"], distributed=True)
    with pytest.raises(ValueError, match="`group`"):
        evaluate(d["x"], d["y"], group=object())  # type: ignore[arg-type]


@given(n=st.integers(0, 50), world=st.integers(1, 7))
def test_shard_range_matches_array_split(n: int, world: int) -> None:
    parts = np.array_split(np.arange(n), world)
    for r in range(world):
        lo, hi = shard_range(n, r, world)
        assert list(range(lo, hi)) == parts[r].tolist()


def test_single_process_shards_are_the_identity() -> None:
    sh = Shards.local(5)
    x = torch.arange(10.0).view(5, 2)
    assert not sh.active and sh.n == 5 and sh.offset == 0
    assert sh.gather(x) is x
    assert [(o, c is x) for o, c in sh.chunks(x)] == [(0, True)]
    ex = RowExchange(torch.tensor([4, 1, 4]), sh)
    assert torch.equal(ex.fetch(x), x[[1, 4]])
    with pytest.raises(ValueError, match="invalid shard"):
        shard_range(3, 2, 2)
