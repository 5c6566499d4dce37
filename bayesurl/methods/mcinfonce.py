"""MCInfoNCE: InfoNCE on vMF samples, u = 1/kappa (URL section 4.1, B.3; MCI eq. 7)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from bayesurl.losses.infonce import two_view_labels
from bayesurl.losses.mcinfonce import MCInfoNCELoss
from bayesurl.methods._vmf import KappaOptions, VMFMethod
from bayesurl.methods.base import register

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["MCInfoNCE"]


@register("mcinfonce")
class MCInfoNCE(VMFMethod):
    """Self-supervised probabilistic contrastive learning (MCI section 4.1, URL appendix B.3).

    Each view gets a vMF posterior ``vMF(e/||e||, kappa(e))``; the loss is InfoNCE on K
    samples, averaged inside the log (MCI eq. 7), with in-batch SimCLR negatives.

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods._vmf.VMFMethod` (``num_classes`` is ignored).
    kappa_hidden, warmup_u, kappa_input, min_kappa
        The kappa head: see :class:`~bayesurl.methods._vmf.VMFMethod`.
    inverse_temperature : float
        t = kappa_pos (URL: t in [8, 64]).
    n_samples : int
        K vMF samples per view during training (URL: 16).
    divide_positive : bool
        ``False`` (reference code) or ``True`` (MCI eq. 7 as printed); see
        :func:`~bayesurl.losses.mcinfonce.mcinfonce_loss`.
    denominator : {"negatives", "positive"}
        ``"negatives"`` (default): URL eq. 2 and the URL benchmark code (no positive in the
        denominator); ``"positive"``: the MCI form.
    mc_average : {"inside", "outside"}
        Samples averaged inside the log (default, URL / MCI code) or outside (URL eq. 2 text).
    self_term : bool, optional
        The URL code's ``e^0`` self-similarity in both log-sum-exps (``None``: on with
        ``"negatives"``); :mod:`bayesurl.losses.mcinfonce`.
    sampler : {"exact", "url_taylor"}
        vMF sampler of the training loss: exact (default) or the URL code's biased one.
    """

    two_view = True
    supervised = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        inverse_temperature: float = 16.0,
        n_samples: int = 16,
        divide_positive: bool = False,
        denominator: str = "negatives",
        mc_average: str = "inside",
        self_term: bool | None = None,
        sampler: str = "exact",
        **options: Unpack[KappaOptions],
    ) -> None:
        super().__init__(backbone, **options)
        self.loss_fn = MCInfoNCELoss(
            inverse_temperature,
            n_samples,
            divide_positive,
            denominator=denominator,
            mc_average=mc_average,
            self_term=self_term,
            sampler=sampler,
        )
        self.hparams.update(
            inverse_temperature=float(inverse_temperature),
            n_samples=int(n_samples),
            divide_positive=bool(divide_positive),
            denominator=denominator,
            mc_average=mc_average,
            self_term=self.loss_fn.self_term,
            sampler=self.loss_fn.sampler.value,
        )

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        """MCInfoNCE of the views ``batch = ((x1, x2), y)`` (``y`` unused)."""
        x1, x2 = self._check_views(batch)
        e, kappa = self.embed_with_kappa(torch.cat([x1, x2]))
        return self.loss_fn(e, two_view_labels(x1.shape[0], e.device), kappa=kappa)
