"""MCDropout with dropout in the head only: one backbone pass, 10 head passes (URL B.11)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_choice
from bayesurl.heads.dropout import MCDropoutHead
from bayesurl.heads.ensemble import average_log_probs
from bayesurl.methods._embedding import EmbeddingOptions
from bayesurl.methods.base import register
from bayesurl.methods.ce import ClassifierMethod
from bayesurl.types import Output
from bayesurl.uncertainty import entropy, jensen_shannon

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["MCDropout"]

_UNCERTAINTIES = ("entropy", "jsd")


@register("mcdropout")
class MCDropout(ClassifierMethod):
    """MC dropout (URL section 4.1, appendix B.11), with dropout only in the head.

    Dropout acts on the embedding before the linear classifier, in training (one pass, CE) and
    at inference (``n_passes`` masks, softmaxes averaged as in the ensemble). URL drops units
    in the whole network and pays ten backbone passes (3.5x CE inference, URL C.7); here the
    backbone runs once and the passes are one batched product in the head.

    - ``embedding``: ``e(x)``, the mean of the dropped-out embeddings;
    - ``logits``: log of the averaged softmax over the passes;
    - ``uncertainty``: its entropy (default) or the JSD between passes (``"jsd"``);
    - ``samples``: ``n_samples`` dropped-out embeddings ``[S, N, D]`` (the pre-classifier
      representation whose variation drives the predictive).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods.ce.ClassifierMethod`.
    p : float
        Dropout rate (URL: 0.087 on ResNet-50, searched in [0.05, 0.25]).
    n_passes : int
        Stochastic passes at inference (URL: 10).
    uncertainty : {"entropy", "jsd"}
        Which ``u(x)`` to return.
    """

    has_distribution = True

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        p: float = 0.1,
        n_passes: int = 10,
        uncertainty: str = "entropy",
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, **options)
        self.uncertainty = check_choice(uncertainty, "uncertainty", _UNCERTAINTIES)
        self.head = MCDropoutHead(self.embed_dim, self.num_classes, p=p, n_passes=n_passes)
        self.hparams.update(p=p, n_passes=n_passes, uncertainty=uncertainty)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """One backbone pass, ``n_passes`` dropout passes of the head (dropout on in any mode)."""
        n_samples = self._check_n_samples(n_samples)
        e = self.embed(x)
        pass_logits, _ = self.head.sample(e)
        log_probs = average_log_probs(pass_logits)
        if self.uncertainty == "entropy":
            u = entropy(log_probs.exp())
        else:
            u = jensen_shannon(pass_logits.softmax(-1))
        samples = self.head.sample(e, n_samples)[1] if n_samples > 0 else None
        return Output(embedding=e, uncertainty=u, logits=log_probs, samples=samples)

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Cross-entropy of one dropout pass (dropout follows ``self.training``)."""
        x, y = self._check_labeled(batch)
        return F.cross_entropy(self.head(self.embed(x)), y)
