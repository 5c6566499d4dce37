"""Ensembles: several linear classifier heads on one shared embedding, and the pooling of
independently trained embedding nets.

Shallow ensemble, URL appendix B.10 (Lakshminarayanan et al. 2017; shared backbone as in Lee
et al. 2015): ``K`` linear heads, their softmaxes averaged, the average trained under
cross-entropy; ``u(x)`` is the entropy of the average or the Jensen-Shannon divergence between
the heads.

Deep ensemble of embedding nets, LAM Table 2 (Warburg et al. 2023, section 4): the members'
L2-normalised embeddings are the draws of the predictive (:func:`pool_embeddings`), optionally
after rotating each member onto a common frame (:func:`orthogonal_procrustes`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_columns, check_finite, check_floating, check_int, check_ndim

__all__ = ["EnsembleHeads", "average_log_probs", "orthogonal_procrustes", "pool_embeddings"]


def average_log_probs(logits: Tensor) -> Tensor:
    """``log (1/K) sum_k softmax(logits_k)`` ``[N, C]`` of member logits ``[K, N, C]``.

    The pooled predictive of an ensemble (URL B.10) or of MC dropout passes (URL B.11),
    computed with ``logsumexp`` so that the cross-entropy of the average is stable.
    """
    check_ndim(logits, "logits", 3)
    check_floating(logits, "logits")
    if logits.shape[0] == 0:
        raise ValueError("`logits` has no members (K = 0)")
    return torch.logsumexp(F.log_softmax(logits, dim=-1), dim=0) - math.log(logits.shape[0])


def orthogonal_procrustes(source: Tensor, target: Tensor) -> Tensor:
    """The orthogonal map that best carries ``source`` onto ``target`` (Schoenemann 1966).

    ``R = argmin ||source R - target||_F`` over orthogonal ``R`` (reflections included) is
    ``U V^T`` of the SVD ``source^T target = U S V^T``. A contrastive loss on normalised
    embeddings (LAM eq. 1) is invariant to orthogonal maps of the embedding space, so two
    independently trained nets agree at best up to such a map; ``R`` fitted on the embeddings
    of the same images puts one net's space in the other's frame.

    Parameters
    ----------
    source, target : Tensor
        ``[N, D]`` embeddings of the same ``N`` inputs by two nets (floating point, finite).

    Returns
    -------
    Tensor
        ``[D, D]`` orthogonal matrix, dtype and device of ``source``.

    Raises
    ------
    ValueError
        For tensors that are not 2-D, differ in shape or hold NaN / inf.
    TypeError
        For integer tensors.

    References
    ----------
    Schoenemann, P. H. (1966). A generalized solution of the orthogonal Procrustes problem.
    Psychometrika, 31(1), 1-10.

    Examples
    --------
    >>> import torch
    >>> q, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))
    >>> z = torch.randn(50, 3, dtype=torch.float64)
    >>> torch.allclose(orthogonal_procrustes(z, z @ q), q)
    True
    """
    for name, t in (("source", source), ("target", target)):
        check_ndim(t, name, 2)
        check_floating(t, name)
        check_finite(t, name)
    if source.shape != target.shape:
        raise ValueError(
            f"`source` and `target` must have the same shape, got {tuple(source.shape)} and "
            f"{tuple(target.shape)}"
        )
    u, _, vh = torch.linalg.svd(source.T @ target.to(source.dtype))
    return u @ vh


def pool_embeddings(members: Tensor, rotations: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The predictive of a deep ensemble of embedding nets: its draws and their mean direction.

    Each member's embedding is L2-normalised (and, with ``rotations``, multiplied by its
    member's map, ``z_k R_k``); these ``K`` unit vectors are the draws of the predictive, and
    the embedding is their normalised mean. Without rotations this is the deep ensemble of
    the LAM code (``deep_ensemble_model.py``: the mean of the normalised member embeddings,
    renormalised) behind LAM Table 2's "Deep Ensemble" row (Warburg et al. 2023, section 4;
    Lakshminarayanan et al. 2017). The spread of the draws gives ``u = 1 / kappa_hat``
    (:func:`bayesurl.evaluation.functional.uncertainty_from_samples`).

    Parameters
    ----------
    members : Tensor
        ``[K, N, D]`` embeddings of ``N`` inputs by ``K`` members.
    rotations : Tensor, optional
        ``[K, D, D]`` orthogonal maps onto a common frame (:func:`orthogonal_procrustes`).

    Returns
    -------
    embedding : Tensor
        ``[N, D]`` normalised mean of the draws.
    samples : Tensor
        ``[K, N, D]`` the normalised (rotated) member embeddings.

    Raises
    ------
    ValueError
        For ``members`` that are not 3-D, have no members or hold NaN / inf, or rotations
        whose shape is not ``[K, D, D]``.
    TypeError
        For integer tensors.
    """
    check_ndim(members, "members", 3)
    check_floating(members, "members")
    check_finite(members, "members")
    if members.shape[0] == 0:
        raise ValueError("`members` has no members (K = 0)")
    z = F.normalize(members, dim=-1)
    if rotations is not None:
        k, _, d = members.shape
        if tuple(rotations.shape) != (k, d, d):
            raise ValueError(
                f"`rotations` must be [K, D, D] = [{k}, {d}, {d}], got {tuple(rotations.shape)}"
            )
        check_floating(rotations, "rotations")
        z = F.normalize(z @ rotations.to(z.dtype), dim=-1)
    return F.normalize(z.mean(0), dim=-1), z


class EnsembleHeads(nn.Module):
    """``K`` independent linear heads ``[N, D] -> [K, N, C]`` (URL appendix B.10).

    The heads are stored as one ``D -> K C`` linear layer (one matrix product for all heads);
    each head keeps PyTorch's default independent initialisation of a ``D -> C`` layer.

    Parameters
    ----------
    embed_dim, num_classes : int
        Embedding dimension ``D`` and number of classes ``C``.
    num_heads : int
        Ensemble size ``K`` (10 in URL).

    Examples
    --------
    >>> import torch
    >>> heads = EnsembleHeads(8, 3, num_heads=4)
    >>> heads(torch.randn(5, 8)).shape
    torch.Size([4, 5, 3])
    """

    def __init__(self, embed_dim: int, num_classes: int, num_heads: int = 10) -> None:
        super().__init__()
        for name, val in (
            ("embed_dim", embed_dim),
            ("num_classes", num_classes),
            ("num_heads", num_heads),
        ):
            check_int(val, name, low=1)
        self.embed_dim, self.num_classes = int(embed_dim), int(num_classes)
        self.num_heads = int(num_heads)
        self.linear = nn.Linear(self.embed_dim, self.num_heads * self.num_classes)

    def head(self, k: int) -> tuple[Tensor, Tensor]:
        """Weight ``[C, D]`` and bias ``[C]`` of head ``k``."""
        if not 0 <= k < self.num_heads:
            raise ValueError(f"`k` must be in [0, {self.num_heads}), got {k}")
        rows = slice(k * self.num_classes, (k + 1) * self.num_classes)
        return self.linear.weight[rows], self.linear.bias[rows]

    def forward(self, embedding: Tensor) -> Tensor:
        """Logits of every head ``[K, N, C]``."""
        check_columns(embedding, "embedding", self.embed_dim)
        check_finite(embedding.detach(), "embedding")
        out = self.linear(embedding).reshape(-1, self.num_heads, self.num_classes)
        return out.transpose(0, 1)
