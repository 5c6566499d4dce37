"""``benchmarks/gpu_check.py --device cpu --dry-run``: every road of the GPU check runs at
small sizes on the CPU against its CPU reference, so the one command a GPU machine gets
cannot rot between the times one is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bayesurl.posthoc.base import wrapper_names

REPO = Path(__file__).resolve().parents[1]


def test_dry_run_every_road_ran_and_agrees(tmp_path: Path) -> None:
    out, js = tmp_path / "gpu_check.txt", tmp_path / "rows.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu"]
    cmd += ["--dry-run", "--out", str(out), "--json", str(js), "--work", str(tmp_path / "w")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    rows = json.loads(js.read_text()) if js.exists() else []
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    roads = {r["road"]: r for r in rows}
    expected = [
        "exact pass N=200",
        "exact pass N=300",
        "benchmark pretrained_smoke",
        "train amp=bf16",
        "train amp=off",
        "train checkpoint",
        *(f"wrap {name}" for name in wrapper_names()),
        "folder 40 images",
        "report",
        "sampled ECE S=6",
        "torchrun 2 ranks",
    ]
    assert sorted(roads) == sorted(expected)
    for name in expected:
        row = roads[name]
        assert row["status"] == "ran", (name, row["reason"])
        assert row["wall"] is not None and row["wall"] >= 0
        assert row["peak_mib"] is None  # no GPU
        if name not in ("train checkpoint", "report"):
            assert row["agrees"] is True, (name, row["agreement"])
    # the exact pass compared every variant's neighbours, the fused one included
    note = roads["exact pass N=200"]["note"]
    assert "neighbours equal: fused True, unfused bf16 True, float32 True" in note
    assert "x bf16 GEMM" in note and "kernel configs" in note
    text = out.read_text()
    assert "no GPU used" in text and "agreement" in text
    assert all(name in text for name in expected)
