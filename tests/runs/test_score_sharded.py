"""Sharded zero-shot scoring (end to end): :func:`bayesurl.runs.predict.score` under
2 and 3 gloo processes equals one process -- metrics (the draw-based ECE included), the
predicted rows and the OOD AUROC over every rank's u -- with uneven blocks and empty ranks."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from _score_sharded_worker import (
    CASES,
    BatchNormLinear,
    fit_evaluator,
    fn,
    score_case,
    sets,
    worker,
)
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from bayesurl.runs.predict import batch_shard, predict, score


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, names: list[str], tmp_path) -> list[dict]:
    mp.start_processes(
        worker,
        args=(world, _free_port(), str(tmp_path), names),
        nprocs=world,
        join=True,
        start_method="fork",
    )
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]


def _dumps(res: dict) -> str:
    return json.dumps({k: v for k, v in res.items() if k != "eval_time"}, sort_keys=True)


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_sharded_score_equals_one_process(world, tmp_path) -> None:
    names = [n for n, (_, w) in CASES.items() if w == world]
    ref = {n: score_case(n) for n in names}
    ranks = _spawn(world, names, tmp_path)
    s = sets()
    for name in names:
        want = ref[name]
        out = want.pop("outputs")
        batch_size = CASES[name][0]
        blocks = [batch_shard(len(s.test), batch_size, r, world) for r in range(world)]
        assert len({hi - lo for lo, hi in blocks}) > 1  # uneven: N is not a multiple of W
        for r, got in enumerate(ranks):
            # every metric exactly equal, ECE from per-batch-seeded draws included
            assert _dumps(got["results"][name]["metrics"]) == _dumps(want), (name, r)
        assert want["ece"] is not None and want["r_auroc"] is not None
        assert want["ood_auroc"] is not None and want["n_test"] == 23
        # the ranks predicted contiguous blocks that concatenate to the one-process rows
        emb = torch.cat([got["results"][name]["test"][0] for got in ranks])
        draws = torch.cat([got["results"][name]["test"][1] for got in ranks], dim=1)
        assert torch.equal(emb, out["test"][0].embedding)
        assert torch.equal(draws, out["test"][0].samples)
        u_id = torch.cat([got["results"][name]["u_id"] for got in ranks])
        assert torch.equal(u_id, out["id_test"][0].uncertainty)
    if world == 3:  # some rank had no rows of some set
        sizes = [batch_shard(7, 16, r, 3) for r in range(3)]
        assert sizes[1][0] == sizes[1][1]


@pytest.mark.distributed
def test_fit_evaluation_hook_is_sharded_under_ddp(tmp_path) -> None:
    """``fit``'s ``eval_fn`` (:func:`epoch_evaluator`) under 2 DDP ranks records, on every
    rank, the single-process scores of rank 0's trained method (BatchNorm statistics
    included)."""
    ranks = _spawn(2, ["W2-bs4"], tmp_path)
    method = BatchNormLinear()
    method.load_state_dict(ranks[0]["fit"]["state"])
    for k in ("norm.running_mean", "norm.running_var"):  # synchronised before the evaluation
        assert torch.equal(ranks[1]["fit"]["state"][k], method.state_dict()[k])
    want = fit_evaluator()(method.eval(), 0)
    assert want["r@1"] is not None and want["ood_auroc"] is not None
    for r, got in enumerate(ranks):
        rec = got["fit"]["eval"]
        assert set(rec) == set(want)
        for k in want:
            if k != "eval_time":
                assert rec[k] == want[k], (r, k)


def test_score_ood_auroc_against_scikit_learn() -> None:
    res = score(fn, sets(), None, batch_size=4)
    s = sets()
    u_id = torch.stack([fn(s.id_test[i][0][None], 0).uncertainty[0] for i in range(10)])
    u_ood = fn(s.ood.images, 0).uncertainty
    is_ood = np.r_[np.zeros(10), np.ones(7)]
    assert res["ood_auroc"] == pytest.approx(roc_auc_score(is_ood, torch.cat([u_id, u_ood])))


@given(n=st.integers(0, 60), batch_size=st.integers(1, 9), world=st.integers(1, 6))
def test_batch_shard_is_a_contiguous_split_on_the_batch_grid(n, batch_size, world) -> None:
    blocks = [batch_shard(n, batch_size, r, world) for r in range(world)]
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    for (_, hi), (lo, _) in zip(blocks, blocks[1:]):
        assert hi == lo
    n_batches = [-(-(hi - lo) // batch_size) for lo, hi in blocks]
    assert max(n_batches) - min(n_batches) <= 1
    assert all(lo % batch_size == 0 or lo == hi for lo, hi in blocks)


@pytest.mark.parametrize("dataset", ["test", "id_test"])  # in memory / through a DataLoader
def test_predict_blocks_concatenate_to_the_whole(dataset) -> None:
    data = getattr(sets(), dataset)
    whole, y = predict(fn, data, None, n_samples=3, batch_size=4, seed=5)
    parts = [predict(fn, data, None, n_samples=3, batch_size=4, seed=5, rows=r)
             for r in [(0, 4), (4, 4), (4, len(data))]]  # fmt: skip
    assert parts[1][0].embedding.shape == (0, 8) and parts[1][0].samples.shape == (3, 0, 8)
    assert torch.equal(torch.cat([p[0].embedding for p in parts]), whole.embedding)
    assert torch.equal(torch.cat([p[0].samples for p in parts], dim=1), whole.samples)
    assert torch.equal(torch.cat([p[1] for p in parts]), y)


def test_predict_rows_and_score_distributed_errors() -> None:
    data = sets().test
    with pytest.raises(ValueError, match="`rows`.*batch grid"):
        predict(fn, data, None, batch_size=4, rows=(2, 10))
    with pytest.raises(ValueError, match="`rows`"):
        predict(fn, data, None, batch_size=4, rows=(0, 99))
    with pytest.raises(ValueError, match="process group"):
        score(fn, sets(), None, distributed=True)
    # the old keyword: a deprecation warning naming the new one, then the same check as
    # distributed=group (no process group initialised here)
    with (
        pytest.warns(DeprecationWarning, match="distributed=group"),
        pytest.raises(ValueError, match="`distributed` needs an initialised"),
    ):
        score(fn, sets(), None, group=object())
    with pytest.raises(ValueError, match="`distributed` needs an initialised"):
        score(fn, sets(), None, distributed=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        batch_shard(5, 0, 0, 1)
