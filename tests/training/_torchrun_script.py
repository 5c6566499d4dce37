"""Run by ``torchrun --nproc_per_node 2`` in the slow torchrun test: fit under real torchrun."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from _ddp_worker import DDP_ARGS  # noqa: E402
from _training_toys import LinearCE, loader  # noqa: E402

from bayesurl.training import cleanup, fit, init_from_env, is_main_process  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(1)
    info = init_from_env(device="cpu")
    assert info.world_size == 2 and info.backend == "gloo"
    torch.manual_seed(0)
    m = LinearCE()
    fit(m, loader(n=64, batch_size=8), **DDP_ARGS)
    if is_main_process():
        torch.save(m.state_dict(), sys.argv[1])
    cleanup()
