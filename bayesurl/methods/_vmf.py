"""Shared base of the vMF-based URL methods (MCInfoNCE, ELK, nivMF, HIB) and of InfoNCE.

Backbone -> :class:`~bayesurl.heads.embedding.EmbeddingNet` -> embedding ``e(x)``; the vMF
methods add a :class:`~bayesurl.heads.kappa.KappaHead` on ``e(x)`` and define the posterior
``vMF(e/||e||, kappa(e))`` with ``u(x) = 1/kappa(x)`` (spec METHODS.md; URL appendix B.3-B.6).
The backbone, input checks and the JSON-serialisable constructor record come from
:class:`~bayesurl.methods._embedding.EmbeddingMethod`, the base shared with the classifier methods.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl.distributions.vmf import sample_vmf
from bayesurl.heads.kappa import KappaHead
from bayesurl.methods._embedding import EmbeddingMethod
from bayesurl.types import Output

__all__ = ["EmbeddingMethod", "VMFMethod"]


class VMFMethod(EmbeddingMethod):
    """Embedding + kappa head: the posterior ``vMF(e/||e||, kappa(e))``, ``u = 1/kappa``.

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`EmbeddingMethod`.
    kappa_hidden : int, optional
        Hidden width of the 3-layer kappa MLP (default ``max(D, 16)``).
    warmup_u : float, optional
        Warm the kappa head up to mean ``u = warmup_u`` on the first training batch (URL B.3:
        0.001); ``None`` (default) keeps the random initialisation.
    """

    has_distribution = True

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        kappa_hidden: int | None = None,
        warmup_u: float | None = None,
    ) -> None:
        super().__init__(backbone, embed_dim, num_classes, backbone_kwargs)
        self.kappa_head = KappaHead(self.embed_dim, kappa_hidden, warmup_u)
        self.hparams.update(kappa_hidden=kappa_hidden, warmup_u=warmup_u)

    def embed_with_kappa(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(e [N, D], kappa [N])``; warms the kappa head up on the first training batch."""
        e = self.embed(x)
        if self.training:
            self.kappa_head.warmup_(e.detach())
        return e, self.kappa_head(e)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Normalised embedding (vMF mean), ``u = 1/kappa``, kappa, and ``[S, N, D]`` samples."""
        s = self._check_n_samples(n_samples)
        e, kappa = self.embed_with_kappa(x)
        mu = F.normalize(e, dim=-1)
        samples = sample_vmf(mu, kappa, s) if s > 0 else None
        return Output(embedding=mu, uncertainty=1.0 / kappa, samples=samples, kappa=kappa)
