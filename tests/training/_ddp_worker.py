"""Worker run by ``torch.multiprocessing.spawn`` in the DDP test (one process per rank)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from _training_toys import LinearCE, loader

from bayesurl.distributed import get_world_size
from bayesurl.training import all_gather_tensors, cleanup, fit, init_from_env, is_main_process

DDP_ARGS = dict(
    epochs=2,
    optimizer="adamw",
    lr=5e-2,
    weight_decay=0.01,
    warmup_epochs=1,
    grad_accum=2,
    seed=0,
    progress=False,
)


def worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    info = init_from_env(device="cpu")
    try:
        assert (info.rank, info.world_size, info.backend) == (rank, world, "gloo")
        assert get_world_size() == world and is_main_process() == (rank == 0)
        torch.manual_seed(100 + rank)  # different init per rank: DDP must broadcast rank 0's
        m = LinearCE()
        if rank == 0:
            torch.manual_seed(0)
            m = LinearCE()
        # per-rank batch 8, global batch 16; the loop swaps in a DistributedSampler
        res = fit(m, loader(n=64, batch_size=8), checkpoint_dir=Path(out) / "ckpt", **DDP_ARGS)
        gathered = all_gather_tensors(torch.full((rank + 2, 3), float(rank)))
        torch.save(
            {
                "params": {k: v.clone() for k, v in m.state_dict().items()},
                "gathered": gathered,
                "steps": res.global_step,
                "losses": res.losses,
            },
            Path(out) / f"rank{rank}.pt",
        )
    finally:
        cleanup()
