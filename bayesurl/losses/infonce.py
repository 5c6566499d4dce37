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

Two behaviours of the URL code are options as well:

- ``self_term``: the code's masks (``pos_mask = mask - diag``, ``neg_mask = 1 - mask``, with
  ``-1000`` offsets on the masked-out entries) leave the self-similarity at logit 0, so a
  constant ``e^0`` sits inside both log-sum-exps,
  ``-log (1 + sum_pos e^{t z_i^T z_p}) + log (1 + sum_neg e^{t z_i^T z_n})``. ``None``
  (default) = on for ``"negatives"`` (the URL code, behind the published numbers), off for
  ``"all"``.
- ``positives`` (:class:`InfoNCELoss` with labels, several positives per anchor): ``"pairs"``
  (default; PML's one term per positive pair) or ``"logsumexp"`` (the URL code's
  ``supervised=True`` path: one log-sum-exp over all positives of an anchor, one term per
  anchor). Two views have one positive per anchor, where both agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import NTXentLoss
from pytorch_metric_learning.reducers import MeanReducer
from torch import Tensor

from bayesurl._checks import check_device, check_int
from bayesurl.losses._base import check_embeddings

__all__ = [
    "InfoNCELoss",
    "check_positives",
    "infonce_loss",
    "resolve_self_term",
    "two_view_labels",
]


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
    if isinstance(device, str):  # a name from a user: parsed and checked, named
        device = check_device(device, "device")
    return torch.arange(check_int(batch_size, "batch_size", low=0), device=device).repeat(2)


_DENOMINATORS = ("negatives", "all")


def _check_denominator(denominator: str) -> str:
    if denominator not in _DENOMINATORS:
        raise ValueError(f"`denominator` must be one of {_DENOMINATORS}, got {denominator!r}")
    return denominator


_POSITIVES = ("pairs", "logsumexp")


def check_positives(positives: str) -> str:
    if positives not in _POSITIVES:
        raise ValueError(f"`positives` must be one of {_POSITIVES}, got {positives!r}")
    return positives


def resolve_self_term(self_term: bool | None, denominator: str) -> bool:
    """``self_term`` with ``None`` resolved: on for the URL code's ``"negatives"`` form only."""
    if self_term is None:
        return denominator == "negatives"
    if not isinstance(self_term, bool):
        raise TypeError(f"`self_term` must be a bool or None, got {type(self_term).__name__}")
    return self_term


def _with_zero(x: Tensor, on: bool) -> Tensor:
    """``x [..., M]`` with a logit-0 column appended when ``on`` (the URL code's self term)."""
    if not on:
        return x
    return torch.cat([x, x.new_zeros(*x.shape[:-1], 1)], dim=-1)


def infonce_loss(
    z1: Tensor,
    z2: Tensor,
    inverse_temperature: float = 16.0,
    reduction: str = "mean",
    denominator: str = "negatives",
    self_term: bool | None = None,
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
    self_term : bool, optional
        Add the URL code's ``e^0`` self-similarity to both log-sum-exps; ``None`` = on for
        ``"negatives"``, off for ``"all"`` (module docstring).
    reduction : {"mean", "none"}
        ``"none"`` returns the ``[2B]`` per-anchor losses (view 1 anchors first).

    Returns
    -------
    Tensor
        The loss.
    """
    t = _check_t(inverse_temperature)
    _check_denominator(denominator)
    with_self = resolve_self_term(self_term, denominator)
    check_embeddings(z1, "z1")
    check_embeddings(z2, "z2")
    if z1.shape != z2.shape:
        raise ValueError(f"`z1` and `z2` must have the same shape, got {z1.shape} and {z2.shape}")
    if z1.shape[0] < 2:
        raise ValueError(f"`z1` needs at least 2 rows (one negative), got {z1.shape[0]}")
    losses = _dense_losses(z1, z2, t, denominator, with_self)
    if reduction == "none":
        return losses
    if reduction == "mean":
        return losses.mean()
    raise ValueError(f"`reduction` must be 'mean' or 'none', got {reduction!r}")


def _dense_losses(
    z1: Tensor, z2: Tensor, t: float | Tensor, denominator: str, with_self: bool
) -> Tensor:
    """Per-anchor losses ``[2B]`` of checked views ``[B, D]`` (B >= 2) from the ``[2B, 2B]``
    similarity matrix."""
    b = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    logits = t * z @ z.T
    eye = torch.eye(2 * b, dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(eye, float("-inf"))
    target = torch.cat([torch.arange(b, 2 * b), torch.arange(b)]).to(z.device)
    rows = torch.arange(2 * b, device=z.device)
    pos = logits[rows, target]
    if denominator == "negatives":
        logits = logits.index_put((rows, target), pos.new_tensor(float("-inf")))
    losses = torch.logsumexp(_with_zero(logits, with_self), 1)
    return losses - torch.logsumexp(_with_zero(pos.unsqueeze(1), with_self), 1)


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
    self_term : bool, optional
        The URL code's ``e^0`` in both log-sum-exps (module docstring); ``None`` = on for
        ``"negatives"``, off for ``"all"``.
    positives : {"pairs", "logsumexp"}
        One term per positive pair (default) or, as the URL code with class labels, one term
        per anchor with a log-sum-exp over all its positives (module docstring).
    **kwargs
        Passed to :class:`pytorch_metric_learning.losses.NTXentLoss` (reducer, distance, ...).
    """

    def __init__(
        self,
        inverse_temperature: float = 16.0,
        denominator: str = "negatives",
        self_term: bool | None = None,
        positives: str = "pairs",
        **kwargs,
    ) -> None:
        t = _check_t(inverse_temperature)
        super().__init__(temperature=1.0 / t, **kwargs)
        self.inverse_temperature = t
        self.denominator = _check_denominator(denominator)
        self.self_term = resolve_self_term(self_term, denominator)
        self.positives = check_positives(positives)

    def _compute_loss(self, pos_pairs, neg_pairs, indices_tuple):  # type: ignore[no-untyped-def]
        """``-log(numerator / denominator)`` per positive pair or per anchor (see above)."""
        a1, _, a2, _ = indices_tuple
        if len(a1) == 0 or len(a2) == 0:
            return self.zero_losses()
        if not self.distance.is_inverted:
            pos_pairs, neg_pairs = -pos_pairs, -neg_pairs
        pos = pos_pairs / self.temperature
        neg_logits = neg_pairs / self.temperature
        if self.positives == "logsumexp":
            return self._per_anchor(pos, neg_logits, a1, a2)
        neg = neg_logits.unsqueeze(0).expand(len(a1), -1)
        same = a2.unsqueeze(0) == a1.unsqueeze(1)
        neg = neg.masked_fill(~same, float("-inf"))
        if self.denominator == "all":
            neg = torch.cat([pos.unsqueeze(1), neg], dim=1)
        log_den = torch.logsumexp(_with_zero(neg, self.self_term), dim=1)
        log_num = torch.logsumexp(_with_zero(pos.unsqueeze(1), self.self_term), dim=1)
        losses = torch.where(same.any(dim=1), log_den - log_num, torch.zeros_like(pos))
        return {
            "loss": {"losses": losses, "indices": indices_tuple[:2], "reduction_type": "pos_pair"}
        }

    def _per_anchor(self, pos: Tensor, neg: Tensor, a1: Tensor, a2: Tensor) -> dict:
        """One term per anchor with positives and negatives: ``lse(pos) - lse(neg)``."""
        anchors = torch.unique(a1)
        pos_mask = a1.unsqueeze(0) == anchors.unsqueeze(1)  # [A, P]
        neg_mask = a2.unsqueeze(0) == anchors.unsqueeze(1)  # [A, Q]
        num = pos.unsqueeze(0).expand(len(anchors), -1).masked_fill(~pos_mask, float("-inf"))
        den = neg.unsqueeze(0).expand(len(anchors), -1).masked_fill(~neg_mask, float("-inf"))
        if self.denominator == "all":
            den = torch.cat([num, den], dim=1)
        log_num = torch.logsumexp(_with_zero(num, self.self_term), dim=1)
        log_den = torch.logsumexp(_with_zero(den, self.self_term), dim=1)
        has = neg_mask.any(dim=1)
        losses = torch.where(has, log_den - log_num, torch.zeros_like(log_num))
        return {"loss": {"losses": losses, "indices": anchors, "reduction_type": "element"}}

    def two_view(self, z1: Tensor, z2: Tensor) -> Tensor:
        """Loss of two views ``[B, D]`` of the same B images."""
        check_embeddings(z1, "z1")
        check_embeddings(z2, "z2")
        if z1.shape != z2.shape:
            raise ValueError(f"`z1` and `z2` must have the same shape, got {z1.shape}, {z2.shape}")
        if z1.shape[0] >= 2 and self._dense_two_view():
            # one positive per anchor: the [2B, 2B] similarity matrix holds every term, where
            # the pair-based path builds a [2B, 2B (2B - 2)] one (same value, B times cheaper)
            t = self.inverse_temperature
            return _dense_losses(z1, z2, t, self.denominator, self.self_term).mean()
        return self(torch.cat([z1, z2]), two_view_labels(z1.shape[0], z1.device))

    def _dense_two_view(self) -> bool:
        """Whether :meth:`two_view` equals :func:`infonce_loss`: PML's defaults (cosine
        similarity of normalised embeddings, mean reducer, no regulariser, this class's terms)."""
        return (
            type(self)._compute_loss is InfoNCELoss._compute_loss
            and type(self.distance) is CosineSimilarity
            and self.distance.normalize_embeddings
            and self.distance.power == 1
            and type(self.reducer) is MeanReducer
            and self.embedding_regularizer is None
        )
