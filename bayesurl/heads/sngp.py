"""SNGP: a random-Fourier-feature Gaussian-process output layer with a Laplace covariance.

URL appendix B.8, eq. 7 (Liu et al. 2020, "Simple and principled uncertainty estimation with
deterministic deep learning via distance awareness"): the logits are a GP over the hidden
representation ``h(x)``, approximated by ``M`` random Fourier features
``phi(x) = sqrt(2/M) cos(W h(x) + b)`` with frozen ``W ~ N(0, 1/l^2)``, ``b ~ U(0, 2 pi)``;
the logit mean is ``phi^T beta`` and its variance ``phi^T (s I + Phi^T Phi)^{-1} phi``, where
``Phi^T Phi`` is accumulated over one training epoch (the Laplace precision update of a
Gaussian likelihood, Liu et al. eq. 9) and reset at the start of the next. Probabilities use the
mean-field approximation ``softmax(logits / sqrt(1 + lambda var))`` (Liu et al. eq. 10).
``lambda = pi / 8`` is the probit approximation of Liu et al. (:data:`PROBIT_MEAN_FIELD`);
the URL code calls its mean field with ``mean_field_factor=1`` (mkirchhof/url 9a92555,
``timm/layers/sngp_layers.py`` line 133), and :class:`RandomFeatureGP` defaults to that
(:data:`URL_MEAN_FIELD`), the factor behind the published URL numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from bayesurl._checks import (
    check_columns,
    check_finite,
    check_int,
    check_ndim,
    check_same_length,
    check_tensor,
)

__all__ = [
    "PROBIT_MEAN_FIELD",
    "URL_MEAN_FIELD",
    "RandomFeatureGP",
    "SNGPOutput",
    "mean_field_logits",
    "spectral_normalize",
]

#: Liu et al.'s mean-field factor: the probit approximation of the expected softmax
PROBIT_MEAN_FIELD = math.pi / 8
#: the URL code's mean-field factor (``sngp_layers.py`` line 133)
URL_MEAN_FIELD = 1.0


def mean_field_logits(
    logits: Tensor, variance: Tensor, factor: float = PROBIT_MEAN_FIELD
) -> Tensor:
    """Mean-field logits ``logits / sqrt(1 + factor * var)`` (Liu et al. 2020, eq. 10).

    Parameters
    ----------
    logits : Tensor
        Posterior mean logits ``[N, C]``.
    variance : Tensor
        Predictive variance per input ``[N]`` (shared by the classes) or per logit ``[N, C]``.
    factor : float
        ``lambda >= 0``; ``pi / 8`` is the probit approximation of the expected softmax.
    """
    if factor < 0:
        raise ValueError(f"`factor` must be >= 0, got {factor}")
    check_tensor(logits, "logits", ndim=2)
    check_tensor(variance, "variance", ndim=(1, 2))
    check_same_length(("logits", logits), ("variance", variance))
    if variance.ndim == 2 and variance.shape != logits.shape:
        raise ValueError(
            f"`variance` must be [N] or [N, C] = {tuple(logits.shape)}, got {tuple(variance.shape)}"
        )
    if variance.ndim == logits.ndim - 1:
        variance = variance.unsqueeze(-1)
    return logits / torch.sqrt(1.0 + factor * variance)


class _SpectralBound(nn.Module):
    """Parametrisation ``W -> W / max(1, sigma(W) / bound)`` with power-iteration ``sigma``.

    Miyato et al. (2018) estimate the largest singular value ``sigma`` of the weight (reshaped
    to ``[out, -1]``) by power iteration, one step per training-mode forward; SNGP (Liu et al.
    2020, eq. 8) rescales only weights whose norm exceeds ``bound``.
    """

    u: Tensor
    v: Tensor

    def __init__(self, weight: Tensor, bound: float, n_power_iterations: int) -> None:
        super().__init__()
        self.bound = float(bound)
        self.n_power_iterations = int(n_power_iterations)
        w = weight.detach().flatten(1)
        u = F.normalize(torch.randn(w.shape[0], dtype=w.dtype, device=w.device), dim=0)
        v = F.normalize(torch.randn(w.shape[1], dtype=w.dtype, device=w.device), dim=0)
        self.register_buffer("u", u)
        self.register_buffer("v", v)
        self._power_iteration(w, 15)

    @torch.no_grad()
    def _power_iteration(self, w: Tensor, n: int) -> None:
        for _ in range(n):
            self.v.copy_(F.normalize(w.T @ self.u, dim=0, eps=1e-12))
            self.u.copy_(F.normalize(w @ self.v, dim=0, eps=1e-12))

    def forward(self, weight: Tensor) -> Tensor:
        w = weight.flatten(1)
        if self.training:
            self._power_iteration(w.detach(), self.n_power_iterations)
        sigma = self.u.clone() @ w @ self.v.clone()
        return weight / torch.clamp(sigma / self.bound, min=1.0)


def spectral_normalize(
    module: nn.Module,
    bound: float = 1.0,
    layer_types: tuple[type[nn.Module], ...] = (nn.Linear,),
    n_power_iterations: int = 1,
) -> int:
    """Bound the spectral norm of every ``layer_types`` weight in ``module`` by ``bound``.

    SNGP's distance-preserving hidden mapping (Liu et al. 2020, section 3.1 and eq. 8; URL B.8
    treats it as a hyper-parameter, URL's ResNet run used bound 3). Each weight ``W`` is
    replaced by ``W / max(1, sigma(W) / bound)`` with ``sigma`` estimated by power iteration
    (Miyato et al. 2018), through :func:`torch.nn.utils.parametrize.register_parametrization`.
    For convolutions the reshaped ``[out, in * k * k]`` weight is bounded, not the convolution
    operator. Modifies ``module`` in place; layers that already carry the parametrisation are
    left alone.

    Parameters
    ----------
    module : nn.Module
        The network whose layers to normalise.
    bound : float
        Upper bound ``c > 0`` of the spectral norm.
    layer_types : tuple of module classes
        Which layers to normalise (e.g. ``(nn.Linear, nn.Conv2d)``).
    n_power_iterations : int
        Power-iteration steps per training-mode forward.

    Returns
    -------
    int
        The number of normalised layers.
    """
    if not bound > 0:
        raise ValueError(f"`bound` must be > 0, got {bound}")
    targets = [m for m in module.modules() if isinstance(m, layer_types)]
    for m in targets:
        done = parametrize.is_parametrized(m, "weight") and any(
            isinstance(p, _SpectralBound) for p in m.parametrizations["weight"]
        )
        if not done:
            parametrize.register_parametrization(
                m, "weight", _SpectralBound(m.weight, bound, n_power_iterations)
            )
    return len(targets)


@dataclass
class SNGPOutput:
    """What :meth:`RandomFeatureGP.forward` returns.

    Attributes
    ----------
    logits : Tensor
        ``[N, C]`` posterior-mean logits ``phi^T beta`` (trained with CE, URL B.8).
    variance : Tensor or None
        ``[N]`` predictive variance ``phi^T Sigma phi`` under the current covariance
        (``None`` when ``forward(..., with_variance=False)``).
    mean_field_logits : Tensor or None
        ``[N, C]`` ``logits / sqrt(1 + lambda var)`` (``None`` without the variance).
    features : Tensor
        ``[N, M]`` the random Fourier features ``phi``.
    """

    logits: Tensor
    variance: Tensor | None
    mean_field_logits: Tensor | None
    features: Tensor


class RandomFeatureGP(nn.Module):
    """Random-feature GP output layer with an epoch-wise Laplace covariance (URL B.8, eq. 7).

    Parameters
    ----------
    in_dim : int
        Dimension of the hidden representation ``h``.
    num_classes : int
        Number of classes ``C``.
    num_random_features : int
        ``M`` (1024 in Liu et al.).
    ridge : float
        Prior precision ``s`` in ``s I + Phi^T Phi`` (URL eq. 7 uses 1).
    mean_field_factor : float
        ``lambda`` of the mean-field logits: 1 as in the URL code (default) or
        :data:`PROBIT_MEAN_FIELD` (``pi / 8``, Liu et al.).
    length_scale : float
        RBF kernel length scale ``l`` (``W ~ N(0, 1/l^2)``).
    layer_norm : bool
        Layer-normalise ``h`` before the random features (URL B.8 tunes this; Liu et al.'s
        code does it by default).

    Notes
    -----
    The covariance is *not* updated inside :meth:`forward`: call :meth:`reset_precision` at
    the start of an epoch, :meth:`accumulate` on each training batch and
    :meth:`update_covariance` at its end (the SNGP method does this in its epoch hooks).
    Before the first update the covariance is the prior ``I / s``.

    Examples
    --------
    >>> import torch
    >>> gp = RandomFeatureGP(8, 3, num_random_features=64)
    >>> out = gp(torch.randn(5, 8))
    >>> gp.accumulate(out.features); gp.update_covariance()
    >>> out.mean_field_logits.shape
    torch.Size([5, 3])
    """

    precision: Tensor
    covariance: Tensor
    rf_weight: Tensor
    rf_bias: Tensor

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        num_random_features: int = 1024,
        ridge: float = 1.0,
        mean_field_factor: float = URL_MEAN_FIELD,
        length_scale: float = 1.0,
        layer_norm: bool = True,
    ) -> None:
        super().__init__()
        for name, val in (
            ("in_dim", in_dim),
            ("num_classes", num_classes),
            ("num_random_features", num_random_features),
        ):
            check_int(val, name, low=1)
        if not ridge > 0:
            raise ValueError(f"`ridge` must be > 0, got {ridge}")
        if mean_field_factor < 0:
            raise ValueError(f"`mean_field_factor` must be >= 0, got {mean_field_factor}")
        if not length_scale > 0:
            raise ValueError(f"`length_scale` must be > 0, got {length_scale}")
        m = int(num_random_features)
        self.in_dim, self.num_classes, self.num_random_features = int(in_dim), int(num_classes), m
        self.ridge = float(ridge)
        self.mean_field_factor = float(mean_field_factor)
        self.length_scale = float(length_scale)
        self.norm: nn.Module = nn.LayerNorm(self.in_dim) if layer_norm else nn.Identity()
        self.register_buffer("rf_weight", torch.randn(m, self.in_dim) / self.length_scale)
        self.register_buffer("rf_bias", torch.rand(m) * (2 * math.pi))
        self.beta = nn.Linear(m, self.num_classes)
        self.register_buffer("precision", self.ridge * torch.eye(m))
        self.register_buffer("covariance", torch.eye(m) / self.ridge)
        self.register_buffer("n_accumulated", torch.zeros((), dtype=torch.long))

    def random_features(self, h: Tensor) -> Tensor:
        """``phi(h) = sqrt(2/M) cos(W norm(h) + b)`` ``[N, M]``."""
        check_columns(h, "h", self.in_dim)
        check_finite(h.detach(), "h")
        z = torch.nn.functional.linear(self.norm(h), self.rf_weight, self.rf_bias)
        return math.sqrt(2.0 / self.num_random_features) * torch.cos(z)

    def predictive_variance(self, features: Tensor) -> Tensor:
        """``phi^T Sigma phi`` ``[N]`` for random features ``[N, M]``."""
        return ((features @ self.covariance) * features).sum(-1)

    def forward(self, h: Tensor, with_variance: bool = True) -> SNGPOutput:
        """Posterior-mean logits, predictive variance and mean-field logits of ``h [N, in_dim]``.

        ``with_variance=False`` skips the ``O(N M^2)`` variance (training needs only the
        posterior-mean logits, URL B.8).
        """
        phi = self.random_features(h)
        logits = self.beta(phi)
        if not with_variance:
            return SNGPOutput(logits, None, None, phi)
        var = self.predictive_variance(phi)
        return SNGPOutput(logits, var, mean_field_logits(logits, var, self.mean_field_factor), phi)

    @torch.no_grad()
    def accumulate(self, features: Tensor) -> None:
        """Add ``Phi_b^T Phi_b`` of one batch of random features to the precision matrix."""
        check_ndim(features, "features", 2)
        f = features.detach().to(self.precision.dtype)
        self.precision.add_(f.T @ f)
        self.n_accumulated.add_(f.shape[0])

    @torch.no_grad()
    def reset_precision(self) -> None:
        """Start a new epoch: precision back to the prior ``s I`` (covariance untouched)."""
        eye = torch.eye(
            self.num_random_features, dtype=self.precision.dtype, device=self.precision.device
        )
        self.precision.copy_(self.ridge * eye)
        self.n_accumulated.zero_()

    @torch.no_grad()
    def update_covariance(self) -> None:
        """``Sigma = precision^{-1}`` through a Cholesky factor (call at the end of an epoch)."""
        chol = torch.linalg.cholesky(self.precision)
        self.covariance.copy_(torch.cholesky_inverse(chol))
