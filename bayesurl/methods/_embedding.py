"""The one base of the backbone + embedding URL methods (every registry method but TaU).

Backbone -> :class:`~bayesurl.heads.embedding.EmbeddingNet` -> embedding ``e(x)`` (URL section
4.1, appendix B: every method attaches its heads to the backbone's pooled embedding). This
module holds what the vMF / InfoNCE methods (:mod:`bayesurl.methods._vmf`) and the
classifier-style methods (:class:`~bayesurl.methods.ce.ClassifierMethod`) share: building
``self.net``, the JSON-serialisable ``hparams`` record, and the checks of ``forward`` /
``training_loss`` inputs -- done here, at the method's public entry, once.

A method declares only its own keywords and passes the shared ones on as
``**options: Unpack[EmbeddingOptions]``; its constructor's signature lists them all
(:meth:`bayesurl.methods.base.Method.__init_subclass__`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypedDict

import torch
from torch import Tensor, nn

from bayesurl._checks import check_finite, check_int, check_integer, check_ndim
from bayesurl.data.batch import unpack_batch
from bayesurl.heads.embedding import EmbeddingNet
from bayesurl.methods.base import Method

__all__ = ["EmbeddingMethod", "EmbeddingOptions"]


def _json_backbone(backbone: str | nn.Module) -> str:
    return backbone if isinstance(backbone, str) else f"<module {type(backbone).__name__}>"


class EmbeddingOptions(TypedDict, total=False):
    """The keywords of :class:`EmbeddingMethod` a method passes on as ``**options``."""

    embed_dim: int | None
    num_classes: int | None
    backbone_kwargs: dict[str, Any] | None


class EmbeddingMethod(Method):
    """A backbone + linear embedding with input checks and an ``hparams`` record.

    Subclasses add their head(s) and implement ``forward`` / ``training_loss``.

    Parameters
    ----------
    backbone : str or nn.Module
        ``"small_convnet"`` (default), a timm model name (random weights) or any module mapping
        inputs to features ``[N, F]``.
    embed_dim : int or None
        Embedding dimension D of the linear projection after the backbone (``None``: the
        backbone features are the embedding).
    num_classes : int or None
        Number of training classes ``C``: bounds the labels where given; required (>= 2) by
        methods with a classifier (:attr:`needs_classes`), ignored by the self-supervised ones.
    backbone_kwargs : dict, optional
        Passed to :class:`~bayesurl.heads.embedding.EmbeddingNet` (``num_features`` / ``width``
        of the small conv net, ``probe_input`` for a module without ``num_features``).

    Attributes
    ----------
    hparams : dict
        JSON-serialisable constructor arguments (a module backbone is recorded by its class name
        only): ``bayesurl.methods.create(name, **hparams)`` rebuilds the method.
    """

    #: ``num_classes`` must be an integer >= 2 (methods with a classifier over the classes)
    needs_classes: ClassVar[bool] = False
    #: smallest embedding dimension the method accepts (2 for the vMF on the sphere S^{D-1})
    min_embed_dim: ClassVar[int] = 2

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int | None = 64,
        num_classes: int | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if self.needs_classes and num_classes is None:
            raise ValueError("`num_classes` must be an integer >= 2, got None")
        if num_classes is not None:
            check_int(num_classes, "num_classes", low=2 if self.needs_classes else 1)
        self.num_classes = None if num_classes is None else int(num_classes)
        self.net = EmbeddingNet(backbone, embed_dim, **dict(backbone_kwargs or {}))
        self.embed_dim = self.net.embed_dim
        if self.embed_dim < self.min_embed_dim:
            raise ValueError(
                f"the embedding dimension must be >= {self.min_embed_dim}, got {self.embed_dim}"
            )
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

    # -- input checks (the public entry: forward / training_loss) -----------------------------
    @staticmethod
    def _check_x(x: Any, name: str = "x") -> Tensor:
        """A non-empty batch tensor ``[N, ...]`` (finiteness is checked by ``EmbeddingNet``)."""
        if not isinstance(x, Tensor):
            raise TypeError(f"`{name}` must be a tensor, got {type(x).__name__}")
        if x.ndim < 2 or x.shape[0] < 1:
            raise ValueError(
                f"`{name}` must be a non-empty batch [N, ...], got shape {tuple(x.shape)}"
            )
        return x

    @staticmethod
    def _check_n_samples(n_samples: int) -> int:
        return check_int(n_samples, "n_samples", low=0)

    def _check_views(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``((x1, x2), y) -> (x1, x2)`` for the two-view (self-supervised) methods."""
        x, _ = unpack_batch(batch)  # self-supervised: labels, if any, are not used
        if not isinstance(x, (tuple, list)):
            raise ValueError("two-view methods need `batch = ((x1, x2), y)`")
        x1, x2 = self._check_x(x[0], "x1"), self._check_x(x[1], "x2")
        if x1.shape != x2.shape:
            raise ValueError(
                f"the two views must have the same shape, got {tuple(x1.shape)} and "
                f"{tuple(x2.shape)}"
            )
        if x1.shape[0] < 2:
            raise ValueError(f"two-view methods need a batch of at least 2, got {x1.shape[0]}")
        # named per view here: the embedding net only sees their concatenation
        check_finite(x1, "x1")
        check_finite(x2, "x2")
        return x1, x2

    def _check_labeled(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``(x, y) -> (x, y)`` with integer labels ``y [N]`` (in ``[0, C)`` if C is known)."""
        x, y = unpack_batch(batch, labels=True)  # structure, and len(y) == len(x)
        x = self._check_x(x)
        check_ndim(y, "y", 1)
        check_integer(y, "y", "integer class labels")
        if self.num_classes is not None and y.numel():
            if int(y.min()) < 0 or int(y.max()) >= self.num_classes:
                raise ValueError(
                    f"`y` must lie in [0, {self.num_classes}), "
                    f"got range [{int(y.min())}, {int(y.max())}]"
                )
        return x, y.to(device=x.device, dtype=torch.long)

    def embed(self, x: Tensor) -> Tensor:
        """Unnormalised embeddings ``[N, D]`` of a batch (backbone + projection).

        A shape error inside the backbone becomes a :class:`ValueError` naming ``x`` and its
        shape (out-of-memory errors pass through unchanged).
        """
        return self._through_net(self.net, x)

    def embed_with_features(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Unnormalised embeddings ``[N, D]`` and the backbone features ``[N, F]`` they
        project, from one backbone pass; errors as :meth:`embed`."""
        return self._through_net(self.net.embed_with_features, x)

    def _through_net(self, call: Callable[[Tensor], Any], x: Tensor) -> Any:
        """``call(x)`` on a checked batch, a backbone shape error raised as naming ``x``."""
        x = self._check_x(x)
        try:
            return call(x)
        except RuntimeError as err:
            if isinstance(err, torch.OutOfMemoryError):
                raise
            raise ValueError(
                f"`x` with shape {tuple(x.shape)} does not fit the backbone "
                f"{type(self.net.backbone).__name__}: {err}"
            ) from err
