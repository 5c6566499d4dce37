"""LAM Table 2 driver: config validation, a tiny resumable run, the summary table."""

from __future__ import annotations

import json

import pytest
import torch

from bayesurl.experiments import lam_table2 as t2


def _fake_data(cfg):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(96) % 4
    x = torch.randn(96, 1, 28, 28, generator=g) * 0.3 + y.view(-1, 1, 1, 1).float()
    return {
        "x_train": x[:64],
        "y_train": y[:64],
        "x_test": x[64:],
        "y_test": y[64:],
        "x_ood": torch.randn(12, 1, 28, 28, generator=g) * 3,
    }


def test_config_validation_names_the_key(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[table2]\nepochs = 1\nbogus = 3\n")
    with pytest.raises(ValueError, match="bogus"):
        t2.load_config(p)
    p.write_text("[other]\n")
    with pytest.raises(ValueError, match="table2"):
        t2.load_config(p)
    with pytest.raises(ValueError, match="rows"):
        t2.Table2Config(rows=["lam_offline"])
    with pytest.raises(ValueError, match="eval_samples"):
        t2.Table2Config(eval_samples=1)
    with pytest.raises(ValueError, match="ensemble_from_seeds"):
        t2.Table2Config(seeds=[0], ensemble_from_seeds=True)
    p.write_text("[table2]\nseeds = [3]\nepochs = 1\n")
    assert t2.load_config(p).seeds == [3]


def test_tiny_run_is_resumable_and_summarised(tmp_path, monkeypatch):
    monkeypatch.setattr(t2, "load_data", _fake_data)
    threads = torch.get_num_threads()
    cfg = t2.Table2Config(
        seeds=[0, 1], epochs=1, online_epochs=1, batch_size=32, online_batch_size=32,
        eval_samples=3, ensemble_from_seeds=True, chunk=16,
    )  # fmt: skip
    try:
        t2.run_table2(cfg, tmp_path)
        files = sorted(p.name for p in tmp_path.glob("*.json"))
        assert "deep_ensemble_s1.json" in files and "deep_ensemble_s0.json" not in files
        assert len(files) == 2 * 5 + 1
        stamp = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.json")}
        t2.run_table2(cfg, tmp_path)  # everything done: nothing rewritten
        assert stamp == {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.json")}
    finally:
        torch.set_num_threads(threads)
    online = json.loads((tmp_path / "lam_online_s0.json").read_text())
    assert online["hessian_min"] >= 0.0  # per-step clamp: the running H is never negative
    for key in ("map@1", "ood_auroc", "ausc", "ece", "lam_ausc", "lam_ece", "lam_ood_auroc"):
        assert online["metrics"][key] is not None
    det = json.loads((tmp_path / "deterministic_s0.json").read_text())
    assert det["metrics"]["ood_auroc"] is None and det["metrics"]["map@1"] is not None
    table = t2.summarize(tmp_path)
    assert table["deep_ensemble"]["seeds"] == [1]
    assert table["lam_online"]["seeds"] == [0, 1]
    md = (tmp_path / "table.md").read_text()
    assert "lam_posthoc" in md and "AUSC (LAM code)" in md
    assert len((tmp_path / "table.csv").read_text().splitlines()) == 1 + 6
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text("[table2]\nseeds = [0, 1]\n")
    (tmp_path / "table.md").unlink()
    t2.main([str(cfg_file), "--out", str(tmp_path), "--summarize"])  # command line, no training
    assert "lam_online" in (tmp_path / "table.md").read_text()
