"""Shared base of the vMF-based URL methods (MCInfoNCE, ELK, nivMF, HIB) and of InfoNCE.

Backbone -> :class:`~bayesurl.heads.embedding.EmbeddingNet` -> embedding ``e(x)``; the vMF
methods add a :class:`~bayesurl.heads.kappa.KappaHead` and define the posterior
``vMF(e/||e||, kappa(x))`` with ``u(x) = 1/kappa(x)`` (docs/concepts/uncertainty.rst). The head
reads the embedding ``e(x)`` (URL appendix B.3-B.6: "a 3-layer MLP attached to the embeddings", the
default) or the backbone features ``f(x)`` that ``e(x)`` projects (:class:`KappaInput`): HIB
(Oh et al., ICLR 2019, arXiv:1810.00319) and LAM's HIB baseline (Warburg et al., 2023,
Table 2) predict the spread from the features, which carry more than a low-dimensional
embedding does.
The backbone, input checks and the JSON-serialisable constructor record come from
:class:`~bayesurl.methods._embedding.EmbeddingMethod`, the base shared with the classifier methods.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_choice, check_int, check_number
from bayesurl.distributions.vmf import sample_vmf
from bayesurl.heads.kappa import KappaHead
from bayesurl.methods._embedding import EmbeddingMethod, EmbeddingOptions
from bayesurl.types import Output

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["EmbeddingMethod", "KappaInput", "KappaOptions", "VMFMethod"]

_T = TypeVar("_T")


class KappaInput(str, Enum):
    """What the kappa head of a vMF method reads."""

    #: the embedding ``e(x)`` (URL appendix B.3-B.6)
    EMBEDDING = "embedding"
    #: the backbone features ``f(x)`` before the projection (HIB, Oh et al. 2019; LAM's HIB)
    FEATURES = "features"

    def select(self, embedding: _T, features: _T) -> _T:
        """The one of ``embedding`` / ``features`` this input names."""
        return features if self is KappaInput.FEATURES else embedding


class KappaOptions(EmbeddingOptions, total=False):
    """The keywords of :class:`VMFMethod` (the kappa head) a vMF method passes on."""

    kappa_hidden: int | None
    warmup_u: float | None
    kappa_input: str | KappaInput
    min_kappa: float


def _parse_kappa_input(value: str | KappaInput) -> KappaInput:
    name = str(getattr(value, "value", value))
    return KappaInput(check_choice(name, "kappa_input", [k.value for k in KappaInput]))


class VMFMethod(EmbeddingMethod):
    """Embedding + kappa head: the posterior ``vMF(e/||e||, kappa(e))``, ``u = 1/kappa``.

    A subclass sets its loss as ``self.loss_fn``, called ``loss_fn(e, y, kappa=kappa)`` on a
    labelled batch by :meth:`training_loss` (a two-view method overrides that).

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`EmbeddingMethod`.
    kappa_hidden : int, optional
        Hidden width of the 3-layer kappa MLP (default ``max(input dim, 16)``); ``0``: one
        linear layer (HIB's head, Oh et al. 2019).
    warmup_u : float, optional
        Warm the kappa head up to mean ``u = warmup_u`` on the first training batch (default
        0.001, URL B.3's warmed-up start: from the random initialisation, kappa ~ 0.7, the vMF
        samples are nearly uniform for D >= 16 and the losses have no usable signal); ``None``
        keeps the random initialisation.
    kappa_input : {"embedding", "features"}
        What the kappa head reads: the embedding ``e(x)`` (default, URL B.3-B.6) or the
        backbone features before the projection (HIB, Oh et al. 2019; LAM's HIB baseline reads
        LAM's 1600 conv features with one linear layer). Both come from one backbone pass.
    min_kappa : float
        Lower bound added to kappa (default ``1e-4``; LAM's HIB: 0.01).
    """

    has_distribution = True

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        kappa_hidden: int | None = None,
        warmup_u: float | None = 1e-3,
        kappa_input: str | KappaInput = KappaInput.EMBEDDING,
        min_kappa: float = 1e-4,
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, **options)
        if kappa_hidden is not None:
            kappa_hidden = check_int(kappa_hidden, "kappa_hidden", low=0)
        min_kappa = check_number(min_kappa, "min_kappa", low=0.0)
        self.kappa_input = _parse_kappa_input(kappa_input)
        in_dim = self.kappa_input.select(self.embed_dim, self.net.feature_dim)
        self.kappa_head = KappaHead(in_dim, kappa_hidden, warmup_u, min_kappa)
        self.hparams.update(
            kappa_hidden=kappa_hidden,
            warmup_u=warmup_u,
            kappa_input=self.kappa_input.value,
            min_kappa=min_kappa,
        )

    def embed_with_kappa(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(e [N, D], kappa [N])`` from one backbone pass; warms the kappa head up on the
        first training batch."""
        e, f = self.embed_with_features(x)
        h = self.kappa_input.select(e, f)
        if self.training:
            self.kappa_head.warmup_(h.detach())
        return e, self.kappa_head(h)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Normalised embedding (vMF mean), ``u = 1/kappa``, kappa, and ``[S, N, D]`` samples."""
        s = self._check_n_samples(n_samples)
        e, kappa = self.embed_with_kappa(x)
        mu = F.normalize(e, dim=-1)
        samples = sample_vmf(mu, kappa, s) if s > 0 else None
        return Output(embedding=mu, uncertainty=1.0 / kappa, samples=samples, kappa=kappa)

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        """``self.loss_fn(e, y, kappa=kappa)`` of a labelled batch ``(x, y)`` (the supervised
        vMF losses: ELK, nivMF, HIB)."""
        x, y = self._check_labeled(batch)
        e, kappa = self.embed_with_kappa(x)
        return self.loss_fn(e, y, kappa=kappa)
