"""Tuned settings committed to a recipe (``[presets.<name>.tuned]``) and the search that
writes them: the search space per kind of estimator, bases first, ``tuned.toml``."""

from __future__ import annotations

import json
import math
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytest.importorskip("optuna")

from bayesurl.data.class_splits import class_splits  # noqa: E402
from bayesurl.runs.config import load_recipe, preset_tuned, read_recipe_file  # noqa: E402
from bayesurl.sweeps.plan import SweepPreset  # noqa: E402
from bayesurl.sweeps.storage import MemoryStore  # noqa: E402
from bayesurl.sweeps.sweep import run_sweep  # noqa: E402
from bayesurl.sweeps.tuning import search_space, tune_estimators, tuned_table  # noqa: E402

RECIPE = """
inherit = "estimators"
[data]
name = "fashion_mnist"
[train]
lr = 1e-3
[presets.p]
train = { epochs = 2 }
[presets.p.tuned]
ce = ["train.lr=0.004"]
pvu = ["estimator.fit.lr=0.0002"]
infonce = ["train.lr=0.0005", "estimator.kwargs.inverse_temperature=30.0"]
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(RECIPE)
    return str(path)


def test_preset_tuned_values_apply_after_the_tables_and_before_set(recipe):
    ce = load_recipe(f"{recipe}/ce", preset="p")
    assert ce.train.lr == pytest.approx(0.004) and ce.train.epochs == 2
    inf = load_recipe(f"{recipe}/infonce", preset="p")
    assert inf.train.lr == pytest.approx(5e-4)
    assert inf.estimator.kwargs["inverse_temperature"] == pytest.approx(30.0)
    # --set wins over the committed value
    assert load_recipe(f"{recipe}/ce", ["train.lr=0.01"], preset="p").train.lr == 0.01
    # without the preset (or in another) the recipe's defaults stay
    assert load_recipe(f"{recipe}/ce").train.lr == pytest.approx(1e-3)


def test_a_posthoc_row_sits_on_its_base_tuned_row(recipe):
    pvu = load_recipe(f"{recipe}/pvu", preset="p")
    ce = load_recipe(f"{recipe}/ce", preset="p")
    assert pvu.estimator.fit["lr"] == pytest.approx(2e-4)
    assert pvu.base is not None and pvu.base.to_dict() == ce.to_dict()
    # an estimator without an entry keeps the defaults, also when its base is tuned
    assert load_recipe(f"{recipe}/elk", preset="p").train.lr == pytest.approx(1e-3)


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ('[presets.p.tuned]\nnosuch = ["train.lr=0.1"]\n', "unknown estimator 'nosuch'"),
        ('[presets.p.tuned]\nce = "train.lr=0.1"\n', "presets.p.tuned.ce"),
        ("[presets.p]\ntuned = 3\n", "presets.p.tuned"),
        ('[presets.p.tuned]\nce = ["train.nosuch=1"]\n', "train.nosuch"),
    ],
)
def test_bad_tuned_tables_name_the_key(tmp_path, table, match):
    path = tmp_path / "bad.toml"
    path.write_text('inherit = "estimators"\n' + table)
    with pytest.raises(ValueError, match=match):
        load_recipe(f"{path}/ce", preset="p")


def test_search_space_follows_the_kind_of_estimator():
    tables = read_recipe_file("fashion_mnist")["estimators"]
    assert search_space("feature_norm", tables["feature_norm"]) == {}
    assert search_space("laplace_ce", tables["laplace_ce"]) == {}  # no fit of its own
    assert set(search_space("pvu", tables["pvu"])) == {"estimator.fit.lr"}
    assert set(search_space("infonce", tables["infonce"])) == {
        "train.lr",
        "estimator.kwargs.inverse_temperature",
    }
    assert set(search_space("lam_online", tables["lam_online"])) == {"train.lr"}


def _fake(seen):
    def run(params):
        seen.append((params["estimator"], list(params["overrides"])))
        lr = fit_lr = 1e-3
        for o in params["overrides"]:
            key, value = o.split("=", 1)
            if key == "train.lr":
                lr = float(value)
            if key == "estimator.fit.lr":
                fit_lr = float(value)
        # peaks at lr = 3e-3 (and at fit.lr = 3e-4 for the wrapper)
        score = 0.7 - 0.05 * abs(math.log10(lr / 3e-3))
        score -= 0.05 * abs(math.log10(fit_lr / 3e-4))
        return {"r@1": 0.5, "r_auroc": score}

    return run


def test_bases_are_tuned_first_and_wrappers_train_on_the_chosen_base(tmp_path):
    tables = read_recipe_file("fashion_mnist")["estimators"]
    seen: list = []
    chosen = tune_estimators(
        ["pvu", "feature_norm", "ce"],
        6,
        _fake(seen),
        MemoryStore(),
        split=class_splits(2)[0],
        out=tmp_path,
        tables=tables,
        preset="p",
        log=lambda s: None,
    )
    order = list(dict.fromkeys(e for e, _ in seen))
    assert order == ["ce", "pvu"]  # feature_norm ran no trial
    ce_own = chosen["ce"]["own"]
    assert len(ce_own) == 1 and ce_own[0].startswith("train.lr=")
    for est, overrides in seen:
        if est == "pvu":  # every wrapper trial sits on the base's chosen rate
            assert overrides[0] == ce_own[0] and overrides[1].startswith("estimator.fit.lr=")
    assert chosen["pvu"]["overrides"] == [*ce_own, *chosen["pvu"]["own"]]
    assert chosen["feature_norm"] == {**chosen["feature_norm"], "own": [], "trials": 0}
    assert chosen["feature_norm"]["skipped"] == "nothing to tune"
    # tuned.toml is the recipe table that reproduces the choice
    text = (tmp_path / "tuned.toml").read_text()
    split = class_splits(2)[0]
    trained = sorted(set(split.upstream) - set(split.val))
    # one sub-table per validation set, naming the classes that scored and trained the search
    table = tomllib.loads(text)["presets"]["p"]["tuned"]
    name = "val_" + "_".join(map(str, split.val))
    assert table == {
        name: {
            "tuned_on": list(split.val),
            "trained_on": trained,
            "ce": ce_own,
            "pvu": chosen["pvu"]["own"],
        }
    }
    saved = json.loads((tmp_path / "tuned.json").read_text())
    assert saved["pvu"]["own"] == table[name]["pvu"]
    assert saved["ce"]["tuned_on"] == list(split.val) and saved["ce"]["trained_on"] == trained
    recipe = tmp_path / "r.toml"
    recipe.write_text('inherit = "estimators"\n[presets.p]\n' + text.split("\n", 1)[1])
    raw = read_recipe_file(str(recipe))
    cs = split.to_dict()
    assert preset_tuned(raw, "p", "r.toml", cs) == {"ce": ce_own, "pvu": chosen["pvu"]["own"]}
    pvu = load_recipe(f"{recipe}/pvu", [("data.class_split", cs)], preset="p")
    assert pvu.base.train.lr == pytest.approx(float(ce_own[0].split("=")[1]))
    assert pvu.tuned_on == list(split.val) and pvu.tuned_trained_on == trained
    # the complement split has the validation classes downstream: no set fits it
    comp = class_splits(2)[1].to_dict()
    with pytest.raises(ValueError, match="downstream class"):
        load_recipe(f"{recipe}/pvu", [("data.class_split", comp)], preset="p")
    assert load_recipe(f"{recipe}/pvu", [("data.class_split", comp)], preset="p", tuned=False)


def test_tuned_table_skips_rows_without_settings():
    text = tuned_table({"a": {"own": [], "trials": 0}, "b": {"own": ["train.lr=0.1"],
                        "r_auroc": 0.61, "trials": 4}}, "x")  # fmt: skip
    assert tomllib.loads(text) == {"presets": {"x": {"tuned": {"b": ["train.lr=0.1"]}}}}
    assert "validation R-AUROC 0.6100, 4 trials" in text


def test_tune_only_plans_nothing(tmp_path):
    seen: list = []
    p = SweepPreset("tn", splits=2, seeds=(0,), storage="stored")
    res = run_sweep(
        ["ce"], preset=p, out=tmp_path, run_fn=_fake(seen), tune=3, tune_only=True,
        log=lambda s: None,
    )  # fmt: skip
    assert res.runs == [] and len(seen) == 3
    assert res.settings["tuned"]["ce"]["trials"] == 3
    assert (tmp_path / "tuned.toml").is_file() and not (tmp_path / "results.json").exists()
    assert res.paths == {f: str(tmp_path / f) for f in ("tuned.json", "tuned.toml")}
    with pytest.raises(ValueError, match="tune_only"):
        run_sweep(["ce"], preset=p, out=tmp_path, run_fn=_fake(seen), tune_only=True)


def test_a_sweep_records_the_settings_its_recipe_commits(recipe):
    res = run_sweep(["ce"], dataset=recipe, preset="p", run_fn=_fake([]), log=lambda s: None)
    (only,) = res.settings["recipe_tuned"]  # one set, its classes not recorded
    assert only["tuned_on"] is None and only["settings"]["ce"] == ["train.lr=0.004"]
    assert set(only["settings"]) == {"ce", "pvu", "infonce"}


def test_untuned_gives_the_recipe_defaults(recipe):
    ce = load_recipe(f"{recipe}/ce", preset="p", tuned=False)
    assert ce.train.lr == pytest.approx(1e-3) and ce.train.epochs == 2  # the preset still
    pvu = load_recipe(f"{recipe}/pvu", preset="p", tuned=False)
    assert pvu.base is not None and pvu.base.train.lr == pytest.approx(1e-3)
    assert "lr" not in pvu.estimator.fit or pvu.estimator.fit["lr"] != pytest.approx(2e-4)
    inf = load_recipe(f"{recipe}/infonce", preset="p", tuned=False)
    assert inf.estimator.kwargs.get("inverse_temperature") != pytest.approx(30.0)


def test_an_untuned_sweep_stamps_its_runs_so_workers_follow(recipe):
    from bayesurl.sweeps.options import SweepOptions
    from bayesurl.sweeps.pipeline import PipelineRun

    params: list = []
    p = SweepPreset("p", recipe_preset="p", splits=0, seeds=(0,))
    res = run_sweep(
        ["ce"], dataset=recipe, preset=p, run_fn=lambda r: params.append(r) or {"r@1": 0.5},
        recipe_tuned=False, log=lambda s: None,
    )  # fmt: skip
    assert [r["recipe_tuned"] for r in params] == [False]
    assert res.settings["recipe_tuned"] == [] and res.settings["recipe_tuned_applied"] is False
    # a worker started without --untuned runs what the lead planned
    worker = PipelineRun(SweepOptions(dataset=recipe), preset=p)
    assert worker.config(params[0]).train.lr == pytest.approx(1e-3)
    assert worker.config({**params[0], "recipe_tuned": True}).train.lr == pytest.approx(4e-3)
    tuned = run_sweep(["ce"], dataset=recipe, preset=p, run_fn=_fake([]), log=lambda s: None)
    assert tuned.settings["recipe_tuned_applied"] is True


def test_benchmark_untuned_reaches_the_sweep(monkeypatch, tmp_path):
    from bayesurl.cli import main
    from bayesurl.sweeps import sweep

    seen = {}

    def fake(estimators, options, **kwargs):
        seen["options"] = options
        raise SystemExit(0)

    monkeypatch.setattr(sweep, "run_sweep", fake)
    with pytest.raises(SystemExit):
        main(["benchmark", "--preset", "smoke", "--untuned", "--out", str(tmp_path)])
    assert seen["options"].recipe_tuned is False
    with pytest.raises(SystemExit):
        main(["benchmark", "--preset", "smoke", "--out", str(tmp_path)])
    assert seen["options"].recipe_tuned is True
