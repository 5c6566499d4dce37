"""CE: cross-entropy on a linear classifier over the embedding, u = softmax entropy.

URL section 4.1 and appendix B.1. This module also holds :class:`ClassifierMethod`, the small
base shared by the classifier-style methods (CE, HET-XL, SNGP, Losspred, Ensemble, MCDropout):
:class:`~bayesurl.methods._embedding.EmbeddingMethod` with a required number of classes.
"""

from __future__ import annotations

import math
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl.heads.classifier import LinearClassifier
from bayesurl.methods._embedding import EmbeddingMethod
from bayesurl.methods.base import register
from bayesurl.types import Output
from bayesurl.uncertainty import softmax_entropy

__all__ = ["CE", "ClassifierMethod"]


class ClassifierMethod(EmbeddingMethod):
    """Shared base of the supervised classifier-style URL methods (not registered itself).

    :class:`~bayesurl.methods._embedding.EmbeddingMethod` (``self.net``, input checks,
    ``hparams``) with a required number of classes ``C >= 2``; subclasses add their head(s)
    and implement ``forward`` / ``training_loss``.

    Parameters
    ----------
    backbone : str or nn.Module
        ``"small_convnet"`` (default), a timm model name (random weights) or any module mapping
        inputs to features ``[N, F]``.
    embed_dim : int or None
        Embedding dimension ``D`` of the linear projection after the backbone (``None``: the
        backbone features are the embedding).
    num_classes : int
        Number of training classes ``C``.
    backbone_kwargs : dict, optional
        Passed to :class:`~bayesurl.heads.embedding.EmbeddingNet` (e.g. ``num_features`` of the
        small conv net, ``probe_input`` for a module without ``num_features``).
    """

    supervised = True
    two_view = False
    needs_classes = True
    min_embed_dim = 1

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int = 5,
        backbone_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(backbone, embed_dim, num_classes, backbone_kwargs)

    def untrained_loss(self) -> float:
        """``ln C``: the cross-entropy of a uniform softmax (Losspred adds a term >= 0)."""
        return math.log(self.num_classes)


@register("ce")
class CE(ClassifierMethod):
    """Cross-entropy baseline (URL section 4.1, appendix B.1).

    ``logits = W e(x) + b`` trained with cross-entropy; ``u(x) = H(softmax(logits))``; the
    embedding is ``e(x)``. No embedding distribution (``samples`` is always ``None``).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`ClassifierMethod`.

    Examples
    --------
    >>> import torch
    >>> m = CE(embed_dim=16, num_classes=3)
    >>> out = m(torch.randn(4, 1, 28, 28))
    >>> out.embedding.shape, out.uncertainty.shape, out.logits.shape
    (torch.Size([4, 16]), torch.Size([4]), torch.Size([4, 3]))
    """

    has_distribution = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int = 5,
        backbone_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(backbone, embed_dim, num_classes, backbone_kwargs)
        self.classifier = LinearClassifier(self.embed_dim, self.num_classes)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Embedding, ``u = H(softmax)``, logits (``n_samples`` is accepted and ignored)."""
        self._check_n_samples(n_samples)
        e = self.embed(x)
        logits = self.classifier(e)
        return Output(embedding=e, uncertainty=softmax_entropy(logits), logits=logits)

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Mean cross-entropy of a batch ``(x, y)`` (URL B.1)."""
        x, y = self._check_labeled(batch)
        return F.cross_entropy(self.classifier(self.embed(x)), y)
