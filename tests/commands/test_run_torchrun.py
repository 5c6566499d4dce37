"""``bayesurl run`` under a real ``torchrun --nproc_per_node 2`` (end to end): the
method trains under DDP, the zero-shot evaluation is sharded, rank 0 alone reports and writes,
and the metrics are those of a single-process evaluation of the trained checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bayesurl.runs import load_recipe, n_samples_for
from bayesurl.runs.data import build_data
from bayesurl.runs.predict import score
from bayesurl.runs.runner import run

RECIPE = "fashion_mnist/mcinfonce"
# eval.batch_size 40 over 150 test images: 4 batches, rows 0:80 on rank 0 and 80:150 on rank 1
SETS = ["--set", "eval.batch_size=40", "--set", "device=cpu"]


@pytest.mark.distributed
def test_bayesurl_run_under_torchrun_two_ranks(tmp_path) -> None:
    import torch

    from bayesurl.training import load_method_from_checkpoint

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "bayesurl", "run", RECIPE, "--preset", "smoke", "--out", str(out), "--no-progress",
           *SETS]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(f"{RECIPE.replace('/', '.')}") <= 1  # rank 0 alone reports
    assert sum(ln.startswith("  R@1 ") for ln in proc.stdout.splitlines()) == 1, proc.stdout
    res = json.loads((out / "result.json").read_text())
    assert res["settings"]["world_size"] == 2 and res["settings"]["config"]["device"] == "cpu"
    # the same model evaluated in one process: every metric identical (ECE included)
    cfg = load_recipe(RECIPE, [("eval.batch_size", 40), ("device", "cpu")], preset="smoke")
    data = build_data(cfg)
    method = load_method_from_checkpoint(out / "last.pt", map_location="cpu").eval()

    def fn(x: torch.Tensor, n: int):
        return method(x, n_samples=n)

    n = n_samples_for(method.has_distribution, cfg.eval.samples)
    want = score(fn, data.sets, data.transform, n_samples=n, batch_size=40, seed=cfg.seed)
    assert want["ece"] is not None and want["n_test"] == 150
    for k in ("r@1", "r_auroc", "ausc", "ause", "map@5", "ece", "ood_auroc", "ood_auprc"):
        assert res["metrics"][k] == want[k], k


def test_run_refuses_non_ddp_estimators_under_torchrun(monkeypatch, tmp_path) -> None:
    """A post-hoc estimator's fit is not distributed: refused before anything runs."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    cfg = load_recipe("fashion_mnist/pvu", preset="smoke")
    with pytest.raises(ValueError, match="kind 'posthoc'.*not distributed"):
        run(cfg, out=tmp_path)
    assert not (tmp_path / "result.json").exists()
