"""HET-XL: a heteroscedastic low-rank Gaussian in embedding space with an MC softmax.

URL appendix B.7, eq. 6 (Collier et al. 2023, "Massively scaling heteroscedastic classifiers"):
each embedding ``phi(x)`` gets a Gaussian ``N(phi(x), V(x) V(x)^T + diag(d(x)))`` whose factor
``V`` and diagonal ``d`` are read off ``phi(x)`` by linear layers; the predictive is the Monte
Carlo average ``E_eps[softmax_tau(W^T (phi(x) + eps))]`` with a learnable temperature ``tau``.

The URL code draws the diagonal part of ``eps`` as ``sqrt(d) * randn(B, S, 1)``
(mkirchhof/url 9a92555, ``timm/layers/hetxl_layers.py`` line 32): one scalar shared by all D
dimensions, so its samples have covariance ``V V^T + sqrt(d) sqrt(d)^T`` (rank R + 1), while
its own comment (``# [B, S, D]``) and its log-determinant (``V.square().sum(-1) + d``, line 27)
assume the diagonal ``diag(d)`` of the paper. ``diag_noise="independent"`` (default) draws the
paper's distribution; ``"shared"`` reproduces the code's draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_columns, check_finite, check_int, check_ndim
from bayesurl.distributions.lowrank_gaussian import LowRankGaussian

__all__ = ["DiagNoise", "HetXLHead", "HetXLOutput", "mc_softmax_log_probs"]


class DiagNoise(str, Enum):
    """How the diagonal part of HET-XL's embedding noise is drawn (module docstring)."""

    #: one standard normal per dimension: ``N(phi, V V^T + diag(d))`` (HET-XL, URL B.7)
    INDEPENDENT = "independent"
    #: one standard normal per sample shared by all dimensions (the URL code)
    SHARED = "shared"


def mc_softmax_log_probs(
    samples: Tensor, weight: Tensor, bias: Tensor | None = None, temperature: Tensor | float = 1.0
) -> Tensor:
    """Log of the Monte Carlo softmax predictive, ``log (1/K) sum_k softmax(W s_k / tau)``.

    The expectation inside URL appendix B.7, eq. 6, computed stably with ``logsumexp``.

    Parameters
    ----------
    samples : Tensor
        Embedding samples ``[K, N, D]``.
    weight : Tensor
        Classifier weight ``[C, D]``.
    bias : Tensor, optional
        Classifier bias ``[C]``.
    temperature : Tensor or float
        Softmax temperature ``tau > 0`` (the logits are divided by it).

    Returns
    -------
    Tensor
        Log-probabilities ``[N, C]`` of the averaged predictive.
    """
    check_ndim(samples, "samples", 3)
    logits = F.linear(samples, weight, bias) / temperature  # [K, N, C]
    return torch.logsumexp(F.log_softmax(logits, dim=-1), dim=0) - math.log(samples.shape[0])


@dataclass
class HetXLOutput:
    """What :meth:`HetXLHead.forward` returns.

    Attributes
    ----------
    log_probs : Tensor
        ``[N, C]`` log of the MC-averaged softmax (the HET-XL predictive).
    distribution : LowRankGaussian
        The embedding distribution ``N(phi, V V^T + diag(d))``.
    samples : Tensor
        ``[K, N, D]`` the embedding samples used for the MC average.
    """

    log_probs: Tensor
    distribution: LowRankGaussian
    samples: Tensor


class HetXLHead(nn.Module):
    """HET-XL output layer on an embedding (URL appendix B.7, eq. 6).

    ``V(x)`` (``D x R``) and the diagonal standard deviation ``sqrt(d(x)) = softplus(.) +
    min_scale`` are linear functions of the embedding ``phi(x)``, as in Collier et al. (2023);
    the classifier ``W`` is a plain linear layer; the temperature ``tau = exp(log_tau)`` is
    learnable (URL B.7: "the softmax temperature is a learnable parameter").

    Parameters
    ----------
    embed_dim, num_classes : int
        Embedding dimension ``D`` and number of classes ``C``.
    rank : int
        Rank ``R`` of the low-rank factor (URL uses 1; rank 10 did not help).
    n_mc : int
        Monte Carlo samples ``K`` of the predictive.
    temperature : float
        Initial temperature ``tau``.
    learn_temperature : bool
        Whether ``tau`` is a trainable parameter (default, URL) or a fixed buffer.
    min_scale : float
        Lower bound of the diagonal standard deviation (``1e-3`` as in the HET-XL code).
    diag_noise : {"independent", "shared"}
        :class:`DiagNoise`: the paper's diagonal (default) or the URL code's shared scalar.

    Examples
    --------
    >>> import torch
    >>> head = HetXLHead(8, 3, n_mc=4)
    >>> out = head(torch.randn(5, 8))
    >>> out.log_probs.shape, out.samples.shape
    (torch.Size([5, 3]), torch.Size([4, 5, 8]))
    """

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        rank: int = 1,
        n_mc: int = 16,
        temperature: float = 1.0,
        learn_temperature: bool = True,
        min_scale: float = 1e-3,
        diag_noise: str | DiagNoise = DiagNoise.INDEPENDENT,
    ) -> None:
        super().__init__()
        try:
            self.diag_noise = DiagNoise(getattr(diag_noise, "value", diag_noise))
        except ValueError:
            valid = ", ".join(v.value for v in DiagNoise)
            raise ValueError(f"`diag_noise` must be one of {valid}, got {diag_noise!r}") from None
        for name, val in (("embed_dim", embed_dim), ("num_classes", num_classes), ("rank", rank)):
            check_int(val, name, low=1)
        check_int(n_mc, "n_mc", low=1)
        if not temperature > 0:
            raise ValueError(f"`temperature` must be > 0, got {temperature}")
        if min_scale < 0:
            raise ValueError(f"`min_scale` must be >= 0, got {min_scale}")
        self.embed_dim, self.num_classes, self.rank = int(embed_dim), int(num_classes), int(rank)
        self.n_mc = int(n_mc)
        self.min_scale = float(min_scale)
        self.cov_factor = nn.Linear(self.embed_dim, self.embed_dim * self.rank)
        self.diag_std = nn.Linear(self.embed_dim, self.embed_dim)
        self.classifier = nn.Linear(self.embed_dim, self.num_classes)
        log_tau = torch.tensor(math.log(temperature))
        if learn_temperature:
            self.log_temperature = nn.Parameter(log_tau)
        else:
            self.register_buffer("log_temperature", log_tau)

    @property
    def temperature(self) -> Tensor:
        """The softmax temperature ``tau`` (a 0-d tensor)."""
        return self.log_temperature.exp()

    def distribution(self, embedding: Tensor) -> LowRankGaussian:
        """The embedding distribution ``N(phi, V V^T + diag(d))`` of a batch ``[N, D]``."""
        check_columns(embedding, "embedding", self.embed_dim)
        check_finite(embedding.detach(), "embedding")
        n = embedding.shape[0]
        factor = self.cov_factor(embedding).reshape(n, self.embed_dim, self.rank)
        std = F.softplus(self.diag_std(embedding)) + self.min_scale
        return LowRankGaussian(embedding, factor, std.pow(2))

    def predictive(self, samples: Tensor) -> Tensor:
        """Log MC-softmax predictive ``[N, C]`` of embedding samples ``[K, N, D]``."""
        return mc_softmax_log_probs(
            samples, self.classifier.weight, self.classifier.bias, self.temperature
        )

    def forward(
        self, embedding: Tensor, n_mc: int | None = None, generator: torch.Generator | None = None
    ) -> HetXLOutput:
        """Sample the embedding distribution and average the tempered softmax (eq. 6).

        Parameters
        ----------
        embedding : Tensor
            ``[N, D]`` embeddings ``phi(x)``.
        n_mc : int, optional
            Number of MC samples (default: ``self.n_mc``).
        generator : torch.Generator, optional
            Randomness for reproducible samples.
        """
        dist = self.distribution(embedding)
        shared = self.diag_noise is DiagNoise.SHARED
        k = self.n_mc if n_mc is None else n_mc
        samples = dist.rsample(k, generator=generator, shared_diag_noise=shared)
        return HetXLOutput(self.predictive(samples), dist, samples)
