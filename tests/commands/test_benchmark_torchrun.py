"""``bayesurl benchmark`` (a sweep) under ``torchrun``, end to end.

The real launch: two gloo ranks run the same two method runs in the same order (DDP training,
sharded evaluation), rank 0 alone prints and writes, and every metric of ``results.json``
equals a single-process evaluation of the run's saved checkpoint (DDP training with 2 ranks is
not bit-identical to one process, so the trained model, not a 1-process training, is the
reference). The fast tests monkeypatch the torchrun environment: estimators whose fit is not
distributed and the stored protocol are refused before anything runs, and a rank other than 0
runs every run but writes and prints nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bayesurl import distributed as D
from bayesurl.cli import main
from bayesurl.runs import load_recipe, n_samples_for
from bayesurl.runs.data import build_data
from bayesurl.runs.predict import score
from bayesurl.runs.runner import RunResult
from bayesurl.sweeps import read_results
from bayesurl.sweeps.sweep import run_sweep

METHODS = ("ce", "mcinfonce")  # a scalar-u classifier and a vMF method with samples (ECE)
# eval.batch_size 40 over 150 test images: 4 batches, rows 0:80 on rank 0 and 80:150 on rank 1
SETS = ["--set", "eval.batch_size=40"]
KEYS = ("r@1", "r_auroc", "ausc", "ause", "map@5", "ece", "ood_auroc", "ood_auprc")


@pytest.mark.distributed
def test_bayesurl_benchmark_under_torchrun_two_ranks(tmp_path) -> None:
    from bayesurl.training import load_method_from_checkpoint

    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "bayesurl", "benchmark", "--preset", "smoke", "--methods", ",".join(METHODS),
           "--device", "cpu", "--out", str(out), "--save-checkpoints", "--no-progress",
           *SETS]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rank 0 alone prints: one notice, one table, one closing line
    assert proc.stdout.count("NOTE: --preset smoke") == 1, proc.stdout
    assert proc.stdout.count("bayesurl benchmark: preset smoke") == 1, proc.stdout
    assert proc.stdout.count("total time") == 1, proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoints",
        "recall_vs_rauroc.png",
        "report.html",  # the HTML report (bayesurl.report); per-query records need 1 process
        "results.csv",
        "results.json",
        "runs.json.gz",  # the runs' training curves, beside results.json
        "training_curves.png",  # the one sweep report draws them on the standard split too
    ]
    res = read_results(out)
    assert res["settings"]["world_size"] == 2 and res["settings"]["device"] == "cpu"
    assert [(r["estimator"], r["seed"]) for r in res["runs"]] == [(m, 0) for m in METHODS]
    for rec in res["runs"]:
        name = rec["estimator"]
        assert rec["error"] is None, rec
        run_json = json.loads((out / "checkpoints" / f"{name}_s0" / "result.json").read_text())
        assert run_json["settings"]["world_size"] == 2
        # the trained model evaluated in one process: every metric identical (ECE included)
        cfg = load_recipe(
            f"fashion_mnist/{name}", [("eval.batch_size", 40), ("device", "cpu")], preset="smoke"
        )
        data = build_data(cfg)
        method = load_method_from_checkpoint(
            out / "checkpoints" / f"{name}_s0" / "last.pt", map_location="cpu"
        ).eval()

        def fn(x: torch.Tensor, n: int, method=method):
            return method(x, n_samples=n)

        n = n_samples_for(method.has_distribution, cfg.eval.samples)
        want = score(fn, data.sets, data.transform, n_samples=n, batch_size=40, seed=cfg.seed)
        assert want["n_test"] == 150
        assert (want["ece"] is None) == (name == "ce")
        for k in KEYS:
            assert rec[k] == want[k], (name, k)
            assert run_json["metrics"][k] == want[k], (name, k)


def _torchrun_env(monkeypatch, rank: int) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))


def test_sweep_refuses_non_ddp_estimators_before_anything_runs(monkeypatch, tmp_path) -> None:
    """Every estimator whose fit is not distributed is named in one error; nothing trains."""
    from bayesurl.runs import estimators

    def no_fit(self, *args, **kwargs):
        raise AssertionError("an estimator was fitted before the refusal")

    monkeypatch.setattr(estimators.MethodEstimator, "fit", no_fit)
    _torchrun_env(monkeypatch, 0)
    with pytest.raises(ValueError, match=r"`estimators` under torchrun") as info:
        run_sweep(["ce", "pvu", "lam_online"], preset="smoke", out=tmp_path / "b", progress=False)
    msg = str(info.value)
    assert "'pvu' (kind 'posthoc')" in msg and "'lam_online' (kind" not in msg
    assert "'ce' (kind" not in msg and "distributed ones here: ce,lam_online" in msg
    assert not D.is_distributed() and not (tmp_path / "b").exists()


def test_cli_benchmark_refusals_under_torchrun(monkeypatch, tmp_path, capsys) -> None:
    """The default list (post-hoc estimators included), for the single-split sweep and the stored
    protocol alike, and the protocol's `--worker` / `--tune`: refused before anything runs."""
    _torchrun_env(monkeypatch, 0)
    out = tmp_path / "b"
    db = ["--storage", f"sqlite:///{out}/sweep.db"]
    for argv in (["--preset", "smoke"], ["--preset", "smoke", *db]):
        assert main(["benchmark", *argv, "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        for name in ("pvu", "tau_posthoc", "laplace_ce"):
            assert f"'{name}' (kind" in err, err
        for name in ("lam_posthoc", "lam_online"):  # LAM trains under DDP through fit
            assert f"'{name}' (kind" not in err, err
    for argv, what in (
        (["--worker", *db], "`--worker`"),
        (["--preset", "smoke", "--tune", "2", *db], "`--tune`"),
    ):
        assert main(["benchmark", *argv, "--methods", "ce", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert what in err and "does not run under torchrun" in err, err
    assert not out.exists()  # no storage opened, nothing written


@pytest.mark.parametrize("rank", [0, 1])
def test_sweep_ranks_run_the_same_runs_rank0_alone_writes(monkeypatch, tmp_path, capsys, rank):
    """One group for the whole sweep; every rank runs every run in order; rank 0 writes."""
    import torch.distributed as dist

    from bayesurl.sweeps import pipeline

    _torchrun_env(monkeypatch, rank)
    state = {"group": False, "init": 0, "cleanup": 0}
    calls: list[tuple[str, int, str | None]] = []

    def init_from_env(backend=None, device=None):
        state["group"] = True
        state["init"] += 1
        return D.DistInfo(rank, 2, rank, "gloo", torch.device("cpu"))

    def cleanup():
        state["group"] = False
        state["cleanup"] += 1

    monkeypatch.setattr(D, "init_from_env", init_from_env)
    monkeypatch.setattr(D, "cleanup", cleanup)
    monkeypatch.setattr(D, "is_distributed", lambda group=None: state["group"])
    monkeypatch.setattr(D, "get_rank", lambda group=None: rank if state["group"] else 0)
    monkeypatch.setattr(D, "get_world_size", lambda group=None: 2 if state["group"] else 1)
    monkeypatch.setattr(dist, "all_gather_object", lambda got, obj, group=None: got.__setitem__(
        slice(None), [obj, obj]))  # fmt: skip

    def fake_run(cfg, *, cache=None, out=None, raise_errors=False, **kw):
        assert state["group"], "a run outside the sweep's process group"
        calls.append((cfg.estimator.name, cfg.seed, out and Path(out).name))
        return RunResult(
            estimator=cfg.estimator.name,
            dataset=cfg.dataset,
            split="zero_shot",
            seed=cfg.seed,
            preset=cfg.preset,
            metrics={"r@1": 0.5 + cfg.seed / 10},
            settings={"data": {}},
            timings={},
            main_process=rank == 0,
        )

    monkeypatch.setattr(pipeline, "run", fake_run)
    out = tmp_path / "b"
    argv = ["benchmark", "--preset", "smoke", "--methods", "mcinfonce,ce", "--seeds", "0,1"]
    assert main([*argv, "--out", str(out), "--save-checkpoints"]) == 0
    assert calls == [
        ("mcinfonce", 0, "mcinfonce_s0"),
        ("mcinfonce", 1, "mcinfonce_s1"),
        ("ce", 0, "ce_s0"),
        ("ce", 1, "ce_s1"),
    ]
    assert state == {"group": False, "init": 1, "cleanup": 1}
    printed = capsys.readouterr()
    if rank == 0:
        assert printed.out.count("bayesurl benchmark: preset smoke") == 1
        assert "NOTE" in printed.out and "mcinfonce seed 1: R@1 0.600" in printed.out
        res = read_results(out)
        assert res["settings"]["world_size"] == 2 and len(res["runs"]) == 4
    else:
        assert printed.out == "" and printed.err == ""
        assert not out.exists()

    # a run that failed on some ranks only cannot be recorded: every rank stops
    def split_verdict(got, obj, group=None):
        got[:] = [None, "RuntimeError: boom"]

    monkeypatch.setattr(dist, "all_gather_object", split_verdict)
    with pytest.raises(RuntimeError, match=r"run ce seed 0 failed on rank\(s\) \[1\] only"):
        run_sweep(["ce"], preset="smoke", progress=False)
    assert state["cleanup"] == 2 and not state["group"]


@pytest.mark.distributed
def test_stored_protocol_under_torchrun_two_ranks(tmp_path) -> None:
    """Rank 0 claims each run of the sweep storage and every rank runs it: no run fails (ranks
    claiming different runs met in DDP with different models before), each is done once."""
    pytest.importorskip("optuna")  # the sweep storage's extra (bayesurl[sweep])
    pytest.importorskip("sqlalchemy")
    out = tmp_path / "proto"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "bayesurl", "benchmark", "--preset", "smoke", "--methods", "ce", "--splits", "2",
           "--storage", f"sqlite:///{out}/sweep.db", "--device", "cpu", "--out", str(out),
           *SETS]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("runs planned") == 1, proc.stdout
    assert proc.stdout.count("results written") == 1, proc.stdout
    assert "sweep smoke: 2/2 runs finished (2 here), 0 running elsewhere, 0 failed" in proc.stdout
    res = read_results(out)
    assert sorted(r["key"] for r in res["runs"]) == ["ce/split0/seed0", "ce/split1/seed0"]
    assert res["settings"]["failed_attempts"] == []
    for rec in res["runs"]:
        assert rec["error"] is None and rec["n_test"] == 150, rec  # the smoke preset's cap
        assert isinstance(rec["mixed_r_auroc"], float), rec  # from every rank's rows


@pytest.mark.parametrize("rank", [0, 1])
def test_merge_under_torchrun_rank0_alone(monkeypatch, tmp_path, capsys, rank) -> None:
    from bayesurl.sweeps.results import SweepResults

    run = {"estimator": "ce", "seed": 0, "error": None, "r@1": 0.5, "r_auroc": 0.6}
    SweepResults(runs=[run], settings={"seeds": [0], "preset": "smoke"}).save(tmp_path / "a")
    _torchrun_env(monkeypatch, rank)
    out = tmp_path / "merged"
    assert main(["benchmark", "--merge", str(tmp_path / "a"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / "results.json").is_file() == (rank == 0)
    assert ("merged 1 results" in printed) == (rank == 0)
