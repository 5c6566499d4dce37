"""A run's config is resolved once, by the plan, in one stated order, and kept with the run.

The references: :func:`~bayesurl.runs.config.load_recipe` called with the override list
written out by hand (the order :func:`~bayesurl.sweeps.plan.resolve_run` states), and the value
each layer of a hand-made recipe sets.
"""

from __future__ import annotations

import json
import lzma
import shutil

import pytest

from bayesurl.runs.config import RunConfig, load_recipe
from bayesurl.sweeps.options import SweepOptions
from bayesurl.sweeps.pipeline import PipelineRun
from bayesurl.sweeps.plan import SweepPreset, plan_sweep, resolve_run, sweep_preset

RECIPE = """
inherit = "estimators"
seed = 3
[data]
name = "fashion_mnist"
[train]
lr = 1.0
epochs = 1
batch_size = 10
[presets.p]
train = { lr = 2.0, epochs = 2, batch_size = 20 }
[presets.p.tuned]
ce = ["train.lr=4.0"]
[estimators.ce]
train = { lr = 3.0, batch_size = 30 }
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "layers.toml"
    path.write_text(RECIPE)
    return str(path)


def test_precedence_is_the_stated_one(recipe):
    """Each layer beats the one below it: run > search > own --set > lead's --set > the
    preset's tuned table > the estimator's table > the preset > the file."""
    p = SweepPreset("p", recipe_preset="p")
    params = {
        "estimator": "ce",
        "seed": 0,
        "sweep_overrides": ["train.lr=5.0", "seed=9", "device=cuda"],
        "overrides": ["train.lr=7.0"],
    }

    def lr(run, **kw):
        return resolve_run(recipe, p, run, device="cpu", **kw).train.lr

    local = ["train.lr=6.0"]
    assert lr(params, overrides=local, tuned={"ce": ["train.lr=8.0"]}) == 7.0
    no_search = {k: v for k, v in params.items() if k != "overrides"}
    assert lr(no_search, overrides=local, tuned={"ce": ["train.lr=8.0"]}) == 8.0
    assert lr(no_search, overrides=local) == 6.0
    assert lr(no_search) == 5.0
    assert lr({"estimator": "ce", "seed": 0}) == 4.0
    assert lr({"estimator": "ce", "seed": 0, "recipe_tuned": False}) == 3.0
    assert lr({"estimator": "ce", "seed": 0}, recipe_tuned=False) == 3.0
    cfg = resolve_run(recipe, p, params, device="cpu")
    assert cfg.train.batch_size == 30 and cfg.train.epochs == 2  # estimator > preset > file
    assert cfg.seed == 0 and cfg.device == "cpu"  # the run's own beat every --set
    assert resolve_run(recipe, SweepPreset("none"), {"estimator": "ce"}).train.epochs == 1
    assert resolve_run(recipe, SweepPreset("none"), {"estimator": "ce"}).seed == 3


@pytest.mark.parametrize("preset", ["quick", "pretrained"])
def test_the_stored_config_equals_what_resolving_gives(preset):
    """Through JSON (as a storage keeps it) and back, for every run of the plan, base rows
    and class splits with tuned sets included."""
    plan = sweep_preset("fashion_mnist", preset)
    plan = SweepPreset(**{**plan.__dict__, "seeds": (0, 1), "splits": min(plan.n_splits, 2)})
    names = ["ce", "pvu", "lam_posthoc"] if preset == "quick" else ["ce", "pvu"]
    sets = ["eval.batch_size=64", ("train.epochs", 1)]
    runs = plan_sweep("fashion_mnist", names, plan, overrides=sets, device="cpu")
    assert len(runs) == len(names) * 2 * max(plan.n_splits, 1)
    pipe = PipelineRun(SweepOptions(overrides=sets), preset=plan, device="cpu")
    for r in json.loads(json.dumps(runs)):
        by_hand = load_recipe(
            f"fashion_mnist/{r['estimator']}",
            [
                "eval.batch_size=64",
                ("train.epochs", 1),
                *([("data.class_split", r["class_split"])] if r["class_split"] else []),
                ("data.stage", "final"),
                ("seed", r["seed"]),
                ("device", "cpu"),
            ],
            preset=plan.recipe_preset,
        )
        assert RunConfig.from_dict(r["config"]) == by_hand
        assert pipe.config(r) == by_hand  # rebuilt from the record, not resolved
        stripped = {k: v for k, v in r.items() if k != "config"}  # a run stored before
        assert pipe.config(stripped) == by_hand


def test_the_pipeline_rebuilds_the_stored_config_and_resolves_only_what_it_adds(monkeypatch):
    from bayesurl.sweeps import pipeline

    plan = sweep_preset("fashion_mnist", "quick")
    (run,) = plan_sweep("fashion_mnist", ["ce"], plan, overrides=["train.epochs=1"])
    calls = []
    monkeypatch.setattr(pipeline, "resolve_run", lambda *a, **k: calls.append(a) or "resolved")
    lead = PipelineRun(SweepOptions(overrides=["train.epochs=1"]), preset=plan, device="cpu")
    assert lead.config(run).train.epochs == 1 and lead.config(run).device == "cpu"
    assert PipelineRun(preset=plan, device="meta").config(run).device == "meta"  # a worker's
    assert calls == []
    # a worker with its own --set, or tuned settings the plan did not have: resolved again
    own = SweepOptions(overrides=["data.root=/x"])
    assert PipelineRun(own, preset=plan).config(run) == "resolved"
    assert PipelineRun(preset=plan, tuned={"ce": ["train.lr=0.1"]}).config(run) == "resolved"
    assert len(calls) == 2


def test_from_dict_checks_what_it_reads():
    cfg = load_recipe("fashion_mnist/pvu", preset="quick")
    assert RunConfig.from_dict(cfg.to_dict()) == cfg and cfg.base is not None
    bad = cfg.to_dict()
    bad["train"]["epochs"] = 0
    with pytest.raises(ValueError, match="train.epochs"):
        RunConfig.from_dict(bad)
    with pytest.raises(ValueError, match="colour"):
        RunConfig.from_dict({**cfg.to_dict(), "colour": 1})
    with pytest.raises(ValueError, match="train.lr"):
        RunConfig.from_dict({**cfg.to_dict(), "train": {"lr": "fast"}})


def test_a_stored_sweep_keeps_the_config_and_an_old_storage_still_resolves(tmp_path):
    optuna = pytest.importorskip("optuna")
    from bayesurl.sweeps.storage import SweepStorage

    plan = sweep_preset("fashion_mnist", "quick")
    runs = plan_sweep("fashion_mnist", ["ce"], plan, device="cpu")
    store = SweepStorage(f"sqlite:///{tmp_path}/new.db", out=tmp_path, sweep="quick")
    store.add_runs(runs)
    claim = store.claim()
    assert claim is not None and claim.params["config"] == runs[0]["config"]
    pipe = PipelineRun(preset=plan, device="cpu")
    assert pipe.config(claim.params) == resolve_run("fashion_mnist", plan, runs[0], device="cpu")
    # a committed storage made before configs were stored: its runs resolve as they did
    old = tmp_path / "old.db"
    with lzma.open("results/clipart/protocol/sweep.db.xz") as src, open(old, "wb") as dst:
        shutil.copyfileobj(src, dst)
    study = optuna.load_study(study_name="sweep:pretrained", storage=f"sqlite:///{old}")
    params = study.trials[0].user_attrs["params"]
    assert "config" not in params
    clipart = SweepOptions(dataset="clipart")
    cfg = PipelineRun(clipart, preset=sweep_preset("clipart", "pretrained")).config(params)
    assert cfg.estimator.name == params["estimator"]
    assert cfg.data.class_split == params["class_split"]
    assert len(SweepStorage(f"sqlite:///{old}", out=tmp_path, sweep="pretrained").records()) > 0
