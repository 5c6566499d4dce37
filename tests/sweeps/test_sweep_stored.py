"""The sweep engine on class splits with a cheap fake run function: plan, storage, tuning,
results files."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("optuna")

from bayesurl.sweeps.plan import SweepPreset, plan_runs, sweep_preset  # noqa: E402
from bayesurl.sweeps.report import read_results  # noqa: E402
from bayesurl.sweeps.sweep import run_sweep  # noqa: E402
from bayesurl.sweeps.tuning import load_tuned  # noqa: E402

PRESET = SweepPreset("t", splits=4, seeds=(0, 1), storage="stored")
QUALITY = {"ce": 0.0, "a": 0.02, "b": 0.05, "c": 0.10}


def fake_run(params):
    """R-AUROC = 0.55 + the estimator's quality + a split effect; with ``train.lr`` in the
    overrides the R-AUROC peaks at lr = 1e-3 and R@1 falls below 0.1 for lr > 5e-3."""
    est, k, s = params["estimator"], params["split"], params["seed"]
    lr = 1e-3
    for o in params.get("overrides") or []:
        if o.startswith("train.lr="):
            lr = float(o.split("=", 1)[1])
    noise = 0.003 * math.sin(7 * k + 3 * s + len(est))
    penalty = 0.05 * abs(math.log10(lr) + 3)
    return {
        "method": est,
        "split": k,
        "seed": s,
        "r@1": 0.05 if lr > 5e-3 else 0.6 + 0.01 * k,
        "r_auroc": 0.55 + QUALITY.get(est, 0.0) + 0.01 * k + noise - penalty,
        "ood_auroc": 0.7 + QUALITY.get(est, 0.0) + noise,
        "ece": None,
        "total_time": 0.01,
        "seen_overrides": list(params.get("overrides") or []),
        # what its settings were tuned on (the report withholds its verdict words otherwise)
        "tuned_on": params.get("tuned_on") or [],
        "downstream": (params.get("class_split") or {}).get("downstream"),
    }


def test_plan_runs_is_estimators_x_splits_x_seeds():
    plan = plan_runs(["ce", "a"], PRESET)
    assert len(plan) == 2 * 4 * 2
    keys = {(r["estimator"], r["split"], r["seed"]) for r in plan}
    assert len(keys) == 16
    assert plan[0]["class_split"]["upstream"] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="estimators"):
        plan_runs([], PRESET)
    with pytest.raises(ValueError, match="preset"):
        sweep_preset("fashion_mnist", "huge")


def test_stored_sweep_writes_results_and_resumes(tmp_path):
    logs = []
    res = run_sweep(
        list(QUALITY), preset=PRESET, out=tmp_path, run_fn=fake_run, log=logs.append, poll=0.1
    )
    assert res.status["complete"] == 32 and res.done_here == 32
    doc = read_results(tmp_path)
    assert len(doc["runs"]) == 32
    assert all({"estimator", "split", "seed", "r_auroc"} <= set(r) for r in doc["runs"])
    summ = doc["summary"]
    assert summ["c"]["r_auroc"]["n"] == 4  # interval over the 4 splits' seed means
    assert summ["c"]["r_auroc"]["mean"] > summ["ce"]["r_auroc"]["mean"]
    paired = doc["paired_vs_ce"]["r_auroc"]
    assert paired["c"]["verdict"] == "better" and paired["c"]["n"] == 8
    rep = doc["reproducibility"]["r_auroc"]
    assert rep["mean"] == pytest.approx(1.0)  # the fake's ranking is split-independent
    assert "note" in doc["reproducibility"]["r@1"] or doc["reproducibility"]["r@1"]["mean"] is None
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    # (these fake runs keep no intervals: no interval fields beside the metrics)
    assert csv_lines[0].startswith("estimator,split,seed,error,r@1,r_auroc")
    assert len(csv_lines) == 33
    assert (tmp_path / "recall_vs_rauroc.png").stat().st_size > 10_000
    # starting again runs nothing: every run is finished
    calls = []
    again = run_sweep(
        list(QUALITY),
        preset=PRESET,
        out=tmp_path,
        run_fn=lambda p: calls.append(p) or fake_run(p),
        log=logs.append,
    )
    assert calls == [] and again.done_here == 0


def test_smoke_presets_say_so(tmp_path):
    logs = []
    p = SweepPreset("s", splits=2, storage="stored", smoke=True, note="tiny")
    run_sweep(["ce", "a", "b"], preset=p, out=tmp_path, run_fn=fake_run, log=logs.append)
    assert "smoke-scale" in logs[0] and "--preset standard" in logs[0]
    quick, standard = (sweep_preset("fashion_mnist", n) for n in ("quick", "standard"))
    assert quick.smoke and not standard.smoke
    assert (quick.splits, quick.stored) == (0, False) and (standard.splits, standard.stored) == (
        4,
        True,
    )


def test_tune_two_estimators_and_reuse(tmp_path):
    logs = []
    p = SweepPreset("tn", splits=2, seeds=(0,), storage="stored")
    run_sweep(["ce", "a"], preset=p, out=tmp_path, run_fn=fake_run, tune=12, log=logs.append)
    tuned = json.loads((tmp_path / "tuned.json").read_text())
    for est in ("ce", "a"):
        t = tuned[est]
        assert t["trials"] == 12
        lr = t["params"]["train.lr"]
        assert 1e-4 <= lr <= 5e-3  # a discarded (R@1 < 0.1) setting is never chosen
        assert t["r@1"] >= 0.1
    assert tuned["a"]["discarded"] + tuned["ce"]["discarded"] >= 1  # lr > 5e-3 was tried
    doc = read_results(tmp_path)
    for r in doc["runs"]:  # the sweep reused the chosen settings
        assert r["seen_overrides"] == load_tuned(tmp_path)[r["estimator"]]
    # a second --tune with the same N runs no further trials
    n_logs = len(logs)
    run_sweep(["ce", "a"], preset=p, out=tmp_path, run_fn=fake_run, tune=12, log=logs.append)
    assert not any("tune " in line for line in logs[n_logs:])


def test_bad_tuned_file(tmp_path):
    (tmp_path / "tuned.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="tuned"):
        load_tuned(tmp_path)


def test_worker_joins_and_waits_for_a_plan(tmp_path):
    run_sweep(["ce", "a", "b"], preset=PRESET, out=tmp_path, run_fn=fake_run, log=print)
    res = run_sweep(None, preset=PRESET, out=tmp_path, worker=True, run_fn=fake_run, log=print)
    assert res.done_here == 0 and res.status["complete"] == 24
    with pytest.raises(ValueError, match="no runs"):
        run_sweep(
            None,
            preset=PRESET,
            out=tmp_path / "empty",
            worker=True,
            run_fn=fake_run,
            poll=0.05,
            plan_timeout=0.2,
        )


def test_worker_with_the_wrong_preset_is_told_which_sweeps_the_storage_holds(tmp_path):
    run_sweep(["ce", "a"], preset=PRESET, out=tmp_path, run_fn=fake_run)
    other = SweepPreset("other", splits=2, seeds=(0,), storage="stored")
    with pytest.raises(ValueError, match="runs of 't'"):
        run_sweep(None, preset=other, out=tmp_path, worker=True, run_fn=fake_run, plan_timeout=60)


def test_worker_runs_with_the_leads_overrides(tmp_path):
    """A worker started without the lead's --set gets them from each stored run; the
    pipeline applies them first and a worker's own --set after them."""
    from bayesurl.sweeps.options import SweepOptions
    from bayesurl.sweeps.pipeline import PipelineRun

    seen = []

    def record(params):
        seen.append(list(params.get("sweep_overrides", [])))
        return fake_run(params)

    lead = ["train.epochs=3", ("data.max_train", 120)]
    run_sweep(["ce"], preset=PRESET, out=tmp_path, overrides=lead, run_fn=record)
    assert seen and all(s == ["train.epochs=3", ["data.max_train", 120]] for s in seen)
    fn = PipelineRun(
        SweepOptions(overrides=["train.epochs=2"]), preset=sweep_preset("fashion_mnist", "smoke")
    )
    params = {"estimator": "ce", "split": 0, "seed": 0, "sweep_overrides": seen[0]}
    cfg = fn.config(params)
    assert cfg.data.max_train == 120  # the lead's
    assert cfg.train.epochs == 2  # the worker's own, after the lead's
    assert (
        PipelineRun(preset=sweep_preset("fashion_mnist", "smoke")).config(params).train.epochs == 3
    )


def test_pipeline_run_fn_on_a_class_split():
    """The run function on the one pipeline: the run sees the split's classes and data sizes."""
    import bayesurl.runs.runner  # noqa: F401  (a failing import fails, it is not skipped)
    from bayesurl.data.class_splits import class_splits
    from bayesurl.runs.config import load_recipe
    from bayesurl.sweeps.pipeline import PipelineRun

    preset = sweep_preset("fashion_mnist", "smoke")
    max_test = load_recipe("fashion_mnist/ce", preset="smoke").data.max_test
    fn = PipelineRun(preset=preset, device="cpu")
    split = class_splits(2)[1]  # 5-9 upstream, 0-4 downstream
    rec = fn(
        {"estimator": "ce", "split": 1, "seed": 0, "class_split": split.to_dict(), "stage": "final"}
    )
    assert rec["error"] is None
    assert (rec["estimator"], rec["split"], rec["seed"]) == ("ce", 1, 0)
    assert rec["downstream"] == [0, 1, 2, 3, 4] and rec["n_test"] == max_test
    assert 0.0 <= rec["r_auroc"] <= 1.0 and 0.0 <= rec["mixed_r_auroc"] <= 1.0
    # URL's crop test ran on the fitted estimator (a share, not a recorded failure)
    assert rec.get("crop_note") is None and 0.0 <= rec["crop_share"] <= 1.0
    # one loss and one probe-u value per trained epoch
    epochs = json.loads(json.dumps(rec)).get("loss_curve")
    assert epochs is not None and len(epochs) == len(rec["u_curve"]) >= 1
    assert all(math.isfinite(v) for v in epochs + rec["u_curve"])


def test_training_curves_plot(tmp_path):
    from bayesurl.evaluation.plots import plot_training_curves

    recs = [
        {
            "estimator": "a",
            "split": 0,
            "error": None,
            "loss_curve": [2.0, 1.0],
            "u_curve": [1, 0.5],
        },
        {"estimator": "b", "split": 0, "error": None, "loss_curve": [3.0, 2.0, 1.5]},
    ]
    path = plot_training_curves(recs, tmp_path / "c.png")
    assert path is not None and path.stat().st_size > 1000
    assert plot_training_curves([{"estimator": "a", "error": None}], tmp_path / "n.png") is None
    assert not (tmp_path / "n.png").exists()


def test_training_curves_fall_when_the_loss_falls_whatever_its_sign(tmp_path, monkeypatch):
    """A loss below zero (InfoNCE, MCInfoNCE, HIB) that improves is drawn falling, as is a
    positive one and one that crosses zero: read back from the saved figure's lines."""
    import matplotlib.pyplot as plt

    from bayesurl.evaluation.plots import plot_training_curves

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    falling = {
        "negative": [-2.0, -5.0, -7.5, -9.0],
        "positive": [3.0, 1.0, 0.5, 0.2],
        "crossing": [0.3, -1.0, -2.5, -3.0],
    }
    recs = [
        {"estimator": name, "split": k, "error": None, "loss_curve": [v - 0.1 * k for v in c]}
        for name, c in falling.items()
        for k in range(3)
    ]
    rising = [1.0, 2.0, 4.0, 8.0]  # a diverging loss must still be drawn rising
    recs.append({"estimator": "rising", "split": 0, "error": None, "loss_curve": rising})
    assert plot_training_curves(recs, tmp_path / "c.png") is not None
    (fig,) = figures
    drawn = {}
    for ax in fig.axes:
        name, _, what = ax.get_title().partition(": ")
        if what == "training loss":
            drawn[name] = [list(line.get_ydata()) for line in ax.get_lines()]
    assert set(drawn) == {*falling, "rising"}
    for name in falling:
        assert len(drawn[name]) == 4  # three runs and their median
        for ys in drawn[name]:
            assert all(b < a for a, b in zip(ys, ys[1:])), (name, ys)
    assert drawn["rising"] == [rising]


def test_write_results_keeps_failed_runs_apart(tmp_path):
    from bayesurl.sweeps.report import write_results

    recs = [fake_run({"estimator": e, "split": k, "seed": 0}) for e in QUALITY for k in range(4)]
    recs.append({"method": "a", "split": 9, "seed": 0, "error": "RuntimeError: x", "r@1": None})
    paths = write_results(recs, tmp_path, {"preset": "t"})
    doc = json.loads(paths["json"].read_text())
    assert doc["summary"]["a"]["_runs"] == {"ok": 4, "failed": 1}
    assert doc["summary"]["a"]["r_auroc"]["n"] == 4  # the failed run is not averaged
    assert len(doc["runs"]) == 17 and paths["png"].is_file()


def test_best_free_baseline_is_the_one_with_the_higher_r_auroc():
    from bayesurl.sweeps.report import best_free_baseline

    summary = {
        "ce": {"r_auroc": {"mean": 0.9}},
        "feature_norm": {"r_auroc": {"mean": 0.61}},
        "feature_knn": {"r_auroc": {"mean": 0.64}},
    }
    assert best_free_baseline(summary) == "feature_knn"
    summary["feature_knn"]["r_auroc"]["mean"] = None
    assert best_free_baseline(summary) == "feature_norm"
    assert best_free_baseline({"ce": {"r_auroc": {"mean": 0.5}}}) is None
