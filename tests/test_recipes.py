"""Recipes (issue 6, section 2): every FashionMNIST recipe runs a smoke training in-process and
writes a loadable checkpoint and a metrics JSON; every recipe script parses its options and
refuses a missing data root with a clear message and exit status 2.

The R@1 written by a recipe is checked against a brute-force float64 1-NN over the embeddings
of the reloaded checkpoint (an independent reference: plain Python loops, no library kNN).
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from bayesurl.recipes import (
    DATASET_CONFIGS,
    RECIPE_DATASETS,
    RECIPE_METHODS,
    URL_IMAGENET_HPARAMS,
    build_parser,
    run_recipe_cli,
)

REPO = Path(__file__).resolve().parents[1]
FOLDER_DATASETS = [d for d in RECIPE_DATASETS if DATASET_CONFIGS[d].needs_root]
# a smaller smoke than --smoke's default keeps the whole file well under a minute on 2 cores
SMOKE = ["--smoke", "--max-train", "96", "--max-test", "60", "--batch-size", "32"]


def _fmnist_available() -> bool:
    from bayesurl.data import find_fashion_mnist

    try:
        find_fashion_mnist()
    except (FileNotFoundError, ValueError):
        return False
    return True


def test_every_method_and_dataset_has_a_script():
    for d in RECIPE_DATASETS:
        for m in RECIPE_METHODS:
            path = REPO / "recipes" / d / f"{m}.py"
            assert path.is_file(), path
            assert f'run_recipe_cli("{m}", "{d}")' in path.read_text(), path


@pytest.mark.parametrize("method", RECIPE_METHODS)
def test_fashion_mnist_recipe_smoke(method, tmp_path, capsys):
    out = tmp_path / method
    argv = [*SMOKE, "--out", str(out), "--no-progress"]
    assert run_recipe_cli(method, "fashion_mnist", argv) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["recipe"] == {"method": method, "dataset": "fashion_mnist", "smoke": True}
    test = record["metrics"]["test"]
    for key in ("r@1", "r_auroc", "ausc", "ood_auroc"):
        assert 0.0 <= test[key] <= 1.0, (key, test[key])
    ckpt = Path(record["checkpoint"])
    assert ckpt.is_file()
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert isinstance(state, dict) and state
    assert f"{method} on fashion_mnist [test]" in capsys.readouterr().out


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


@pytest.mark.skipif(not _fmnist_available(), reason="FashionMNIST not installed")
def test_recipe_r1_matches_brute_force_on_reloaded_checkpoint(tmp_path):
    from bayesurl.data import as_tensors, default_transform, default_zero_shot
    from bayesurl.training import load_method_from_checkpoint

    out = tmp_path / "ce"
    run_recipe_cli("ce", "fashion_mnist", [*SMOKE, "--out", str(out), "--no-progress"])
    record = json.loads((out / "metrics.json").read_text())
    method = load_method_from_checkpoint(out / "last.pt").eval()
    zs = default_zero_shot(max_train=96, max_test=60, max_ood=60, val_fraction=0.0, seed=0)
    x, y = as_tensors(zs.test)
    with torch.no_grad():
        emb = method(default_transform(1)(x)).embedding
    assert record["metrics"]["test"]["r@1"] == pytest.approx(_brute_force_r1(emb, y), abs=1e-9)


@pytest.mark.parametrize("dataset", FOLDER_DATASETS)
@pytest.mark.parametrize("method", RECIPE_METHODS)
def test_missing_root_is_a_clear_error(method, dataset, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        run_recipe_cli(method, dataset, ["--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--root" in err and "required" in err
    assert "download" in err.lower() or "get " in err.lower()
    missing = tmp_path / "no_such_folder"
    with pytest.raises(SystemExit) as exc:
        run_recipe_cli(method, dataset, ["--root", str(missing), "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert str(missing) in capsys.readouterr().err
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.parametrize("dataset", RECIPE_DATASETS)
def test_every_script_answers_help(dataset, monkeypatch, capsys):
    for method in RECIPE_METHODS:
        path = REPO / "recipes" / dataset / f"{method}.py"
        monkeypatch.setattr(sys, "argv", [str(path), "--help"])
        with pytest.raises(SystemExit) as exc:
            runpy.run_path(str(path), run_name="__main__")
        assert exc.value.code == 0
        text = capsys.readouterr().out
        for opt in ("--epochs", "--seed", "--out", "--device", "--root", "--smoke"):
            assert opt in text, (path, opt)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--epochs", "0"], "--epochs"),
        (["--lr", "nan"], "--lr"),
        (["--optimizer", "rmsprop"], "optimizer"),
        (["--embed-dim", "-3"], "embed-dim"),
        (["--eval-samples", "-1"], "eval-samples"),
        (["--root", "/no/such/fmnist"], "/no/such/fmnist"),
    ],
)
def test_bad_options_exit_2(argv, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        run_recipe_cli("ce", "fashion_mnist", [*argv, "--out", str(tmp_path), "--no-progress"])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="method"):
        build_parser("svm", "cub")
    with pytest.raises(ValueError, match="dataset"):
        build_parser("ce", "mnist")


def test_imagenet_defaults_follow_url_appendix_b():
    # URL appendix B: 16 x 128 accumulated to 2048, 32 epochs, 5 warm-up, LAMB, ResNet-50
    args = build_parser("ce", "imagenet").parse_args(["--root", "x"])
    cfg = DATASET_CONFIGS["imagenet"]
    assert (cfg.batch_size * cfg.grad_accum, args.epochs, args.warmup_epochs) == (2048, 32, 5)
    assert args.optimizer == "lamb" and args.backbone == "resnet50"
    assert set(URL_IMAGENET_HPARAMS) == {"resnet50", "vit_medium_patch16_gap_256"}
    for table in URL_IMAGENET_HPARAMS.values():
        assert set(table) == set(RECIPE_METHODS[:11])
        for hp in table.values():
            assert 1e-6 < hp["lr_base"] < 1e-1
            assert hp.get("batch", 128) * hp.get("accum", 16) in (2016, 2048, 2064)


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


@pytest.mark.parametrize("method", ["ce", "mcinfonce", "lam_posthoc", "pvu"])
def test_folder_recipe_runs_on_a_cub_layout(method, fake_cub, tmp_path):
    out = tmp_path / method
    argv = ["--root", str(fake_cub), "--smoke", "--backbone", "small_convnet"]
    argv += ["--image-size", "12", "--out", str(out), "--no-progress"]
    assert run_recipe_cli(method, "cub", argv) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["n_train"] == 200  # classes 1-100, two images each (URL section 3.2 split)
    assert 0.0 <= record["metrics"]["test"]["r@1"] <= 1.0
    assert Path(record["checkpoint"]).is_file()


def test_url_hyperparameters_are_valid_method_arguments():
    from bayesurl.methods import get

    for table in URL_IMAGENET_HPARAMS.values():
        for name, hp in table.items():
            kwargs = hp.get("kwargs", {})
            method = get(name)(backbone="small_convnet", embed_dim=8, num_classes=3, **kwargs)
            for key, value in kwargs.items():
                if key in method.hparams:
                    assert method.hparams[key] == value, (name, key)


def test_imagenet_recipe_on_an_imagefolder_with_zero_shot_cub(fake_cub, tmp_path):
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
    out = tmp_path / "run"
    argv = ["--root", str(tmp_path / "imagenet"), "--downstream-root", str(dml), "--smoke"]
    argv += ["--backbone", "small_convnet", "--image-size", "12", "--embed-dim", "16"]
    assert run_recipe_cli("ce", "imagenet", [*argv, "--out", str(out), "--no-progress"]) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["n_train"] == 24
    assert record["hparams"]["num_classes"] == 3
    # smoke: one micro-batch of at most 64, no accumulation; URL's lr scaled from lr-base
    assert record["hparams"]["grad_accum"] == 1
    assert record["hparams"]["lr"] == pytest.approx(
        URL_IMAGENET_HPARAMS["resnet50"]["ce"]["lr_base"] * 128 * 16 / 256
    )
    assert set(record["metrics"]) == {"cub"}
    assert 0.0 <= record["metrics"]["cub"]["r@1"] <= 1.0
