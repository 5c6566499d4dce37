"""Temperature heads for Temperature as Uncertainty (TaU, Wu & Goodman;
docs/concepts/uncertainty.rst, "Where u(x) comes from").

TaU predicts an *inverse* temperature ``1/tau = sigmoid(s) / scale`` from a logit ``s`` (TaU
Algorithm 1 and appendix A, "Optimization Stability"), so ``tau = scale (1 + exp(-s)) > scale``.
The helpers below compute both directions stably for every ``s`` (also ``+-inf``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bayesurl._checks import check_int, check_ndim

__all__ = [
    "TAU_UNCERTAINTIES",
    "TemperatureHead",
    "check_tau_uncertainty",
    "inverse_temperature",
    "log_temperature_ratio",
    "tau_uncertainty",
    "temperature",
]

#: The values of TaU's ``uncertainty`` option (:func:`tau_uncertainty`), default first.
TAU_UNCERTAINTIES = ("log_temperature", "temperature", "logit")


def _check_scale(scale: float) -> float:
    scale = float(scale)
    if not scale > 0.0 or scale != scale or scale == float("inf"):
        raise ValueError(f"`scale` must be a finite positive number, got {scale}")
    return scale


def inverse_temperature(s: Tensor, scale: float = 0.1) -> Tensor:
    """``1/tau = sigmoid(s) / scale`` (TaU Algorithm 1, "rescale for numerical stability").

    Parameters
    ----------
    s : Tensor
        Temperature logits (any shape).
    scale : float
        The lower bound ``M`` of ``tau`` (TaU section 2; 0.1 in the paper).

    Returns
    -------
    Tensor
        Inverse temperatures in ``(0, 1/scale)``, same shape, dtype and device as ``s``.
    """
    return torch.sigmoid(s) / _check_scale(scale)


def temperature(s: Tensor, scale: float = 0.1) -> Tensor:
    """``tau = scale / sigmoid(s) = scale (1 + exp(-s))``, the temperature (TaU section 2).

    Computed as ``scale * (1 + exp(-s))`` so it never divides by an underflowed sigmoid; it is
    strictly decreasing in ``s`` and ``tau > scale`` wherever ``exp(-s)`` does not underflow
    (``tau -> scale`` as ``s -> inf``; TaU section 2, the lower bound ``M``).
    """
    return _check_scale(scale) * (1.0 + torch.exp(-s))


def log_temperature_ratio(s: Tensor) -> Tensor:
    """``log(tau / scale) = log(1 + exp(-s)) = softplus(-s)``: the log of the temperature in
    units of its lower bound ``M = scale``, TaU's default u(x).

    It ranks inputs exactly as ``tau`` does, is ``>= 0`` (0 for the most certain input, the
    floor ``tau = M``) and keeps float32 resolution where ``tau`` itself ties at ``M``:
    ``softplus(-s)`` is about ``exp(-s)`` for large ``s``, representable up to ``s ~ 87``,
    while ``M (1 + exp(-s))`` rounds to ``M`` once ``exp(-s)`` drops below the float32
    spacing at 1 (``s > ~16.6``). This is TaU appendix A's reason for scoring OOD inputs
    with the pre-sigmoid value, on the temperature's own (log) scale.
    """
    return torch.nn.functional.softplus(-s)


def tau_uncertainty(s: Tensor, scale: float, kind: str) -> Tensor:
    """TaU's u(x) from the temperature logits ``s`` (higher = less certain for every kind).

    Parameters
    ----------
    s : Tensor
        Temperature logits.
    scale : float
        Lower bound ``M`` of ``tau``.
    kind : {"log_temperature", "temperature", "logit"}
        ``"log_temperature"`` (default of the methods): ``u = log(tau / M) = softplus(-s)``
        (:func:`log_temperature_ratio`); ``"temperature"``: ``u = tau = M (1 + e^-s)`` (TaU
        section 2); ``"logit"``: ``u = -s``, the raw pre-sigmoid score of TaU appendix A
        (same ranking, any real value).
    """
    if kind == "log_temperature":
        return log_temperature_ratio(s)
    if kind == "temperature":
        return temperature(s, scale)
    if kind == "logit":
        return -s
    raise ValueError(f"`uncertainty` must be one of {', '.join(TAU_UNCERTAINTIES)}, got {kind!r}")


def check_tau_uncertainty(kind: str) -> str:
    """``kind`` if it is a value of TaU's ``uncertainty`` option, else a ``ValueError``."""
    if kind not in TAU_UNCERTAINTIES:
        raise ValueError(
            f"`uncertainty` must be one of {', '.join(TAU_UNCERTAINTIES)}, got {kind!r}"
        )
    return kind


class TemperatureHead(nn.Module):
    """Temperature logit ``s(e)`` on top of an embedding (TaU section 4, post-hoc TaU).

    The post-hoc variant of the TaU paper freezes a pretrained encoder and trains only a linear
    temperature head; ``hidden > 0`` inserts one ReLU layer for a slightly richer head.

    Parameters
    ----------
    in_features : int
        Embedding dimension D.
    scale : float
        Lower bound of the temperature (TaU Algorithm 1, 0.1).
    hidden : int
        Width of an optional hidden layer (0: a single linear layer, the paper's choice).

    Examples
    --------
    >>> head = TemperatureHead(16)
    >>> s = head(torch.randn(4, 16))
    >>> head.temperature(s).shape
    torch.Size([4])
    """

    def __init__(self, in_features: int, scale: float = 0.1, hidden: int = 0) -> None:
        super().__init__()
        check_int(in_features, "in_features", low=1)
        check_int(hidden, "hidden", low=0)
        self.in_features = int(in_features)
        self.scale = _check_scale(scale)
        if hidden:
            self.net: nn.Module = nn.Sequential(
                nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, 1)
            )
        else:
            self.net = nn.Linear(in_features, 1)

    def forward(self, embedding: Tensor) -> Tensor:
        """Temperature logits ``s [N]`` of embeddings ``[N, D]`` (used as they are)."""
        check_ndim(embedding, "embedding", 2)
        if embedding.shape[1] != self.in_features:
            raise ValueError(
                f"`embedding` has {embedding.shape[1]} features, the head expects "
                f"{self.in_features}"
            )
        return self.net(embedding).squeeze(-1)

    def inverse_temperature(self, s: Tensor) -> Tensor:
        """``sigmoid(s) / scale``."""
        return inverse_temperature(s, self.scale)

    def temperature(self, s: Tensor) -> Tensor:
        """``tau = scale (1 + exp(-s))``."""
        return temperature(s, self.scale)
