"""The shared backbone -> embedding projection every URL method is built on.

URL (section 4.1, appendix B) trains every method on a backbone (ResNet-50 with 2048-dim pooled
embeddings, ViT-Medium) and attaches each method's heads to the embedding. This module gives
that piece once: a backbone (timm name, ``"small_convnet"`` or any ``nn.Module``) followed by an
optional linear projection to ``embed_dim`` (e.g. to a small embedding on CPU).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from bayesurl._checks import check_finite, check_int, check_ndim
from bayesurl.backbones import build_backbone

__all__ = ["EmbeddingNet", "build_backbone"]


class EmbeddingNet(nn.Module):
    """Backbone followed by an optional linear projection: ``e(x) = W f(x) + b`` or ``f(x)``.

    The embedding e(x) every URL method builds on (URL appendix B: the backbone's pooled
    features; the projection is optional). The output is *not* normalised, so methods that
    read information from the norm (InfoNCE's ``u = 1/||e(x)||``, docs/concepts/uncertainty.rst)
    keep it.

    Parameters
    ----------
    backbone : str or nn.Module
        ``"small_convnet"``, a timm model name (created with ``num_classes=0`` and random
        weights) or any module mapping inputs to features ``[N, F]``.
    embed_dim : int, optional
        Output dimension D. ``None`` (default) returns the backbone features themselves.
    **backbone_kwargs
        Passed to :func:`build_backbone` (e.g. ``num_features`` of ``SmallConvNet`` or
        ``probe_input`` for a module without a ``num_features`` attribute).

    Attributes
    ----------
    feature_dim : int
        Backbone feature dimension F.
    embed_dim : int
        Output dimension D (``F`` without projection).

    Examples
    --------
    >>> import torch
    >>> net = EmbeddingNet("small_convnet", embed_dim=16)
    >>> net(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 16])
    """

    def __init__(
        self, backbone: str | nn.Module, embed_dim: int | None = None, **backbone_kwargs: Any
    ) -> None:
        super().__init__()
        if embed_dim is not None:
            check_int(embed_dim, "embed_dim", low=1)
        self.backbone, self.feature_dim = build_backbone(backbone, **backbone_kwargs)
        if embed_dim is None:
            self.proj: nn.Module = nn.Identity()
            self.embed_dim = self.feature_dim
        else:
            self.proj = nn.Linear(self.feature_dim, int(embed_dim))
            self.embed_dim = int(embed_dim)

    def features(self, x: Tensor) -> Tensor:
        """Backbone features ``[N, F]`` (checked to be 2-D)."""
        f = self.backbone(x)
        check_ndim(f, "backbone output", 2)
        return f

    def embed_with_features(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Embeddings ``[N, D]`` (unnormalised) and the backbone features ``[N, F]`` they
        project, from one backbone pass (for heads that read the features)."""
        if isinstance(x, Tensor):
            check_finite(x, "x")
        f = self.features(x)
        return self.proj(f), f

    def forward(self, x: Tensor) -> Tensor:
        """Embeddings ``[N, D]`` (unnormalised)."""
        return self.embed_with_features(x)[0]
