"""LAM Table 2 driver: config validation, a tiny resumable run, the summary table."""

from __future__ import annotations

import json
import math

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
    assert len((tmp_path / "table.csv").read_text().splitlines()) == 1 + 6  # no kron rows run
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text("[table2]\nseeds = [0, 1]\n")
    (tmp_path / "table.md").unlink()
    t2.main([str(cfg_file), "--out", str(tmp_path), "--summarize"])  # command line, no training
    assert "lam_online" in (tmp_path / "table.md").read_text()


def test_kron_rows_run_and_give_finite_metrics(tmp_path, monkeypatch):
    """``lam_posthoc_kron`` / ``lam_online_kron`` fit an EKFAC posterior (not the diagonal)."""
    monkeypatch.setattr(t2, "load_data", _fake_data)
    threads = torch.get_num_threads()
    cfg = t2.Table2Config(
        seeds=[0], rows=["lam_posthoc", "lam_online", "lam_posthoc_kron", "lam_online_kron"],
        epochs=1,
        online_epochs=1, batch_size=32, online_batch_size=32, eval_samples=3, chunk=16,
    )  # fmt: skip
    try:
        t2.run_table2(cfg, tmp_path)
    finally:
        torch.set_num_threads(threads)
    diag = json.loads((tmp_path / "lam_posthoc_s0.json").read_text())
    assert diag["hessian_structure"] == "diag"
    for row in ("lam_posthoc_kron", "lam_online_kron"):
        d = json.loads((tmp_path / f"{row}_s0.json").read_text())
        assert d["hessian_structure"] == "kron" and d["settings"]["hessian_structure"] == "diag"
        for key in ("map@1", "ood_auroc", "ausc", "ece", "lam_ausc", "lam_ece", "lam_ood_auroc"):
            v = d["metrics"][key]
            assert v is not None and math.isfinite(v), (row, key, v)
    post = json.loads((tmp_path / "lam_posthoc_kron_s0.json").read_text())
    assert "als_iterations" in post["fit_report"][-1]  # the Kronecker fit ran
    # same deterministic model: same retrieval, different posterior (uncertainties differ)
    assert post["metrics"]["map@1"] == diag["metrics"]["map@1"]
    assert post["metrics"]["ood_auroc"] != diag["metrics"]["ood_auroc"]
    online = json.loads((tmp_path / "lam_online_s0.json").read_text())
    online_kron = json.loads((tmp_path / "lam_online_kron_s0.json").read_text())
    assert online_kron["metrics"]["ood_auroc"] != online["metrics"]["ood_auroc"]
    table = t2.summarize(tmp_path)
    assert list(table) == ["lam_posthoc", "lam_online", "lam_posthoc_kron", "lam_online_kron"]
    with pytest.raises(ValueError, match="hessian_structure"):
        t2.Table2Config(hessian_structure="full")
    structured = t2.Table2Config(rows=["lam_posthoc"], hessian_structure="kron")
    assert structured.hessian_structure == "kron"


def _count_pairs_brute(labels, emb, margin):
    """All positive pairs plus the negatives inside the margin, by a double loop."""
    n, count = len(labels), 0
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            if labels[i] == labels[j]:
                count += 1
            elif float((emb[i] - emb[j]).norm()) < margin:
                count += 1
    return count


def test_posthoc_sweep_uses_the_chosen_miner(tmp_path, monkeypatch):
    """Each sweep miner is the one passed to ``fit``; ``all`` counts every pair (brute force)."""
    from pytorch_metric_learning.miners import PairMarginMiner

    from bayesurl.laplace.metric import BaseMetricLaplace

    monkeypatch.setattr(t2, "load_data", _fake_data)
    cfg = t2.Table2Config(seeds=[0], batch_size=64, eval_samples=3, chunk=16, margin=0.7)
    torch.manual_seed(0)
    net = t2.LamConvNet(cfg.latent_dim)
    (tmp_path / "models").mkdir()
    torch.save(net.state_dict(), tmp_path / "models" / "det_s0.pt")
    used = []
    fit = BaseMetricLaplace.fit

    def spy(self, loader, miner=None, **kw):
        used.append(miner)
        return fit(self, loader, miner, **kw)

    monkeypatch.setattr(BaseMetricLaplace, "fit", spy)
    threads = torch.get_num_threads()
    res = t2.posthoc_sweep(
        cfg, tmp_path, 0, priors="1", hessian_scales="1,10", miners="hard,loss,all,lam_triplet",
        max_triplets=50,
    )  # fmt: skip
    assert torch.get_num_threads() == threads  # global state restored
    assert [type(m).__name__ for m in used] == [
        "NoneType", "PairMarginMiner", "_AllPairs", "_CappedTriplets"
    ]  # fmt: skip
    assert isinstance(used[1], PairMarginMiner) and used[1].neg_margin == 0.7
    assert [(d["miner"], d["hessian_scale"]) for d in res] == [
        (m, b) for m in ("hard", "loss", "all", "lam_triplet") for b in (1.0, 10.0)
    ]
    # one batch of all 64 training rows: "all" = every positive pair + negatives in the margin
    data = _fake_data(cfg)
    with torch.no_grad():
        emb = torch.nn.functional.normalize(net(data["x_train"]), dim=1)
    expect = _count_pairs_brute(data["y_train"].tolist(), emb, cfg.margin)
    by_miner = {d["miner"]: d for d in res}
    assert by_miner["all"]["n_pairs"] == expect
    # the capped LAM-code triplets: at most 50 triplets, so <= 100 pairs
    assert by_miner["lam_triplet"]["n_pairs"] <= 100
    # hard: one positive and at most one negative per anchor
    assert by_miner["hard"]["n_pairs"] <= 2 * 64
    # the summary: one row per setting, in SWEEP_MINERS order, metrics copied from the JSON
    summary = t2.summarize_sweep(tmp_path)
    assert [(r["miner"], r["hessian_scale"]) for r in summary] == [
        (d["miner"], d["hessian_scale"]) for d in res
    ]
    assert summary[0]["ood_auroc"] == [res[0]["metrics"]["ood_auroc"]]
    md = (tmp_path / "posthoc_sweep.md").read_text().splitlines()
    assert len(md) == 2 + len(res) and "lam_triplet" in md[-1]
    csv = (tmp_path / "posthoc_sweep_display.csv").read_text().splitlines()
    assert len(csv) == 1 + len(res) and csv[0].startswith('"miner","fit batch"')
    # resumable: a second call with the same grid computes nothing new
    n_fits = len(used)
    again = t2.posthoc_sweep(cfg, tmp_path, 0, priors="1", hessian_scales="1,10", miners="all")
    assert len(used) == n_fits and len(again) == len(res)
    with pytest.raises(ValueError, match="miner"):
        t2.posthoc_sweep(cfg, tmp_path, 0, miners="hardest")
    with pytest.raises(ValueError, match="batch"):
        t2.posthoc_sweep(cfg, tmp_path, 0, miners="hard@0")
    # "name@B": that miner fitted with batches of B (a new setting, recorded as such)
    res = t2.posthoc_sweep(cfg, tmp_path, 0, priors="1", hessian_scales="1", miners="hard@32")
    assert (res[-1]["miner"], res[-1]["fit_batch_size"]) == ("hard", 32)
    assert res[-1]["n_pairs"] != by_miner["hard"]["n_pairs"]  # two batches of 32, not one
    with pytest.raises(ValueError, match="hessian_scales"):
        t2.posthoc_sweep(cfg, tmp_path, 0, miners="hard", hessian_scales="0")


def test_aligned_ensemble_undoes_a_rotation_of_a_member():
    """A member whose embedding space is a rotation of member 0's aligns back onto it
    (orthogonal Procrustes); the unaligned ensemble (the LAM code's) does not."""
    torch.manual_seed(0)
    a = t2.LamConvNet(3)
    b = t2.LamConvNet(3)
    b.load_state_dict(a.state_dict())
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():  # z_b = Q z_a for every input
        b.linear.weight.copy_(q @ a.linear.weight)
        b.linear.bias.copy_(q @ a.linear.bias)
    data = _fake_data(None)
    _, _, s = t2._predict_ensemble_aligned([a, b], data["x_test"], data["x_train"], 16)
    za = t2._predict_deterministic(a, data["x_test"], 16)[0]
    torch.testing.assert_close(s[0], za)
    torch.testing.assert_close(s[1], za, atol=1e-5, rtol=1e-5)
    _, _, s_raw = t2._predict_ensemble([a, b], data["x_test"], 16)
    assert float((s_raw[1] - za).norm(dim=1).mean()) > 0.1  # unaligned: a different frame
    # the Procrustes rotation recovers a known rotation
    src = torch.randn(50, 3, dtype=torch.float64)
    r = t2._procrustes(src, src @ q.double())
    torch.testing.assert_close(r, q.double())
