"""InfoNCE / SimCLR's NT-Xent with an inverse temperature (URL appendix B.2, eq. 1).

Two views ``z1, z2`` of a batch of B images; every one of the 2B normalised embeddings is an
anchor whose positive is the other view of its image and whose negatives are the remaining
2B - 2 embeddings, averaged over the 2B anchors (URL eq. 1 sums the two directions of each
pair). The denominator is an option (``denominator``):

- ``"negatives"`` (default): ``-t z_i^T z_i+ + log sum_{j in neg(i)} exp(t z_i^T z_j)``, the
  sum over the negatives only, as URL eq. 1 prints it and as the URL benchmark code computes
  it (``timm/loss/MCInfoNCE.py``, class ``InfoNCE``: log-sum-exp over the positive mask minus
  log-sum-exp over the negative mask), i.e. the loss behind the published URL numbers.
  Unbounded below (a ratio above 1 is possible).
- ``"all"``: SimCLR's NT-Xent and PML's ``NTXentLoss``, the positive also in the denominator
  (``log sum_{j != i}``); the loss is then ``>= 0``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import NTXentLoss
from torch import Tensor

from bayesurl.losses._base import check_embeddings

__all__ = ["InfoNCELoss", "infonce_loss", "two_view_labels"]


def _check_t(t: float | Tensor, name: str = "inverse_temperature") -> float | Tensor:
    """A positive finite scale; a 0-dim tensor is returned as it is (so it can be learned)."""
    if isinstance(t, Tensor):
        if t.ndim != 0:
            raise ValueError(f"`{name}` must be a scalar, got shape {tuple(t.shape)}")
        value = float(t.detach())
        if not (value > 0 and value < float("inf")):
            raise ValueError(f"`{name}` must be a positive finite scalar, got {value}")
        return t
    t = float(t)
    if not (t > 0 and t < float("inf")):
        raise ValueError(f"`{name}` must be a positive finite float, got {t}")
    return t


def two_view_labels(batch_size: int, device: torch.device | None = None) -> Tensor:
    """Labels ``[0..B-1, 0..B-1]`` that make PML losses treat two views as the only positives."""
    return torch.arange(batch_size, device=device).repeat(2)


_DENOMINATORS = ("negatives", "all")


def _check_denominator(denominator: str) -> str:
    if denominator not in _DENOMINATORS:
        raise ValueError(f"`denominator` must be one of {_DENOMINATORS}, got {denominator!r}")
    return denominator


def infonce_loss(
    z1: Tensor,
    z2: Tensor,
    inverse_temperature: float = 16.0,
    reduction: str = "mean",
    denominator: str = "negatives",
) -> Tensor:
    """SimCLR InfoNCE of two views (URL appendix B.2, eq. 1).

    Parameters
    ----------
    z1, z2 : Tensor
        ``[B, D]`` embeddings of the two views (normalised internally, B >= 2).
    inverse_temperature : float
        t (URL tunes t in [8, 64]).
    denominator : {"negatives", "all"}
        Sum over the negatives only (URL eq. 1 and code, default) or also over the positive
        (SimCLR / PML NT-Xent); see the module docstring.
    reduction : {"mean", "none"}
        ``"none"`` returns the ``[2B]`` per-anchor losses (view 1 anchors first).

    Returns
    -------
    Tensor
        The loss.
    """
    t = _check_t(inverse_temperature)
    _check_denominator(denominator)
    check_embeddings(z1, "z1")
    check_embeddings(z2, "z2")
    if z1.shape != z2.shape:
        raise ValueError(f"`z1` and `z2` must have the same shape, got {z1.shape} and {z2.shape}")
    b = z1.shape[0]
    if b < 2:
        raise ValueError(f"`z1` needs at least 2 rows (one negative), got {b}")
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    logits = t * z @ z.T
    eye = torch.eye(2 * b, dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(eye, float("-inf"))
    target = torch.cat([torch.arange(b, 2 * b), torch.arange(b)]).to(z.device)
    if denominator == "all":
        losses = F.cross_entropy(logits, target, reduction="none")
    else:
        rows = torch.arange(2 * b, device=z.device)
        pos = logits[rows, target]
        losses = torch.logsumexp(logits.index_put((rows, target), pos.new_tensor(float("-inf"))), 1)
        losses = losses - pos
    if reduction == "none":
        return losses
    if reduction == "mean":
        return losses.mean()
    raise ValueError(f"`reduction` must be 'mean' or 'none', got {reduction!r}")


class InfoNCELoss(NTXentLoss):
    """PML's NT-Xent parameterised by the inverse temperature t (URL appendix B.2).

    A drop-in ``BaseMetricLossFunction`` (miners, reducers, ``indices_tuple``, ``ref_emb``).
    For two views call it on ``torch.cat([z1, z2])`` with :func:`two_view_labels`, or use
    :meth:`two_view`.

    Parameters
    ----------
    inverse_temperature : float
        t = 1 / temperature (URL: t in [8, 64]).
    denominator : {"negatives", "all"}
        Negatives only (URL eq. 1 and benchmark code, default) or also the positive (PML's
        NT-Xent). With a miner, each positive pair's negatives are the mined negatives of its
        anchor; a positive pair without negatives contributes 0.
    **kwargs
        Passed to :class:`pytorch_metric_learning.losses.NTXentLoss` (reducer, distance, ...).
    """

    def __init__(
        self, inverse_temperature: float = 16.0, denominator: str = "negatives", **kwargs
    ) -> None:
        t = _check_t(inverse_temperature)
        super().__init__(temperature=1.0 / t, **kwargs)
        self.inverse_temperature = t
        self.denominator = _check_denominator(denominator)

    def _compute_loss(self, pos_pairs, neg_pairs, indices_tuple):  # type: ignore[no-untyped-def]
        """Per-positive-pair ``-log(e^pos / denominator)`` (see ``denominator``)."""
        a1, _, a2, _ = indices_tuple
        if len(a1) == 0 or len(a2) == 0:
            return self.zero_losses()
        if not self.distance.is_inverted:
            pos_pairs, neg_pairs = -pos_pairs, -neg_pairs
        pos = pos_pairs / self.temperature
        neg = (neg_pairs / self.temperature).unsqueeze(0).expand(len(a1), -1)
        same = a2.unsqueeze(0) == a1.unsqueeze(1)
        neg = neg.masked_fill(~same, float("-inf"))
        if self.denominator == "all":
            neg = torch.cat([pos.unsqueeze(1), neg], dim=1)
        log_den = torch.logsumexp(neg, dim=1)
        losses = torch.where(same.any(dim=1), log_den - pos, torch.zeros_like(pos))
        return {
            "loss": {"losses": losses, "indices": indices_tuple[:2], "reduction_type": "pos_pair"}
        }

    def two_view(self, z1: Tensor, z2: Tensor) -> Tensor:
        """Loss of two views ``[B, D]`` of the same B images."""
        check_embeddings(z1, "z1")
        check_embeddings(z2, "z2")
        if z1.shape != z2.shape:
            raise ValueError(f"`z1` and `z2` must have the same shape, got {z1.shape}, {z2.shape}")
        return self(torch.cat([z1, z2]), two_view_labels(z1.shape[0], z1.device))
