"""ELK: ProxyNCA with the analytic vMF expected likelihood kernel, u = 1/kappa (URL B.4)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from bayesurl.losses.elk import ELKLoss
from bayesurl.methods._vmf import VMFMethod
from bayesurl.methods.base import register

__all__ = ["ELK"]


@register("elk")
class ELK(VMFMethod):
    """Supervised probabilistic proxy learning with the expected likelihood kernel (URL B.4).

    Images get ``vMF(e/||e||, kappa(e))`` posteriors, classes learnable vMF proxies whose
    concentrations are scaled by t; the loss is cross-entropy over the classes' analytic log
    expected likelihoods (URL eq. 3).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods._vmf.VMFMethod`; ``num_classes`` (>= 2) is required.
    kappa_hidden, warmup_u, kappa_input, min_kappa
        The kappa head: see :class:`~bayesurl.methods._vmf.VMFMethod`.
        ``warmup_u`` defaults to 0.001 here (URL B.3's warmed-up start): from the random
        initialisation (kappa ~ 0.7) the vMF samples are nearly uniform for D >= 16 and the
        loss has no usable signal.
    kappa_scale : float
        t, the proxies' concentration multiplier (URL: [8, 64]).
    shared_proxy_kappa : bool
        One concentration shared by all class proxies.
    """

    supervised = True
    two_view = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int = 5,
        backbone_kwargs: dict[str, Any] | None = None,
        kappa_hidden: int | None = None,
        warmup_u: float | None = 1e-3,
        kappa_scale: float = 16.0,
        shared_proxy_kappa: bool = False,
        kappa_input: str = "embedding",
        min_kappa: float = 1e-4,
    ) -> None:
        if num_classes is None:
            raise ValueError("`num_classes` is required for ELK")
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
        self.loss_fn = ELKLoss(
            num_classes, self.embed_dim, kappa_scale, shared_kappa=shared_proxy_kappa
        )
        self.hparams.update(
            kappa_scale=float(kappa_scale), shared_proxy_kappa=bool(shared_proxy_kappa)
        )

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        """ELK ProxyNCA loss of ``batch = (x, y)``."""
        x, y = self._check_labeled(batch)
        e, kappa = self.embed_with_kappa(x)
        return self.loss_fn(e, y, kappa=kappa)
