"""Post-hoc Temperature as Uncertainty (TaU section 4, "Uncertainty on Pretrained Models").

Freeze any encoder and train only a temperature head ``s(e)`` with the TaU-SimCLR loss on two
augmented views: ``1/tau = sigmoid(s)/scale`` (TaU Algorithm 1). The embedding stays the
encoder's; only the per-input temperature is learned. The reported u(x) is an option, as for
:class:`bayesurl.methods.tau.TaU`: ``"log_temperature"`` (default) ``u = log(tau / scale) =
softplus(-s)``, the temperature's log in units of its floor, which keeps float32 resolution
where ``tau = scale (1 + e^-s)`` ties (s > ~16.6; TaU appendix A scores OOD inputs before the
sigmoid for that reason); ``"temperature"``, ``u = tau`` (Algorithm 1); or ``"logit"``,
``u = -s``. Higher = less certain for each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from bayesurl._checks import check_int, check_number
from bayesurl._modules import device_of
from bayesurl.data.batch import iterate, unpack_batch
from bayesurl.heads.temperature import TemperatureHead, check_tau_uncertainty, tau_uncertainty
from bayesurl.losses.tau import TaUVariant, _variant, tau_simclr_loss
from bayesurl.posthoc.base import (
    PosthocWrapper,
    check_embedding_width,
    known_embedding_dim,
    register_wrapper,
)

__all__ = ["PosthocTaU"]


def two_views(x: Any, augment: Callable[[Tensor], Tensor] | None) -> tuple[Tensor, Tensor]:
    """The two views of a batch: ``x = (x1, x2)`` as given, or ``augment`` applied twice."""
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return x[0], x[1]
    if isinstance(x, Tensor) and augment is not None:
        return augment(x), augment(x)
    raise ValueError(
        "post-hoc TaU trains on two augmented views: use a loader yielding ((x1, x2), y) "
        "(e.g. bayesurl.data's TwoViews) or pass `augment=` (applied twice per batch)"
    )


@register_wrapper("tau", fit_inputs="raw")
class PosthocTaU(PosthocWrapper):
    """A frozen encoder plus a trained temperature head (TaU section 4).

    Parameters
    ----------
    encoder : nn.Module
        Maps inputs to embeddings ``[N, D]``; frozen.
    scale : float
        Lower bound of the temperature (TaU Algorithm 1, 0.1).
    variant : {"paper", "reference"}
        TaU-SimCLR loss variant (:class:`~bayesurl.losses.tau.TaUVariant`).
    hidden : int
        Hidden width of the head (0: linear, the paper's post-hoc head).
    uncertainty : {"log_temperature", "temperature", "logit"}
        u(x) reported: ``log(tau / scale)`` (default), ``tau`` (TaU Algorithm 1) or ``-s``
        (TaU appendix A). All rank inputs the same way up to float32 ties of ``tau``.
    embed_dim : int, optional
        D. When omitted it is known only for an ``nn.Linear`` encoder (or a Sequential ending
        in one) and a registry method; otherwise the head is built from the first embeddings
        the encoder returns in :meth:`fit` (never from attributes such as timm's
        ``num_features``, the width before a classifier head).
    """

    def __init__(
        self,
        encoder: nn.Module,
        *,
        scale: float = 0.1,
        variant: str | TaUVariant = "paper",
        hidden: int = 0,
        uncertainty: str = "log_temperature",
        embed_dim: int | None = None,
    ) -> None:
        super().__init__(encoder)
        self.uncertainty = check_tau_uncertainty(uncertainty)
        self.scale = float(scale)
        self.variant = _variant(variant)
        self.hidden = int(hidden)
        TemperatureHead(1, self.scale, self.hidden)  # validates the options early
        if embed_dim is not None:
            check_int(embed_dim, "embed_dim", low=1)
        dim = embed_dim if embed_dim is not None else known_embedding_dim(encoder)
        self.head: TemperatureHead | None = None
        if dim is not None:
            self._build_head(int(dim))

    def _build_head(self, dim: int) -> None:
        self.head = TemperatureHead(dim, self.scale, self.hidden).to(device_of(self.encoder))

    def config(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "variant": self.variant.value,
            "hidden": self.hidden,
            "uncertainty": self.uncertainty,
            "embed_dim": None if self.head is None else self.head.in_features,
        }

    def logit(self, embedding: Tensor) -> Tensor:
        """Temperature logits ``s [N]`` (the pre-sigmoid score TaU appendix A prefers for OOD:
        ``-s`` ranks inputs like ``tau`` but keeps float32 resolution)."""
        if self.head is None:
            raise ValueError("the TaU head is not built yet: call `fit` (or pass `embed_dim`)")
        check_embedding_width(embedding, self.head.in_features, "TaU head")
        dtype = next(self.head.parameters()).dtype
        s = self.head(embedding.detach().to(dtype))
        return s.to(embedding.dtype) if embedding.is_floating_point() else s

    def check_embedding(self, embedding: Tensor) -> None:
        if self.head is not None:
            check_embedding_width(embedding, self.head.in_features, "TaU head")

    def uncertainty_from(self, embedding: Tensor) -> Tensor:
        s = self.logit(embedding)
        return tau_uncertainty(s, self.scale, self.uncertainty)

    def _embedded_views(
        self, batch: Any, augment: Callable[[Tensor], Tensor] | None, dev: torch.device
    ) -> tuple[Tensor, Tensor] | None:
        """The frozen embeddings of a batch's two views in the head's dtype (the head is built
        from the first batch); ``None`` for a batch of one image."""
        x, _ = unpack_batch(batch, views=True)
        x1, x2 = two_views(x, augment)
        with torch.no_grad():
            e1, e2 = self.embed(x1.to(dev)), self.embed(x2.to(dev))
        if self.head is None:
            self._build_head(int(e1.shape[1]))
        check_embedding_width(e1, self.head.in_features, "TaU head")
        if e1.shape[0] < 2:
            return None
        dtype = next(self.head.parameters()).dtype
        return e1.to(dtype), e2.to(dtype)

    def fit(
        self,
        loader: Iterable[Any],
        *,
        epochs: int = 1,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        augment: Callable[[Tensor], Tensor] | None = None,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        progress: bool = True,
    ) -> dict[str, Any]:
        """Train the temperature head on two views per batch; the encoder stays frozen.

        Parameters
        ----------
        loader : iterable
            Yields ``((x1, x2), y)`` / ``(x1, x2)`` pairs of views, or ``x`` / ``(x, y)`` with
            ``augment`` given.
        epochs, lr, weight_decay : int, float, float
            AdamW settings (``optimizer`` replaces AdamW: a callable taking the parameters).
        augment : callable, optional
            Random augmentation applied twice to single-view batches.
        progress : bool
            tqdm bar per epoch.

        Returns
        -------
        dict
            ``losses`` (mean per epoch) and ``train_seconds``.
        """
        check_int(epochs, "epochs", low=1)
        check_number(lr, "lr", low=0.0, low_open=True)
        check_number(weight_decay, "weight_decay", low=0.0)
        make_opt = optimizer or (lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=weight_decay))
        dev = device_of(self.encoder)
        opt = None
        losses: list[float] = []
        t0 = time.perf_counter()
        skipped = 0
        for epoch in range(int(epochs)):
            vals = []
            for batch in iterate(loader, progress, f"TaU epoch {epoch + 1}/{epochs}"):
                views = self._embedded_views(batch, augment, dev)
                if views is None:  # SimCLR needs a negative: a batch of one trains nothing
                    skipped += 1
                    continue
                if opt is None:
                    opt = make_opt(self.head.parameters())
                    self.head.train()
                e1, e2 = views
                loss = tau_simclr_loss(
                    e1, e2, self.head(e1), self.head(e2), scale=self.scale, variant=self.variant
                )
                if not torch.isfinite(loss):
                    raise ValueError(
                        f"TaU loss is not finite ({float(loss)}) in epoch {epoch + 1}; check the "
                        "encoder's embeddings and `scale`"
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                vals.append(float(loss.detach()))
            losses.append(sum(vals) / len(vals) if vals else math.nan)
        if self.head is not None:
            self.head.eval()
        if opt is None:
            why = (
                f"all {skipped} batch(es) held a single image (SimCLR needs >= 2 per batch)"
                if skipped
                else "`loader` yielded no data"
            )
            raise ValueError(f"post-hoc TaU could not train: {why}")
        self.fitted = True
        return {"losses": losses, "train_seconds": time.perf_counter() - t0}
