"""HIB: pairwise match probabilities of vMF samples, u = 1/kappa (URL section 4.1, B.6)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from bayesurl.losses.hib import HIBLoss
from bayesurl.methods._vmf import VMFMethod
from bayesurl.methods.base import register

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
        ``warmup_u`` defaults to 0.001 here (URL B.3's warmed-up start): from the random
        initialisation (kappa ~ 0.7) the vMF samples are nearly uniform for D >= 16 and the
        loss has no usable signal.
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

    supervised = True
    two_view = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        kappa_hidden: int | None = None,
        warmup_u: float | None = 1e-3,
        scale: float = 16.0,
        bias: float = -8.0,
        n_samples: int = 16,
        negative_term: str = "log_p",
        eps: float = 1e-5,
        kappa_input: str = "embedding",
        min_kappa: float = 1e-4,
    ) -> None:
        super().__init__(
            backbone,
            embed_dim,
            num_classes,
            backbone_kwargs,
            kappa_hidden,
            warmup_u,
            kappa_input=kappa_input,
            min_kappa=min_kappa,
        )
        self.loss_fn = HIBLoss(scale, bias, n_samples, negative_term, eps=eps)
        self.hparams.update(
            scale=float(scale),
            bias=float(bias),
            n_samples=int(n_samples),
            negative_term=negative_term,
            eps=float(eps),
        )

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        """HIB loss over all pairs of ``batch = (x, y)``."""
        x, y = self._check_labeled(batch)
        e, kappa = self.embed_with_kappa(x)
        return self.loss_fn(e, y, kappa=kappa)
