"""``bayesurl train``: trains a registered method, checkpoints, resumes, fails clearly."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bayesurl.cli import main
from bayesurl.methods import base
from bayesurl.types import Output


class ToyImageCE(base.Method):
    """Flatten -> linear embedding -> linear classifier; CE loss (a stand-in registered method)."""

    def __init__(
        self,
        backbone: str = "small_convnet",
        embed_dim: int = 8,
        num_classes: int = 5,
        scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(49, embed_dim))
        self.cls = nn.Linear(embed_dim, num_classes)
        self.scale = scale

    def forward(self, x, n_samples=0):
        e = self.embed(x.mean(1, keepdim=True))
        logits = self.cls(e)
        p = logits.softmax(-1)
        return Output(F.normalize(e, dim=-1), -(p * p.log()).sum(-1), logits)

    def training_loss(self, batch):
        x, y = batch
        self.seen_shape = tuple(x.shape[1:])
        return F.cross_entropy(self.scale * self.cls(self.embed(x.mean(1, keepdim=True))), y)


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setattr(ToyImageCE, "name", "toy_cli_ce")
    base.METHODS.add("toy_cli_ce", ToyImageCE)
    yield
    base.METHODS.remove("toy_cli_ce")


def test_train_saves_checkpoint_and_resumes(tmp_path, toy_registered, capsys):
    from bayesurl.training import load_method_from_checkpoint

    out = tmp_path / "run"
    argv = [
        "train",
        "--method",
        "toy_cli_ce",
        "--dataset",
        "digits",
        "--subset",
        "120",
        "--batch-size",
        "40",
        "--epochs",
        "2",
        "--lr",
        "1e-2",
        "--embed-dim",
        "8",
        "--method-arg",
        "scale=2.0",
        "--out",
        str(out),
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    assert "trained toy_cli_ce for 2 epochs" in capsys.readouterr().out
    ck = torch.load(out / "last.pt", weights_only=True)
    assert ck["epoch"] == 2 and ck["method"]["name"] == "toy_cli_ce"
    assert ck["method"]["kwargs"]["scale"] == 2.0 and ck["method"]["kwargs"]["embed_dim"] == 8
    summary = json.loads((out / "train.json").read_text())
    assert summary["epochs"] == 2 and len(summary["history"]) == 2
    assert (out / "loss.png").stat().st_size > 1000
    m = load_method_from_checkpoint(out / "last.pt")
    assert isinstance(m, ToyImageCE) and m.scale == 2.0
    assert torch.equal(m.cls.weight, ck["model"]["cls.weight"])

    resume = [*argv[:-5], "--out", str(out), "--resume", str(out / "last.pt"), "--no-progress"]
    # another `epochs` would silently re-plan the schedule: one clear line, exit 2
    capsys.readouterr()
    assert main([*resume, "--epochs", "3", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "epochs: saved 2, now 3" in err
    # the same plan resumes (nothing left to do after 2 of 2 epochs)
    assert main([*resume, "--epochs", "2", "--device", "cpu"]) == 0
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 2


def test_bad_input_exits_2_with_a_clear_message(tmp_path, toy_registered, capsys):
    assert main(["train", "--method", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'nope'" in err and "toy_cli_ce" in err
    assert main(["train", "--method", "toy_cli_ce", "--dataset", "imagenet"]) == 2
    assert "unknown `--dataset` 'imagenet'" in capsys.readouterr().err
    assert main(["train", "--method", "toy_cli_ce", "--resume", str(tmp_path / "x.pt")]) == 2
    assert "x.pt" in capsys.readouterr().err
    assert main(["train", "--method", "toy_cli_ce", "--threads", "0"]) == 2
    assert "`--threads` must be >= 1" in capsys.readouterr().err
    assert main(["train", "--method", "toy_cli_ce", "--epochs", "0"]) == 2
    assert "`--epochs` must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--method", "toy_cli_ce", "--method-arg", "noequals"])


def _fake_cub(root):
    """ROOT/CUB_200_2011 with 200 classes x 2 tiny JPEGs (the standard metadata files)."""
    from PIL import Image

    base = root / "CUB_200_2011"
    imgs, labels, classes, i = [], [], [], 0
    for c in range(1, 201):
        folder = f"{c:03d}.Bird_{c}"
        classes.append(f"{c} {folder}")
        (base / "images" / folder).mkdir(parents=True)
        for k in range(2):
            i += 1
            Image.new("RGB", (20, 16), (c, 255 - c, 40 * k)).save(
                base / "images" / folder / f"{k}.jpg"
            )
            imgs.append(f"{i} {folder}/{k}.jpg")
            labels.append(f"{i} {c}")
    for name, lines in (
        ("images.txt", imgs),
        ("image_class_labels.txt", labels),
        ("classes.txt", classes),
    ):
        (base / name).write_text("\n".join(lines) + "\n")
    return root


def test_train_on_a_folder_dataset(tmp_path, toy_registered, capsys):
    root = _fake_cub(tmp_path / "cub")
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--method",
                "toy_cli_ce",
                "--dataset",
                "cub",
                "--root",
                str(root),
                "--image-size",
                "12",
                "--batch-size",
                "50",
                "--epochs",
                "1",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    ck = torch.load(out / "last.pt", weights_only=True)
    assert ck["method"]["kwargs"]["num_classes"] == 100  # CUB train classes 1-100
    assert ck["global_step"] == 4  # 200 images / 50
    assert main(["train", "--method", "toy_cli_ce", "--dataset", "cub", "--out", str(out)]) == 2
    assert "`--root` is required" in capsys.readouterr().err
