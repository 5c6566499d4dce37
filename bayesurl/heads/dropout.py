"""Head-only MC dropout: dropout on the embedding, a linear classifier, several passes.

URL appendix B.11 (Gal and Ghahramani 2016) keeps dropout active at inference and averages 10
predictions like the ensemble of B.10. URL drops units throughout the network, which needs 10
full forward passes (3.5x CE's inference time, URL appendix C.7). Here dropout acts only in the
head: the backbone runs once and the ``S`` passes are one batched matrix product over ``S``
dropout masks of the embedding. :func:`block_dropout_linear` is the same idea for dropout on
the features before a linear embedding layer (LAM's MC dropout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_columns, check_finite, check_int, check_ndim

__all__ = ["MCDropoutHead", "block_dropout_linear"]


class MCDropoutHead(nn.Module):
    """Dropout on the embedding followed by a linear classifier (URL B.11, head only).

    Parameters
    ----------
    embed_dim, num_classes : int
        Embedding dimension ``D`` and number of classes ``C``.
    p : float
        Dropout rate (URL tunes it in ``[0.05, 0.25]``).
    n_passes : int
        Default number of stochastic passes ``S`` at inference (10 in URL).

    Examples
    --------
    >>> import torch
    >>> head = MCDropoutHead(8, 3, p=0.2)
    >>> logits, dropped = head.sample(torch.randn(5, 8), 4)
    >>> logits.shape, dropped.shape
    (torch.Size([4, 5, 3]), torch.Size([4, 5, 8]))
    """

    def __init__(self, embed_dim: int, num_classes: int, p: float = 0.1, n_passes: int = 10):
        super().__init__()
        for name, val in (("embed_dim", embed_dim), ("num_classes", num_classes)):
            check_int(val, name, low=1)
        if not 0.0 < p < 1.0:
            raise ValueError(f"`p` must be in (0, 1), got {p}")
        check_int(n_passes, "n_passes", low=1)
        self.embed_dim, self.num_classes = int(embed_dim), int(num_classes)
        self.p, self.n_passes = float(p), int(n_passes)
        self.classifier = nn.Linear(self.embed_dim, self.num_classes)

    def _check(self, embedding: Tensor) -> None:
        check_columns(embedding, "embedding", self.embed_dim)
        check_finite(embedding.detach(), "embedding")

    def forward(self, embedding: Tensor) -> Tensor:
        """One pass ``[N, C]``: dropout in training mode, the deterministic mean net in eval."""
        self._check(embedding)
        return self.classifier(F.dropout(embedding, self.p, self.training))

    def sample(self, embedding: Tensor, n_passes: int | None = None) -> tuple[Tensor, Tensor]:
        """``S`` stochastic passes with dropout on, whatever the module's mode.

        Parameters
        ----------
        embedding : Tensor
            ``[N, D]`` embeddings (computed once by the backbone).
        n_passes : int, optional
            ``S`` (default ``self.n_passes``).

        Returns
        -------
        logits : Tensor
            ``[S, N, C]`` one row of logits per pass.
        dropped : Tensor
            ``[S, N, D]`` the dropped-out (inverse-scaled) embeddings, samples of the
            pre-classifier representation whose mean is ``embedding``.
        """
        self._check(embedding)
        s = self.n_passes if n_passes is None else int(n_passes)
        if s < 1:
            raise ValueError(f"`n_passes` must be >= 1, got {n_passes}")
        dropped = F.dropout(embedding.unsqueeze(0).expand(s, *embedding.shape), self.p, True)
        return self.classifier(dropped), dropped


def block_dropout_linear(
    features: Tensor, linear: nn.Linear, p: float, groups: int, n_draws: int
) -> Tensor:
    """``n_draws`` outputs of ``linear(dropout(features))``, one keep / drop per feature block.

    The ``F`` features are cut into ``groups`` blocks of ``F / groups`` consecutive features
    that are kept or dropped together (``groups = F``: ordinary dropout; the channels of a
    flattened conv map: ``Dropout2d`` before the flatten, LAM's MC dropout, section 4). Kept
    blocks are scaled by ``1 / (1 - p)``. The linear layer is applied per block once
    (``[N, groups, D]``) and the draws only weigh the blocks, so ``S`` draws cost one product
    of ``[S, N, groups]`` masks instead of ``S`` passes over ``[N, F]``.

    Parameters
    ----------
    features : Tensor
        ``[N, F]`` inputs of ``linear``.
    linear : nn.Linear
        The layer after the dropout (``F`` inputs, ``D`` outputs).
    p : float
        Drop probability of a block, in ``[0, 1)``.
    groups : int
        Number of blocks; must divide ``F``.
    n_draws : int
        ``S`` independent masks (torch's global generator).

    Returns
    -------
    Tensor
        ``[S, N, D]``.

    Raises
    ------
    ValueError
        If ``features`` is not ``[N, F]`` with ``F = linear.in_features``, ``groups`` does
        not divide ``F``, or ``p`` / ``n_draws`` are out of range.
    """
    check_ndim(features, "features", 2)
    n, f = features.shape
    if f != linear.in_features:
        raise ValueError(f"`features` must have {linear.in_features} columns, got {f}")
    if check_int(groups, "groups", low=1) and f % int(groups):
        raise ValueError(f"`groups` must divide the {f} features, got {groups}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"`p` must be in [0, 1), got {p}")
    check_int(n_draws, "n_draws", low=1)
    g = int(groups)
    w = linear.weight.reshape(linear.out_features, g, f // g)
    per_block = torch.einsum("ngk,dgk->ngd", features.reshape(n, g, f // g), w)
    keep = torch.rand(int(n_draws), n, g, device=features.device, dtype=features.dtype) >= p
    out = torch.einsum("sng,ngd->snd", keep.to(features.dtype) / (1.0 - p), per_block)
    return out if linear.bias is None else out + linear.bias
