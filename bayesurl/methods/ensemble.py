"""Ensemble: 10 linear heads on a shared backbone, averaged softmax (URL B.10)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_choice
from bayesurl.heads.ensemble import EnsembleHeads, average_log_probs
from bayesurl.methods._embedding import EmbeddingOptions
from bayesurl.methods.base import register
from bayesurl.methods.ce import ClassifierMethod
from bayesurl.types import Output
from bayesurl.uncertainty import entropy, jensen_shannon

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Ensemble"]

_UNCERTAINTIES = ("entropy", "jsd")


@register("ensemble")
class Ensemble(ClassifierMethod):
    """Shallow deep ensemble (URL section 4.1, appendix B.10).

    ``K`` linear heads share the backbone and embedding; their softmaxes are averaged and the
    average is trained with cross-entropy.

    - ``embedding``: the shared ``e(x)``;
    - ``logits``: log of the averaged softmax;
    - ``uncertainty``: entropy of the average (default) or the Jensen-Shannon divergence between
      the heads (``uncertainty="jsd"``);
    - ``samples``: none. The members differ only after the embedding, so the embedding has no
      distribution (the heads' predictive spread is what ``jsd`` measures).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods.ce.ClassifierMethod`.
    num_heads : int
        Ensemble size (URL: 10).
    uncertainty : {"entropy", "jsd"}
        Which ``u(x)`` to return.
    """

    has_distribution = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        num_heads: int = 10,
        uncertainty: str = "entropy",
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, **options)
        self.uncertainty = check_choice(uncertainty, "uncertainty", _UNCERTAINTIES)
        self.heads = EnsembleHeads(self.embed_dim, self.num_classes, num_heads)
        self.hparams.update(num_heads=num_heads, uncertainty=uncertainty)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Shared embedding, entropy (or JSD) of the pooled predictive, its log-probabilities."""
        self._check_n_samples(n_samples)
        e = self.embed(x)
        member_logits = self.heads(e)
        log_probs = average_log_probs(member_logits)
        if self.uncertainty == "entropy":
            u = entropy(log_probs.exp())
        else:
            u = jensen_shannon(member_logits.softmax(-1))
        return Output(embedding=e, uncertainty=u, logits=log_probs)

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Cross-entropy of the averaged softmax (URL B.10)."""
        x, y = self._check_labeled(batch)
        return F.nll_loss(average_log_probs(self.heads(self.embed(x))), y)
