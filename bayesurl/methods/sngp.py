"""SNGP: spectral-normalised network with a random-feature GP output layer (URL B.8, eq. 7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl.heads.sngp import URL_MEAN_FIELD, RandomFeatureGP, spectral_normalize
from bayesurl.methods._embedding import EmbeddingOptions
from bayesurl.methods.base import register
from bayesurl.methods.ce import ClassifierMethod
from bayesurl.types import Output
from bayesurl.uncertainty import softmax_entropy

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["SNGP"]

_SPECTRAL = ("none", "projection", "all")


@register("sngp")
class SNGP(ClassifierMethod):
    """SNGP (URL section 4.1, appendix B.8, eq. 7; Liu et al. 2020).

    ``h(x)`` = the embedding network (optionally spectrally normalised), a random-Fourier-
    feature GP output layer on ``h``. Training: cross-entropy on the posterior-mean logits, and
    the precision matrix ``s I + Phi^T Phi`` is accumulated over the epoch's training batches
    (reset in :meth:`on_epoch_start`, inverted in :meth:`on_epoch_end`). Inference: mean-field
    logits ``logits / sqrt(1 + lambda phi^T Sigma phi)``.

    - ``embedding``: ``h(x)`` (the representation the GP reads);
    - ``logits``: the mean-field logits;
    - ``uncertainty``: entropy of their softmax;
    - ``samples``: none (the distribution is over logits, not embeddings).

    Under ``torch.distributed`` the per-rank precision sums are all-reduced before the inverse.

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`~bayesurl.methods.ce.ClassifierMethod`.
    num_random_features : int
        ``M`` random Fourier features (1024 as in Liu et al.).
    ridge : float
        Prior precision ``s`` (URL eq. 7: 1).
    mean_field_factor : float
        ``lambda`` of the mean-field approximation: 1 as in the URL code (default) or
        ``pi / 8`` (Liu et al.; :data:`~bayesurl.heads.sngp.PROBIT_MEAN_FIELD`).
    length_scale : float
        RBF length scale of the random features.
    layer_norm : bool
        Layer-normalise ``h`` before the random features (URL's ``gp-input-normalization``).
    spectral_norm : {"all", "projection", "none"} or None
        Where to bound spectral norms: every linear and conv layer of the embedding network
        (Liu et al.), only the linear projection after the backbone, or nowhere ("GP only");
        ``None`` is ``"none"`` (a recipe's ``"none"`` is read as a missing value).
    spec_norm_bound : float
        The bound ``c`` (URL's ResNet-50 run: 3.0).
    """

    has_distribution = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        *,
        num_random_features: int = 1024,
        ridge: float = 1.0,
        mean_field_factor: float = URL_MEAN_FIELD,
        length_scale: float = 1.0,
        layer_norm: bool = True,
        spectral_norm: str | None = "all",
        spec_norm_bound: float = 3.0,
        **options: Unpack[EmbeddingOptions],
    ) -> None:
        super().__init__(backbone, **options)
        if spectral_norm is None:
            spectral_norm = "none"
        if spectral_norm not in _SPECTRAL:
            raise ValueError(
                f"`spectral_norm` must be one of {', '.join(_SPECTRAL)}, got {spectral_norm!r}"
            )
        if spectral_norm == "all":
            spectral_normalize(self.net, spec_norm_bound, (nn.Linear, nn.Conv2d))
        elif spectral_norm == "projection" and isinstance(self.net.proj, nn.Linear):
            spectral_normalize(self.net.proj, spec_norm_bound)
        gp_options = {
            "num_random_features": num_random_features,
            "ridge": ridge,
            "mean_field_factor": mean_field_factor,
            "length_scale": length_scale,
            "layer_norm": layer_norm,
        }
        self.gp = RandomFeatureGP(self.embed_dim, self.num_classes, **gp_options)
        self.hparams.update(
            gp_options, spectral_norm=spectral_norm, spec_norm_bound=spec_norm_bound
        )

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Embedding ``h``, entropy of the mean-field softmax, mean-field logits."""
        self._check_n_samples(n_samples)
        h = self.embed(x)
        out = self.gp(h)
        return Output(
            embedding=h,
            uncertainty=softmax_entropy(out.mean_field_logits),
            logits=out.mean_field_logits,
        )

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Cross-entropy on the posterior-mean logits; adds the batch to the precision matrix.

        The precision is only updated in training mode (``self.training``).
        """
        x, y = self._check_labeled(batch)
        out = self.gp(self.embed(x), with_variance=False)
        if self.training:
            self.gp.accumulate(out.features)
        return F.cross_entropy(out.logits, y)

    def on_epoch_start(self, epoch: int) -> None:
        """Reset the precision matrix to the prior ``s I`` (Liu et al., Algorithm 1)."""
        self.gp.reset_precision()

    def on_epoch_end(self, epoch: int) -> None:
        """Sum the precision over ranks (if distributed) and invert it into the covariance."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            ridge = self.gp.ridge * torch.eye(
                self.gp.num_random_features,
                dtype=self.gp.precision.dtype,
                device=self.gp.precision.device,
            )
            data = self.gp.precision - ridge
            torch.distributed.all_reduce(data)
            self.gp.precision.copy_(data + ridge)
            torch.distributed.all_reduce(self.gp.n_accumulated)
        self.gp.update_covariance()
