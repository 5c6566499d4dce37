"""MCInfoNCE: InfoNCE on vMF samples (MCI section 4.1, eq. 7; URL appendix B.3, eq. 2).

Each input has a posterior ``vMF(mu(x), kappa(x))``. K reparameterised samples are drawn per
input; sample k of the anchor is compared with sample k of its positive and of its negatives,
and the InfoNCE fraction is averaged over the K samples *inside* the log (log-mean-exp):

``L = -log (1/K) sum_k  e^{t z_k^T z_k+} / (c e^{t z_k^T z_k+} + (1/M) sum_m e^{t z_k^T z_mk-})``

with ``t = kappa_pos`` (the inverse temperature) and ``c = 1`` (the MCI controlled-experiment
reference code) or ``c = 1/M`` (eq. 7 as printed; ``divide_positive=True``). With kappa = inf
every sample is its mean and the loss is InfoNCE at temperature ``1/t`` (shifted by ``log M``
for ``c = 1/M``, with averaged negatives for ``c = 1``).

Two options select the variant (paper text vs authors' code):

- ``denominator="negatives"`` (default): no positive in the denominator and the negatives
  summed, ``e^{t z_k^T z_k+} / sum_m e^{t z_k^T z_mk-}``, as URL eq. 2 prints it and as the
  URL benchmark code computes it (``timm/loss/MCInfoNCE.py``: log-sum-exp over the positive
  mask minus log-sum-exp over the negative mask) -- the loss behind the URL numbers.
  ``denominator="positive"``: the MCI form above (``c = 1`` or ``1/M``); the controlled
  experiment (:mod:`bayesurl.experiments.controlled`) uses it.
- ``mc_average="inside"`` (default): log-mean-exp over the K samples, as the URL and MCI code
  do; ``"outside"``: the mean over samples of the per-sample log ratio, ``(1/16) sum_i`` in
  front of the logs of URL eq. 2 as printed.

With ``denominator="negatives"`` the URL code's two further behaviours are options too, as in
:mod:`bayesurl.losses.infonce`: ``self_term`` (the self-similarity's ``e^0`` inside both
log-sum-exps of every sample, ``log (1 + e^pos) - log (1 + sum e^neg)``; on by default with
``"negatives"``, as in the code behind the URL numbers) and, in :class:`MCInfoNCELoss`,
``positives="logsumexp"`` (one log-sum-exp over all positives of an anchor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import torch
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
from torch import Tensor

from bayesurl._checks import check_int
from bayesurl.distributions.vmf import VmfSampler, _sample_vmf, check_sampler
from bayesurl.losses._base import (
    ExplicitKappaLoss,
    check_anchor_positive,
    check_explicit_negatives,
    check_in_batch_negatives,
    contrastive_log_ratio,
    log_mean_exp,
    log_ratio_from_mean,
    masked_log_mean_exp,
    reduce_losses,
    sample_triplets,
)
from bayesurl.losses.infonce import (
    _check_t,
    check_positives,
    resolve_self_term,
    two_view_labels,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "MCInfoNCELoss",
    "MCInfoNCEOptions",
    "MCInfoNCEVariant",
    "mcinfonce_anchor_losses",
    "mcinfonce_loss",
    "mcinfonce_pair_losses",
]


def _check_n_samples(n: int) -> int:
    return check_int(n, "n_samples", low=1)


_DENOMINATORS = ("negatives", "positive")
_MC_AVERAGES = ("inside", "outside")


def _check_variant(denominator: str, mc_average: str, self_term: bool | None = None) -> bool:
    """Validate the variant options; returns ``self_term`` resolved."""
    if denominator not in _DENOMINATORS:
        raise ValueError(f"`denominator` must be one of {_DENOMINATORS}, got {denominator!r}")
    if mc_average not in _MC_AVERAGES:
        raise ValueError(f"`mc_average` must be one of {_MC_AVERAGES}, got {mc_average!r}")
    with_self = resolve_self_term(self_term, denominator)
    if with_self and denominator != "negatives":
        raise ValueError("`self_term` is the URL code's and needs denominator='negatives'")
    return with_self


class MCInfoNCEOptions(TypedDict, total=False):
    """The keywords choosing the variant of :func:`mcinfonce_loss` (:class:`MCInfoNCEVariant`)."""

    divide_positive: bool
    denominator: str
    mc_average: str
    self_term: bool | None


@dataclass(frozen=True)
class MCInfoNCEVariant:
    """Which MCInfoNCE (paper text or authors' code; module docstring), checked once.

    Built from the keywords of :func:`mcinfonce_loss` (:class:`MCInfoNCEOptions`) and handed
    down to the per-pair and per-anchor losses; ``self_term`` is resolved (``None`` becomes on
    with ``"negatives"``, off with ``"positive"``).

    Parameters
    ----------
    divide_positive, denominator, mc_average, self_term
        See :func:`mcinfonce_loss`.

    Raises
    ------
    ValueError
        For an unknown ``denominator`` / ``mc_average``, or ``self_term`` with
        ``denominator="positive"``.
    """

    divide_positive: bool = False
    denominator: str = "negatives"
    mc_average: str = "inside"
    self_term: bool | None = None

    def __post_init__(self) -> None:
        with_self = _check_variant(self.denominator, self.mc_average, self.self_term)
        object.__setattr__(self, "self_term", with_self)

    def log_ratio(self, pos: Tensor, log_neg_mean: Tensor, m: Tensor) -> Tensor:
        """Per-sample log ratio of positive logits and the log-mean-exp of their ``m``
        negatives; ``"negatives"``: ``pos - log sum_m e^neg`` (0 without negatives)."""
        if self.denominator == "positive":
            return log_ratio_from_mean(pos, log_neg_mean, m, self.divide_positive)
        log_sum = log_neg_mean + torch.log(m.clamp_min(1.0))
        ratio = _url_log_ratio(pos, log_sum, bool(self.self_term))
        return torch.where(m > 0, ratio, torch.zeros_like(pos))

    def loss(self, log_ratio: Tensor) -> Tensor:
        """Loss from ``[K, ...]`` per-sample log ratios: log-mean-exp (inside) or mean (outside)."""
        if self.mc_average == "inside":
            return -log_mean_exp(log_ratio, dim=0)
        return -log_ratio.mean(dim=0)


def _url_log_ratio(log_pos_sum: Tensor, log_neg_sum: Tensor, self_term: bool) -> Tensor:
    """``log sum e^pos - log sum e^neg``, each with the code's ``e^0`` when ``self_term``."""
    if self_term:
        zero = torch.zeros_like(log_pos_sum)
        return torch.logaddexp(zero, log_pos_sum) - torch.logaddexp(zero, log_neg_sum)
    return log_pos_sum - log_neg_sum


def mcinfonce_pair_losses(
    samples: Tensor,
    ref_samples: Tensor,
    pairs: tuple[Tensor, Tensor, Tensor, Tensor],
    inverse_temperature: float,
    divide_positive: bool = False,
    denominator: str = "negatives",
    mc_average: str = "inside",
    self_term: bool | None = None,
) -> Tensor:
    """Per-positive-pair MCInfoNCE losses from vMF samples and PML pair indices.

    Parameters
    ----------
    samples : Tensor
        ``[K, N, D]`` unit-norm samples of the anchors.
    ref_samples : Tensor
        ``[K, R, D]`` unit-norm samples of the reference set.
    pairs : tuple of Tensor
        ``(a1, p, a2, n)`` as returned by ``lmu.convert_to_pairs``; the negatives of positive
        pair ``(a1[i], p[i])`` are every ``n[j]`` with ``a2[j] == a1[i]``.
    inverse_temperature : float
        t = kappa_pos.
    divide_positive, denominator, mc_average, self_term
        See :func:`mcinfonce_loss`.

    Returns
    -------
    Tensor
        ``[P]`` losses, one per positive pair.
    """
    variant = MCInfoNCEVariant(divide_positive, denominator, mc_average, self_term)
    return _pair_losses(samples, ref_samples, pairs, inverse_temperature, variant)


def _pair_losses(
    samples: Tensor,
    ref_samples: Tensor,
    pairs: tuple[Tensor, Tensor, Tensor, Tensor],
    inverse_temperature: float | Tensor,
    variant: MCInfoNCEVariant,
) -> Tensor:
    """:func:`mcinfonce_pair_losses` with the variant resolved."""
    a1, p, a2, n = pairs
    sims = inverse_temperature * torch.einsum("knd,krd->knr", samples, ref_samples)
    neg_of_anchor = torch.zeros(
        samples.shape[1], ref_samples.shape[1], dtype=torch.bool, device=samples.device
    )
    neg_of_anchor[a2, n] = True
    # the negatives depend on the anchor only: average them once per anchor ([K, N]), then
    # gather per positive pair (memory K N R instead of K P R)
    log_neg_mean, m = masked_log_mean_exp(sims, neg_of_anchor)
    pos = sims[:, a1, p]  # [K, P]
    return variant.loss(variant.log_ratio(pos, log_neg_mean[:, a1], m[a1]))


def _pair_mask(rows: Tensor, cols: Tensor, n: int, r: int) -> Tensor:
    mask = torch.zeros(n, r, dtype=torch.bool, device=rows.device)
    mask[rows, cols] = True
    return mask


def mcinfonce_anchor_losses(
    samples: Tensor,
    ref_samples: Tensor,
    pairs: tuple[Tensor, Tensor, Tensor, Tensor],
    inverse_temperature: float,
    mc_average: str = "inside",
    self_term: bool = True,
) -> tuple[Tensor, Tensor]:
    """Per-anchor MCInfoNCE with one log-sum-exp over all positives (the URL code).

    ``log sum_p e^{t z_k^T z_pk} - log sum_n e^{t z_k^T z_nk}`` per sample k (each with the
    code's ``e^0`` when ``self_term``), averaged over k as ``mc_average`` says; the
    ``supervised=True`` path of URL ``timm/loss/MCInfoNCE.py``. Arguments as in
    :func:`mcinfonce_pair_losses` (``denominator="negatives"`` implied).

    Returns
    -------
    tuple of Tensor
        ``[A]`` losses and the ``[A]`` anchor indices (anchors with a positive; an anchor
        without negatives gets 0).
    """
    variant = MCInfoNCEVariant(mc_average=mc_average, self_term=self_term)
    a1, p, a2, n = pairs
    sims = inverse_temperature * torch.einsum("knd,krd->knr", samples, ref_samples)
    big_n, r = sims.shape[1:]
    anchors = torch.unique(a1)
    log_pos_mean, m_pos = masked_log_mean_exp(sims, _pair_mask(a1, p, big_n, r))
    log_neg_mean, m_neg = masked_log_mean_exp(sims, _pair_mask(a2, n, big_n, r))
    log_pos = (log_pos_mean + torch.log(m_pos.clamp_min(1.0)))[:, anchors]
    log_neg = (log_neg_mean + torch.log(m_neg.clamp_min(1.0)))[:, anchors]
    has = m_neg[anchors] > 0
    log_ratio = torch.where(
        has, _url_log_ratio(log_pos, log_neg, self_term), torch.zeros_like(log_pos)
    )
    return variant.loss(log_ratio), anchors


def mcinfonce_loss(
    mu_anchor: Tensor,
    kappa_anchor: Tensor | float,
    mu_pos: Tensor,
    kappa_pos: Tensor | float,
    mu_neg: Tensor | None = None,
    kappa_neg: Tensor | float | None = None,
    *,
    n_samples: int = 16,
    kappa_pos_scale: float | Tensor = 16.0,
    generator: torch.Generator | None = None,
    reduction: str = "mean",
    **variant: Unpack[MCInfoNCEOptions],
) -> Tensor:
    """MCInfoNCE on plain tensors (MCI eq. 7), for explicit or in-batch negatives.

    Parameters
    ----------
    mu_anchor, mu_pos : Tensor
        ``[B, D]`` locations of the anchors and their positives (normalised internally).
    kappa_anchor, kappa_pos : Tensor or float
        ``[B]`` concentrations (``inf`` allowed: the sample is the mean).
    mu_neg : Tensor, optional
        ``[B, M, D]`` explicit negatives per anchor. ``None``: in-batch SimCLR negatives --
        anchors and positives are both anchors (2B of them) and each has the 2B - 2 other
        inputs as negatives (URL appendix B.3, eq. 2).
    kappa_neg : Tensor or float, optional
        ``[B, M]`` concentrations of the negatives (required with ``mu_neg``).
    n_samples : int
        K, the number of vMF samples per input (URL: 16, MCI: 512).
    kappa_pos_scale : float or Tensor
        kappa_pos of the generative process = the inverse temperature t (MCI: 20,
        URL: t in [8, 64]); a 0-dim tensor may require grad (MCI tunes "kappa_pos learnable").
    generator : torch.Generator, optional
        Makes the vMF samples reproducible (anchors, positives, negatives drawn in that order).
    reduction : {"mean", "sum", "none"}
        Over anchors (``[B]`` or ``[2B]`` for in-batch negatives with ``"none"``).
    divide_positive : bool
        With ``denominator="positive"`` only. ``False`` (MCI reference code): only the
        negatives are averaged by M, loss >= 0. ``True``: the positive in the denominator is
        divided by M too (MCI eq. 7 as printed).
    denominator : {"negatives", "positive"}
        ``"negatives"`` (default; URL eq. 2 and the URL benchmark code): the positive is not
        in the denominator and the negatives are summed. ``"positive"``: the MCI form.
    mc_average : {"inside", "outside"}
        Average the K samples inside the log (default; URL and MCI code) or outside it (URL
        eq. 2 as printed).
    self_term : bool, optional
        The URL code's ``e^0`` in both log-sum-exps of every sample; ``None`` = on with
        ``"negatives"`` (the URL code), off with ``"positive"`` (where it is refused).

    Returns
    -------
    Tensor
        The loss.
    """
    t = _check_t(kappa_pos_scale, "kappa_pos_scale")
    k = _check_n_samples(n_samples)
    v = MCInfoNCEVariant(**variant)
    ka, kp = check_anchor_positive(mu_anchor, kappa_anchor, mu_pos, kappa_pos)
    b, d = mu_anchor.shape
    if mu_neg is None:
        check_in_batch_negatives(b, kappa_neg)
        z = _sample_vmf(torch.cat([mu_anchor, mu_pos]), torch.cat([ka, kp]), k, generator=generator)
        pairs = lmu.get_all_pairs_indices(two_view_labels(b, z.device))
        # get_all_pairs_indices lists positives row by row: anchor i has exactly one
        return reduce_losses(_pair_losses(z, z, pairs, t, v), reduction)
    kn = check_explicit_negatives(mu_neg, kappa_neg, b, d)
    za, zp, zn = sample_triplets(mu_anchor, ka, mu_pos, kp, mu_neg, kn, k, generator)
    pos = t * (za * zp).sum(-1)  # [K, B]
    neg = t * torch.einsum("kbd,kbmd->kbm", za, zn)
    if v.denominator == "positive":
        log_ratio = contrastive_log_ratio(pos, neg, None, v.divide_positive)
    else:
        log_ratio = _url_log_ratio(pos, torch.logsumexp(neg, dim=-1), bool(v.self_term))
    return reduce_losses(v.loss(log_ratio), reduction)


class MCInfoNCELoss(ExplicitKappaLoss):
    """MCInfoNCE as a pytorch-metric-learning loss (MCI eq. 7, URL appendix B.3).

    Positive pairs come from ``labels`` (or a miner's ``indices_tuple``); the negatives of a
    positive pair ``(a, p)`` are all negatives of anchor ``a``. For SimCLR's two views call it
    on ``torch.cat([e1, e2])`` with :func:`~bayesurl.losses.infonce.two_view_labels`. The
    concentration is passed explicitly: ``loss(emb, labels, kappa=kappa)``; one set of K
    samples per input is shared by all pairs it takes part in.

    Parameters
    ----------
    inverse_temperature : float
        t = kappa_pos (URL: t in [8, 64]).
    n_samples : int
        K, vMF samples per input (URL: 16).
    divide_positive, denominator, mc_average, self_term
        See :func:`mcinfonce_loss` (defaults: the URL benchmark code).
    positives : {"pairs", "logsumexp"}
        One term per positive pair (default) or one per anchor with a log-sum-exp over its
        positives (the URL code with class labels; :func:`mcinfonce_anchor_losses`; needs
        ``denominator="negatives"``).
    sampler : {"exact", "url_taylor"}
        The vMF sampler (:func:`~bayesurl.distributions.sample_vmf`): exact (default) or the
        URL / MCI code's biased Taylor-envelope sampler, an opt-in for reproducing its numbers.
    **kwargs
        Passed to ``BaseMetricLossFunction`` (reducer, embedding regularizer, ...).
    """

    def __init__(
        self,
        inverse_temperature: float = 16.0,
        n_samples: int = 16,
        divide_positive: bool = False,
        denominator: str = "negatives",
        mc_average: str = "inside",
        self_term: bool | None = None,
        positives: str = "pairs",
        sampler: str | VmfSampler = VmfSampler.EXACT,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.sampler = check_sampler(sampler)
        self.inverse_temperature = _check_t(inverse_temperature)
        self.n_samples = _check_n_samples(n_samples)
        self.variant = MCInfoNCEVariant(bool(divide_positive), denominator, mc_average, self_term)
        self.positives = check_positives(positives)
        if self.positives == "logsumexp" and denominator != "negatives":
            raise ValueError("`positives='logsumexp'` needs denominator='negatives'")
        self.generator: torch.Generator | None = None

    @property
    def self_term(self) -> bool:
        """The URL code's ``e^0`` term, resolved (:class:`MCInfoNCEVariant`)."""
        return bool(self.variant.self_term)

    @property
    def denominator(self) -> str:
        return self.variant.denominator

    @property
    def mc_average(self) -> str:
        return self.variant.mc_average

    @property
    def divide_positive(self) -> bool:
        return self.variant.divide_positive

    def compute_loss(
        self, embeddings, labels, indices_tuple, ref_emb, ref_labels, kappa, ref_kappa
    ):
        if labels is None and indices_tuple is None:
            raise ValueError("MCInfoNCELoss needs `labels` or `indices_tuple`")
        pairs = lmu.convert_to_pairs(indices_tuple, labels, ref_labels)
        if len(pairs[0]) == 0:
            return self.zero_losses()
        z = _sample_vmf(embeddings, kappa, self.n_samples, self.generator, self.sampler)
        if ref_emb is embeddings:
            zr = z
        else:
            zr = _sample_vmf(ref_emb, ref_kappa, self.n_samples, self.generator, self.sampler)
        if self.positives == "logsumexp":
            losses, anchors = mcinfonce_anchor_losses(
                z, zr, pairs, self.inverse_temperature, self.mc_average, self.self_term
            )
            return {"loss": {"losses": losses, "indices": anchors, "reduction_type": "element"}}
        losses = _pair_losses(z, zr, pairs, self.inverse_temperature, self.variant)
        return {"loss": {"losses": losses, "indices": pairs[:2], "reduction_type": "pos_pair"}}
