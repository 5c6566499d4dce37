"""nivMF: ELK with non-isotropic vMF class proxies, MC with 16 samples, u = 1/kappa (URL B.5)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from bayesurl.losses.nivmf import NivMFLoss
from bayesurl.methods._vmf import VMFMethod
from bayesurl.methods.base import register

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
        See :class:`~bayesurl.methods._vmf.VMFMethod`; ``num_classes`` (>= 2) is required.
    kappa_hidden, warmup_u, kappa_input, min_kappa
        The kappa head: see :class:`~bayesurl.methods._vmf.VMFMethod`.
        ``warmup_u`` defaults to 0.001 here (URL B.3's warmed-up start): from the random
        initialisation (kappa ~ 0.7) the vMF samples are nearly uniform for D >= 16 and the
        loss has no usable signal.
    kappa_scale : float
        t, the proxies' concentration multiplier (URL: [8, 64]).
    n_samples : int
        Monte-Carlo samples per image during training (URL: 16).
    density : {"url", "eccv22"}
        nivMF density of the proxies: the URL benchmark code's (default) or ECCV22 eq. 4
        (:func:`bayesurl.losses.nivmf.nivmf_log_density`).
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
        n_samples: int = 16,
        density: str = "url",
        kappa_input: str = "embedding",
        min_kappa: float = 1e-4,
    ) -> None:
        if num_classes is None:
            raise ValueError("`num_classes` is required for nivMF")
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
        self.loss_fn = NivMFLoss(
            num_classes, self.embed_dim, kappa_scale, n_samples, density=density
        )
        self.hparams.update(
            kappa_scale=float(kappa_scale), n_samples=int(n_samples), density=density
        )

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        """nivMF ProxyNCA loss of ``batch = (x, y)``."""
        x, y = self._check_labeled(batch)
        e, kappa = self.embed_with_kappa(x)
        return self.loss_fn(e, y, kappa=kappa)
