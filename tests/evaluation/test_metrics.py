"""torchmetrics classes: batch accumulation, merge_state, a 2-process gloo gather, plot()."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bayesurl.evaluation import functional as Fm
from bayesurl.evaluation import metrics as M


def data(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)[y]
    x = x + torch.randn(n, 5, generator=g, dtype=torch.float64)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    s = x + 0.3 * torch.randn(6, n, 5, generator=g, dtype=torch.float64)
    ood = torch.rand(n, generator=g) < 0.3
    return x, y, u, s, ood


def make_all():
    return {
        "r1": M.RecallAtK(1),
        "r5": M.RecallAtK(5),
        "map": M.MAPAtK(5),
        "rauroc": M.RAUROC(),
        "ausc": M.AUSC(),
        "ause": M.AUSE(),
        "ece": M.RetrievalECE(mode="exact"),
        "oodroc": M.OODAUROC(),
        "oodpr": M.OODAUPRC(),
    }


def update(ms, x, y, u, s, ood) -> None:
    for name, m in ms.items():
        if name == "ece":
            m.update(s, y)
        elif name.startswith("ood"):
            m.update(u, ood)
        else:
            m.update(x, y, u)


def reference(x, y, u, s, ood) -> dict[str, float]:
    _, c = Fm.r_at_1(x, y)
    return {
        "r1": float(Fm.recall_at_k(x, y, 1)),
        "r5": float(Fm.recall_at_k(x, y, 5)),
        "map": float(Fm.map_at_k(x, y, 5)),
        "rauroc": float(Fm.r_auroc(u, c)),
        "ausc": float(Fm.ausc(u, c)),
        "ause": float(Fm.ause(u, c)),
        "ece": float(Fm.retrieval_ece(s, y, mode="exact").ece),
        "oodroc": float(Fm.auroc(u, ood)),
        "oodpr": float(Fm.average_precision(u, ood)),
    }


def test_batches_equal_functional_on_full_set() -> None:
    x, y, u, s, ood = data()
    ms = make_all()
    for sl in (slice(0, 20), slice(20, 41), slice(41, 64)):
        update(ms, x[sl], y[sl], u[sl], s[:, sl], ood[sl])
    ref = reference(x, y, u, s, ood)
    for name, m in ms.items():
        assert float(m.compute()) == pytest.approx(ref[name], abs=1e-12), name


def test_merge_state_concatenates() -> None:
    x, y, u, s, ood = data(seed=1)
    a, b = make_all(), make_all()
    update(a, x[:30], y[:30], u[:30], s[:, :30], ood[:30])
    update(b, x[30:], y[30:], u[30:], s[:, 30:], ood[30:])
    ref = reference(x, y, u, s, ood)
    for name in a:
        a[name].merge_state(b[name])
        assert float(a[name].compute()) == pytest.approx(ref[name], abs=1e-12), name


def test_plots_return_figures(tmp_path) -> None:
    x, y, u, s, ood = data(seed=2)
    ms = make_all()
    update(ms, x, y, u, s, ood)
    for name, m in ms.items():
        fig, ax = m.plot()
        fig.savefig(tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").stat().st_size > 0 and ax is not None


@pytest.mark.filterwarnings("ignore:The ``compute`` method")
def test_update_validates() -> None:
    with pytest.raises(ValueError, match="uncertainties"):
        M.RAUROC().update(torch.randn(3, 2), torch.arange(3))
    with pytest.raises(ValueError, match="labels"):
        M.RecallAtK().update(torch.randn(3, 2), torch.arange(4))
    with pytest.raises(ValueError, match="samples"):
        M.RetrievalECE().update(torch.randn(2, 3, 2), torch.arange(4))
    with pytest.raises(ValueError, match="compute"):
        M.AUSC().compute()
    with pytest.raises(ValueError, match="sync_on_compute"):
        M.RecallAtK(sync_on_compute=True)


def _worker(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x, y, u, s, ood = data(seed=3)
        sl = slice(0, 37) if rank == 0 else slice(37, 64)  # uneven shards
        ms = make_all()
        update(ms, x[sl], y[sl], u[sl], s[:, sl], ood[sl])
        queue.put((rank, {k: float(m.compute()) for k, m in ms.items()}))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_process_gloo_gather() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(2, port, queue), nprocs=2, join=True, start_method="fork")
    got = dict(queue.get() for _ in range(2))
    # Each rank searches its rows over both shards (sharded search, no embedding gathered);
    # rows count in rank order: ranks 0 and 1 see the same full set.
    ref = reference(*data(seed=3))
    for rank in (0, 1):
        for name, v in got[rank].items():
            assert v == pytest.approx(ref[name], abs=1e-12), (rank, name)
