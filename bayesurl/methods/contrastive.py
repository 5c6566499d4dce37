"""Contrastive embeddings (LAM eq. 1): the deterministic baseline and its MC-dropout variant.

Warburg et al. (2023), section 3, eq. 1: ``0.5 ||u_i - u_j||^2`` for positive pairs and
``0.5 max(0, m - ||u_i - u_j||)^2`` for negative pairs of L2-normalised embeddings ``u``,
over the pairs with a non-zero loss (PML ``PairMarginMiner(0, m)``). The "Deterministic" and
"MC dropout" rows of LAM's Table 2 are these two methods; LAM post-hoc / online put a
last-layer Laplace posterior on the same net (:mod:`bayesurl.laplace`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from pytorch_metric_learning.miners import PairMarginMiner
from torch import Tensor, nn

from bayesurl._checks import check_finite, check_int
from bayesurl.evaluation.functional import uncertainty_from_samples
from bayesurl.heads.dropout import block_dropout_linear
from bayesurl.losses.contrastive import ContrastiveLoss
from bayesurl.methods._embedding import EmbeddingMethod, EmbeddingOptions
from bayesurl.methods.base import register
from bayesurl.types import Output

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Contrastive", "ContrastiveMCDropout"]


@register("contrastive")
class Contrastive(EmbeddingMethod):
    """Deterministic contrastive embedding (LAM eq. 1; Table 2, "Deterministic").

    - ``embedding``: ``e(x) / ||e(x)||``;
    - ``uncertainty``: ``1 / ||e(x)||``, the norm heuristic of InfoNCE
      (docs/concepts/uncertainty.rst, "Where u(x) comes from"); LAM
      reports no uncertainty for this row;
    - no embedding distribution.

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods._embedding.EmbeddingMethod`.
    margin : float
        Negative margin ``m`` of eq. 1 (LAM's FashionMNIST configs: 0.7).
    """

    supervised = True
    two_view = False
    has_distribution = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        margin: float = 0.2,
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, **options)
        self.loss_fn = ContrastiveLoss(margin=margin)
        self.miner = PairMarginMiner(pos_margin=0.0, neg_margin=float(margin))
        self.hparams.update(margin=float(margin))

    def _loss(self, e: Tensor, y: Tensor) -> Tensor:
        u = F.normalize(e, dim=-1)
        return self.loss_fn(u, y, self.miner(u.detach(), y))

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Normalised embedding and ``u = 1/||e||`` (``n_samples`` is accepted and ignored)."""
        self._check_n_samples(n_samples)
        e = self.embed(x)
        norm = e.norm(dim=-1).clamp_min(torch.finfo(e.dtype).tiny)
        return Output(embedding=e / norm[:, None], uncertainty=1.0 / norm)

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Contrastive loss (eq. 1) over the mined pairs of ``batch = (x, y)``."""
        x, y = self._check_labeled(batch)
        return self._loss(self.embed(x), y)


@register("contrastive_mcdropout")
class ContrastiveMCDropout(Contrastive):
    """MC dropout on the features before the linear embedding layer (LAM Table 2, "MC dropout").

    Dropout acts on the backbone features in ``dropout_groups`` blocks (LAM drops whole conv
    channels, ``Dropout2d``; :func:`~bayesurl.heads.dropout.block_dropout_linear`), in
    training (one mask, eq. 1) and at inference, where the backbone runs once and every draw
    is a mask of the last layer's input (Gal & Ghahramani, 2016).

    - ``embedding``: the normalised mean of ``n_passes`` normalised draws;
    - ``uncertainty``: ``1 / kappa_hat`` of those draws (Sra's approximation,
      docs/concepts/uncertainty.rst, "Samples");
    - ``samples``: ``n_samples`` further draws ``[S, N, D]``.

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs, margin
        See :class:`Contrastive`; ``embed_dim`` must be set (the dropout sits before that
        linear layer).
    p : float
        Drop probability of a block.
    n_passes : int
        Draws behind ``embedding`` and ``uncertainty``.
    dropout_groups : int, optional
        Blocks of consecutive features dropped together; default: the backbone's
        ``feature_groups`` (the channels of :class:`~bayesurl.backbones.LamConvNet`), else
        every feature on its own.
    """

    has_distribution = True

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        margin: float = 0.2,
        p: float = 0.05,
        n_passes: int = 32,
        dropout_groups: int | None = None,
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, margin=margin, **options)
        if not isinstance(self.net.proj, nn.Linear):
            raise ValueError("`embed_dim` must be set: the dropout acts before that linear layer")
        if not 0.0 < float(p) < 1.0:
            raise ValueError(f"`p` must be in (0, 1), got {p}")
        check_int(n_passes, "n_passes", low=2)
        groups = dropout_groups or getattr(self.net.backbone, "feature_groups", None)
        groups = int(groups or self.net.feature_dim)
        if self.net.feature_dim % groups:
            raise ValueError(
                f"`dropout_groups` must divide the {self.net.feature_dim} backbone features, "
                f"got {groups}"
            )
        self.p, self.n_passes, self.groups = float(p), int(n_passes), groups
        self.hparams.update(p=float(p), n_passes=int(n_passes), dropout_groups=dropout_groups)

    def _features(self, x: Tensor) -> Tensor:
        x = self._check_x(x)
        check_finite(x, "x")
        return self.net.features(x)

    def _draws(self, h: Tensor, n: int) -> Tensor:
        z = block_dropout_linear(h, self.net.proj, self.p, self.groups, n)  # type: ignore[arg-type]
        return F.normalize(z, dim=-1)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Mean of the draws, ``u = 1/kappa_hat`` of them, and ``[S, N, D]`` samples."""
        s = self._check_n_samples(n_samples)
        h = self._features(x)
        passes = self._draws(h, self.n_passes)
        mean = F.normalize(passes.mean(dim=0), dim=-1)
        u = uncertainty_from_samples(passes).to(mean.dtype)
        samples = self._draws(h, s) if s > 0 else None
        return Output(embedding=mean, uncertainty=u, samples=samples)

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Eq. 1 on one dropout mask of ``batch = (x, y)``."""
        x, y = self._check_labeled(batch)
        z = block_dropout_linear(self._features(x), self.net.proj, self.p, self.groups, 1)[0]  # type: ignore[arg-type]
        return self._loss(z, y)
