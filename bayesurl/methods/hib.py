"""HIB: pairwise match probabilities of vMF samples, u = 1/kappa (URL section 4.1, B.6)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from bayesurl.losses.hib import HIBLoss
from bayesurl.methods._vmf import KappaOptions, VMFMethod
from bayesurl.methods.base import register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["HIB"]


@register("hib")
class HIB(VMFMethod):
    """Hedged Instance Embeddings with vMF posteriors and cosine similarities (URL B.6, eq. 5).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods._vmf.VMFMethod` (``num_classes`` only bounds the labels).
    kappa_hidden, warmup_u, kappa_input, min_kappa
        The kappa head: see :class:`~bayesurl.methods._vmf.VMFMethod`.
    scale : float
        t of ``sigmoid(t s^T s' + b)`` (URL: [8, 64]).
    bias : float
        b (URL: [-8, 8]).
    n_samples : int
        K samples per image during training (URL: 16).
    negative_term : {"log_p", "log1m_p"}
        Different-label pairs: URL's ``+log p`` (default) or the original ``-log(1 - p)``.
    eps : float
        Added to p before the logs, as the URL code's ``EPS = 1e-5`` (default);
        :mod:`bayesurl.losses.hib`.
    """

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        scale: float = 16.0,
        bias: float = -8.0,
        n_samples: int = 16,
        negative_term: str = "log_p",
        eps: float = 1e-5,
        **options: Unpack[KappaOptions],
    ) -> None:
        super().__init__(backbone, **options)
        self.loss_fn = HIBLoss(scale, bias, n_samples, negative_term, eps=eps)
        self.hparams.update(
            scale=float(scale),
            bias=float(bias),
            n_samples=int(n_samples),
            negative_term=negative_term,
            eps=float(eps),
        )
