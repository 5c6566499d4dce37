"""Uncertainty scores shared by the classifier-style methods (docs/concepts/uncertainty.rst, "Where
u(x) comes from").

All return ``u`` with higher = less certain.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["entropy", "softmax_entropy", "jensen_shannon"]


def entropy(probs: Tensor, dim: int = -1) -> Tensor:
    """Shannon entropy ``-sum p log p`` along ``dim`` (0 log 0 = 0)."""
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(dim)


def softmax_entropy(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(logits)`` over the last dim, computed from log-probabilities."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def jensen_shannon(probs: Tensor) -> Tensor:
    """Jensen-Shannon divergence of ``S`` predictive distributions ``[S, N, C]``.

    ``H(mean_s p_s) - mean_s H(p_s)``: the disagreement (epistemic) part of the entropy of an
    ensemble or MC-dropout predictive (URL appendix B.10, B.11).
    """
    if probs.ndim != 3:
        raise ValueError(f"`probs` must be [S, N, C], got shape {tuple(probs.shape)}")
    return entropy(probs.mean(0)) - entropy(probs).mean(0)
