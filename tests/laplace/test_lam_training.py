"""LAM trains through ``training.fit``: contrastive and online LAM equal hand-written loops,
online LAM resumes bit-identically, and 2 gloo ranks equal one process averaging by hand."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from bayesurl.laplace import (
    ContrastiveEmbedding,
    MetricLaplace,
    OnlineLam,
    OnlineLaplaceUpdate,
    ggn_diagonal_linear,
    train_contrastive,
    train_online,
)
from bayesurl.losses.contrastive import ContrastiveLoss
from bayesurl.training import cleanup, fit, init_from_env

MARGIN, ALPHA, N = 0.5, 0.1, 64


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)).double()


def _batches(n: int = N, b: int = 16, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4
    centers = torch.randn(4, 6, generator=g, dtype=torch.float64) * 2
    x = centers[y] + 0.5 * torch.randn(n, 6, generator=g, dtype=torch.float64)
    return [(x[i : i + b], y[i : i + b]) for i in range(0, n, b)]


def _pair_miner(margin: float):
    from pytorch_metric_learning.miners import PairMarginMiner

    return PairMarginMiner(pos_margin=0.0, neg_margin=margin)


def test_train_contrastive_equals_a_plain_adam_loop():
    batches = _batches()
    ref = _net()
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    loss_fn, miner = ContrastiveLoss(margin=MARGIN), _pair_miner(MARGIN)
    means = []
    for _ in range(2):
        total = 0.0
        for x, y in batches:
            emb = F.normalize(ref(x), dim=1)
            loss = loss_fn(emb, y, miner(emb.detach(), y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach().float())  # the loop records float32 losses
        means.append(total / len(batches))
    net = _net()
    got = train_contrastive(
        net, batches, torch.optim.Adam(net.parameters(), lr=1e-2), 2, margin=MARGIN, progress=False
    )
    assert got == pytest.approx(means, rel=0, abs=0)
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def _hand_online(batches, epochs: int, accum: int = 1):
    """Online LAM by hand: eq. 4's loss, eq. 5 after every micro-batch, a step per group."""
    net = _net()
    la = MetricLaplace(net, mode="online", margin=MARGIN, alpha=ALPHA, dataset_size=N)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(epochs):
        opt.zero_grad()
        for i, (x, y) in enumerate(batches):
            loss = la.online_loss(x, y, generator=gen)  # updates H now
            (loss / accum).backward()
            if (i + 1) % accum == 0:
                opt.step()
                opt.zero_grad()
    return net, la


def _fit_online(batches, epochs: int, accum: int = 1, **kwargs):
    net = _net()
    la = MetricLaplace(net, mode="online", margin=MARGIN, alpha=ALPHA, dataset_size=N)
    method = OnlineLam(la, torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    res = fit(
        method,
        batches,
        epochs=epochs,
        optimizer=opt,
        lr=1e-2,
        min_lr=1e-2,
        grad_accum=accum,
        progress=False,
        hooks=[OnlineLaplaceUpdate(la)],
        **kwargs,
    )
    return net, la, res


@pytest.mark.parametrize("accum", [1, 2])
def test_online_lam_through_fit_equals_the_hand_loop(accum):
    batches = _batches()
    ref_net, ref_la = _hand_online(batches, 2, accum)
    net, la, _ = _fit_online(batches, 2, accum)
    assert torch.equal(la.hessian, ref_la.hessian) and float(la.hessian.sum()) > 0
    for p, q in zip(net.parameters(), ref_net.parameters(), strict=True):
        assert torch.equal(p, q)
    assert [r["epoch"] for r in la.fit_report] == [0, 1]


def test_train_online_is_the_same_run():
    batches = _batches()
    ref_net, ref_la = _hand_online(batches, 2)
    net = _net()
    la = MetricLaplace(net, mode="online", margin=MARGIN, alpha=ALPHA, dataset_size=N)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    train_online(la, batches, opt, 2, generator=torch.Generator().manual_seed(0), progress=False)
    assert torch.equal(la.hessian, ref_la.hessian)


def test_online_lam_resumes_bit_identically(tmp_path):
    batches = _batches()
    net_full, la_full, _ = _fit_online(batches, 3, checkpoint_dir=tmp_path / "full")
    ck = torch.load(tmp_path / "full" / "last.pt", weights_only=True)
    assert torch.equal(ck["hooks"]["online_laplace"]["hessian"], la_full.hessian)
    _fit_online(batches, 3, checkpoint_dir=tmp_path / "part", keep_epoch_checkpoints=True)
    # a fresh process state: resume epoch 2's checkpoint of a 3-epoch run
    net, la, res = _fit_online(batches, 3, resume=tmp_path / "part" / "epoch_2.pt")
    assert res.epochs == 3 and len(res.losses) == len(batches)
    assert torch.equal(la.hessian, la_full.hessian)
    for p, q in zip(net.parameters(), net_full.parameters(), strict=True):
        assert torch.equal(p, q)


def test_online_hook_refuses_a_posthoc_laplace():
    with pytest.raises(TypeError, match="online"):
        OnlineLaplaceUpdate(MetricLaplace(_net()))
    with pytest.raises(TypeError, match="online"):
        OnlineLam(MetricLaplace(_net()))


def test_contrastive_embedding_forward_is_normalised():
    m = ContrastiveEmbedding(_net())
    x, _ = _batches()[0]
    out = m(x)
    torch.testing.assert_close(out.embedding.norm(dim=1), torch.ones(len(x), dtype=x.dtype))


# -- DDP: 2 gloo ranks equal one process that averages the two shards by hand ---------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shards():
    """Two ranks x 2 steps of 16; rank r trains on every other batch (no loader sharding)."""
    batches = _batches(n=N, b=16)
    return [batches[0::2], batches[1::2]]


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    init_from_env(device="cpu")
    try:
        net = _net(seed=10 + rank)  # DDP must start every rank from rank 0's weights
        la = MetricLaplace(net, mode="online", margin=MARGIN, alpha=ALPHA, dataset_size=N)
        method = OnlineLam(la, torch.Generator().manual_seed(0))
        fit(
            method,
            _shards()[rank],
            epochs=2,
            optimizer="sgd",
            lr=0.05,
            min_lr=0.05,
            progress=False,
            hooks=[OnlineLaplaceUpdate(la)],
        )
        state = {"params": [p.detach().clone() for p in net.parameters()], "H": la.hessian}
        torch.save(state, Path(out) / f"rank{rank}.pt")
    finally:
        cleanup()


def _reference():
    """One process: per step, each shard's loss (same weight draw on both: one generator
    state), the mean of the two losses' gradients, and LAM eq. 5 with the mean curvature."""
    net = _net(seed=10)
    la = MetricLaplace(net, mode="online", margin=MARGIN, alpha=ALPHA, dataset_size=N)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    shards = _shards()
    for _ in range(2):
        for step in range(len(shards[0])):
            state = gen.get_state()
            losses, curvatures = [], []
            for shard in shards:
                gen.set_state(state)
                x, y = shard[step]
                losses.append(la.online_loss(x, y, generator=gen, update_hessian=False))
                batch = la.pending
                w = batch.thetas[0][: 4 * 8].reshape(4, 8)
                b = batch.thetas[0][4 * 8 :]
                curvatures.append(
                    ggn_diagonal_linear(
                        w,
                        b,
                        batch.phi,
                        batch.pairs,
                        approximation="fixed",
                        geometry="arccos",
                        margin=la.hessian_margin,
                        clamp=False,
                    )
                )
            la.pending = None
            opt.zero_grad()
            (0.5 * (losses[0] + losses[1])).backward()
            opt.step()
            mean = 0.5 * (curvatures[0] + curvatures[1])
            scale = N / len(shards[0][step][1])
            la.hessian = (1 - ALPHA) * la.hessian + scale * mean.clamp_min(0.0)
    return net, la


@pytest.mark.distributed
def test_online_lam_under_ddp_matches_one_process_averaging_by_hand(tmp_path):
    ref_net, ref_la = _reference()
    mp.start_processes(
        _ddp_worker,
        args=(2, _free_port(), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="fork",
    )
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert torch.equal(r0["H"], r1["H"])  # every rank keeps the same posterior
    torch.testing.assert_close(r0["H"], ref_la.hessian, rtol=1e-10, atol=1e-10)
    assert float(r0["H"].sum()) > 0
    for p0, p1, q in zip(r0["params"], r1["params"], ref_net.parameters(), strict=True):
        assert torch.equal(p0, p1)
        torch.testing.assert_close(p0, q.detach(), rtol=1e-10, atol=1e-12)
