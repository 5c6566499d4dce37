"""CE: cross-entropy on a linear classifier over the embedding, u = softmax entropy.

URL section 4.1 and appendix B.1. This module also holds :class:`ClassifierMethod`, the small
base shared by the classifier-style methods (CE, HET-XL, SNGP, Losspred, Ensemble, MCDropout):
:class:`~bayesurl.methods._embedding.EmbeddingMethod` with a required number of classes, and
:class:`~bayesurl.methods._embedding.EmbeddingOptions`, the keywords a method passes on to it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl.heads.classifier import LinearClassifier
from bayesurl.methods._embedding import EmbeddingMethod, EmbeddingOptions
from bayesurl.methods.base import register
from bayesurl.types import Output
from bayesurl.uncertainty import softmax_entropy

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["CE", "ClassifierMethod", "EmbeddingOptions"]


class ClassifierMethod(EmbeddingMethod):
    """Shared base of the supervised classifier-style URL methods (not registered itself).

    :class:`~bayesurl.methods._embedding.EmbeddingMethod` (``self.net``, input checks,
    ``hparams``) with a required number of classes ``C >= 2``; subclasses add their head(s)
    and implement ``forward`` / ``training_loss``.

    Parameters
    ----------
    backbone, embed_dim, backbone_kwargs
        See :class:`~bayesurl.methods._embedding.EmbeddingMethod`.
    num_classes : int
        Number of training classes ``C`` (default 5).
    """

    supervised = True
    two_view = False
    needs_classes = True
    min_embed_dim = 1

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        num_classes: int = 5,
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, num_classes=num_classes, **options)

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
        self, backbone: str | nn.Module = "small_convnet", **options: Unpack[EmbeddingOptions]
    ) -> None:
        super().__init__(backbone, **options)
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
