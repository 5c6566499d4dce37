"""Backbones by name: the small conv net of the embedded default or any timm model.

One place builds every backbone (:func:`build_backbone`), reads its feature dimension
(:func:`resolve_backbone`) and reports the input it expects (:func:`data_config`: channels,
mean / std, input size), the way timm's ``resolve_model_data_config`` does for its models
(Wightman, *PyTorch Image Models*, ``timm.data.resolve_model_data_config``). Drivers ask
:func:`data_config` instead of testing backbone names. A local weights file is loaded with
``torch.load(..., weights_only=True)`` (``checkpoint=`` of :func:`build_backbone`); nothing is
downloaded unless a caller passes timm's own ``pretrained=True``.

The backbone is a module mapping images to features ``[N, F]``; URL (Kirchhof et al., 2023,
section 4.1, appendix B) uses a ResNet-50 or ViT-Medium from timm, LAM (Warburg et al., 2023,
section 5) a small conv net on FashionMNIST, which :class:`SmallConvNet` is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from bayesurl._modules import eval_mode

__all__ = [
    "BackboneDataConfig",
    "SmallConvNet",
    "build_backbone",
    "data_config",
    "load_backbone_weights",
    "resolve_backbone",
]

#: Pixel mean / std of the FashionMNIST training images on [0, 1] (the small conv net's input).
_GRAY_MEAN, _GRAY_STD = 0.2860, 0.3530


class SmallConvNet(nn.Module):
    """A four-block conv net for 28 x 28 images (FashionMNIST, upsampled digits).

    Small enough to train eleven methods on two CPU cores in minutes; the LAM paper uses a
    network of this size for its FashionMNIST experiments (LAM section 5).

    Parameters
    ----------
    in_channels : int
        Image channels (1 for grayscale).
    num_features : int
        Output feature dimension F.
    width : int
        Channels of the first block (doubled once).
    dropout : float
        Dropout before the last linear layer (0 disables it).

    Attributes
    ----------
    pretrained_cfg : dict
        ``input_size``, ``mean``, ``std`` of the expected input, in timm's format.
    """

    def __init__(
        self, in_channels: int = 1, num_features: int = 128, width: int = 32, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.num_features = num_features
        c = int(in_channels)
        self.pretrained_cfg: dict[str, Any] = {
            "input_size": (c, 28, 28),
            "mean": (_GRAY_MEAN,) * c,
            "std": (_GRAY_STD,) * c,
        }
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 14
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 7
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(
            nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
            nn.Linear(2 * width, num_features),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


#: backbone names built by bayesurl itself (anything else is a timm model name)
_LOCAL_BACKBONES: dict[str, type[nn.Module]] = {"small_convnet": SmallConvNet}


def load_backbone_weights(module: nn.Module, path: str | os.PathLike[str]) -> nn.Module:
    """Load a local weights file into ``module`` with ``torch.load(..., weights_only=True)``.

    The file holds a state dict, or a dict with one under ``"state_dict"`` / ``"model"``.
    Entries the module does not have (e.g. the classifier of a timm checkpoint, dropped by
    ``num_classes=0``) are ignored; a missing entry is an error.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a readable weights-only state dict or misses a module entry (the
        message names ``backbone.checkpoint``).
    """
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise FileNotFoundError(f"`backbone.checkpoint` {p!r} does not exist")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(
            f"`backbone.checkpoint` {p!r} is not a readable weights-only file: {exc}"
        ) from None
    if isinstance(state, dict):
        for key in ("state_dict", "model"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"`backbone.checkpoint` {p!r} holds no state dict of tensors")
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    if missing:
        raise ValueError(
            f"`backbone.checkpoint` {p!r} does not fit the backbone: missing "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    try:
        module.load_state_dict({k: state[k] for k in own}, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"`backbone.checkpoint` {p!r} does not fit the backbone: {exc}") from None
    return module


def _timm_model(name: str, kwargs: dict[str, Any]) -> nn.Module:
    import timm

    if not timm.is_model(name):
        raise ValueError(
            f"unknown `backbone` {name!r}: neither {', '.join(_LOCAL_BACKBONES)} nor a timm model "
            "name (timm.list_models() lists them)"
        )
    kwargs.setdefault("pretrained", False)
    return timm.create_model(name, num_classes=0, **kwargs)


def resolve_backbone(backbone: str | nn.Module, **timm_kwargs: Any) -> tuple[nn.Module, int]:
    """Return ``(module, feature_dim)`` for a timm model name or an ``nn.Module``.

    A timm name is created with ``num_classes=0`` and random weights (no hub download) unless
    ``checkpoint`` (a local weights file, see :func:`load_backbone_weights`) or timm's
    ``pretrained`` / ``checkpoint_path`` are passed in ``timm_kwargs``. For a plain module the
    feature dimension is read from a ``num_features`` / ``out_features`` attribute, or probed
    with one forward pass of a ``probe_input`` passed in ``timm_kwargs``.

    Raises
    ------
    ValueError
        For an unknown timm name (naming ``backbone``) or a module whose feature dimension
        cannot be found.
    """
    if isinstance(backbone, str):
        kwargs = dict(timm_kwargs)
        kwargs.pop("probe_input", None)
        checkpoint = kwargs.pop("checkpoint", None)
        module = _timm_model(backbone, kwargs)
        if checkpoint:
            load_backbone_weights(module, checkpoint)
        return module, int(module.num_features)
    if not isinstance(backbone, nn.Module):
        raise TypeError(
            f"`backbone` must be a timm model name or an nn.Module, got {type(backbone).__name__}"
        )
    for attr in ("num_features", "out_features", "feature_dim"):
        if isinstance(getattr(backbone, attr, None), int):
            return backbone, int(getattr(backbone, attr))
    probe = timm_kwargs.get("probe_input")
    if probe is None:
        raise ValueError(
            "`backbone` has no `num_features`/`out_features` attribute; pass `probe_input` "
            "(one example batch) so the feature dimension can be measured"
        )
    with eval_mode(backbone), torch.no_grad():
        feats = backbone(probe)
    if feats.ndim != 2:
        raise ValueError(f"`backbone` must return features [N, F], got shape {tuple(feats.shape)}")
    return backbone, int(feats.shape[1])


def build_backbone(backbone: str | nn.Module, **kwargs: Any) -> tuple[nn.Module, int]:
    """Return ``(module, feature_dim)`` for a backbone spec.

    ``"small_convnet"`` builds :class:`SmallConvNet` (``kwargs`` go to its constructor;
    ``in_chans`` is accepted as timm spells it); any other string is a timm model name and
    every ``nn.Module`` is used as it is (both through :func:`resolve_backbone`). A
    ``checkpoint`` keyword loads local weights (:func:`load_backbone_weights`).

    Parameters
    ----------
    backbone : str or nn.Module
        The backbone or its name.
    **kwargs
        Constructor arguments of ``SmallConvNet``, or timm / ``probe_input`` /
        ``checkpoint`` arguments of :func:`resolve_backbone`.
    """
    if isinstance(backbone, str) and backbone.lower() in _LOCAL_BACKBONES:
        kwargs = dict(kwargs)
        kwargs.pop("probe_input", None)
        checkpoint = kwargs.pop("checkpoint", None)
        if "in_chans" in kwargs:
            kwargs["in_channels"] = kwargs.pop("in_chans")
        module = _LOCAL_BACKBONES[backbone.lower()](**kwargs)
        if checkpoint:
            load_backbone_weights(module, checkpoint)
        return module, int(module.num_features)  # type: ignore[arg-type]
    return resolve_backbone(backbone, **kwargs)


@dataclass(frozen=True)
class BackboneDataConfig:
    """The input a backbone expects (timm's ``resolve_model_data_config`` fields).

    Attributes
    ----------
    in_chans : int
        Image channels.
    mean, std : tuple of float
        Per-channel normalisation on the ``[0, 1]`` scale.
    input_size : tuple of int
        ``(C, H, W)`` the backbone was designed for.
    """

    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    input_size: tuple[int, int, int]


def data_config(backbone: str | nn.Module, **kwargs: Any) -> BackboneDataConfig:
    """Channels, mean / std and input size a backbone expects.

    For a name the backbone is built (random weights, cheap) with ``kwargs``; timm models
    answer through ``timm.data.resolve_model_data_config``, other modules through a
    ``pretrained_cfg`` dict (as :class:`SmallConvNet` has) or the ``in_channels`` of their
    first ``nn.Conv2d`` with ImageNet statistics.

    Raises
    ------
    ValueError
        For an unknown backbone name (naming ``backbone``).
    """
    module = backbone
    if isinstance(backbone, str):
        kwargs = {k: v for k, v in kwargs.items() if k != "checkpoint"}
        module, _ = build_backbone(backbone, **kwargs)
    cfg = getattr(module, "pretrained_cfg", None)
    if not isinstance(cfg, dict) or "mean" not in cfg:
        conv = next((m for m in module.modules() if isinstance(m, nn.Conv2d)), None)
        c = int(conv.in_channels) if conv is not None else 3
        cfg = {"input_size": (c, 224, 224), "mean": (0.485, 0.456, 0.406)[:c]}
        cfg["std"] = (0.229, 0.224, 0.225)[:c]
    elif "architecture" in cfg or "hf_hub_id" in cfg or "url" in cfg:
        from timm.data import resolve_model_data_config

        cfg = resolve_model_data_config(module)
    size = tuple(int(s) for s in cfg["input_size"])
    mean = tuple(float(m) for m in cfg["mean"])
    std = tuple(float(s) for s in cfg["std"])
    conv = next((m for m in module.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is not None and int(conv.in_channels) != size[0]:  # e.g. timm's in_chans=1
        c = int(conv.in_channels)  # statistics averaged over the configured channels
        size = (c, size[1], size[2])
        mean, std = (sum(mean) / len(mean),) * c, (sum(std) / len(std),) * c
    return BackboneDataConfig(
        in_chans=size[0], mean=mean, std=std, input_size=(size[0], size[1], size[2])
    )
