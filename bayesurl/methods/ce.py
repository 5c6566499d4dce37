"""CE: cross-entropy on a linear classifier over the embedding, u = softmax entropy.

URL section 4.1 and appendix B.1. This module also holds :class:`ClassifierMethod`, the small
base shared by the classifier-style methods (CE, HET-XL, SNGP, Losspred, Ensemble, MCDropout):
backbone -> embedding network, input checks, and the JSON-serialisable ``hparams`` record.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_ndim, check_same_length
from bayesurl.heads.classifier import LinearClassifier
from bayesurl.heads.embedding import EmbeddingNet
from bayesurl.methods.base import Method, register
from bayesurl.types import Output
from bayesurl.uncertainty import softmax_entropy

__all__ = ["CE", "ClassifierMethod"]


def _json_backbone(backbone: str | nn.Module) -> str:
    return backbone if isinstance(backbone, str) else f"<module {type(backbone).__name__}>"


class ClassifierMethod(Method):
    """Shared base of the supervised classifier-style URL methods (not registered itself).

    Builds ``self.net = EmbeddingNet(backbone, embed_dim, **backbone_kwargs)`` and validates
    inputs. Subclasses add their head(s) and implement ``forward`` / ``training_loss``.

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

    Attributes
    ----------
    hparams : dict
        The constructor arguments, JSON-serialisable (a module backbone is recorded by its class
        name only), so that a checkpoint can rebuild the method with
        ``bayesurl.methods.create(name, **hparams)``.
    """

    supervised = True
    two_view = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int = 5,
        backbone_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if int(num_classes) != num_classes or num_classes < 2:
            raise ValueError(f"`num_classes` must be an integer >= 2, got {num_classes}")
        self.num_classes = int(num_classes)
        self.net = EmbeddingNet(backbone, embed_dim, **dict(backbone_kwargs or {}))
        self.embed_dim = self.net.embed_dim
        kw = {k: v for k, v in (backbone_kwargs or {}).items() if k != "probe_input"}
        self.hparams: dict[str, Any] = {
            "backbone": _json_backbone(backbone),
            "embed_dim": embed_dim,
            "num_classes": self.num_classes,
            "backbone_kwargs": kw,
        }

    # -- input checks -------------------------------------------------------------------------
    @staticmethod
    def _check_x(x: Any) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"`x` must be a tensor, got {type(x).__name__}")
        if x.ndim < 2 or x.shape[0] < 1:
            raise ValueError(f"`x` must be a non-empty batch [N, ...], got shape {tuple(x.shape)}")
        return x

    @staticmethod
    def _check_n_samples(n_samples: int) -> int:
        if int(n_samples) != n_samples or n_samples < 0:
            raise ValueError(f"`n_samples` must be an integer >= 0, got {n_samples}")
        return int(n_samples)

    def _check_batch(self, batch: Any) -> tuple[Tensor, Tensor]:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise ValueError("`batch` must be a pair (x, y)")
        x, y = batch
        x = self._check_x(x)
        if not isinstance(y, Tensor):
            y = torch.as_tensor(y)
        check_ndim(y, "y", 1)
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(f"`y` must hold integer class labels, got dtype {y.dtype}")
        check_same_length(("x", x), ("y", y))
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise ValueError(
                f"`y` must lie in [0, {self.num_classes}), "
                f"got range [{int(y.min())}, {int(y.max())}]"
            )
        return x, y.long()

    def embed(self, x: Tensor) -> Tensor:
        """Embeddings ``[N, D]`` of a batch (backbone + projection).

        A shape error inside the backbone becomes a :class:`ValueError` naming ``x`` and its
        shape (out-of-memory errors pass through unchanged).
        """
        x = self._check_x(x)
        try:
            return self.net(x)
        except RuntimeError as err:
            if isinstance(err, torch.OutOfMemoryError):
                raise
            raise ValueError(
                f"`x` with shape {tuple(x.shape)} does not fit the backbone "
                f"{type(self.net.backbone).__name__}: {err}"
            ) from err


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
        x, y = self._check_batch(batch)
        return F.cross_entropy(self.classifier(self.embed(x)), y)
