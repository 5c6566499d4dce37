"""Expected likelihood kernel (ELK) between vMF distributions and the ELK ProxyNCA loss.

The expected likelihood kernel of two densities is ``int p(z) q(z) dz`` (Jebara & Kondor 2003);
for ``p = vMF(mu1, k1)`` and ``q = vMF(mu2, k2)`` on S^{D-1} it is analytic:

``log ELK = log C_D(k1) + log C_D(k2) - log C_D(||k1 mu1 + k2 mu2||)``

(ECCV22 nivMF paper, supplement D, reprinted in the thesis; MCI appendix B.5). URL appendix
B.4 uses it inside ProxyNCA: each class is a vMF proxy ``rho_c`` whose concentration is scaled
by t, and the loss is ``-elk_sim(zeta, rho*) + log sum_c exp(elk_sim(zeta, rho_c))`` (URL eq. 3)
with ``zeta = vMF(e/||e||, kappa(e))`` the image's posterior. MCI eq. 55 plugs the same kernel
into InfoNCE (:func:`elk_contrastive_loss`).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
from torch import Tensor

from bayesurl._checks import check_floating
from bayesurl.heads.proxies import VMFProxies
from bayesurl.losses._base import (
    ProxyLoss,
    check_anchor_positive,
    check_class_labels,
    check_embeddings,
    check_explicit_negatives,
    check_in_batch_negatives,
    check_kappa,
    check_labels,
    contrastive_log_ratio,
    reduce_losses,
)
from bayesurl.losses.infonce import _check_t, two_view_labels
from bayesurl.losses.normalizer import VmfNormalizer, check_normalizer, log_normalizer

__all__ = [
    "ELKLoss",
    "elk_contrastive_loss",
    "elk_log_kernel",
    "elk_pairwise_log_kernel",
    "elk_proxy_loss",
]


def _log_kernel_from_cos(
    k1: Tensor, k2: Tensor, cos: Tensor, dim: int, normalizer: VmfNormalizer = VmfNormalizer.EXACT
) -> Tensor:
    # ||k1 mu1 + k2 mu2||^2 = k1^2 + k2^2 + 2 k1 k2 cos, floored away from 0 (its sqrt has an
    # infinite derivative there: antipodal means with equal concentrations)
    k3_sq = k1 * k1 + k2 * k2 + 2.0 * k1 * k2 * cos.clamp(-1.0, 1.0)
    k3 = torch.sqrt(k3_sq.clamp_min(1e-12))
    log_c = partial(log_normalizer, dim=dim, normalizer=normalizer)
    return log_c(k1) + log_c(k2) - log_c(k3)


def elk_log_kernel(mu1: Tensor, kappa1: Tensor, mu2: Tensor, kappa2: Tensor) -> Tensor:
    """``log int vMF(z; mu1, k1) vMF(z; mu2, k2) dz``, elementwise with broadcasting.

    Parameters
    ----------
    mu1, mu2 : Tensor
        ``[..., D]`` mean directions (normalised internally).
    kappa1, kappa2 : Tensor
        ``[...]`` finite concentrations ``>= 0``, broadcastable with the means' batch shape.

    Returns
    -------
    Tensor
        ``[...]`` log kernel values (the ``elk_sim`` of URL eq. 3).
    """
    if mu1.shape[-1] != mu2.shape[-1]:
        raise ValueError(f"`mu1` and `mu2` differ in dimension: {mu1.shape[-1]} vs {mu2.shape[-1]}")
    check_floating(mu1, "mu1")
    check_floating(mu2, "mu2")
    try:
        batch = torch.broadcast_shapes(mu1.shape[:-1], mu2.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"`mu1` {tuple(mu1.shape)} and `mu2` {tuple(mu2.shape)}: batch shapes do not broadcast"
        ) from None
    for name, k in (("kappa1", kappa1), ("kappa2", kappa2)):
        shape = torch.as_tensor(k).shape
        try:  # a [N, 1] kappa against [N] means would silently give an [N, N] result
            ok = torch.broadcast_shapes(shape, batch) == batch
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"`{name}` of shape {tuple(shape)} does not fit the means' batch shape "
                f"{tuple(batch)}"
            )
    for name, t in (("mu1", mu1), ("mu2", mu2), ("kappa1", kappa1), ("kappa2", kappa2)):
        if not torch.isfinite(torch.as_tensor(t)).all():
            raise ValueError(f"`{name}` must be finite")
    kappa1, kappa2 = torch.as_tensor(kappa1).to(mu1), torch.as_tensor(kappa2).to(mu1)
    if bool((kappa1 < 0).any()) or bool((kappa2 < 0).any()):
        raise ValueError("`kappa1` and `kappa2` must be non-negative")
    return _elk_log_kernel(mu1, kappa1, mu2, kappa2)


def _elk_log_kernel(mu1: Tensor, kappa1: Tensor, mu2: Tensor, kappa2: Tensor) -> Tensor:
    """:func:`elk_log_kernel` of validated tensors (finite, ``kappa >= 0`` of ``mu1``'s dtype)."""
    cos = (F.normalize(mu1, dim=-1) * F.normalize(mu2, dim=-1)).sum(-1)
    return _log_kernel_from_cos(kappa1, kappa2, cos, mu1.shape[-1])


def elk_pairwise_log_kernel(
    mu: Tensor,
    kappa: Tensor,
    ref_mu: Tensor,
    ref_kappa: Tensor,
    normalizer: str | VmfNormalizer = VmfNormalizer.EXACT,
) -> Tensor:
    """``[N, R]`` log ELK between every ``vMF(mu_i, kappa_i)`` and ``vMF(ref_mu_j, ref_kappa_j)``.

    Same formula as :func:`elk_log_kernel`, with the cosines from one matrix product.
    ``normalizer``: the exact ``log C_D`` (default) or the URL code's polynomial fit
    (``"url_poly"``, URL ``elk_sim``; :mod:`bayesurl.losses.normalizer`).
    """
    norm = check_normalizer(normalizer)
    mu, k, ref_mu, rk = _check_pairwise(mu, kappa, ref_mu, ref_kappa, ("mu", "ref_mu"))
    return _elk_pairwise_log_kernel(mu, k, ref_mu, rk, norm)


def _check_pairwise(
    mu: Tensor, kappa: Tensor, ref_mu: Tensor, ref_kappa: Tensor, names: tuple[str, str]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Checked ``(mu, kappa, ref_mu, ref_kappa)`` in one floating dtype (the promoted one of
    the means), each error naming the caller's argument (``names``: the two means)."""
    a, b = names
    ka, kb = a.replace("mu", "kappa"), b.replace("mu", "kappa")
    check_embeddings(mu, a)
    check_embeddings(ref_mu, b)
    if mu.shape[1] != ref_mu.shape[1]:
        raise ValueError(f"`{a}` and `{b}` differ in dimension: {mu.shape[1]} vs {ref_mu.shape[1]}")
    dtype = torch.promote_types(mu.dtype, ref_mu.dtype)
    mu, ref_mu = mu.to(dtype), ref_mu.to(dtype)
    k = check_kappa(kappa, mu, ka, allow_inf=False)
    rk = check_kappa(ref_kappa, ref_mu, kb, allow_inf=False)
    return mu, k, ref_mu, rk


def _elk_pairwise_log_kernel(
    mu: Tensor,
    kappa: Tensor,
    ref_mu: Tensor,
    ref_kappa: Tensor,
    normalizer: VmfNormalizer = VmfNormalizer.EXACT,
) -> Tensor:
    """:func:`elk_pairwise_log_kernel` of validated tensors (``kappa [N]``, ``ref_kappa [R]``
    finite, ``>= 0``)."""
    cos = F.normalize(mu, dim=-1) @ F.normalize(ref_mu, dim=-1).T
    return _log_kernel_from_cos(
        kappa.unsqueeze(1), ref_kappa.unsqueeze(0), cos, mu.shape[1], normalizer
    )


def elk_proxy_loss(
    mu: Tensor,
    kappa: Tensor,
    labels: Tensor,
    proxy_mu: Tensor,
    proxy_kappa: Tensor,
    reduction: str = "mean",
) -> Tensor:
    """ELK ProxyNCA (URL appendix B.4, eq. 3): cross-entropy over the classes' log ELK.

    Parameters
    ----------
    mu : Tensor
        ``[N, D]`` embeddings (normalised internally).
    kappa : Tensor
        ``[N]`` their concentrations.
    labels : Tensor
        ``[N]`` class indices in ``[0, C)``.
    proxy_mu, proxy_kappa : Tensor
        ``[C, D]`` and ``[C]``: the class proxies (already scaled by t).
    reduction : {"mean", "sum", "none"}
        As in :func:`torch.nn.functional.cross_entropy`.
    """
    mu, k, proxy_mu, pk = _check_pairwise(mu, kappa, proxy_mu, proxy_kappa, ("mu", "proxy_mu"))
    logits = _elk_pairwise_log_kernel(mu, k, proxy_mu, pk)
    _check_class_labels(labels, mu, proxy_mu.shape[0])
    return F.cross_entropy(logits, labels, reduction=reduction)


def _check_class_labels(labels: Tensor, embeddings: Tensor, num_classes: int) -> None:
    check_labels(labels, embeddings)
    check_class_labels(labels, num_classes)


def elk_contrastive_loss(
    mu_anchor: Tensor,
    kappa_anchor: Tensor | float,
    mu_pos: Tensor,
    kappa_pos: Tensor | float,
    mu_neg: Tensor | None = None,
    kappa_neg: Tensor | float | None = None,
    *,
    scale: float | Tensor = 1.0,
    divide_positive: bool = False,
    negatives: str = "mean",
    reduction: str = "mean",
) -> Tensor:
    """Contrastive ELK (MCI appendix B.5, eq. 55): InfoNCE with ``scale * log ELK`` similarities.

    ``-log e^{s_pos} / (c e^{s_pos} + (1/M) sum_m e^{s_m})``, ``s = scale * log ELK``,
    ``c = 1`` (eq. 55) or ``1/M`` (``divide_positive``). Arguments as in
    :func:`~bayesurl.losses.mcinfonce.mcinfonce_loss` (``mu_neg [B, M, D]`` or ``None`` for
    in-batch SimCLR negatives); concentrations must be finite. ``scale`` (the kappa of MCI
    eq. 55) may be a 0-dim tensor that requires grad. ``negatives="mean"`` (default) averages
    the negatives as eq. 55 does; ``"sum"`` sums them as the MCI code does
    (mkirchhof/Probabilistic_Contrastive_Learning b0f70c0, ``utils/losses.py`` line 73:
    ``mean(sim_pos) - logsumexp(cat(sim_pos, sim_neg))``; needs ``divide_positive=False``).
    The two agree for M = 1, the controlled experiment's default.
    """
    if negatives not in ("mean", "sum"):
        raise ValueError(f"`negatives` must be 'mean' or 'sum', got {negatives!r}")
    if negatives == "sum" and divide_positive:
        raise ValueError("`divide_positive` needs negatives='mean'")
    ka, kp = check_anchor_positive(mu_anchor, kappa_anchor, mu_pos, kappa_pos, allow_inf=False)
    scale = _check_t(scale, "scale")
    b, d = mu_anchor.shape
    if mu_neg is None:
        check_in_batch_negatives(b, kappa_neg)
        mu, kap = torch.cat([mu_anchor, mu_pos]), torch.cat([ka, kp])
        sims = scale * _elk_pairwise_log_kernel(mu, kap, mu, kap)
        a1, p, a2, n = lmu.get_all_pairs_indices(two_view_labels(b, mu.device))
        mask = torch.zeros_like(sims, dtype=torch.bool)
        mask[a2, n] = True
        neg = sims[a1] + _log_count(mask[a1], negatives, sims)
        losses = -contrastive_log_ratio(sims[a1, p], neg, mask[a1], divide_positive)
    else:
        kn = check_explicit_negatives(mu_neg, kappa_neg, b, d, allow_inf=False)
        pos = scale * _elk_log_kernel(mu_anchor, ka, mu_pos, kp)
        neg = scale * _elk_log_kernel(mu_anchor.unsqueeze(1), ka.unsqueeze(1), mu_neg, kn)
        neg = neg + _log_count(torch.ones_like(neg, dtype=torch.bool), negatives, neg)
        losses = -contrastive_log_ratio(pos, neg, None, divide_positive)
    return reduce_losses(losses, reduction)


def _log_count(mask: Tensor, negatives: str, like: Tensor) -> Tensor:
    """``log M`` per row for ``"sum"`` (a mean of ``e^{s + log M}`` is the sum), else 0."""
    if negatives == "mean":
        return like.new_zeros(())
    return torch.log(mask.sum(-1, keepdim=True).clamp_min(1).to(like.dtype))


class ELKLoss(ProxyLoss):
    """ELK ProxyNCA as a pytorch-metric-learning loss with learnable vMF proxies (URL B.4).

    ``loss(embeddings, labels, kappa=kappa)``: a :class:`~bayesurl.losses._base.ProxyLoss`
    (labels needed, no ``indices_tuple`` nor ``ref_emb``) over analytic log ELKs; optimise
    ``loss.parameters()`` too (the proxies).

    Parameters
    ----------
    num_classes, embedding_size : int
        Number of classes C and embedding dimension D.
    kappa_scale : float
        t, the multiplier of the proxies' concentrations (URL: t in [8, 64]).
    shared_kappa : bool
        One proxy concentration for all classes.
    learn_proxy_kappa : bool
        Learn the proxies' concentrations.
    normalizer : {"exact", "url_poly"}
        ``log C_D`` exact (default) or the URL code's polynomial fit
        (:mod:`bayesurl.losses.normalizer`).
    **kwargs
        Passed to ``BaseMetricLossFunction`` (reducer, ...).
    """

    allow_inf_kappa = False

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        kappa_scale: float = 16.0,
        shared_kappa: bool = False,
        learn_proxy_kappa: bool = True,
        normalizer: str | VmfNormalizer = VmfNormalizer.EXACT,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.normalizer = check_normalizer(normalizer)
        self.proxies = VMFProxies(
            num_classes, embedding_size, kappa_scale, shared_kappa, learn_proxy_kappa
        )

    def _proxy_logits(
        self, embeddings: Tensor, kappa: Tensor, proxy_mu: Tensor, proxy_kappa: Tensor
    ) -> Tensor:
        return _elk_pairwise_log_kernel(embeddings, kappa, proxy_mu, proxy_kappa, self.normalizer)
