"""Hedged Instance Embeddings (HIB) with vMF posteriors (URL appendix B.6; MCI appendix B.4).

The match probability of two inputs is the Monte-Carlo average over K paired samples of their
vMF posteriors, ``p(n, m) = (1/K) sum_k sigmoid(t s_nk^T s_mk + b)`` (URL B.6; Oh et al. 2019
with cosine instead of L2 distances and no KL prior; URL prints a sum over the 16 samples,
the mean is used so that p is a probability, as in HIB). Same-label pairs minimise ``-log p``;
different-label pairs either minimise ``+log p`` (URL eq. 5, "which stabilized training", the
default) or ``-log(1 - p)`` (the original HIB, ``negative_term="log1m_p"``). Each term is
averaged over its own set of pairs.

Which term the URL code uses depends on the commit of ``timm/loss/HedgedInstance.py``
(mkirchhof/url): ``+log p`` at 9a92555 and 0bd3ea0 (the camera-ready code behind the URL
numbers, line 42: ``... - (match_prob.log() * neg_mask).sum(-1) / ...``), ``-log(1 - p)`` at
bf67867 (added with the Pretrained Visual Uncertainties code, line 42:
``+ ((1 - match_prob).log() * neg_mask).sum(-1) / ...``). Every commit adds ``EPS = 1e-5`` to
the averaged p before the logs (line 32); ``eps`` (default ``1e-5``) does the same, so the
different-pair ``+log p`` term stops at ``log 1e-5`` instead of falling to
``log sigmoid(b - t)``. ``eps=0`` is the formula of URL B.6.

MCI's own HIB (mkirchhof/Probabilistic_Contrastive_Learning b0f70c0, ``utils/losses.py``
lines 102-111), behind the controlled experiment, differs twice: it averages ``log sigmoid``
over the samples (the mean outside the log; :func:`hib_loss`'s ``mc_average="outside"``) and
divides the mean over anchors and negatives by M once more (``negative_weight = 1 / M``;
no difference at the experiment's default M = 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import torch
import torch.nn.functional as F
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
from torch import Tensor

from bayesurl.distributions.vmf import _sample_vmf
from bayesurl.losses._base import (
    ExplicitKappaLoss,
    check_anchor_positive,
    check_explicit_negatives,
    check_in_batch_negatives,
    reduce_losses,
    sample_triplets,
)
from bayesurl.losses.infonce import _check_t
from bayesurl.losses.mcinfonce import _check_n_samples

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["HIBLoss", "HIBOptions", "HIBVariant", "hib_log_match_probability", "hib_loss"]

_NEG_TERMS = ("log_p", "log1m_p")


def _check_neg_term(term: str) -> str:
    if term not in _NEG_TERMS:
        raise ValueError(f"`negative_term` must be one of {_NEG_TERMS}, got {term!r}")
    return term


def hib_log_match_probability(
    samples1: Tensor,
    samples2: Tensor,
    scale: float | Tensor,
    bias: float | Tensor,
    complement: bool = False,
    eps: float = 0.0,
    mc_average: str = "inside",
) -> Tensor:
    """``log p`` (or ``log(1 - p)``) of ``p = mean_k sigmoid(scale * <s1_k, s2_k> + bias)``.

    Parameters
    ----------
    samples1, samples2 : Tensor
        ``[K, ..., D]`` paired unit-norm samples (sample k of one input meets sample k of the
        other).
    scale, bias : float
        t and b of URL appendix B.6.
    complement : bool
        Return ``log(1 - p)`` instead of ``log p``.
    eps : float
        ``p`` is replaced by ``p + eps`` (the URL code's ``EPS``): ``log(p + eps)`` or
        ``log(1 - p - eps)`` (floored at the dtype's smallest normal number, where the code
        would take the log of a negative number).
    mc_average : {"inside", "outside"}
        ``log mean_k sigmoid`` (HIB's p, default) or ``mean_k log sigmoid`` (MCI's code;
        ``eps`` must then be 0).

    Returns
    -------
    Tensor
        ``[...]``, computed stably as a log-mean-exp of log-sigmoids.
    """
    logits = scale * (samples1 * samples2).sum(-1) + bias
    logs = F.logsigmoid(-logits if complement else logits)
    if mc_average == "outside":
        return logs.mean(dim=0)
    log_mean = torch.logsumexp(logs, dim=0) - math.log(logs.shape[0])
    if eps == 0.0:
        return log_mean
    if not complement:
        return torch.logaddexp(log_mean, log_mean.new_tensor(math.log(eps)))
    tiny = torch.finfo(log_mean.dtype).tiny
    return torch.log((torch.exp(log_mean) - eps).clamp_min(tiny))


def _check_eps(eps: float) -> float:
    eps = float(eps)
    if not (0.0 <= eps < 1.0):
        raise ValueError(f"`eps` must lie in [0, 1), got {eps}")
    return eps


class HIBOptions(TypedDict, total=False):
    """The keywords choosing the variant of :func:`hib_loss` (:class:`HIBVariant`)."""

    negative_term: str
    eps: float
    mc_average: str
    negative_weight: float


@dataclass(frozen=True)
class HIBVariant:
    """How :func:`hib_loss` turns match probabilities into a loss (URL code, MCI code).

    Checked once, where it is built: a ValueError names an unknown ``negative_term`` or
    ``mc_average``, an ``eps`` outside ``[0, 1)`` (or non-zero with ``mc_average="outside"``)
    and a negative or non-finite ``negative_weight``.

    Parameters
    ----------
    negative_term, eps, mc_average, negative_weight
        See :func:`hib_loss`.
    """

    negative_term: str = "log_p"
    eps: float = 1e-5
    mc_average: str = "inside"
    negative_weight: float = 1.0

    def __post_init__(self) -> None:
        _check_neg_term(self.negative_term)
        object.__setattr__(self, "eps", _check_eps(self.eps))
        if self.mc_average not in ("inside", "outside"):
            raise ValueError(f"`mc_average` must be 'inside' or 'outside', got {self.mc_average!r}")
        if self.mc_average == "outside" and self.eps != 0.0:
            raise ValueError("`eps` must be 0 with mc_average='outside' (no p to shift)")
        weight = self.negative_weight
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"`negative_weight` must be finite and >= 0, got {weight}")

    @property
    def complement(self) -> bool:
        """The different-pair term reads ``log(1 - p)`` (``"log1m_p"``) instead of ``log p``."""
        return self.negative_term == "log1m_p"

    @property
    def sign(self) -> float:
        """``+1`` for URL's ``+log p``, ``-1`` for ``-log(1 - p)``."""
        return 1.0 if self.negative_term == "log_p" else -1.0

    def log_match(
        self,
        samples1: Tensor,
        samples2: Tensor,
        scale: float | Tensor,
        bias: float | Tensor,
        complement: bool = False,
    ) -> Tensor:
        """:func:`hib_log_match_probability` with this variant's ``eps`` and ``mc_average``."""
        return hib_log_match_probability(
            samples1, samples2, scale, bias, complement, self.eps, self.mc_average
        )


def hib_loss(
    mu_anchor: Tensor,
    kappa_anchor: Tensor | float,
    mu_pos: Tensor,
    kappa_pos: Tensor | float,
    mu_neg: Tensor | None = None,
    kappa_neg: Tensor | float | None = None,
    *,
    n_samples: int = 16,
    scale: float | Tensor = 16.0,
    bias: float | Tensor = -8.0,
    generator: torch.Generator | None = None,
    reduction: str = "mean",
    **variant: Unpack[HIBOptions],
) -> Tensor:
    """Contrastive HIB on plain tensors (MCI appendix B.4, eq. 54; URL B.6 variant).

    Per anchor: ``-log p(x, x+) + (1/M) sum_m term(p(x, x_m-))`` with ``term = log p`` (URL,
    default) or ``-log(1 - p)`` (``negative_term="log1m_p"``, MCI eq. 54 / original HIB).
    Arguments as in :func:`~bayesurl.losses.mcinfonce.mcinfonce_loss`; ``mu_neg=None`` uses
    in-batch SimCLR negatives (2B anchors, 2B - 2 negatives each).

    Parameters
    ----------
    scale, bias : float or Tensor
        t in [8, 64] and b in [-8, 8] of URL appendix B.6 (a and b of MCI eq. 54); 0-dim
        tensors may require grad.
    negative_term : {"log_p", "log1m_p"}
        The different-pair term (URL code 0bd3ea0 / bf67867; module docstring).
    eps : float
        Added to p before the logs, as the URL code's ``EPS`` (module docstring).
    mc_average : {"inside", "outside"}
        ``log p`` with p the sample mean (default) or the sample mean of ``log sigmoid``
        (MCI's code; needs ``eps=0``).
    negative_weight : float
        Multiplies the different-pair term (MCI's code: ``1 / M``).
    """
    v = HIBVariant(**variant)
    k = _check_n_samples(n_samples)
    scale = _check_t(scale, "scale")
    if not bool(torch.isfinite(torch.as_tensor(bias).detach()).all()):
        raise ValueError(f"`bias` must be finite, got {bias}")
    ka, kp = check_anchor_positive(mu_anchor, kappa_anchor, mu_pos, kappa_pos)
    b, d = mu_anchor.shape
    if mu_neg is None:
        check_in_batch_negatives(b, kappa_neg)
        z = _sample_vmf(torch.cat([mu_anchor, mu_pos]), torch.cat([ka, kp]), k, generator=generator)
        return reduce_losses(_in_batch_losses(z, scale, bias, v), reduction)
    kn = check_explicit_negatives(mu_neg, kappa_neg, b, d)
    za, zp, zn = sample_triplets(mu_anchor, ka, mu_pos, kp, mu_neg, kn, k, generator)
    log_p_pos = v.log_match(za, zp, scale, bias)
    log_neg = v.log_match(za.unsqueeze(2), zn, scale, bias, v.complement)  # [B, M]
    return reduce_losses(-log_p_pos + v.negative_weight * v.sign * log_neg.mean(-1), reduction)


def _in_batch_losses(
    z: Tensor, scale: float | Tensor, bias: float | Tensor, v: HIBVariant
) -> Tensor:
    """``[2B]`` HIB losses of the samples ``z [K, 2B, D]`` of B two-view pairs: each input's
    positive is its other view, its negatives the 2B - 2 other inputs."""
    n = z.shape[1]
    b = n // 2
    partner = torch.cat([torch.arange(b, n), torch.arange(b)]).to(z.device)
    log_p_pos = v.log_match(z, z[:, partner], scale, bias)  # [2B]
    neg_mask = ~torch.eye(n, dtype=torch.bool, device=z.device)
    neg_mask[torch.arange(n, device=z.device), partner] = False
    zz = z.unsqueeze(2).expand(-1, -1, n, -1)
    log_neg = v.log_match(
        zz, z.unsqueeze(1).expand(-1, n, -1, -1), scale, bias, v.complement
    )  # [2B, 2B]
    neg_term = v.sign * (log_neg * neg_mask).sum(-1) / neg_mask.sum(-1)
    return -log_p_pos + v.negative_weight * neg_term


class HIBLoss(ExplicitKappaLoss):
    """HIB as a pytorch-metric-learning loss (URL appendix B.6, eq. 5).

    ``-mean_{same pairs} log p + mean_{different pairs} log p`` (or ``- log(1 - p)``); pairs
    come from ``labels`` (all pairs without self-matches) or a miner's ``indices_tuple``, and
    ``ref_emb`` works. One set of K samples per input is shared by all pairs it is part of.

    Parameters
    ----------
    scale : float
        t (URL: [8, 64]).
    bias : float
        b (URL: [-8, 8]).
    n_samples : int
        K (URL: 16).
    negative_term : {"log_p", "log1m_p"}
        URL's ``+log p`` (default; URL code 0bd3ea0) or the original ``-log(1 - p)`` (URL
        code bf67867, MCI eq. 54).
    eps : float
        Added to p before the logs (the URL code's ``EPS = 1e-5``, default).
    **kwargs
        Passed to ``BaseMetricLossFunction``.
    """

    def __init__(
        self,
        scale: float = 16.0,
        bias: float = -8.0,
        n_samples: int = 16,
        negative_term: str = "log_p",
        eps: float = 1e-5,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.scale = _check_t(scale, "scale")
        if not math.isfinite(bias):
            raise ValueError(f"`bias` must be finite, got {bias}")
        self.bias = float(bias)
        self.n_samples = _check_n_samples(n_samples)
        self.negative_term = _check_neg_term(negative_term)
        self.eps = _check_eps(eps)
        self.generator: torch.Generator | None = None

    def _sub_loss_names(self) -> list[str]:
        return ["pos_loss", "neg_loss"]

    def compute_loss(
        self, embeddings, labels, indices_tuple, ref_emb, ref_labels, kappa, ref_kappa
    ):
        if labels is None and indices_tuple is None:
            raise ValueError("HIBLoss needs `labels` or `indices_tuple`")
        a1, p, a2, n = lmu.convert_to_pairs(indices_tuple, labels, ref_labels)
        z = _sample_vmf(embeddings, kappa, self.n_samples, generator=self.generator)
        if ref_emb is embeddings:
            zr = z
        else:
            zr = _sample_vmf(ref_emb, ref_kappa, self.n_samples, generator=self.generator)
        out = self.zero_losses()
        if len(a1) > 0:
            lp = hib_log_match_probability(z[:, a1], zr[:, p], self.scale, self.bias, eps=self.eps)
            out["pos_loss"] = {"losses": -lp, "indices": (a1, p), "reduction_type": "pos_pair"}
        if len(a2) > 0:
            comp = self.negative_term == "log1m_p"
            ln = hib_log_match_probability(
                z[:, a2], zr[:, n], self.scale, self.bias, comp, self.eps
            )
            losses = -ln if comp else ln
            out["neg_loss"] = {"losses": losses, "indices": (a2, n), "reduction_type": "neg_pair"}
        return out
