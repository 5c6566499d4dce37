"""The one road: ``bayesurl run`` and ``bayesurl benchmark`` give identical metrics for the same
estimator, data and seed (one estimator of each kind), and those metrics are
``bayesurl.evaluate`` on the predicted arrays; OOD AUROC against scikit-learn.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import bayesurl
from bayesurl.cli import main
from bayesurl.runs import load_recipe, n_samples_for, run
from bayesurl.runs.predict import predict
from bayesurl.sweeps import read_results

# one of each kind: registry method (with and without samples), post-hoc wrappers on the CE
# base (PVU, post-hoc TaU, laplace-torch Laplace on the classifier), LAM post-hoc and online
ONE_OF_EACH = ["elk", "ce", "pvu", "tau_posthoc", "laplace_ce", "lam_posthoc", "lam_online"]
KEYS = ("r@1", "r_auroc", "ausc", "ause", "ece", "map@5", "ood_auroc", "ood_auprc")


@pytest.fixture(scope="module")
def smoke_benchmark(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    rc = main(["benchmark", "--preset", "smoke", "--out", str(out), "--no-progress"])
    return rc, read_results(out)


def test_smoke_benchmark_has_every_estimator_with_finite_rauroc(smoke_benchmark, capsys):
    rc, res = smoke_benchmark
    assert rc == 0
    names = res["settings"]["estimators"]
    assert len(names) >= 16
    assert {"pvu", "tau_posthoc", "laplace_ce", "lam_posthoc", "lam_online"} <= set(names)
    for r in res["runs"]:
        assert r["error"] is None, r
        assert math.isfinite(r["r_auroc"]), r["estimator"]


@pytest.mark.parametrize("name", ONE_OF_EACH)
def test_run_and_benchmark_give_identical_metrics(name, smoke_benchmark, tmp_path):
    _, bench = smoke_benchmark
    row = next(r for r in bench["runs"] if r["estimator"] == name)
    out = tmp_path / name
    # the default invocation (progress lines on) against the benchmark's (--no-progress)
    argv = ["run", f"fashion_mnist/{name}", "--preset", "smoke"]
    assert main([*argv, "--out", str(out)]) == 0
    single = json.loads((out / "result.json").read_text())["metrics"]
    for key in KEYS:
        assert single[key] == row[key], (name, key)


@pytest.mark.parametrize("name", ["mcinfonce", "ce", "laplace_ce", "lam_online"])
def test_metrics_are_evaluate_on_the_predicted_arrays(name):
    cfg = load_recipe(f"fashion_mnist/{name}", preset="smoke")
    res = run(cfg, keep_outputs=True)
    out, y = res.outputs["test"]
    samples = out.samples if res.metrics["n_samples"] > 0 else None
    ref = bayesurl.evaluate(out.embedding, y, uncertainties=out.uncertainty, samples=samples)
    for key in ("r@1", "r_auroc", "ausc", "ause", "ece", "map@5"):
        assert res.metrics[key] == ref[key], key
    u_id = res.outputs["id_test"][0].uncertainty.double().numpy()
    u_ood = res.outputs["ood"][0].uncertainty.double().numpy()
    labels = np.r_[np.zeros(len(u_id)), np.ones(len(u_ood))]
    expected = roc_auc_score(labels, np.r_[u_id, u_ood])
    assert res.metrics["ood_auroc"] == pytest.approx(expected, abs=1e-9)
    # the one sampling rule: S draws exactly where a distribution is defined
    has_dist = res.metrics["n_samples"] > 0
    assert (res.metrics["ece"] is not None) == has_dist
    if has_dist:
        assert out.samples.shape[:2] == (cfg.eval.samples, y.shape[0])


def test_run_reports_mixed_r_auroc_and_crop_share():
    """Every metric a benchmark reports, a run reports: the mixed 50/50 R-AUROC (URL App. C.5)
    against loops and scikit-learn on the kept outputs, and URL's crop test on the fitted
    estimator's u of CROP_IMAGES evenly spaced downstream images and their centre crops."""
    from bayesurl.evaluation.url_extra import center_crop_resize
    from bayesurl.runs.data import build_data
    from bayesurl.runs.predict import transformed_inputs
    from bayesurl.runs.runner import CROP_IMAGES

    cfg = load_recipe("fashion_mnist/ce", preset="smoke")
    res = run(cfg, keep_outputs=True)
    (o_t, y_t), (o_i, y_i) = res.outputs["test"], res.outputs["id_test"]
    n = min(len(y_t), len(y_i))
    gen = torch.Generator().manual_seed(0)  # side a: the held-out upstream images
    ia = torch.randperm(len(y_i), generator=gen)[:n].sort().values
    ib = torch.randperm(len(y_t), generator=gen)[:n].sort().values
    emb = torch.nn.functional.normalize(
        torch.cat([o_i.embedding[ia], o_t.embedding[ib]]).double(), dim=1
    )
    side = np.r_[np.zeros(n), np.ones(n)]
    lab = np.r_[y_i[ia].numpy(), y_t[ib].numpy()]
    sims = (emb @ emb.T).numpy()
    np.fill_diagonal(sims, -np.inf)
    nn = sims.argmax(axis=1)
    wrong = (side[nn] != side) | (lab[nn] != lab)
    u = np.r_[o_i.uncertainty[ia].double().numpy(), o_t.uncertainty[ib].double().numpy()]
    assert res.metrics["mixed_r_auroc"] == pytest.approx(roc_auc_score(wrong, u), abs=1e-9)
    # the crop test: share of images whose crop (area U[0.1, 0.75], seed 0) gets a higher u
    n_test = len(y_t)
    idx = torch.linspace(0, n_test - 1, min(CROP_IMAGES, n_test)).round().long().unique()
    images = transformed_inputs(build_data(cfg).sets.test, idx.tolist(), res.transform, "cpu")
    gen = torch.Generator().manual_seed(0)
    area = 0.1 + 0.65 * torch.rand(len(idx), generator=gen, dtype=torch.float64)
    u_full, u_crop = [], []
    with torch.no_grad():
        for lo in range(0, len(idx), 512):  # the check's batches
            xb, ab = images[lo : lo + 512].float(), area[lo : lo + 512]
            u_full.append(res.fitted.predict(xb, 0).uncertainty.double())
            u_crop.append(res.fitted.predict(center_crop_resize(xb, ab), 0).uncertainty.double())
    u_full, u_crop = torch.cat(u_full), torch.cat(u_crop)
    share = float((u_crop > u_full).double().mean())
    assert res.metrics["crop_share"] == pytest.approx(share, abs=1e-12)
    assert res.metrics["crop_spearman"] is not None


def test_sampling_rule():
    assert n_samples_for(True, 7) == 7 and n_samples_for(False, 7) == 0
    with pytest.raises(ValueError, match="n_samples"):
        n_samples_for(True, -1)


def test_predict_is_seeded_without_touching_the_global_state():
    x = torch.randn(10, 3)

    def fn(xb, n):
        return bayesurl.Output(embedding=xb + torch.randn_like(xb), uncertainty=xb[:, 0])

    state = torch.random.get_rng_state()
    a, _ = predict(fn, x, None, batch_size=4, seed=3)
    b, _ = predict(fn, x, None, batch_size=4, seed=3)
    assert torch.equal(a.embedding, b.embedding)
    assert torch.equal(torch.random.get_rng_state(), state)
    with pytest.raises(ValueError, match="batch_size"):
        predict(fn, x, None, batch_size=0)


def test_base_is_trained_once_and_reused(monkeypatch):
    from bayesurl.runs import RunCache
    from bayesurl.runs import estimators as E

    calls = []
    original = E.MethodEstimator.fit

    def counting(self, *args, **kwargs):
        calls.append(self.cfg.estimator.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(E.MethodEstimator, "fit", counting)
    cache = RunCache()
    for name in ("pvu", "tau_posthoc", "laplace_ce"):
        run(load_recipe(f"fashion_mnist/{name}", preset="smoke"), cache=cache)
    assert calls == ["ce"]
    run(load_recipe("fashion_mnist/pvu", ["seed=1"], preset="smoke"), cache=cache)
    assert calls == ["ce", "ce"]  # another seed: another base


def test_rows_that_keep_their_base_embedding_search_once(monkeypatch):
    """PVU, post-hoc TaU and laplace-torch keep the CE net's embedding: one kNN search for
    the four rows, the same metrics as searching each time."""
    from bayesurl.evaluation import NeighborMemo
    from bayesurl.evaluation import evaluator as ev
    from bayesurl.runs import RunCache

    calls = []
    search = ev._search
    monkeypatch.setattr(ev, "_search", lambda *a, **k: calls.append(1) or search(*a, **k))
    hashes = []
    key = NeighborMemo.key
    monkeypatch.setattr(NeighborMemo, "key", staticmethod(lambda *a: hashes.append(1) or key(*a)))
    cache = RunCache()
    names = ("ce", "pvu", "tau_posthoc", "laplace_ce")
    shared = {n: run(load_recipe(f"fashion_mnist/{n}", preset="smoke"), cache=cache) for n in names}
    assert len(calls) == 1
    assert len(hashes) == 4  # each row's embedding hashed once, the miss included
    memo = cache.memos[None]  # not frozen: in memory
    assert (memo.hits, memo.misses) == (3, 1)
    for n in names[1:]:
        alone = run(load_recipe(f"fashion_mnist/{n}", preset="smoke"), neighbor_memo=None)
        for key in KEYS:
            assert shared[n].metrics[key] == alone.metrics[key], (n, key)
    assert len(calls) == 4


def test_eval_metrics_adds_map_at_r_to_a_run_as_a_brute_force_loop_computes_it():
    """``eval.metrics = ["map@r"]`` adds MAP@R and R-precision (Musgrave et al., 2020) to a
    run's defaults, equal to a loop over the kept downstream outputs (float64 cosine, each
    query's R = its class's other members) and to ``evaluate`` on them; without it the run
    reports neither."""
    cfg = load_recipe("fashion_mnist/ce", preset="smoke", overrides=['eval.metrics=["map@r"]'])
    res = run(cfg, keep_outputs=True)
    out, y = res.outputs["test"]
    emb = torch.nn.functional.normalize(out.embedding.double(), dim=1)
    sims = (emb @ emb.T).numpy()
    np.fill_diagonal(sims, -np.inf)
    labels = y.numpy()
    aps, rps = [], []
    for i in range(len(labels)):
        r = int((labels == labels[i]).sum()) - 1
        if r == 0:
            continue
        order = np.argsort(-sims[i], kind="stable")[:r]
        hit = labels[order] == labels[i]
        aps.append(float(np.sum(np.cumsum(hit) / np.arange(1, r + 1) * hit) / r))
        rps.append(float(hit.mean()))
    # float32 search against a float64 loop: near-ties may swap neighbours
    assert res.metrics["map@r"] == pytest.approx(np.mean(aps), abs=1e-4)
    assert res.metrics["r_precision"] == pytest.approx(np.mean(rps), abs=1e-4)
    # and exactly what the evaluator gives on the same outputs (the run's memo reused nothing
    # short of the R neighbours)
    direct = bayesurl.evaluate(out.embedding, y, include=["map@r"], intervals=False)
    assert res.metrics["map@r"] == direct["map@r"]
    assert res.metrics["r_precision"] == direct["r_precision"]
    iv = res.metrics["intervals"]["map@r"]
    assert iv.low <= res.metrics["map@r"] <= iv.high
    plain = run(load_recipe("fashion_mnist/ce", preset="smoke"))
    assert "map@r" not in plain.metrics and "r_precision" not in plain.metrics
    assert plain.metrics["r_auroc"] == res.metrics["r_auroc"]


@pytest.mark.parametrize(
    "value, message",
    [
        ('["map@q"]', "`eval.metrics`: unknown metric 'map@q'"),
        ('"map@r"', "`eval.metrics` must be a list"),
    ],
)
def test_eval_metrics_refuses_a_bad_value_naming_the_key(value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_recipe("fashion_mnist/ce", preset="smoke", overrides=[f"eval.metrics={value}"])
