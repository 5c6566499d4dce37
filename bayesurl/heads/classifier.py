"""The plain linear classifier on an embedding (URL appendix B.1, the CE baseline)."""

from __future__ import annotations

from torch import Tensor, nn

from bayesurl._checks import check_columns, check_finite, check_int

__all__ = ["LinearClassifier"]


class LinearClassifier(nn.Linear):
    """Class logits ``W e + b`` of embeddings ``e [N, D]`` (URL appendix B.1).

    An :class:`torch.nn.Linear` that checks its input (2-D, ``D`` columns, finite), so a wrong
    embedding shape fails with a message naming ``embedding``. It is the last linear layer that
    laplace-torch's last-layer Laplace fits for the CE and Losspred methods.

    Parameters
    ----------
    embed_dim, num_classes : int
        Embedding dimension ``D`` and number of classes ``C``.
    bias : bool
        Whether to learn a bias.
    """

    def __init__(self, embed_dim: int, num_classes: int, bias: bool = True) -> None:
        for name, val in (("embed_dim", embed_dim), ("num_classes", num_classes)):
            check_int(val, name, low=1)
        super().__init__(int(embed_dim), int(num_classes), bias=bias)

    def forward(self, embedding: Tensor) -> Tensor:
        """Logits ``[N, C]``."""
        check_columns(embedding, "embedding", self.in_features)
        check_finite(embedding.detach(), "embedding")
        return super().forward(embedding)
