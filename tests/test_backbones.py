"""bayesurl.backbones: one place builds backbones, reports their input (timm's data config
fields) and loads local weights with ``weights_only=True``; references: timm's own
``resolve_model_data_config`` and the weights saved by the test itself."""

from __future__ import annotations

import pytest
import torch

from bayesurl.backbones import (
    PACKAGED_WEIGHTS,
    SmallConvNet,
    build_backbone,
    data_config,
    load_backbone_weights,
    resolve_backbone,
)


def test_data_config_matches_timm_and_the_small_convnet():
    timm = pytest.importorskip("timm")
    from timm.data import resolve_model_data_config

    ref = resolve_model_data_config(timm.create_model("resnet18", pretrained=False))
    cfg = data_config("resnet18")
    assert cfg.in_chans == 3 and cfg.input_size == tuple(ref["input_size"])
    assert cfg.mean == tuple(ref["mean"]) and cfg.std == tuple(ref["std"])
    small = data_config("small_convnet", width=4, num_features=8)
    assert small.in_chans == 1 and small.input_size == (1, 28, 28)
    assert data_config("small_convnet", in_chans=3).in_chans == 3
    assert data_config("resnet18", in_chans=1).in_chans == 1
    assert data_config(SmallConvNet(in_channels=3)).mean == (0.2860,) * 3


def _registered_backbones() -> list[tuple[str, dict]]:
    """Every backbone bayesurl names: its own, the packaged-weights names, every recipe's."""
    from bayesurl.runs.config import list_recipes, read_recipe_file

    found = {("small_convnet", ()), ("lam_convnet", ()), ("identity", (("num_features", 7),))}
    found |= {(n, ()) for n in PACKAGED_WEIGHTS}
    for dataset in list_recipes():
        raw = read_recipe_file(dataset)
        tables = [raw, *raw.get("presets", {}).values(), *raw["estimators"].values()]
        for t in tables:
            b = t.get("backbone", {})
            if "name" in b:
                found.add((b["name"], tuple(sorted(dict(b.get("kwargs", {})).items()))))
    return [(n, dict(kw)) for n, kw in sorted(found)]


@pytest.mark.parametrize("name, kwargs", _registered_backbones())
def test_data_config_of_a_name_equals_the_built_models(name, kwargs, monkeypatch):
    """A name answers from its configuration, and the answer equals the built module's."""
    pytest.importorskip("timm")
    import bayesurl.backbones as bb

    for chans in (None, 1, 3):
        kw = dict(kwargs) if chans is None else {**kwargs, "in_chans": chans}
        built = data_config(build_backbone(name, **kw)[0])
        with monkeypatch.context() as m:  # nothing may be built to answer
            m.setattr(bb, "build_backbone", None)
            m.setattr(bb, "resolve_backbone", None)
            m.setattr(bb, "_timm_model", None)
            assert data_config(name, **kw, pretrained=True, checkpoint="x.pt") == built, kw


def test_unknown_timm_name_is_a_value_error_naming_backbone():
    with pytest.raises(ValueError, match="`backbone` 'no_such_net'"):
        build_backbone("no_such_net")
    with pytest.raises(ValueError, match="`backbone`"):
        data_config("no_such_net")


def test_local_weights_load_offline(tmp_path):
    torch.manual_seed(0)
    src = SmallConvNet(width=4, num_features=8)
    path = tmp_path / "w.pt"
    torch.save({"state_dict": {**src.state_dict(), "head.weight": torch.zeros(2)}}, path)
    module, dim = build_backbone("small_convnet", width=4, num_features=8, checkpoint=str(path))
    assert dim == 8
    for k, v in src.state_dict().items():
        assert torch.equal(module.state_dict()[k], v), k
    timm_module, _ = resolve_backbone("resnet18")
    with pytest.raises(ValueError, match="backbone.checkpoint.*missing"):
        load_backbone_weights(timm_module, path)
    with pytest.raises(FileNotFoundError, match="backbone.checkpoint"):
        build_backbone("small_convnet", checkpoint=str(tmp_path / "none.pt"))
    bad = tmp_path / "bad.pt"
    bad.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="backbone.checkpoint.*bad.pt"):
        build_backbone("small_convnet", checkpoint=str(bad))
