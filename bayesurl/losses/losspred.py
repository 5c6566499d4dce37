"""Direct loss prediction (Losspred): cross-entropy plus an L2 fit of the predicted loss.

URL appendix B.9, eq. 8: ``L = CE(x, y) + lambda (u(x) - CE_detached(x, y))^2``, where ``u`` is
a 3-layer MLP on the embedding. The CE target inside the L2 term is detached so that ``u`` is
fitted to the loss and not the loss to ``u``.

This is a classification loss on logits and a per-sample ``u``, not a pair/tuple loss on
embeddings, so pytorch-metric-learning's ``BaseMetricLossFunction`` contract (miners,
``indices_tuple``, ``ref_emb``) does not apply; it is a plain :class:`torch.nn.Module`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import (
    check_columns,
    check_finite,
    check_floating,
    check_int,
    check_ndim,
    check_same_length,
)

__all__ = ["LossPredictionLoss", "LossPredictor", "losspred_loss"]


def _check_inputs(logits: Tensor, u: Tensor, labels: Tensor) -> None:
    check_ndim(logits, "logits", 2)
    check_ndim(u, "u", 1)
    check_floating(logits, "logits")
    check_ndim(labels, "labels", 1)
    check_same_length(("logits", logits), ("u", u), ("labels", labels))
    if labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"`labels` must be integer class indices, got dtype {labels.dtype}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= logits.shape[1]):
        raise ValueError(
            f"`labels` must lie in [0, {logits.shape[1]}), "
            f"got range [{int(labels.min())}, {int(labels.max())}]"
        )
    check_finite(logits.detach(), "logits")
    check_finite(u.detach(), "u")


def losspred_loss(
    logits: Tensor, u: Tensor, labels: Tensor, lam: float = 0.04, detach_target: bool = True
) -> Tensor:
    """URL appendix B.9, eq. 8: ``mean_i CE_i + lam * mean_i (u_i - sg(CE_i))^2``.

    Parameters
    ----------
    logits : Tensor
        Class logits ``[N, C]``.
    u : Tensor
        Predicted losses ``[N]`` (the method's uncertainty).
    labels : Tensor
        Integer class labels ``[N]``.
    lam : float
        ``lambda`` balancing the two terms (URL searches ``[0.01, 0.99]``; its ResNet-50 run
        used 0.04, the default here).
    detach_target : bool
        Stop the gradient of the CE target inside the L2 term (URL B.9; ``False`` only for
        ablations).

    Returns
    -------
    Tensor
        The scalar loss.
    """
    _check_inputs(logits, u, labels)
    if not lam >= 0:
        raise ValueError(f"`lam` must be >= 0, got {lam}")
    ce = F.cross_entropy(logits, labels, reduction="none")
    target = ce.detach() if detach_target else ce
    return ce.mean() + lam * (u - target).pow(2).mean()


class LossPredictionLoss(nn.Module):
    """Module form of :func:`losspred_loss` (URL appendix B.9, eq. 8).

    Parameters
    ----------
    lam : float
        Weight of the loss-prediction term.
    detach_target : bool
        Detach the CE target of the L2 term (URL B.9).
    """

    def __init__(self, lam: float = 0.04, detach_target: bool = True) -> None:
        super().__init__()
        if not lam >= 0:
            raise ValueError(f"`lam` must be >= 0, got {lam}")
        self.lam = float(lam)
        self.detach_target = bool(detach_target)

    def forward(self, logits: Tensor, u: Tensor, labels: Tensor) -> Tensor:
        """Scalar loss of logits ``[N, C]``, predicted losses ``[N]`` and labels ``[N]``."""
        return losspred_loss(logits, u, labels, self.lam, self.detach_target)


class LossPredictor(nn.Module):
    """The 3-layer MLP ``u(e) > 0`` that predicts the per-sample loss (URL appendix B.9).

    ``Linear(D, H) - LeakyReLU - Linear(H, H) - LeakyReLU - Linear(H, 1) - Softplus`` plus a
    small ``eps``, the uncertainty module URL attaches to the embedding. URL's code feeds the
    embedding to it *without* a stop-gradient, so the L2 term also shapes the backbone; the
    "pretrained visual uncertainties" follow-up (thesis chapter 5) detaches it to keep the
    embedding intact. Both are available through ``detach_input``.

    Parameters
    ----------
    in_dim : int
        Embedding dimension ``D``.
    hidden_dim : int, optional
        Hidden width ``H`` (default ``max(in_dim, 16)``; URL uses 512-1024 on 2048-d ResNets).
    detach_input : bool
        Stop gradients from the predictor into the embedding (default ``False`` = URL code).
    warmup_u : float, optional
        If given, :meth:`warmup_` shifts the output bias once so that the mean prediction on a
        batch is ``warmup_u`` (URL B.9: "whether or not to warm up kappa to 0.001").
    eps : float
        Added to the softplus output so that ``u > 0``.
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int | None = None,
        detach_input: bool = False,
        warmup_u: float | None = None,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        check_int(in_dim, "in_dim", low=1)
        if warmup_u is not None and not (math.isfinite(warmup_u) and warmup_u > eps):
            raise ValueError(f"`warmup_u` must be a finite float > eps or None, got {warmup_u}")
        h = max(int(in_dim), 16) if hidden_dim is None else int(hidden_dim)
        self.in_dim, self.detach_input = int(in_dim), bool(detach_input)
        self.warmup_u, self.eps = warmup_u, float(eps)
        self.mlp = nn.Sequential(
            nn.Linear(self.in_dim, h),
            nn.LeakyReLU(),
            nn.Linear(h, h),
            nn.LeakyReLU(),
            nn.Linear(h, 1),
        )
        self.register_buffer("warmed_up", torch.tensor(warmup_u is None))

    def forward(self, embedding: Tensor) -> Tensor:
        """Predicted losses ``[N] > 0`` of embeddings ``[N, D]``."""
        check_columns(embedding, "embedding", self.in_dim)
        e = embedding.detach() if self.detach_input else embedding
        return F.softplus(self.mlp(e).squeeze(-1)) + self.eps

    @torch.no_grad()
    def warmup_(self, embedding: Tensor) -> bool:
        """Shift the last bias once so that the batch mean of ``u`` is ``warmup_u``.

        Bisection on the bias shift (the mean of ``softplus(a + s)`` is increasing in ``s``).
        Returns whether a shift was applied now.
        """
        if self.warmup_u is None or bool(self.warmed_up):
            return False
        check_finite(embedding.detach(), "embedding")
        a = self.mlp(embedding.detach()).squeeze(-1)

        def mean_u(shift: float) -> float:
            return float((F.softplus(a + shift) + self.eps).mean())

        lo, hi = -1.0, 1.0
        while mean_u(lo) > self.warmup_u:
            lo *= 2.0
        while mean_u(hi) < self.warmup_u:
            hi *= 2.0
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if mean_u(mid) < self.warmup_u else (lo, mid)
        self.mlp[-1].bias.add_(0.5 * (lo + hi))
        self.warmed_up.fill_(True)
        return True
