"""InfoNCE: SimCLR two-view contrastive learning, u = 1/||e(x)|| (URL section 4.1, B.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from bayesurl.losses.infonce import InfoNCELoss
from bayesurl.methods._embedding import EmbeddingMethod, EmbeddingOptions
from bayesurl.methods.base import register
from bayesurl.types import Output

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["InfoNCE"]


@register("infonce")
class InfoNCE(EmbeddingMethod):
    """Self-supervised InfoNCE baseline (URL appendix B.2, eq. 1).

    Two augmented views of each image are positives, the rest of the batch negatives.
    InfoNCE has no uncertainty of its own; following the URL code, ``u(x) = 1/||e(x)||``
    (inputs the model is unsure about get smaller embedding norms).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods._embedding.EmbeddingMethod` (``num_classes`` is ignored).
    inverse_temperature : float
        t of URL eq. 1 (tuned in [8, 64]).
    denominator : {"negatives", "all"}
        Negatives only (URL eq. 1 and the URL benchmark code, default) or also the positive
        (SimCLR / PML NT-Xent); :mod:`bayesurl.losses.infonce`.
    self_term : bool, optional
        The URL code's ``e^0`` self-similarity in both log-sum-exps (``None``: on with
        ``"negatives"``); :mod:`bayesurl.losses.infonce`.

    Examples
    --------
    >>> m = InfoNCE(embed_dim=16)
    >>> out = m(torch.randn(4, 1, 28, 28))
    >>> out.embedding.shape, out.uncertainty.shape
    (torch.Size([4, 16]), torch.Size([4]))
    """

    two_view = True
    supervised = False
    has_distribution = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        inverse_temperature: float = 16.0,
        denominator: str = "negatives",
        self_term: bool | None = None,
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, **options)
        self.loss_fn = InfoNCELoss(
            inverse_temperature, denominator=denominator, self_term=self_term
        )
        self.hparams.update(
            inverse_temperature=float(inverse_temperature),
            denominator=denominator,
            self_term=self.loss_fn.self_term,
        )

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Unnormalised embedding ``e(x)`` and ``u = 1/||e(x)||``; no samples (no distribution)."""
        self._check_n_samples(n_samples)
        e = self.embed(x)
        return Output(embedding=e, uncertainty=1.0 / e.norm(dim=-1).clamp_min(1e-12))

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        """InfoNCE of the views ``batch = ((x1, x2), y)`` (``y`` unused)."""
        x1, x2 = self._check_views(batch)
        e = self.embed(torch.cat([x1, x2]))
        b = x1.shape[0]
        return self.loss_fn.two_view(e[:b], e[b:])
