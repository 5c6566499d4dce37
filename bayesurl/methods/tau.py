"""TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1, section 2).

The encoder outputs ``D + 1`` values: the first ``D`` are the embedding, the last one ``s``
gives ``1/tau = sigmoid(s) / scale``; the loss is SimCLR with each row scaled by its own
``1/tau`` (:func:`bayesurl.losses.tau.tau_simclr_loss`). Self-supervised, two views per image.

The reported uncertainty is an option (``uncertainty``): ``"logit"`` (default) ``u = -s``, the
pre-sigmoid logit that TaU appendix A ("Optimization Stability") uses for OOD detection
because ``tau = scale (1 + e^-s)`` stops resolving inputs in float32 once ``e^-s`` drops below
the float32 spacing at 1 (``s > ~16.6``: every such input gets ``u = scale`` exactly, a tie);
``"temperature"``: ``u = tau`` itself (TaU section 2). Both rank inputs the same way wherever
``tau`` has no ties.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from bayesurl.data.batch import unpack_batch
from bayesurl.heads.embedding import EmbeddingNet
from bayesurl.heads.temperature import temperature
from bayesurl.losses.tau import _variant, tau_simclr_loss
from bayesurl.methods._embedding import _json_backbone
from bayesurl.methods.base import Method, register
from bayesurl.types import Output

__all__ = ["TaU"]


@register("tau")
class TaU(Method):
    """TaU + SimCLR (TaU Algorithm 1).

    Parameters
    ----------
    backbone : str or nn.Module
        ``"small_convnet"`` (default), a timm model name or any module mapping inputs to
        features ``[N, F]``.
    embed_dim : int
        Embedding dimension ``D``; the projection outputs ``D + 1`` values.
    scale : float
        Lower bound of the temperature (0.1 in TaU).
    variant : {"paper", "reference"}
        :class:`~bayesurl.losses.tau.TaUVariant` (the reference code removes the positive from
        the denominator, scales each row's denominator by its own temperature and both rows'
        positive by view 1's).
    uncertainty : {"logit", "temperature"}
        ``u = -s`` (the pre-sigmoid logit, TaU appendix A; default) or ``u = tau``.
    backbone_kwargs : dict, optional
        Passed to :class:`~bayesurl.heads.embedding.EmbeddingNet`.
    num_classes : int, optional
        Unused (TaU is self-supervised); accepted so every method takes the same arguments.
    """

    two_view = True
    supervised = False
    has_distribution = False

    def __init__(
        self,
        backbone: str | nn.Module = "small_convnet",
        embed_dim: int = 64,
        scale: float = 0.1,
        variant: str = "paper",
        backbone_kwargs: dict[str, Any] | None = None,
        num_classes: int | None = None,
        uncertainty: str = "logit",
    ) -> None:
        super().__init__()
        if uncertainty not in ("logit", "temperature"):
            raise ValueError(f"`uncertainty` must be 'logit' or 'temperature', got {uncertainty!r}")
        self.uncertainty = uncertainty
        if int(embed_dim) != embed_dim or embed_dim < 1:
            raise ValueError(f"`embed_dim` must be a positive integer, got {embed_dim}")
        self.embed_dim = int(embed_dim)
        self.scale = float(scale)
        if not self.scale > 0:
            raise ValueError(f"`scale` must be positive, got {scale}")
        self.variant = _variant(variant)
        self.net = EmbeddingNet(backbone, self.embed_dim + 1, **dict(backbone_kwargs or {}))
        kw = {k: v for k, v in (backbone_kwargs or {}).items() if k != "probe_input"}
        self.hparams: dict[str, Any] = {
            "backbone": _json_backbone(backbone),
            "embed_dim": self.embed_dim,
            "scale": self.scale,
            "variant": self.variant.value,
            "backbone_kwargs": kw,
            "uncertainty": uncertainty,
        }

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Embedding ``[N, D]`` (unnormalised) and temperature logit ``s [N]``."""
        out = self.net(x)
        return out[:, : self.embed_dim], out[:, self.embed_dim]

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        """Embedding and ``u = -s`` (``uncertainty="logit"``) or ``tau = scale (1 + e^-s)``."""
        if n_samples:
            raise ValueError("TaU defines no embedding distribution; use n_samples=0")
        z, s = self.encode(x)
        u = -s if self.uncertainty == "logit" else temperature(s, self.scale)
        return Output(embedding=z, uncertainty=u)

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        """TaU-SimCLR loss of a two-view batch ``((x1, x2), y)``; labels are ignored."""
        x, _ = unpack_batch(batch)
        if not isinstance(x, (tuple, list)):
            raise ValueError("TaU trains on two views: `batch` must be ((x1, x2), y)")
        z1, s1 = self.encode(x[0])
        z2, s2 = self.encode(x[1])
        return tau_simclr_loss(z1, z2, s1, s2, scale=self.scale, variant=self.variant)
