"""Recipes as data: every dataset x estimator table of the TOML files resolves to a
typed config; ``bayesurl run <dataset>/<estimator>`` trains, checkpoints and evaluates; bad
keys, values, names and missing data roots fail with a message naming them (exit status 2).

Moved from tests/test_recipes.py (the 75 recipe scripts are gone). The R@1 written by a run is
checked against a brute-force float64 1-NN over the embeddings of the reloaded checkpoint (an
independent reference: plain Python loops, no library kNN).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bayesurl.cli import main
from bayesurl.runs import build_estimator, config, list_recipes, load_recipe
from bayesurl.runs.config import (
    RECIPE_DIR,
    DataConfig,
    EstimatorConfig,
    RunConfig,
    TrainConfig,
    read_recipe_file,
    tuned_sets,
)
from bayesurl.sweeps.plan import preset_splits, sweep_preset

REPO = Path(__file__).resolve().parents[2]
FOLDER_DATASETS = ["cub", "cars", "sop"]
FMNIST = list_recipes()["fashion_mnist"]
# a smaller smoke than the preset keeps the file under a minute on a small CPU
SMALL = ["--preset", "smoke", "--set", "data.max_train=96", "--set", "data.max_test=60"]
SMALL += ["--set", "train.batch_size=32", "--no-progress"]


def test_every_dataset_and_estimator_table_resolves():
    recipes = list_recipes()
    assert {"fashion_mnist", *FOLDER_DATASETS} <= set(recipes)
    for dataset, names in recipes.items():
        raw = read_recipe_file(dataset)
        # the URL recipes hold every estimator; LAM's closed-set table its own rows
        closed = raw.get("data", {}).get("split") == "closed"
        assert len(names) >= (5 if closed else 16), dataset
        presets = list(raw.get("presets", {}))
        assert "smoke" in presets, dataset
        for name in names:
            for preset in (None, *presets):
                # tuned tables per validation set: a run names its split (and so its table)
                split = []
                if preset is not None and len(tuned_sets(raw, preset, dataset)) > 1:
                    first = preset_splits(sweep_preset(dataset, preset))[0]
                    split = [("data.class_split", first.to_dict())]
                cfg = load_recipe(f"{dataset}/{name}", split, preset=preset)
                assert cfg.estimator.name == name and cfg.dataset == dataset
                build_estimator(cfg)  # checks the method / wrapper / LAM options


def test_no_recipe_stubs_left():
    for folder in (REPO / "examples").iterdir():
        if folder.is_dir() and folder.name != "controlled":
            assert not list(folder.glob("*.py")), folder
    # LAM Table 2 is the recipe fashion_mnist_closed.toml, not a script of its own
    assert not (REPO / "examples" / "fashion_mnist").exists()
    assert not (REPO / "bayesurl" / "experiments" / "lam_table2.py").exists()
    assert not (REPO / "bayesurl" / "recipes.py").exists()
    assert sorted(p.stem for p in RECIPE_DIR.glob("*.toml")) == sorted(list_recipes())


@pytest.mark.parametrize("name", FMNIST)
def test_fashion_mnist_run_smoke(name, tmp_path, capsys):
    out = tmp_path / name
    assert main(["run", f"fashion_mnist/{name}", *SMALL, "--out", str(out)]) == 0
    record = json.loads((out / "result.json").read_text())
    assert record["estimator"] == name and record["dataset"] == "fashion_mnist"
    assert record["preset"] == "smoke" and record["error"] is None
    m = record["metrics"]
    for key in ("r@1", "r_auroc", "ausc", "ood_auroc"):
        assert 0.0 <= m[key] <= 1.0, (key, m[key])
    assert (m["ece"] is None) == (m["n_samples"] == 0)
    ckpt = Path(record["checkpoint"])
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert isinstance(state, dict) and state
    assert f"fashion_mnist/{name} (seed 0, preset smoke)" in capsys.readouterr().out


def _brute_force_r1(emb: torch.Tensor, labels: torch.Tensor) -> float:
    z = torch.nn.functional.normalize(emb.double(), dim=1).tolist()
    y = labels.tolist()
    hits = 0
    for i, zi in enumerate(z):
        best, best_j = -2.0, -1
        for j, zj in enumerate(z):
            if j == i:
                continue
            s = sum(a * b for a, b in zip(zi, zj, strict=True))
            if s > best:
                best, best_j = s, j
        hits += int(y[best_j] == y[i])
    return hits / len(z)


def test_run_r1_matches_brute_force_on_reloaded_checkpoint(tmp_path):
    from bayesurl.data import as_tensors, default_transform
    from bayesurl.runs.data import build_data
    from bayesurl.training import load_method_from_checkpoint

    out = tmp_path / "ce"
    assert main(["run", "fashion_mnist/ce", *SMALL, "--out", str(out)]) == 0
    record = json.loads((out / "result.json").read_text())
    method = load_method_from_checkpoint(out / "last.pt").eval()
    cfg = load_recipe("fashion_mnist/ce", ["data.max_train=96", "data.max_test=60"], preset="smoke")
    x, y = as_tensors(build_data(cfg).sets.test)
    with torch.no_grad():
        emb = method(default_transform(1)(x)).embedding
    assert record["metrics"]["r@1"] == pytest.approx(_brute_force_r1(emb, y), abs=1e-9)


@pytest.mark.parametrize("dataset", FOLDER_DATASETS)
def test_missing_root_is_a_clear_error(dataset, tmp_path, capsys):
    assert main(["run", f"{dataset}/ce", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "data.root" in err and "required" in err
    assert "download" in err.lower() or "get " in err.lower()
    missing = tmp_path / "no_such_folder"
    argv = ["run", f"{dataset}/ce", "--set", f"data.root={str(missing)!r}"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert str(missing) in capsys.readouterr().err
    assert not (tmp_path / "o" / "result.json").exists()


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["train.epochs=0"], "train.epochs"),
        (["train.lr=nan"], "train.lr"),
        (["train.lr=fast"], "train.lr"),
        (["train.optimizer=rmsprop"], "train.optimizer"),
        (["backbone.embed_dim=-3"], "backbone.embed_dim"),
        (["eval.samples=-1"], "eval.samples"),
        (["data.root='/no/such/fmnist'"], "/no/such/fmnist"),
        (["train.epoch=3"], "train.epoch"),
        (["trian.epochs=3"], "trian"),
        (["estimator.kwargs.no_such_option=1"], "no_such_option"),
        (["backbone.name=no_such_net"], "backbone"),
        (["epochs"], "KEY=VALUE"),
    ],
)
def test_bad_overrides_exit_2(overrides, needle, tmp_path, capsys):
    argv = ["run", "fashion_mnist/ce", "--preset", "smoke", "--out", str(tmp_path / "o")]
    for o in overrides:
        argv += ["--set", o]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert not (tmp_path / "o" / "result.json").exists()


def test_unknown_keys_name_the_key_and_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"train\.epoch`.*valid keys of \[train\]: epochs"):
        load_recipe("fashion_mnist/ce", ["train.epoch=3"])
    with pytest.raises(ValueError, match="valid: ce, infonce"):
        load_recipe("fashion_mnist/svm")
    with pytest.raises(ValueError, match="valid: .*fashion_mnist"):
        load_recipe("mnist/ce")
    with pytest.raises(ValueError, match="valid presets: smoke, quick, standard, full"):
        load_recipe("fashion_mnist/ce", preset="huge")
    bad = tmp_path / "mine.toml"
    bad.write_text('[estimators.ce]\nkind = "method"\nlearning_rate = 1.0\n')
    with pytest.raises(ValueError, match=r"estimators\.ce\.learning_rate.*valid keys.*kwargs"):
        load_recipe(f"{bad}/ce")
    bad.write_text("epochs = 3\n[estimators.ce]\n")
    with pytest.raises(ValueError, match="unknown key `epochs` in mine.toml; valid top-level"):
        load_recipe(f"{bad}/ce")
    bad.write_text('[estimators.p]\nkind = "posthoc"\nwrapper = "pvu"\nbase = "nothing"\n')
    with pytest.raises(ValueError, match="base"):
        load_recipe(f"{bad}/p")


def test_overrides_are_typed_and_reach_the_config():
    cfg = load_recipe(
        "fashion_mnist/pvu",
        [
            "train.epochs=5",
            "estimator.fit.epochs=3",
            "seed=4",
            "backbone.kwargs.width=8",
            "data.max_train=none",
        ],
        preset="quick",
    )
    assert cfg.train.epochs == 5 and cfg.seed == 4 and cfg.data.max_train is None
    assert cfg.estimator.fit == {"epochs": 3, "lr": 1e-3}
    assert cfg.backbone.kwargs == {"width": 8}
    # the base (CE) shares data / train / seed overrides but not the estimator's own
    assert cfg.base is not None and cfg.base.estimator.name == "ce"
    assert cfg.base.train.epochs == 5 and cfg.base.seed == 4 and cfg.base.estimator.fit == {}


@pytest.fixture(scope="module")
def fake_cub(tmp_path_factory):
    """A CUB-200-2011 folder layout with two random 12 x 12 JPEGs per class."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("cub")
    base = root / "CUB_200_2011"
    rng = np.random.default_rng(0)
    images, labels, classes = [], [], []
    idx = 1
    for c in range(1, 201):
        classes.append(f"{c} {c:03d}.bird")
        (base / "images" / f"{c:03d}.bird").mkdir(parents=True)
        for k in range(2):
            rel = f"{c:03d}.bird/{k}.jpg"
            pixels = (rng.random((12, 12, 3)) * 255).astype("uint8")
            Image.fromarray(pixels).save(base / "images" / rel)
            images.append(f"{idx} {rel}")
            labels.append(f"{idx} {c}")
            idx += 1
    (base / "images.txt").write_text("\n".join(images) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (base / "classes.txt").write_text("\n".join(classes) + "\n")
    return root


@pytest.mark.parametrize("name", ["ce", "mcinfonce", "lam_posthoc", "pvu"])
def test_folder_recipe_runs_on_a_cub_layout(name, fake_cub, tmp_path):
    out = tmp_path / name
    argv = ["run", f"cub/{name}", "--preset", "smoke", "--set", f"data.root={str(fake_cub)!r}"]
    argv += ["--set", "data.image_size=12", "--set", "data.max_train=none"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    record = json.loads((out / "result.json").read_text())
    # classes 1-100, two images each (URL section 3.2 split); RGB crops of 12 px
    assert record["settings"]["data"]["sizes"]["train"] == 200
    assert record["settings"]["data"]["channels"] == 3
    assert 0.0 <= record["metrics"]["r@1"] <= 1.0
    assert Path(record["checkpoint"]).is_file()


def _imagenet_layout(tmp_path, fake_cub):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    for c in range(3):
        folder = tmp_path / "imagenet" / "train" / f"n0{c}"
        folder.mkdir(parents=True)
        for k in range(8):
            pixels = (rng.random((14, 14, 3)) * 255).astype("uint8")
            Image.fromarray(pixels).save(folder / f"{k}.JPEG")
    dml = tmp_path / "dml"
    dml.mkdir()
    (dml / "cub").symlink_to(fake_cub, target_is_directory=True)
    return tmp_path / "imagenet", dml


def test_imagenet_recipe_on_an_imagefolder_with_zero_shot_cub(fake_cub, tmp_path):
    root, dml = _imagenet_layout(tmp_path, fake_cub)
    out = tmp_path / "run"
    argv = ["run", "imagenet/ce", "--preset", "smoke", "--no-progress", "--out", str(out)]
    argv += ["--set", f"data.root={str(root)!r}", "--set", f"data.downstream_root={str(dml)!r}"]
    argv += ["--set", "data.image_size=12"]
    assert main(argv) == 0
    record = json.loads((out / "result.json").read_text())
    assert record["settings"]["data"]["sizes"]["train"] == 24
    assert record["settings"]["data"]["upstream_classes"] == [0, 1, 2]
    m = record["metrics"]
    assert set(m["per_set"]) == {"cub"} and m["r@1"] == m["per_set"]["cub"]["r@1"]
    assert 0.0 <= m["r@1"] <= 1.0
    # without the downstream folder the run stops before training, naming the key
    assert main(argv[:-4] + ["--set", f"data.root={str(root)!r}"]) == 2


def test_imagenet_defaults_follow_url_appendix_b():
    # URL appendix B: 16 x 128 accumulated to 2048, 32 epochs, 5 warm-up, LAMB, ResNet-50
    cfg = load_recipe("imagenet/ce")
    t = cfg.train
    assert (t.batch_size * t.grad_accum, t.epochs, t.warmup_epochs) == (2048, 32, 5.0)
    assert t.optimizer == "lamb" and cfg.backbone.name == "resnet50"
    assert load_recipe("imagenet_vit/ce").backbone.name == "vit_medium_patch16_gap_256"
    # lr-base of URL's code appendix (per 256 images) scaled to the aggregated batch
    assert t.lr == pytest.approx(0.0027583475549166764 * 2048 / 256)
    hib = load_recipe("imagenet_vit/hib").train
    assert (hib.batch_size, hib.grad_accum) == (48, 43)
    assert hib.lr == pytest.approx(0.0005920448270870512 * 48 * 43 / 256)
    # "none" in a free-form table is None (TOML has no null)
    assert load_recipe("imagenet/elk").estimator.kwargs["warmup_u"] is None


def test_train_command_takes_a_recipe(tmp_path, capsys):
    out = tmp_path / "t"
    argv = ["train", "--recipe", "fashion_mnist/ce", "--preset", "smoke", "--no-progress"]
    assert main([*argv, "--set", "data.max_train=96", "--out", str(out)]) == 0
    assert "trained ce for 1 epochs" in capsys.readouterr().out
    ck = torch.load(out / "last.pt", weights_only=True)
    assert ck["method"]["kwargs"]["embed_dim"] == 16  # the smoke preset's backbone
    assert main(["train", "--out", str(out)]) == 2
    assert "--recipe" in capsys.readouterr().err


def test_recipe_files_inherit_one_base_table_of_estimators(tmp_path):
    """A file states what differs; the base's tables fill in the rest, kwargs key by key."""
    base = config.tomllib.loads((config.BASE_DIR / "estimators.toml").read_text())["estimators"]
    path = tmp_path / "mine.toml"
    path.write_text(
        'inherit = "estimators"\n[data]\nname = "digits"\n'
        "[estimators.hetxl]\nkwargs = { n_mc = 4 }\n"
        '[estimators.extra]\nmethod = "ce"\nnote = "added"\n'
    )
    tables = read_recipe_file(str(path))["estimators"]
    assert list(tables) == [*base, "extra"]
    assert tables["hetxl"]["kwargs"] == {**base["hetxl"]["kwargs"], "n_mc": 4}
    assert tables["hetxl"]["note"] == base["hetxl"]["note"]
    cfg = load_recipe(f"{path}/pvu")
    assert (cfg.estimator.kind, cfg.estimator.base) == ("posthoc", "ce")
    # the shipped folder-set files hold only their differences
    for name in ("cub", "cars", "sop"):
        text = (config.BASE_DIR.parent / f"{name}.toml").read_text()
        assert text.count("[estimators.") <= 3, name
    path.write_text('inherit = "nosuch"\n[estimators.ce]\n')
    with pytest.raises(ValueError, match="unknown `inherit` 'nosuch'.*valid: estimators"):
        read_recipe_file(str(path))


def test_the_config_checks_name_the_optimizers_and_amp_modes_training_accepts():
    """runs.config keeps its own tuple of the names (it does not import torch through
    training); they must be the names of training's enums, no more and no fewer."""
    from bayesurl.runs import config
    from bayesurl.training import AmpMode
    from bayesurl.training.optim import OptimizerName

    assert set(config.OPTIMIZER_NAMES) == {o.value for o in OptimizerName}
    assert set(config.AMP_MODES) == {a.value for a in AmpMode}


def test_run_config_from_checkpoint_reads_the_backbone_of_the_method():
    """The one config of a run on a trained method: the backbone its hparams name (or the
    small convnet), the method as the estimator unless another is given, range-checked."""
    method = SimpleNamespace(
        name="ce", hparams={"backbone": "small_convnet", "backbone_kwargs": {"width": 8}}
    )
    cfg = RunConfig.from_checkpoint(method, dataset="fashion_mnist")
    assert cfg.estimator == EstimatorConfig(name="ce")
    assert cfg.data == DataConfig(name="fashion_mnist") and cfg.train == TrainConfig()
    assert (cfg.backbone.name, cfg.backbone.kwargs) == ("small_convnet", {"width": 8})
    assert cfg.seed == 0 and cfg.device is None
    bare = RunConfig.from_checkpoint(SimpleNamespace(name="pfe"), dataset="digits", seed=3)
    assert bare.backbone.name == "small_convnet" and bare.backbone.kwargs == {}
    assert bare.estimator.name == "pfe" and bare.seed == 3
    wrapped = EstimatorConfig(name="tau", kind="posthoc", base="ce", wrapper="tau")
    assert RunConfig.from_checkpoint(method, dataset="x", estimator=wrapped).estimator is wrapped
    with pytest.raises(ValueError, match="train.batch_size"):
        RunConfig.from_checkpoint(method, dataset="x", train=TrainConfig(batch_size=0))
