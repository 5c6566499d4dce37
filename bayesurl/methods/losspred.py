"""Losspred: cross-entropy plus direct prediction of the per-sample loss (URL B.9, eq. 8)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from bayesurl.heads.classifier import LinearClassifier
from bayesurl.losses.losspred import LossPredictor, losspred_loss
from bayesurl.methods._embedding import EmbeddingOptions
from bayesurl.methods.base import register
from bayesurl.methods.ce import ClassifierMethod
from bayesurl.types import Output

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Losspred"]


@register("losspred")
class Losspred(ClassifierMethod):
    """Direct loss prediction (URL section 4.1, appendix B.9, eq. 8).

    A linear classifier on the embedding trained with cross-entropy, and a 3-layer MLP
    ``u(e)`` trained to predict each sample's (detached) cross-entropy:
    ``L = CE + lam * (u - CE_detached)^2``.

    - ``embedding``: ``e(x)``; ``logits``: the classifier's logits;
    - ``uncertainty``: the predicted loss ``u(x) > 0``;
    - ``samples``: none.

    The predictor reads the embedding *with* gradient by default, as URL's code does (its
    uncertainty module is called on the features without ``detach``), so the L2 term also
    trains the backbone; ``detach_input=True`` gives the stop-gradient variant of the
    "pretrained visual uncertainties" follow-up (thesis chapter 5).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods.ce.ClassifierMethod`.
    lam : float
        Weight of the loss-prediction term (URL ResNet-50: 0.04; searched in [0.01, 0.99]).
    hidden_dim : int, optional
        Width of the predictor MLP (default ``max(D, 16)``).
    detach_input : bool
        Stop-gradient between embedding and predictor.
    warmup_u : float, optional
        Warm the predictor's mean output up to this value on the first training batch
        (URL: 0.001 or no warm-up, the default).
    """

    has_distribution = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        lam: float = 0.04,
        hidden_dim: int | None = None,
        detach_input: bool = False,
        warmup_u: float | None = None,
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, **options)
        if not lam >= 0:
            raise ValueError(f"`lam` must be >= 0, got {lam}")
        self.lam = float(lam)
        self.classifier = LinearClassifier(self.embed_dim, self.num_classes)
        self.predictor = LossPredictor(
            self.embed_dim, hidden_dim, detach_input=detach_input, warmup_u=warmup_u
        )
        self.hparams.update(
            lam=lam, hidden_dim=hidden_dim, detach_input=detach_input, warmup_u=warmup_u
        )

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Embedding, predicted loss as ``u``, logits."""
        self._check_n_samples(n_samples)
        e = self.embed(x)
        return Output(embedding=e, uncertainty=self.predictor(e), logits=self.classifier(e))

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """``CE + lam (u - CE_detached)^2`` of a batch ``(x, y)`` (URL B.9, eq. 8)."""
        x, y = self._check_labeled(batch)
        e = self.embed(x)
        if self.training:
            self.predictor.warmup_(e)
        return losspred_loss(self.classifier(e), self.predictor(e), y, self.lam)
