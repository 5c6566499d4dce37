"""torch.distributed: 2 gloo processes match 1 process on the same global batch."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp
from _ddp_worker import DDP_ARGS, worker
from _training_toys import LinearCE, loader

from bayesurl.distributed import distributed_loader
from bayesurl.training import all_gather_tensors, fit, init_from_env, is_main_process


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
def test_ddp_two_processes_match_one_process_on_the_global_batch(tmp_path):
    # reference: one process, global batch 16 = 2 ranks x 8 (run first: forked workers then
    # inherit the already-imported optimiser modules)
    torch.manual_seed(0)
    ref = LinearCE()
    res = fit(ref, loader(n=64, batch_size=16), **DDP_ARGS)
    mp.start_processes(
        worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="fork"
    )
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["steps"] == r1["steps"] == res.global_step == 2 * 2
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(r0["params"][k], v, rtol=0, atol=1e-10)
        assert torch.equal(r0["params"][k], r1["params"][k])  # ranks stay in sync
    assert any(not torch.equal(r0["params"][k], v0) for k, v0 in _init_state().items())
    # variable-length gather: rank 0 has 2 rows of 0, rank 1 has 3 rows of 1
    expected = torch.cat([torch.zeros(2, 3), torch.ones(3, 3)])
    assert torch.equal(r0["gathered"], expected) and torch.equal(r1["gathered"], expected)
    # only rank 0 wrote the checkpoint, it has the synchronised weights
    ck = torch.load(tmp_path / "ckpt" / "last.pt", weights_only=True)
    assert ck["config"]["world_size"] == 2 and len(ck["rng"]) == 2
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.pt"]
    assert torch.equal(ck["model"]["linear.weight"], r0["params"]["linear.weight"])


def _init_state():
    torch.manual_seed(0)
    return LinearCE().state_dict()


def test_single_process_fallbacks(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    info = init_from_env()
    assert (info.rank, info.world_size, info.backend) == (0, 1, None)
    assert is_main_process()
    t = torch.arange(6.0).reshape(3, 2)
    assert all_gather_tensors(t) is t
    ld = loader()
    assert distributed_loader(ld) is ld
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        init_from_env()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match="RANK=5"):
        init_from_env()


@pytest.mark.slow
@pytest.mark.distributed
def test_fit_under_real_torchrun_matches_one_process(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "_torchrun_script.py"
    out = tmp_path / "params.pt"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(script),
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.manual_seed(0)
    ref = LinearCE()
    fit(ref, loader(n=64, batch_size=16), **DDP_ARGS)
    got = torch.load(out, weights_only=True)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-10)
