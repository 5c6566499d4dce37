"""TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1, section 2).

The encoder outputs ``D + 1`` values: the first ``D`` are the embedding, the last one ``s``
gives ``1/tau = sigmoid(s) / scale``; the loss is SimCLR with each row scaled by its own
``1/tau`` (:func:`bayesurl.losses.tau.tau_simclr_loss`). Self-supervised, two views per image.

The reported uncertainty is an option (``uncertainty``), higher = less certain for each:
``"log_temperature"`` (default) ``u = log(tau / scale) = softplus(-s)``, the log of the
temperature in units of its floor (>= 0; it keeps float32 resolution where ``tau = scale (1 +
e^-s)`` ties at ``scale``, once ``s > ~16.6``: TaU appendix A's reason for scoring OOD inputs
before the sigmoid); ``"temperature"``: ``u = tau`` itself (TaU section 2); ``"logit"``:
``u = -s``, the raw pre-sigmoid score. All three rank inputs the same way wherever ``tau`` has
no ties (:func:`bayesurl.heads.temperature.tau_uncertainty`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from bayesurl._checks import check_int
from bayesurl.data.batch import unpack_batch
from bayesurl.heads.embedding import EmbeddingNet
from bayesurl.heads.temperature import check_tau_uncertainty, tau_uncertainty
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
    uncertainty : {"log_temperature", "temperature", "logit"}
        ``u = log(tau / scale) = softplus(-s)`` (default), ``u = tau`` (TaU section 2) or
        ``u = -s`` (the pre-sigmoid logit, TaU appendix A); see the module docs.
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
        uncertainty: str = "log_temperature",
    ) -> None:
        super().__init__()
        self.uncertainty = check_tau_uncertainty(uncertainty)
        check_int(embed_dim, "embed_dim", low=1)
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
        """Embedding and u: ``log(tau / scale)``, ``tau`` or ``-s`` (``uncertainty``)."""
        if n_samples:
            raise ValueError("TaU defines no embedding distribution; use n_samples=0")
        z, s = self.encode(x)
        u = tau_uncertainty(s, self.scale, self.uncertainty)
        return Output(embedding=z, uncertainty=u)

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        """TaU-SimCLR loss of a two-view batch ``((x1, x2), y)``; labels are ignored."""
        x, _ = unpack_batch(batch)
        if not isinstance(x, (tuple, list)):
            raise ValueError("TaU trains on two views: `batch` must be ((x1, x2), y)")
        z1, s1 = self.encode(x[0])
        z2, s2 = self.encode(x[1])
        return tau_simclr_loss(z1, z2, s1, s2, scale=self.scale, variant=self.variant)
