"""``bayesurl.distributed.launch_local`` and ``bayesurl evaluate --nproc-per-node``:
ranks forked from one process get torchrun's environment, a rank's failure is reported, and
the command's metrics equal one process's, uneven shards and exact duplicates included."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesurl.distributed import RankFailedError, launch_local

ROOT = Path(__file__).parents[1]


def _report(out: str) -> None:
    """One rank: write what torchrun's environment and the thread setting say."""
    import torch.distributed as dist

    from bayesurl.distributed import cleanup, init_from_env

    info = init_from_env(device="cpu")
    t = torch.tensor([info.rank + 1])
    dist.all_reduce(t)  # the ranks really form one group
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    rec = {k: os.environ[k] for k in keys} | {"threads": torch.get_num_threads(), "sum": int(t)}
    Path(out, f"rank{info.rank}.json").write_text(json.dumps(rec))
    cleanup()


def _fail_on_rank_1(out: str) -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("`labels` is empty on this rank")
    Path(out, "rank0.json").write_text("{}")


def _exit_3() -> int:
    return 3


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_launch_local_sets_torchrun_environment(world, tmp_path) -> None:
    launch_local(_report, world, (str(tmp_path),), threads=1)
    recs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r, rec in enumerate(recs):
        assert rec["RANK"] == rec["LOCAL_RANK"] == str(r)
        assert rec["WORLD_SIZE"] == rec["LOCAL_WORLD_SIZE"] == str(world)
        assert rec["MASTER_ADDR"] == "127.0.0.1" and rec["threads"] == 1
        assert rec["sum"] == world * (world + 1) // 2
    assert "RANK" not in os.environ  # the launching process is untouched


@pytest.mark.distributed
def test_launch_local_spawn_start_method(tmp_path) -> None:
    """The ``spawn`` start method (used for CUDA devices) runs the same ranks."""
    launch_local(_report, 2, (str(tmp_path),), threads=1, start_method="spawn")
    recs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["RANK"] for r in recs] == ["0", "1"] and all(r["sum"] == 3 for r in recs)


@pytest.mark.distributed
def test_launch_local_threads_default_from_omp(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    launch_local(_report, 2, (str(tmp_path),))
    assert json.loads((tmp_path / "rank1.json").read_text())["threads"] == 2


@pytest.mark.distributed
def test_launch_local_reports_the_failing_rank(tmp_path) -> None:
    with pytest.raises(RankFailedError, match=r"rank 1 of 2 failed: ValueError: `labels` is empty"):
        launch_local(_fail_on_rank_1, 2, (str(tmp_path),), threads=1)
    with pytest.raises(RankFailedError, match="rank 0 of 1 exited with status 3"):
        launch_local(_exit_3, 1, threads=1)


def test_launch_local_bad_arguments(monkeypatch) -> None:
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="`nprocs`"):
            launch_local(_exit_3, bad)
    for bad in (True, "2"):  # not a number: check_int's TypeError
        with pytest.raises(TypeError, match="`nprocs`"):
            launch_local(_exit_3, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`threads`"):
        launch_local(_exit_3, 2, threads=0)
    with pytest.raises(ValueError, match="`start_method`"):
        launch_local(_exit_3, 2, threads=1, start_method="teleport")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="already one rank"):
        launch_local(_exit_3, 2, threads=1)


def _npz(path: Path, n: int = 31, nan: bool = False) -> Path:
    g = np.random.default_rng(0)
    x = g.standard_normal((n, 6)).astype(np.float32)
    x[10] = x[3]  # an exact duplicate: a tie at the top, on different ranks for W = 2, 3
    x[20] = x[3]
    if nan:
        x[25, 2] = np.nan  # on rank 1 of 2
    y = g.integers(0, 4, n)
    s = (x[None] + 0.3 * g.standard_normal((4, n, 6))).astype(np.float32)
    np.savez(path, embeddings=x, labels=y, samples=s, ood_uncertainties=g.random(7))
    return path


def _cli(*args: str, threads: str = "1") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(
        [sys.executable, "-m", "bayesurl", "evaluate", *args],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_evaluate_nproc_per_node_equals_one_process(world, tmp_path) -> None:
    path = _npz(tmp_path / "x.npz")
    one, many = tmp_path / "one.json", tmp_path / "many.json"
    p1 = _cli(str(path), "--json", str(one))
    pw = _cli(str(path), "--json", str(many), "--nproc-per-node", str(world))
    assert p1.returncode == 0 and pw.returncode == 0, (p1.stderr, pw.stderr)
    a, b = json.loads(one.read_text()), json.loads(many.read_text())
    assert a == b and a["ece"] is not None and a["ood_auroc"] is not None and a["n"] == 31
    # rank 0 alone prints its table (one "r@1" row; "mixed_r@1" is another metric)
    assert len(re.findall(r"^r@1\s", pw.stdout, flags=re.M)) == 1


@pytest.mark.distributed
def test_evaluate_nproc_per_node_rank_error_is_one_line(tmp_path) -> None:
    path = _npz(tmp_path / "x.npz", nan=True)
    p = _cli(str(path), "--nproc-per-node", "2")
    assert p.returncode == 2
    # whichever rank the launcher reports, the message is rank 1's own (raise_if_any shares it)
    assert "of 2 failed: ValueError" in p.stderr, p.stderr
    assert "`embeddings` contains non-finite values (1 NaN" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_evaluate_nproc_per_node_checked_before_work(monkeypatch, tmp_path, capsys) -> None:
    from bayesurl.cli import main

    path = _npz(tmp_path / "x.npz")
    assert main(["evaluate", str(path), "--nproc-per-node", "0"]) == 2
    assert "--nproc-per-node" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["evaluate", str(path), "--nproc-per-node", "2"]) == 2
    err = capsys.readouterr().err
    assert "--nproc-per-node: already launched by torchrun" in err


def test_console_main_freezes_the_heap_before_exit(monkeypatch) -> None:
    import bayesurl.cli as cli

    monkeypatch.setattr(cli, "main", lambda: 3)
    assert gc.get_freeze_count() == 0
    try:
        with pytest.raises(SystemExit) as exc:
            cli.console_main()
        assert exc.value.code == 3
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


@pytest.mark.distributed
def test_evaluate_checkpoint_nproc_per_node_equals_one_process(tmp_path) -> None:
    """``--checkpoint`` with forked ranks: each embeds its block of batches, the metrics (the
    draw-based ECE included) are one process's."""
    from _tiny_checkpoint import train_tiny_mcinfonce

    train_tiny_mcinfonce(tmp_path, max_train=40, max_test=50, max_ood=21)
    common = ["--checkpoint", str(tmp_path / "last.pt"), "--dataset", "default"]
    common += ["--n-samples", "3", "--max-test", "50", "--max-ood", "21"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    p1 = _cli(*common, "--json", str(one))
    p2 = _cli(*common, "--json", str(two), "--nproc-per-node", "2")
    assert p1.returncode == 0 and p2.returncode == 0, (p1.stderr[-2000:], p2.stderr[-2000:])
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    keys = ("r@1", "r_auroc", "ausc", "ause", "map@5", "recall@5", "ood_auroc", "ece", "n_test")
    for k in keys:
        assert a[k] == b[k] and a[k] is not None, k
    assert p2.stdout.count("zero-shot on") == 1  # rank 0 alone prints
