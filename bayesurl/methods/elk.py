"""ELK: ProxyNCA with the analytic vMF expected likelihood kernel, u = 1/kappa (URL B.4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from bayesurl.losses.elk import ELKLoss
from bayesurl.methods._vmf import KappaOptions, VMFMethod
from bayesurl.methods.base import register

if TYPE_CHECKING:
    from typing_extensions import Unpack

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
    kappa_scale : float
        t, the proxies' concentration multiplier (URL: [8, 64]).
    shared_proxy_kappa : bool
        One concentration shared by all class proxies.
    """

    needs_classes = True

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        num_classes: int = 5,
        kappa_scale: float = 16.0,
        shared_proxy_kappa: bool = False,
        **options: Unpack[KappaOptions],
    ) -> None:
        super().__init__(backbone, num_classes=num_classes, **options)
        self.loss_fn = ELKLoss(
            num_classes, self.embed_dim, kappa_scale, shared_kappa=shared_proxy_kappa
        )
        self.hparams.update(
            kappa_scale=float(kappa_scale), shared_proxy_kappa=bool(shared_proxy_kappa)
        )
