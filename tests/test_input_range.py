"""Images outside the input a backbone declares give one warning naming both ranges.

Crafted inputs: scikit-learn's sample photographs on ``[0, 1]`` normalised with the backbone's
own mean / std (no warning), the same divided by 255 once more (nearly constant: the
old ``plot_6`` mistake) and left on ``[0, 255]`` (far outside), through every road that feeds
a backbone: :func:`build_backbone`'s module, the training forward of ``EmbeddingNet``, the
frozen-feature encoder and a timm model handed to :func:`bayesurl.wrap`.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from bayesurl.backbones import (
    INPUT_CHECK_CALLS,
    Identity,
    build_backbone,
    data_config,
    watch_input_range,
)
from bayesurl.heads.embedding import EmbeddingNet
from bayesurl.posthoc.base import as_encoder

timm = pytest.importorskip("timm")


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    """Two photographs, 64 px, float on [0, 1]."""
    from sklearn.datasets import load_sample_image

    images = [
        torch.tensor(load_sample_image(f)).permute(2, 0, 1) for f in ("china.jpg", "flower.jpg")
    ]
    x = torch.stack(images).float() / 255
    return nn.functional.interpolate(x, size=(64, 64), mode="bilinear", antialias=True)


def _normalise(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    cfg = data_config(module)
    mean = torch.tensor(cfg.mean).view(1, -1, 1, 1)
    std = torch.tensor(cfg.std).view(1, -1, 1, 1)
    return (x - mean) / std


def _ours(record) -> list[str]:
    return [str(w.message) for w in record if "expects inputs in" in str(w.message)]


def _feed(module: nn.Module, *batches: torch.Tensor) -> list[str]:
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        for x in batches:
            module(x)
    return _ours(record)


@pytest.mark.parametrize("name", ["tf_efficientnet_lite0", "resnet18"])
def test_normal_images_give_no_warning(photos, name):
    model, _ = build_backbone(name)
    assert _feed(model.eval(), _normalise(photos, model), _normalise(photos.flip(-1), model)) == []


def test_images_divided_by_255_twice_warn_once_naming_both_ranges(photos):
    model, _ = build_backbone("tf_efficientnet_lite0")
    bad = _normalise(photos / 255, model)
    messages = _feed(model.eval(), bad, bad, bad)
    assert len(messages) == 1
    lo, hi = float(bad.min()), float(bad.max())
    assert -1.0 <= lo < hi < -0.99  # the issue's [-1, -0.992]
    assert "expects inputs in [-1, 1]" in messages[0]
    assert (
        f"got a batch in [{lo:.4g}, {hi:.4g}]" in messages[0] and "nearly constant" in messages[0]
    )
    assert "tf_efficientnet_lite0" in messages[0]


def test_pixels_left_on_0_255_are_far_outside(photos):
    model, _ = build_backbone("resnet18")
    cfg = data_config(model)
    low = min(-m / s for m, s in zip(cfg.mean, cfg.std))
    high = max((1 - m) / s for m, s in zip(cfg.mean, cfg.std))
    messages = _feed(model.eval(), _normalise(photos * 255, model))
    assert len(messages) == 1 and "far outside" in messages[0]
    assert f"[{low:.3g}, {high:.3g}]" in messages[0]


def test_warning_points_at_the_callers_line(photos):
    model, _ = build_backbone("small_convnet", in_chans=3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model(photos * 255)
    ours = [w for w in record if "expects inputs in" in str(w.message)]
    assert len(ours) == 1 and ours[0].filename == __file__


def test_training_forward_and_frozen_features_are_watched(photos):
    from bayesurl.features import FrozenEncoder

    net = EmbeddingNet("small_convnet", embed_dim=8, in_chans=3)
    assert _feed(net, _normalise(photos, net.backbone)) == []
    assert len(_feed(net, photos / 255 / 255, photos / 255 / 255)) == 1
    backbone, _ = build_backbone("tf_efficientnet_lite0")
    frozen = FrozenEncoder(backbone.eval(), nn.Identity(), resolution=32)
    assert len(_feed(frozen, (photos / 255 - 0.5) / 0.5)) == 1


def test_a_timm_model_handed_to_wrap_is_watched_once(photos):
    model = timm.create_model("resnet18", pretrained=False, num_classes=0).eval()
    assert as_encoder(model) is model and as_encoder(model) is model
    hooks = [h for h in model._forward_pre_hooks.values() if type(h).__name__ == "_InputRangeCheck"]
    assert len(hooks) == 1
    assert len(_feed(model, _normalise(photos, model) / 1e3)) == 1


def test_modules_without_a_declared_input_are_not_watched():
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
    assert not watch_input_range(plain) and not plain._forward_pre_hooks
    assert not watch_input_range(Identity(16))
    assert _feed(build_backbone("identity", num_features=16)[0], torch.zeros(4, 16)) == []


def test_only_the_first_calls_are_checked_and_outputs_are_unchanged(photos):
    model, _ = build_backbone("small_convnet", in_chans=3)
    good = _normalise(photos, model)
    assert _feed(model.eval(), *[good] * INPUT_CHECK_CALLS, photos * 255) == []
    ref, _ = build_backbone("small_convnet", in_chans=3)
    ref.load_state_dict(model.state_dict())
    ref._forward_pre_hooks.clear()
    x = good.clone().requires_grad_(True)
    torch.testing.assert_close(model.eval()(x), ref.eval()(x), rtol=0, atol=0)
