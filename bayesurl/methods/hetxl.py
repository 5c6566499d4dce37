"""HET-XL: heteroscedastic low-rank Gaussian in embedding space, MC softmax (URL B.7, eq. 6)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_choice
from bayesurl.heads.hetxl import HetXLHead
from bayesurl.methods._embedding import EmbeddingOptions
from bayesurl.methods.base import register
from bayesurl.methods.ce import ClassifierMethod
from bayesurl.types import Output
from bayesurl.uncertainty import entropy

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["HetXL"]

_UNCERTAINTIES = ("entropy", "logdet")


@register("hetxl")
class HetXL(ClassifierMethod):
    """HET-XL (URL section 4.1, appendix B.7, eq. 6; Collier et al. 2023).

    Each embedding ``phi(x)`` gets a Gaussian ``N(phi(x), V V^T + diag(d))`` (rank ``R``);
    ``n_mc`` samples are classified by a linear layer with a learnable temperature and their
    softmaxes averaged; the loss is the cross-entropy of that average.

    - ``embedding``: the Gaussian mean ``phi(x)``;
    - ``logits``: log of the MC-averaged softmax (so ``softmax(logits)`` is the predictive);
    - ``uncertainty``: entropy of the predictive (default; URL found it better) or
      ``log det Sigma(x)`` (``uncertainty="logdet"``; the log of URL's ``det Sigma``, same
      ranking, may be negative);
    - ``samples``: ``n_samples`` draws of the embedding Gaussian ``[S, N, D]``.

    The predictive, and hence the entropy, is itself a Monte Carlo estimate: two forwards of
    the same input differ slightly (pass ``n_mc`` large for a stable ranking).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods.ce.ClassifierMethod`.
    rank : int
        Rank ``R`` of the covariance factor (URL: 1).
    n_mc : int
        MC samples of the predictive in training and inference.
    temperature : float
        Initial softmax temperature (learnable).
    uncertainty : {"entropy", "logdet"}
        Which ``u(x)`` to return.
    diag_noise : {"independent", "shared"}
        The paper's diagonal noise (default) or the URL code's one scalar shared by all
        dimensions; :class:`~bayesurl.heads.hetxl.DiagNoise`.
    """

    has_distribution = True

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        rank: int = 1,
        n_mc: int = 16,
        temperature: float = 1.0,
        uncertainty: str = "entropy",
        diag_noise: str = "independent",
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, **options)
        self.uncertainty = check_choice(uncertainty, "uncertainty", _UNCERTAINTIES)
        head_options = {"rank": rank, "n_mc": n_mc, "temperature": temperature}
        self.head = HetXLHead(
            self.embed_dim, self.num_classes, **head_options, diag_noise=diag_noise
        )
        self.hparams.update(
            head_options, uncertainty=uncertainty, diag_noise=self.head.diag_noise.value
        )

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Gaussian mean, predictive entropy (or log det), MC log-probabilities, samples."""
        n_samples = self._check_n_samples(n_samples)
        e = self.embed(x)
        out = self.head(e)
        if self.uncertainty == "entropy":
            u = entropy(out.log_probs.exp())
        else:
            u = out.distribution.log_det()
        samples = out.distribution.rsample(n_samples) if n_samples > 0 else None
        return Output(embedding=e, uncertainty=u, logits=out.log_probs, samples=samples)

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Cross-entropy of the MC-averaged tempered softmax (URL B.7, eq. 6)."""
        x, y = self._check_labeled(batch)
        return F.nll_loss(self.head(self.embed(x)).log_probs, y)

    @property
    def temperature(self) -> Tensor:
        """The learned softmax temperature."""
        return self.head.temperature.detach()
