"""nivMF: ELK with non-isotropic vMF class proxies, MC with 16 samples, u = 1/kappa (URL B.5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from bayesurl.losses.nivmf import NivMFLoss
from bayesurl.methods._vmf import KappaOptions, VMFMethod
from bayesurl.methods.base import register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["NivMF"]


@register("nivmf")
class NivMF(VMFMethod):
    """Supervised proxy learning with non-isotropic vMF proxies (URL B.5; ECCV22 eq. 6).

    As :class:`~bayesurl.methods.elk.ELK`, but each class proxy has one concentration per
    embedding dimension and the expected likelihood is estimated from ``n_samples`` samples of
    the image posterior.

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods.elk.ELK` (``num_classes`` >= 2 is required).
    kappa_hidden, warmup_u, kappa_input, min_kappa, kappa_scale
        The kappa head and the proxies' ``t``: see :class:`~bayesurl.methods.elk.ELK`.
    n_samples : int
        Monte-Carlo samples per image during training (URL: 16).
    density : {"url", "eccv22"}
        nivMF density of the proxies: the URL benchmark code's (default) or ECCV22 eq. 4
        (:func:`bayesurl.losses.nivmf.nivmf_log_density`).
    """

    needs_classes = True

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        num_classes: int = 5,
        kappa_scale: float = 16.0,
        n_samples: int = 16,
        density: str = "url",
        **options: Unpack[KappaOptions],
    ) -> None:
        super().__init__(backbone, num_classes=num_classes, **options)
        self.loss_fn = NivMFLoss(
            num_classes, self.embed_dim, kappa_scale, n_samples, density=density
        )
        self.hparams.update(
            kappa_scale=float(kappa_scale), n_samples=int(n_samples), density=density
        )
