"""Shared plumbing of the probabilistic (vMF) losses.

- :class:`ExplicitKappaLoss`: a pytorch-metric-learning ``BaseMetricLossFunction`` whose
  ``forward`` also takes the concentrations ``kappa`` / ``ref_kappa`` explicitly. PML's own
  ``forward`` passes no extra keyword to ``compute_loss`` and its distances normalise the
  embeddings, which would discard a norm-encoded kappa; here the embeddings reach
  ``compute_loss`` unnormalised and every loss normalises them itself.
- :class:`ProxyLoss`: an ``ExplicitKappaLoss`` that is cross-entropy over the log kernels
  between each embedding's vMF and learnable class proxies (ELK, nivMF).
- :func:`contrastive_log_ratio`: ``log e^pos / (c e^pos + (1/M) sum_m e^neg_m)``, the InfoNCE
  fraction of MCInfoNCE (MCI eq. 7) and contrastive ELK (MCI appendix B.5, eq. 55).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.utils import common_functions as c_f
from torch import Tensor

from bayesurl._checks import check_concentration, check_finite, check_ndim, check_same_length
from bayesurl.distributions.vmf import _sample_vmf

__all__ = [
    "ExplicitKappaLoss",
    "ProxyLoss",
    "check_class_labels",
    "check_embeddings",
    "check_kappa",
    "check_labels",
    "contrastive_log_ratio",
    "log_mean_exp",
    "log_ratio_from_mean",
    "masked_log_mean_exp",
]


def check_kappa(
    kappa: Tensor | float | None,
    like: Tensor,
    name: str,
    *,
    allow_inf: bool = True,
) -> Tensor:
    """Validate concentrations for the rows of ``like [N, ...]``; returns ``kappa [N]``.

    ``None`` reads kappa from the embedding norm ``||like||`` (the vMF duality of the ECCV22
    nivMF paper, section 3.2). Scalars broadcast. NaN, negative values, (unless
    ``allow_inf``) infinity, and a positive kappa on an all-zero row of ``like`` (no mean
    direction; :func:`~bayesurl.distributions.sample_vmf` refuses it too) raise a ValueError
    naming ``name``.
    """
    if kappa is None:
        return like.norm(dim=-1)
    k = torch.as_tensor(kappa, device=like.device).to(like.dtype)
    if k.ndim == 0:
        k = k.expand(like.shape[:-1])
    if k.shape != like.shape[:-1]:
        raise ValueError(
            f"`{name}` must have shape {tuple(like.shape[:-1])} to match the embeddings, "
            f"got {tuple(k.shape)}"
        )
    k = check_concentration(k, name, allow_inf=allow_inf)
    zero = (like == 0).all(-1) & (k > 0)
    if bool(zero.any()):
        raise ValueError(
            f"{int(zero.sum())} all-zero embedding row(s) have a positive `{name}`: a zero "
            "vector has no direction to concentrate around"
        )
    return k


def check_embeddings(x: Tensor, name: str, ndim: int = 2) -> Tensor:
    """Raise unless ``x`` is a finite floating tensor with ``ndim`` dims and ``D >= 2``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"`{name}` must be a tensor, got {type(x).__name__}")
    check_ndim(x, name, ndim)
    if not x.is_floating_point():
        raise ValueError(f"`{name}` must be a floating tensor, got {x.dtype}")
    check_finite(x, name)
    if x.shape[-1] < 2:
        raise ValueError(f"`{name}` needs embedding dimension >= 2, got {x.shape[-1]}")
    return x


def check_labels(labels: Tensor | None, embeddings: Tensor, name: str = "labels") -> None:
    """Raise unless ``labels`` is ``None`` or a 1-D integer tensor of the embeddings' length."""
    if labels is None:
        return
    if not isinstance(labels, Tensor):
        raise TypeError(f"`{name}` must be a tensor, got {type(labels).__name__}")
    check_ndim(labels, name, 1)
    check_same_length(("embeddings" if name == "labels" else "ref_emb", embeddings), (name, labels))


def check_class_labels(labels: Tensor, num_classes: int, name: str = "labels") -> None:
    """Raise unless ``labels`` (already checked by :func:`check_labels`) are class indices in
    ``[0, num_classes)``."""
    if labels.dtype.is_floating_point:
        raise ValueError(f"`{name}` must be integer class indices, got {labels.dtype}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"`{name}` must lie in [0, {num_classes}), got [{int(labels.min())}, "
            f"{int(labels.max())}]"
        )


def check_anchor_positive(
    mu_anchor: Tensor,
    kappa_anchor: Tensor | float,
    mu_pos: Tensor,
    kappa_pos: Tensor | float,
    *,
    allow_inf: bool = True,
) -> tuple[Tensor, Tensor]:
    """Validate anchor / positive vMF parameters of the pair losses; return the two kappas."""
    check_embeddings(mu_anchor, "mu_anchor")
    check_embeddings(mu_pos, "mu_pos")
    if mu_pos.shape != mu_anchor.shape:
        raise ValueError(
            f"`mu_pos` must have the shape of `mu_anchor` {tuple(mu_anchor.shape)}, "
            f"got {tuple(mu_pos.shape)}"
        )
    ka = check_kappa(kappa_anchor, mu_anchor, "kappa_anchor", allow_inf=allow_inf)
    kp = check_kappa(kappa_pos, mu_pos, "kappa_pos", allow_inf=allow_inf)
    return ka, kp


def check_in_batch_negatives(n_anchors: int, kappa_neg: Tensor | None) -> None:
    """In-batch (SimCLR) negatives need two anchors and no separate ``kappa_neg``."""
    if kappa_neg is not None:
        raise ValueError("`kappa_neg` was given without `mu_neg`")
    if n_anchors < 2:
        raise ValueError(f"in-batch negatives need at least 2 anchors, got {n_anchors}")


def check_explicit_negatives(
    mu_neg: Tensor,
    kappa_neg: Tensor | float | None,
    n_anchors: int,
    dim: int,
    *,
    allow_inf: bool = True,
) -> Tensor:
    """Validate M explicit negatives per anchor, ``mu_neg [B, M, D]``; return their kappa."""
    check_embeddings(mu_neg, "mu_neg", ndim=3)
    if mu_neg.shape[0] != n_anchors or mu_neg.shape[2] != dim:
        raise ValueError(
            f"`mu_neg` must have shape [{n_anchors}, M, {dim}], got {tuple(mu_neg.shape)}"
        )
    if kappa_neg is None:
        raise ValueError("`kappa_neg` is required with `mu_neg`")
    if mu_neg.shape[1] < 1:
        raise ValueError("`mu_neg` needs at least one negative per anchor")
    return check_kappa(kappa_neg, mu_neg, "kappa_neg", allow_inf=allow_inf)


def sample_triplets(
    mu_anchor: Tensor,
    kappa_anchor: Tensor,
    mu_pos: Tensor,
    kappa_pos: Tensor,
    mu_neg: Tensor,
    kappa_neg: Tensor,
    n_samples: int,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """K vMF samples of checked anchors ``[B, D]``, positives ``[B, D]`` and their negatives
    ``[B, M, D]``, drawn in that order: ``[K, B, D]``, ``[K, B, D]``, ``[K, B, M, D]``."""
    b, m, d = mu_neg.shape
    za = _sample_vmf(mu_anchor, kappa_anchor, n_samples, generator=generator)
    zp = _sample_vmf(mu_pos, kappa_pos, n_samples, generator=generator)
    zn = _sample_vmf(
        mu_neg.reshape(b * m, d), kappa_neg.reshape(b * m), n_samples, generator=generator
    )
    return za, zp, zn.reshape(n_samples, b, m, d)


def reduce_losses(losses: Tensor, reduction: str) -> Tensor:
    """Reduce per-anchor losses by ``"mean"``, ``"sum"`` or ``"none"``."""
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    if reduction == "none":
        return losses
    raise ValueError(f"`reduction` must be 'mean', 'sum' or 'none', got {reduction!r}")


def log_mean_exp(x: Tensor, dim: int) -> Tensor:
    """``log mean exp(x)`` along ``dim`` (the Monte-Carlo average of MCI eq. 7)."""
    return torch.logsumexp(x, dim=dim) - math.log(x.shape[dim])


def masked_log_mean_exp(x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(log (1/M) sum_m e^{x_m}, M)`` over the last dim, counting only ``mask``-ed entries.

    ``x`` is ``[..., P, M]``, ``mask`` a boolean ``[P, M]`` (or ``None``: every entry). Rows
    without any valid entry give ``-inf`` (with finite gradients) and ``M = 0``.
    """
    if mask is None:
        m = torch.full(x.shape[-2:-1], x.shape[-1], dtype=x.dtype, device=x.device)
        return torch.logsumexp(x, dim=-1) - math.log(max(x.shape[-1], 1)), m
    m = mask.sum(-1).to(x.dtype)
    has = mask.any(-1)
    filled = x.masked_fill(~mask, -math.inf)
    # rows without entries: keep the logsumexp finite (its gradient would be NaN)
    filled = torch.where(has.unsqueeze(-1), filled, torch.zeros_like(filled))
    log_sum = torch.where(has, torch.logsumexp(filled, dim=-1), -math.inf)
    return log_sum - torch.log(m.clamp_min(1.0)), m


def log_ratio_from_mean(
    pos: Tensor, log_neg_mean: Tensor, m: Tensor, divide_positive: bool = False
) -> Tensor:
    """``log e^pos / (c e^pos + e^{log_neg_mean})`` with ``c = 1`` or ``1/m`` (see below)."""
    if divide_positive:
        return pos - torch.logaddexp(pos - torch.log(m.clamp_min(1.0)), log_neg_mean)
    return pos - torch.logaddexp(pos, log_neg_mean)


def contrastive_log_ratio(
    pos: Tensor, neg: Tensor, neg_mask: Tensor | None = None, divide_positive: bool = False
) -> Tensor:
    """``log [ e^pos / (c e^pos + (1/M) sum_m e^neg_m) ]`` with ``c = 1`` or ``1/M``.

    Parameters
    ----------
    pos : Tensor
        ``[..., P]`` positive logits.
    neg : Tensor
        ``[..., P, M]`` negative logits.
    neg_mask : Tensor, optional
        ``[P, M]`` boolean mask of the valid negatives per positive (M_p = its row sum).
        Rows without any negative give 0 (ratio 1).
    divide_positive : bool
        ``False`` (the MCInfoNCE reference code): only the negatives are averaged, ``c = 1``,
        so the ratio is ``<= 1`` and the loss ``>= 0``. ``True`` (MCI eq. 7): the positive is
        divided by M too, ``c = 1/M``.
    """
    try:  # pos may broadcast into neg's batch shape, never widen it
        fits = neg.ndim >= 1 and torch.broadcast_shapes(pos.shape, neg.shape[:-1]) == neg.shape[:-1]
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"`neg` {tuple(neg.shape)} must be `pos` {tuple(pos.shape)} plus a last dim of "
            "negatives"
        )
    log_neg_mean, m = masked_log_mean_exp(neg, neg_mask)
    return log_ratio_from_mean(pos, log_neg_mean, m, divide_positive)


def _promote(x: Tensor) -> Tensor:
    """``x`` in float32 if it is float16 / bfloat16, else unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class ExplicitKappaLoss(BaseMetricLossFunction):
    """``BaseMetricLossFunction`` with explicit vMF concentrations (see module docstring).

    ``loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None, *,
    kappa=None, ref_kappa=None)``; ``kappa=None`` reads the concentration from the embedding
    norm. Subclasses implement ``compute_loss(embeddings, labels, indices_tuple, ref_emb,
    ref_labels, kappa, ref_kappa)`` and get miners, reducers and ``ref_emb`` from PML. The
    ``distance`` of PML is not used: the embeddings are compared by cosine / vMF terms.

    Validation happens once, here, as in PML (``forward`` checks and converts, then calls
    ``compute_loss``): ``forward`` checks ``embeddings`` / ``labels`` / ``kappa`` and
    ``ref_emb`` / ``ref_labels`` / ``ref_kappa``, and ``compute_loss`` trusts them -- it
    works with the unchecked cores (``_sample_vmf``, ``_elk_pairwise_log_kernel``, ...)
    instead of the public functions, which validate their own inputs again. Only what
    ``forward`` cannot know is checked there (e.g. labels in ``[0, C)`` of a proxy loss:
    :func:`check_class_labels`).
    """

    allow_inf_kappa: bool = True

    def get_default_distance(self) -> CosineSimilarity:
        return CosineSimilarity()

    def forward(  # type: ignore[override]
        self,
        embeddings: Tensor,
        labels: Tensor | None = None,
        indices_tuple: Any = None,
        ref_emb: Tensor | None = None,
        ref_labels: Tensor | None = None,
        *,
        kappa: Tensor | float | None = None,
        ref_kappa: Tensor | float | None = None,
    ) -> Tensor:
        """Reduced loss of a batch (PML's ``forward`` with explicit concentrations).

        Parameters
        ----------
        embeddings : Tensor
            ``[N, D]`` embeddings.
        labels : Tensor, optional
            ``[N]`` class labels (or ``None`` with ``indices_tuple``).
        indices_tuple : tuple of Tensor, optional
            Pairs or triplets from a PML miner.
        ref_emb, ref_labels : Tensor, optional
            Reference embeddings and labels (PML's ``ref_emb``).
        kappa, ref_kappa : Tensor or float, optional
            vMF concentrations; ``None`` reads them from the embedding norms.

        Returns
        -------
        Tensor
            Scalar loss.
        """
        check_embeddings(embeddings, "embeddings")
        check_labels(labels, embeddings)
        # half-precision inputs (mixed precision) are promoted: the Bessel recurrence and the
        # log-sum-exps need float32 at least; autocast is switched off inside the loss
        embeddings = _promote(embeddings)
        kappa = check_kappa(kappa, embeddings, "kappa", allow_inf=self.allow_inf_kappa)
        if ref_emb is not None:
            ref_emb = _promote(ref_emb)
        with torch.autocast(embeddings.device.type, enabled=False):
            return self._forward(
                embeddings, labels, indices_tuple, ref_emb, ref_labels, kappa, ref_kappa
            )

    def _forward(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, kappa, ref_kappa):
        if ref_emb is None:
            if ref_kappa is not None:
                raise ValueError("`ref_kappa` was given without `ref_emb`")
            if ref_labels is not None:
                raise ValueError("`ref_labels` was given without `ref_emb`")
            ref_kappa = kappa
        else:
            check_embeddings(ref_emb, "ref_emb")
            if ref_emb.shape[1] != embeddings.shape[1]:
                raise ValueError(
                    f"`ref_emb` has dimension {ref_emb.shape[1]}, `embeddings` "
                    f"{embeddings.shape[1]}"
                )
            check_labels(ref_labels, ref_emb, "ref_labels")
            ref_kappa = check_kappa(ref_kappa, ref_emb, "ref_kappa", allow_inf=self.allow_inf_kappa)
        self.reset_stats()
        if labels is not None:
            labels = c_f.to_device(labels, embeddings)
        ref_emb_, ref_labels = c_f.set_ref_emb(embeddings, labels, ref_emb, ref_labels)
        loss_dict = self.compute_loss(
            embeddings, labels, indices_tuple, ref_emb_, ref_labels, kappa, ref_kappa
        )
        self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
        return self.reducer(loss_dict, embeddings, labels)

    def compute_loss(  # type: ignore[override]
        self, embeddings, labels, indices_tuple, ref_emb, ref_labels, kappa, ref_kappa
    ):  # pragma: no cover - abstract
        raise NotImplementedError


class ProxyLoss(ExplicitKappaLoss):
    """Cross-entropy over the log kernels between the embeddings' vMFs and class proxies.

    ``loss(embeddings, labels, kappa=kappa)``; like PML's proxy losses it needs labels and
    supports neither ``indices_tuple`` nor ``ref_emb``. The proxies are the module
    ``self.proxies`` (parameters of the loss: optimise ``loss.parameters()`` too), returning
    ``(mu [C, D], kappa)``; a subclass sets them and implements :meth:`_proxy_logits`, the log
    kernels of checked tensors.
    """

    proxies: torch.nn.Module

    def _proxy_logits(
        self, embeddings: Tensor, kappa: Tensor, proxy_mu: Tensor, proxy_kappa: Tensor
    ) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _class_logits(self, embeddings: Tensor, kappa: Tensor) -> Tensor:
        proxy_mu, proxy_kappa = self.proxies()
        return self._proxy_logits(
            embeddings, kappa, proxy_mu.to(embeddings), proxy_kappa.to(embeddings)
        )

    def logits(self, embeddings: Tensor, kappa: Tensor | float) -> Tensor:
        """``[N, C]`` log kernels between the embeddings' vMFs and every class proxy."""
        check_embeddings(embeddings, "embeddings")
        kappa = check_kappa(kappa, embeddings, "kappa", allow_inf=self.allow_inf_kappa)
        return self._class_logits(embeddings, kappa)

    def compute_loss(
        self, embeddings, labels, indices_tuple, ref_emb, ref_labels, kappa, ref_kappa
    ):
        c_f.labels_required(labels)
        c_f.indices_tuple_not_supported(indices_tuple)
        c_f.ref_not_supported(embeddings, labels, ref_emb, ref_labels)
        # embeddings, labels and kappa were validated by forward; the proxies are parameters
        check_class_labels(labels, self.proxies.num_classes)
        losses = F.cross_entropy(self._class_logits(embeddings, kappa), labels, reduction="none")
        idx = c_f.torch_arange_from_size(embeddings)
        return {"loss": {"losses": losses, "indices": idx, "reduction_type": "element"}}
