"""Shared base of the vMF-based URL methods (MCInfoNCE, ELK, nivMF, HIB) and of InfoNCE.

Backbone -> :class:`~bayesurl.heads.embedding.EmbeddingNet` -> embedding ``e(x)``; the vMF
methods add a :class:`~bayesurl.heads.kappa.KappaHead` on ``e(x)`` and define the posterior
``vMF(e/||e||, kappa(e))`` with ``u(x) = 1/kappa(x)`` (spec METHODS.md; URL appendix B.3-B.6).
Input checks and the JSON-serialisable constructor record live here too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_finite, check_ndim, check_same_length
from bayesurl.distributions.vmf import sample_vmf
from bayesurl.heads.embedding import EmbeddingNet
from bayesurl.heads.kappa import KappaHead
from bayesurl.methods.base import Method
from bayesurl.types import Output

__all__ = ["EmbeddingMethod", "VMFMethod"]


def _json_backbone(backbone: str | nn.Module) -> str:
    return backbone if isinstance(backbone, str) else f"<module {type(backbone).__name__}>"


class EmbeddingMethod(Method):
    """A backbone + linear embedding with input checks and an ``hparams`` record.

    Parameters
    ----------
    backbone : str or nn.Module
        ``"small_convnet"`` (default), a timm model name (random weights) or any module mapping
        inputs to features ``[N, F]``.
    embed_dim : int or None
        Embedding dimension D of the projection after the backbone (``None``: the features).
    num_classes : int or None
        Number of training classes (used by the proxy methods, ignored by the others).
    backbone_kwargs : dict, optional
        Passed to :class:`~bayesurl.heads.embedding.EmbeddingNet` (``num_features`` / ``width``
        of the small conv net, ``probe_input`` for a module without ``num_features``).

    Attributes
    ----------
    hparams : dict
        JSON-serialisable constructor arguments (a module backbone is recorded by its class name
        only): ``bayesurl.methods.create(name, **hparams)`` rebuilds the method.
    """

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.net = EmbeddingNet(backbone, embed_dim, **dict(backbone_kwargs or {}))
        self.embed_dim = self.net.embed_dim
        if self.embed_dim < 2:
            raise ValueError(f"the embedding dimension must be >= 2, got {self.embed_dim}")
        self.num_classes = None if num_classes is None else int(num_classes)
        kw = {k: v for k, v in (backbone_kwargs or {}).items() if k != "probe_input"}
        self.hparams: dict[str, Any] = {
            "backbone": _json_backbone(backbone),
            "embed_dim": embed_dim,
            "num_classes": self.num_classes,
            "backbone_kwargs": kw,
        }

    @property
    def init_kwargs(self) -> dict[str, Any]:
        """Alias of :attr:`hparams` (read by the training loop's checkpoints)."""
        return dict(self.hparams)

    # -- input checks -------------------------------------------------------------------------
    @staticmethod
    def _check_x(x: Any, name: str = "x") -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"`{name}` must be a tensor, got {type(x).__name__}")
        if x.ndim < 2 or x.shape[0] < 1:
            raise ValueError(
                f"`{name}` must be a non-empty batch [N, ...], got shape {tuple(x.shape)}"
            )
        check_finite(x, name)
        return x

    @staticmethod
    def _check_n_samples(n_samples: int) -> int:
        if int(n_samples) != n_samples or n_samples < 0:
            raise ValueError(f"`n_samples` must be an integer >= 0, got {n_samples}")
        return int(n_samples)

    @staticmethod
    def _split_batch(batch: Any) -> tuple[Any, Any]:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise ValueError("`batch` must be a pair (x, y)")
        return batch[0], batch[1]

    def _check_views(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``((x1, x2), y) -> (x1, x2)`` for the two-view (self-supervised) methods."""
        x, _ = self._split_batch(batch)
        if not isinstance(x, (tuple, list)) or len(x) != 2:
            raise ValueError("two-view methods need `batch = ((x1, x2), y)`")
        x1, x2 = self._check_x(x[0], "x1"), self._check_x(x[1], "x2")
        if x1.shape != x2.shape:
            raise ValueError(
                f"the two views must have the same shape, got {tuple(x1.shape)} and "
                f"{tuple(x2.shape)}"
            )
        if x1.shape[0] < 2:
            raise ValueError(f"two-view methods need a batch of at least 2, got {x1.shape[0]}")
        return x1, x2

    def _check_labeled(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``(x, y) -> (x, y)`` with integer labels ``y [N]`` (in ``[0, C)`` if C is known)."""
        x, y = self._split_batch(batch)
        x = self._check_x(x)
        if not isinstance(y, Tensor):
            y = torch.as_tensor(y)
        check_ndim(y, "y", 1)
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(f"`y` must hold integer class labels, got dtype {y.dtype}")
        check_same_length(("x", x), ("y", y))
        if self.num_classes is not None and y.numel():
            if int(y.min()) < 0 or int(y.max()) >= self.num_classes:
                raise ValueError(
                    f"`y` must lie in [0, {self.num_classes}), "
                    f"got range [{int(y.min())}, {int(y.max())}]"
                )
        return x, y.to(device=x.device, dtype=torch.long)

    def embed(self, x: Tensor) -> Tensor:
        """Unnormalised embeddings ``[N, D]`` (backbone + projection)."""
        return self.net(self._check_x(x))


class VMFMethod(EmbeddingMethod):
    """Embedding + kappa head: the posterior ``vMF(e/||e||, kappa(e))``, ``u = 1/kappa``.

    Parameters
    ----------
    backbone, embed_dim, num_classes, backbone_kwargs
        See :class:`EmbeddingMethod`.
    kappa_hidden : int, optional
        Hidden width of the 3-layer kappa MLP (default ``max(D, 16)``).
    warmup_u : float, optional
        Warm the kappa head up to mean ``u = warmup_u`` on the first training batch (URL B.3:
        0.001); ``None`` (default) keeps the random initialisation.
    """

    has_distribution = True

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        kappa_hidden: int | None = None,
        warmup_u: float | None = None,
    ) -> None:
        super().__init__(backbone, embed_dim, num_classes, backbone_kwargs)
        self.kappa_head = KappaHead(self.embed_dim, kappa_hidden, warmup_u)
        self.hparams.update(kappa_hidden=kappa_hidden, warmup_u=warmup_u)

    def embed_with_kappa(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(e [N, D], kappa [N])``; warms the kappa head up on the first training batch."""
        e = self.embed(x)
        if self.training:
            self.kappa_head.warmup_(e.detach())
        return e, self.kappa_head(e)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Normalised embedding (vMF mean), ``u = 1/kappa``, kappa, and ``[S, N, D]`` samples."""
        s = self._check_n_samples(n_samples)
        e, kappa = self.embed_with_kappa(x)
        mu = F.normalize(e, dim=-1)
        samples = sample_vmf(mu, kappa, s) if s > 0 else None
        return Output(embedding=mu, uncertainty=1.0 / kappa, samples=samples, kappa=kappa)
