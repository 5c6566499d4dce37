"""Sharded evaluation over torch.distributed: 2 and 3 gloo processes give the
single-process metrics, ties and duplicates across shard borders and an empty rank included."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from _sharded_worker import CASES, data, plain, run_case, worker
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
    ref = {name: plain(run_case(name, d, everything, everything)) for name in CASES}
    # the intervals and the notes come along, the bootstrap's too (seeded, gathered data)
    assert {"r@1", "r_auroc", "ausc", "ece", "ood_auroc"} <= set(ref["exact"]["intervals"])
    assert ref["id_set"]["intervals"]["mixed_r_auroc"][3] == "delong"
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
    # a NaN on the last rank: it names the argument, the others name the rank and repeat its
    # message
    last = len(sizes) - 1
    assert "embeddings" in ranks[last]["error"] and "non-finite" in ranks[last]["error"].lower()
    for r in range(last):
        assert ranks[r]["error"] == f"rank {last} rejected its input: {ranks[last]['error']}"
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


def _npz(tmp_path, compressed: bool = False):
    d = data(n=29)
    arrays = {
        "embeddings": d["x"].float().numpy(),
        "labels": d["y"].numpy(),
        "uncertainties": d["u"].numpy(),
        "samples": d["samples"].float().numpy(),
        "ood_uncertainties": d["ood"].numpy(),
    }
    path = tmp_path / ("c.npz" if compressed else "x.npz")
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path, arrays


@pytest.mark.parametrize("compressed", [False, True])
def test_load_npz_shard_reads_each_ranks_rows(tmp_path, compressed) -> None:
    from bayesurl.commands.evaluate import load_npz_shard

    path, arrays = _npz(tmp_path, compressed)
    for world in (1, 2, 3, 40):  # 40 > N: some ranks get no rows
        parts = [load_npz_shard(path, r, world) for r in range(world)]
        for k, a in arrays.items():
            axis = 1 if k == "samples" else 0
            got = np.concatenate([p[k] for p in parts], axis=axis)
            assert got.dtype == a.dtype and np.array_equal(got, a), (k, world)
            rows = [p[k].shape[axis] for p in parts]
            n = a.shape[axis]
            assert rows == [len(x) for x in np.array_split(np.arange(n), world)]


def test_load_npz_shard_truncated_file(tmp_path) -> None:
    """An array whose header promises more rows than the archive holds: the rank reading past
    the end names the file and the array (nothing silently short)."""
    from bayesurl.commands.evaluate import load_npz_shard

    path, arrays = _npz(tmp_path)
    np.savez(path, embeddings=arrays["embeddings"], labels=arrays["labels"])
    raw = path.read_bytes()
    d = arrays["embeddings"].shape[1]
    assert raw.count(f"(29, {d})".encode()) == 1 and raw.count(b"(29,)") == 1
    raw = raw.replace(f"(29, {d})".encode(), f"(99, {d})".encode())
    path.write_bytes(raw.replace(b"(29,)", b"(99,)"))
    assert load_npz_shard(path, 0, 9)["embeddings"].shape == (11, d)  # within the file
    with pytest.raises(ValueError, match=r"x.npz: array `embeddings` is truncated"):
        load_npz_shard(path, 8, 9)


def test_load_npz_shard_length_mismatch(tmp_path) -> None:
    from bayesurl.commands.evaluate import load_npz_shard

    path, arrays = _npz(tmp_path)
    np.savez(path, **{**arrays, "labels": arrays["labels"][:-1]})
    with pytest.raises(ValueError, match="length mismatch: `labels`"):
        load_npz_shard(path, 0, 2)


@pytest.mark.distributed
def test_cli_evaluate_under_two_ranks_equals_one_process(tmp_path) -> None:
    from _sharded_worker import cli_worker

    from bayesurl.cli import main

    path, _ = _npz(tmp_path)
    assert main(["evaluate", str(path), "--json", str(tmp_path / "one.json")]) == 0
    argv = ["evaluate", str(path), "--json", str(tmp_path / "two.json")]
    mp.start_processes(
        cli_worker, args=(2, argv, _free_port()), nprocs=2, join=True, start_method="fork"
    )
    one = json.loads((tmp_path / "one.json").read_text())
    two = json.loads((tmp_path / "two.json").read_text())
    assert one == two and one["ece"] is not None and one["n"] == 29


@pytest.mark.distributed
def test_cli_checkpoint_under_two_ranks_equals_one_process(tmp_path) -> None:
    """Under torchrun ``--checkpoint`` is sharded (each rank embeds its block of batches,
    :func:`bayesurl.runs.predict.score`) and gives one process's metrics, ECE included."""
    from _sharded_worker import cli_worker
    from _tiny_checkpoint import train_tiny_mcinfonce

    from bayesurl.cli import main

    train_tiny_mcinfonce(tmp_path, max_train=40, max_test=50, max_ood=21)
    common = ["--checkpoint", str(tmp_path / "last.pt"), "--dataset", "default"]
    common += ["--n-samples", "3", "--max-test", "50", "--max-ood", "21"]
    assert main(["evaluate", *common, "--json", str(tmp_path / "one.json")]) == 0
    argv = ["evaluate", *common, "--json", str(tmp_path / "two.json")]
    mp.start_processes(
        cli_worker, args=(2, argv, _free_port()), nprocs=2, join=True, start_method="fork"
    )
    one = json.loads((tmp_path / "one.json").read_text())
    two = json.loads((tmp_path / "two.json").read_text())
    keys = ("r@1", "r_auroc", "ausc", "ause", "map@5", "recall@5", "ood_auroc", "ece", "n_test")
    for k in keys:
        assert one[k] == two[k] and one[k] is not None, k
