"""LAM Table 2 as a recipe (``fashion_mnist_closed.toml``): LAM rows that start from the
deterministic row's net, LAM's fixed prior, and the resumable sweep.

Replaces tests/experiments/test_lam_table2.py (the stand-alone driver is gone): its kron-row
smoke is the sweep below; resuming is the stored sweep's (``--storage``, tested with the
engine in tests/runs/); the post-hoc sweep and the aligned ensemble left with the driver.

References: the base net's own weights and outputs (the LAM posterior mean must be them),
the recipe's prior precision, and the recorded ``result.json`` files.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from bayesurl.runs import load_recipe
from bayesurl.runs.runner import RunCache, run
from bayesurl.sweeps.sweep import run_sweep

ROWS = ["deterministic", "mc_dropout", "hib", "lam_posthoc", "lam_online", "lam_posthoc_kron"]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """The recipe's rows at the smoke preset, one seed, checkpoints and result.json kept."""
    torch.set_num_threads(1)
    ckpt = tmp_path_factory.mktemp("lam_table") / "checkpoints"
    res = run_sweep(
        ROWS, dataset="fashion_mnist_closed", preset="smoke", seeds=(0,), progress=False,
        checkpoint_dir=ckpt, raise_errors=True,
    )  # fmt: skip
    return res, ckpt


def test_every_row_runs_with_finite_metrics(table):
    res, _ = table
    rows = {r["estimator"]: r for r in res.runs}
    assert list(rows) == ROWS and not any(r["error"] for r in rows.values())
    for name, r in rows.items():
        for key in ("map@1", "map@5", "map@10", "ood_auroc", "ood_auprc", "ausc"):
            assert math.isfinite(r[key]), (name, key)
        # ECE where there is an embedding distribution (the sampling rule)
        assert (r["ece"] is None) == (name == "deterministic")


def test_lam_rows_start_from_the_deterministic_net(table):
    _, ckpt = table

    def metrics(name):
        return json.loads((ckpt / f"{name}_s0" / "result.json").read_text())["metrics"]

    # post-hoc LAM's mean embedding is the deterministic net's (evaluated in the posterior's
    # float64, so a near tie may flip): the same retrieval
    det = metrics("deterministic")
    for name in ("lam_posthoc", "lam_posthoc_kron"):
        for key in ("r@1", "map@1", "map@5", "map@10"):
            assert metrics(name)[key] == pytest.approx(det[key], abs=2e-3), (name, key)


def test_hib_row_reads_kappa_linearly_from_the_conv_features(table):
    """The hib row is LAM's HIB: ``kappa = softplus(Linear(1600 -> 1)(h)) + 0.01`` of the conv
    features ``h`` before the 3-d embedding layer, no warm-up (the trained checkpoint's own
    weights, the formula in float64)."""
    from bayesurl.training.checkpoint import load_method_from_checkpoint

    _, ckpt = table
    m = load_method_from_checkpoint(ckpt / "hib_s0" / "last.pt").double()
    assert m.hparams["kappa_input"] == "features" and m.hparams["warmup_u"] is None
    (lin,) = list(m.kappa_head.mlp)
    assert (lin.in_features, lin.out_features) == (1600, 1) and m.embed_dim == 3
    x = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        h = m.net.backbone(x)
        out = m(x)
    ref = torch.nn.functional.softplus(h @ lin.weight[0] + lin.bias[0]) + 0.01
    torch.testing.assert_close(out.kappa, ref, rtol=1e-12, atol=0)


def test_posthoc_lam_is_the_base_net_with_a_fixed_prior():
    cfg = load_recipe("fashion_mnist_closed/lam_posthoc", preset="smoke")
    assert cfg.base is not None and cfg.base.estimator.method == "contrastive"
    cache = RunCache(keep={"deterministic"})
    base = run(cfg.base, cache=cache, keep_outputs=True)
    lam = run(cfg, cache=cache, keep_outputs=True)
    net = base.fitted.method.net
    la = lam.fitted.la
    assert la.model is not net  # a copy: the base row stays what it was
    torch.testing.assert_close(la.last_layer.weight, net.proj.weight, rtol=0, atol=0)
    emb_base = base.outputs["test"][0].embedding
    emb_lam = lam.outputs["test"][0].embedding
    torch.testing.assert_close(emb_lam, emb_base, rtol=1e-5, atol=1e-6)
    assert lam.fit["prior_precision"] == pytest.approx(1.0)  # fit.optimize_prior = false
    assert lam.timings["base_fit"] == pytest.approx(base.fit["train_time"])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["estimator.fit.bogus=1"], "fit.bogus"),
        (["estimator.fit.optimize_prior=1"], "optimize_prior"),
    ],
)
def test_lam_fit_options_are_checked(overrides, needle):
    from bayesurl.runs import build_estimator

    cfg = load_recipe("fashion_mnist_closed/lam_online", overrides, preset="smoke")
    with pytest.raises(ValueError, match=needle):
        build_estimator(cfg)


def test_a_method_has_no_base(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(
        '[estimators.a]\nmethod = "contrastive"\n[estimators.b]\nmethod = "ce"\nbase = "a"\n'
    )
    with pytest.raises(ValueError, match="kind 'method' has no `base`"):
        load_recipe(f"{path}/b")


def test_registry_rows_train_at_lams_constant_rate(monkeypatch):
    """The deterministic row trains like LAM's Adam runs: the learning rate of every optimiser
    step is the configured one (a cosine decay to 0 over the two epochs cost about 0.03
    mAP@1 against the committed table)."""
    import bayesurl.training.loop as loop

    seen = []
    real = loop.build_scheduler

    def spy(opt, total, warmup, min_factor):
        sched = real(opt, total, warmup, min_factor)
        seen.append([sched.lr_lambdas[0](t) for t in range(total)])
        return sched

    monkeypatch.setattr(loop, "build_scheduler", spy)
    cfg = load_recipe("fashion_mnist_closed/deterministic", preset="smoke")
    assert cfg.train.min_lr == cfg.train.lr == 1e-3
    run(cfg)
    assert len(seen) == 1 and len(seen[0]) > 1 and all(f == 1.0 for f in seen[0])
    with pytest.raises(ValueError, match="train.min_lr"):
        load_recipe("fashion_mnist_closed/deterministic", ["train.min_lr=-1"], preset="smoke")
