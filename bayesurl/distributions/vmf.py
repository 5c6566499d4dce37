"""The von Mises-Fisher distribution on the unit sphere S^{D-1}.

Density ``p(z | mu, kappa) = C_D(kappa) exp(kappa mu^T z)`` with

``log C_D(kappa) = (D/2 - 1) log kappa - (D/2) log(2 pi) - log I_{D/2-1}(kappa)``.

Everything here is exact (no polynomial fits of the papers) and stays finite for D = 2048 and
kappa up to 1e5 and beyond:

- ``log I_v(x)`` is evaluated at a large order ``V = v + m >= 80`` with the uniform asymptotic
  (Debye) expansion of Abramowitz & Stegun 9.7.7 (relative error below 1e-10 there), then
  brought down to order ``v`` with the backward recurrence ``I_{n-1} = (2n/x) I_n + I_{n+1}``
  in log / ratio form, which is numerically stable for the modified Bessel function I.
- The ratio ``A_D(kappa) = I_{D/2}(kappa) / I_{D/2-1}(kappa)`` (the mean resultant length)
  falls out of the same recurrence, and gives the exact gradient
  ``d/dkappa log C_D(kappa) = -A_D(kappa)``.
- Sampling is Wood's (1994) rejection sampler for the cosine ``w = mu^T z`` with the
  reparameterisation of Davidson et al. (2018, "Hyperspherical VAEs"): the Beta proposal is
  reparameterised, only rejected rows are redrawn, D = 3 uses the closed-form inverse CDF, and
  ``kappa = inf`` returns the mean direction.

References
----------
Wood, A. (1994). Simulation of the von Mises Fisher distribution.
Davidson, T. R. et al. (2018). Hyperspherical Variational Auto-Encoders. UAI.
Kirchhof, M. et al. (2023). Probabilistic Contrastive Learning Recovers the Correct Aleatoric
Uncertainty of Ambiguous Inputs. ICML (MCInfoNCE), section 4 and appendix B.
Sra, S. (2012). A short note on parameter approximation for von Mises-Fisher distributions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from bayesurl._checks import check_finite, check_ndim

__all__ = [
    "VonMisesFisher",
    "log_bessel_iv",
    "vmf_log_normalizer",
    "vmf_mean_resultant_length",
    "kappa_from_resultant_length",
    "sample_vmf",
]

_DEBYE_MIN_ORDER = 80.0


def _debye_log_iv(v: Tensor, x: Tensor) -> Tensor:
    """log I_v(x) by the uniform asymptotic expansion in the order (A&S 9.7.7), v large."""
    z = x / v
    sq = torch.sqrt(1.0 + z * z)
    t = 1.0 / sq
    # eta = sqrt(1 + z^2) + log(z / (1 + sqrt(1 + z^2)))
    eta = sq + torch.log(z) - torch.log1p(sq)
    t2 = t * t
    u1 = t * (3.0 - 5.0 * t2) / 24.0
    u2 = t2 * (81.0 - 462.0 * t2 + 385.0 * t2 * t2) / 1152.0
    u3 = t * t2 * (30375.0 - 369603.0 * t2 + 765765.0 * t2**2 - 425425.0 * t2**3) / 414720.0
    u4 = (
        t2
        * t2
        * (
            4465125.0
            - 94121676.0 * t2
            + 349922430.0 * t2**2
            - 446185740.0 * t2**3
            + 185910725.0 * t2**4
        )
        / 39813120.0
    )
    series = 1.0 + u1 / v + u2 / v**2 + u3 / v**3 + u4 / v**4
    return v * eta - 0.5 * torch.log(2.0 * math.pi * v) - 0.5 * torch.log(sq) + torch.log(series)


def _log_iv_and_ratio(v: float, x: Tensor) -> tuple[Tensor, Tensor]:
    """Return ``(log I_v(x), I_{v+1}(x) / I_v(x))`` for a scalar order ``v >= 0`` and x > 0."""
    m = max(0, math.ceil(_DEBYE_MIN_ORDER - v))
    top = v + m
    vt = torch.full_like(x, top)
    log_i = _debye_log_iv(vt, x)
    ratio = torch.exp(_debye_log_iv(vt + 1.0, x) - log_i)
    for k in range(m):
        n = top - k  # recur from order n down to n - 1
        step = 2.0 * n / x + ratio
        log_i = log_i + torch.log(step)
        ratio = 1.0 / step
    return log_i, ratio


class _LogBesselIv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, v: float) -> Tensor:  # type: ignore[override]
        log_i, ratio = _log_iv_and_ratio(v, x)
        ctx.save_for_backward(x, ratio)
        ctx.v = v
        return log_i

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, ratio = ctx.saved_tensors
        # d/dx log I_v(x) = I_{v+1}(x)/I_v(x) + v/x   (A&S 9.6.26)
        return grad * (ratio + ctx.v / x), None


def _as_float_tensor(kappa: Tensor | float, name: str) -> Tensor:
    k = torch.as_tensor(kappa)
    if not k.is_floating_point():
        k = k.to(torch.get_default_dtype())
    if bool(torch.isnan(k).any()):
        raise ValueError(f"`{name}` contains NaN")
    if bool((k < 0).any()):
        raise ValueError(f"`{name}` must be non-negative, got min {float(k.min())}")
    return k


def _check_dim(dim: int) -> int:
    if int(dim) != dim or dim < 2:
        raise ValueError(f"`dim` must be an integer >= 2, got {dim}")
    return int(dim)


def log_bessel_iv(v: float, x: Tensor | float) -> Tensor:
    """Natural log of the modified Bessel function of the first kind, ``log I_v(x)``.

    Differentiable in ``x`` (exact derivative ``I_{v+1}/I_v + v/x``), finite for orders in the
    thousands and arguments up to 1e5 and beyond, where ``scipy.special.iv`` overflows.

    Parameters
    ----------
    v : float
        Order, ``v >= 0``.
    x : Tensor or float
        Positive arguments (any shape).
    """
    if v < 0:
        raise ValueError(f"`v` must be >= 0, got {v}")
    xt = _as_float_tensor(x, "x")
    if bool((xt <= 0).any()):
        raise ValueError("`x` must be positive")
    return _LogBesselIv.apply(xt, float(v))


# smallest kappa used internally; below it the normaliser equals its kappa -> 0 limit to
# double precision (the correction is O(kappa^2 / D)).
_KAPPA_TINY = 1e-30


class _VmfLogNormalizer(torch.autograd.Function):
    """log C_D(kappa) with the exact derivative -A_D(kappa) (no cancellation of v/kappa)."""

    @staticmethod
    def forward(ctx, kappa: Tensor, dim: int) -> Tensor:  # type: ignore[override]
        v = dim / 2.0 - 1.0
        log_i, ratio = _log_iv_and_ratio(v, kappa)
        ctx.save_for_backward(ratio)
        return v * torch.log(kappa) - (dim / 2.0) * math.log(2.0 * math.pi) - log_i

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (ratio,) = ctx.saved_tensors
        return -grad * ratio, None


def vmf_log_normalizer(kappa: Tensor | float, dim: int) -> Tensor:
    """``log C_D(kappa)`` of the vMF density on S^{D-1} (MCInfoNCE paper, eq. 3).

    Exact and differentiable; its gradient is computed as ``-A_D(kappa)`` directly, so it keeps
    full relative precision also where ``(D/2-1)/kappa`` is huge. ``kappa = 0`` gives the
    uniform density ``-log |S^{D-1}|``; ``kappa = inf`` gives ``inf``.

    Parameters
    ----------
    kappa : Tensor or float
        Concentrations ``>= 0`` (any shape).
    dim : int
        Ambient dimension ``D >= 2``.
    """
    d = _check_dim(dim)
    k = _as_float_tensor(kappa, "kappa")
    finite = torch.isfinite(k)
    ks = torch.where(finite, k, torch.ones_like(k)).clamp_min(_KAPPA_TINY)
    out = _VmfLogNormalizer.apply(ks, d)
    return torch.where(finite, out, torch.full_like(out, math.inf))


def vmf_mean_resultant_length(kappa: Tensor | float, dim: int) -> Tensor:
    """Mean resultant length ``A_D(kappa) = I_{D/2}(kappa) / I_{D/2-1}(kappa) = E[mu^T z]``.

    ``A_D(0) = 0`` and ``A_D(inf) = 1``.
    """
    d = _check_dim(dim)
    k = _as_float_tensor(kappa, "kappa")
    finite = torch.isfinite(k)
    ks = torch.where(finite, k, torch.ones_like(k)).clamp_min(_KAPPA_TINY)
    _, ratio = _log_iv_and_ratio(d / 2.0 - 1.0, ks)
    ratio = torch.where(k > 0, ratio, torch.zeros_like(ratio))
    return torch.where(finite, ratio, torch.ones_like(ratio))


def kappa_from_resultant_length(r: Tensor, dim: int) -> Tensor:
    """Sra's (2012) approximation ``kappa_hat = R (D - R^2) / (1 - R^2)`` (spec METRICS.md).

    Used to turn samples into a concentration: ``R = ||mean_s z_s||`` of unit-norm samples.
    ``R`` is clamped to ``[0, 1 - 1e-12]`` so identical samples give a large, finite kappa.
    """
    d = _check_dim(dim)
    r = torch.as_tensor(r)
    check_finite(r, "r")
    r = r.clamp(0.0, 1.0 - 1e-12)
    return r * (d - r * r) / (1.0 - r * r)


def _sample_w(kappa: Tensor, dim: int, n: int, generator: torch.Generator | None) -> Tensor:
    """Draw ``n`` cosines ``w = mu^T z`` per kappa entry: shape ``[n, *kappa.shape]``."""
    shape = (n, *kappa.shape)
    k = kappa.expand(shape)
    if dim == 3:
        # closed-form inverse CDF: w = 1 + log(u + (1 - u) exp(-2 kappa)) / kappa
        u = torch.rand(shape, dtype=k.dtype, device=k.device, generator=generator)
        u = u.clamp_min(torch.finfo(k.dtype).tiny)
        log_term = torch.logaddexp(torch.log(u), torch.log1p(-u) - 2.0 * k)
        return (1.0 + log_term / k).clamp(-1.0, 1.0)
    dm1 = dim - 1.0
    # Wood (1994), with the cancellation-free form of b
    b = dm1 / (2.0 * k + torch.sqrt(4.0 * k * k + dm1 * dm1))
    x0 = (1.0 - b) / (1.0 + b)
    c = k * x0 + dm1 * torch.log1p(-x0 * x0)
    w = torch.empty(shape, dtype=k.dtype, device=k.device)
    todo = torch.ones(shape, dtype=torch.bool, device=k.device)
    for _ in range(1000):
        idx = todo.nonzero(as_tuple=True)
        m = idx[0].numel()
        if m == 0:
            break
        kb, bb, x0b, cb = k[idx], b[idx], x0[idx], c[idx]
        # the proposal Beta((D-1)/2, (D-1)/2) has no parameters: kappa's gradient flows
        # through w = f(eps, b(kappa)) (Davidson et al. 2018, the reparameterised proposal)
        eps = _beta_symmetric(dm1 / 2.0, m, kb, generator)
        denom = 1.0 - (1.0 - bb) * eps
        wb = (1.0 - (1.0 + bb) * eps) / denom
        u = torch.rand(m, dtype=k.dtype, device=k.device, generator=generator)
        accept = kb * wb + dm1 * torch.log1p(-x0b * wb) - cb >= torch.log(u)
        acc_idx = tuple(i[accept] for i in idx)
        w = w.index_put(acc_idx, wb[accept])
        todo[acc_idx] = False
    else:  # pragma: no cover - acceptance is > 0.5 for every kappa, D
        raise RuntimeError("vMF rejection sampler did not converge in 1000 rounds")
    return w


def _beta_symmetric(
    a: float, m: int, like: Tensor, generator: torch.Generator | None
) -> Tensor:
    """``m`` draws of Beta(a, a) as a ratio of Gamma draws, with an optional generator.

    Uses torch's native Gamma kernel (``torch._standard_gamma``, the one behind
    :class:`torch.distributions.Gamma`), which accepts a generator and runs on every device.
    """
    if a == 0.5:  # D = 2: the arcsine law, sin^2(pi U / 2) exactly
        u = torch.rand(m, dtype=like.dtype, device=like.device, generator=generator)
        return torch.sin(0.5 * math.pi * u).square()
    conc = torch.full((2, m), a, dtype=like.dtype, device=like.device)
    g = torch._standard_gamma(conc, generator=generator)
    total = g[0] + g[1]
    # Gamma(a) draws with a <= 1/2 can underflow to 0 in float32; both zero is a tie
    return torch.where(total > 0, g[0] / total.clamp_min(torch.finfo(like.dtype).tiny), 0.5)


def sample_vmf(
    mu: Tensor,
    kappa: Tensor | float,
    n_samples: int,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Reparameterised vMF samples ``[S, N, D]`` for unit mean directions ``mu [N, D]``.

    Gradients flow to ``mu`` (Householder reflection) and to ``kappa`` (through the
    reparameterised Beta proposal of Davidson et al. 2018; the rejection-correction term of
    their estimator is omitted, as in their reference implementation). ``kappa = inf`` rows
    return ``mu`` exactly.

    Parameters
    ----------
    mu : Tensor
        ``[N, D]`` mean directions (normalised internally).
    kappa : Tensor or float
        ``[N]`` (or scalar) concentrations ``>= 0``; ``inf`` allowed.
    n_samples : int
        Number of draws S.
    generator : torch.Generator, optional
        Makes the draws reproducible.
    """
    check_ndim(mu, "mu", 2)
    check_finite(mu, "mu")
    if n_samples < 1:
        raise ValueError(f"`n_samples` must be >= 1, got {n_samples}")
    n, dim = mu.shape
    _check_dim(dim)
    k = _as_float_tensor(kappa, "kappa").to(device=mu.device, dtype=mu.dtype)
    k = k.expand(n) if k.ndim == 0 else k
    if k.shape != (n,):
        raise ValueError(f"`kappa` must have shape [{n}] to match `mu`, got {tuple(k.shape)}")
    mu = torch.nn.functional.normalize(mu, dim=-1)
    finite = torch.isfinite(k)
    k_safe = torch.where(finite, k, torch.ones_like(k)).clamp_min(1e-12)
    # the cosine is drawn in float64 whatever the input precision: in float32, 1 +- b and
    # x0 = (1 - b) / (1 + b) round to 1 for kappa >~ 1e7 and no proposal would be accepted
    w = _sample_w(k_safe.double(), dim, n_samples, generator).to(mu.dtype)  # [S, N]
    # tangent direction: uniform on S^{D-2} orthogonal to e1
    v = torch.randn((n_samples, n, dim - 1), dtype=mu.dtype, device=mu.device, generator=generator)
    v = torch.nn.functional.normalize(v, dim=-1)
    # sqrt(1 - w^2) computed without cancellation near w = 1
    # (clamped away from 0: at w = +-1, which float32 Beta draws hit in D = 2, the derivative of
    # sqrt is infinite and the kappa gradient would turn NaN)
    tiny = torch.finfo(w.dtype).tiny
    sin = torch.sqrt(((1.0 - w).clamp_min(0.0) * (1.0 + w).clamp_min(0.0)).clamp_min(tiny))
    z = torch.cat([w.unsqueeze(-1), sin.unsqueeze(-1) * v], dim=-1)  # around e1
    # Householder reflection mapping e1 -> mu: H = I - 2 u u^T / ||u||^2, u = e1 - mu
    e1 = torch.zeros_like(mu)
    e1[:, 0] = 1.0
    u = e1 - mu
    unorm2 = (u * u).sum(-1, keepdim=True)
    safe = unorm2 > 1e-24
    coef = torch.where(safe, 2.0 / unorm2.clamp_min(1e-24), torch.zeros_like(unorm2))
    z = z - coef * (z * u).sum(-1, keepdim=True) * u
    z = torch.nn.functional.normalize(z, dim=-1)
    return torch.where(finite.view(1, n, 1), z, mu.unsqueeze(0).expand_as(z))


class VonMisesFisher:
    """vMF(mu, kappa) with batch shape ``[N]`` on S^{D-1}.

    Parameters
    ----------
    loc : Tensor
        ``[N, D]`` mean directions (normalised internally).
    concentration : Tensor
        ``[N]`` concentrations kappa ``>= 0`` (``inf`` allowed for sampling).

    Examples
    --------
    >>> mu = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    >>> d = VonMisesFisher(mu, torch.full((4,), 10.0))
    >>> d.rsample(16).shape
    torch.Size([16, 4, 8])
    """

    def __init__(self, loc: Tensor, concentration: Tensor) -> None:
        check_ndim(loc, "loc", 2)
        check_finite(loc, "loc")
        k = _as_float_tensor(concentration, "concentration").to(loc)
        if k.ndim == 0:
            k = k.expand(loc.shape[0])
        if k.shape != loc.shape[:1]:
            raise ValueError(
                f"`concentration` must have shape [{loc.shape[0]}], got {tuple(k.shape)}"
            )
        self.loc = torch.nn.functional.normalize(loc, dim=-1)
        self.concentration = k
        self.dim = loc.shape[1]

    @property
    def mean(self) -> Tensor:
        """``E[z] = A_D(kappa) mu`` (not unit norm)."""
        return vmf_mean_resultant_length(self.concentration, self.dim).unsqueeze(-1) * self.loc

    def log_normalizer(self) -> Tensor:
        """``log C_D(kappa)``, shape ``[N]``."""
        return vmf_log_normalizer(self.concentration, self.dim)

    def log_prob(self, z: Tensor) -> Tensor:
        """``log C_D(kappa) + kappa mu^T z`` for unit vectors ``z [..., N, D]``."""
        return self.log_normalizer() + self.concentration * (z * self.loc).sum(-1)

    def entropy(self) -> Tensor:
        """``-log C_D(kappa) - kappa A_D(kappa)``."""
        k = self.concentration
        return -self.log_normalizer() - k * vmf_mean_resultant_length(k, self.dim)

    def rsample(self, n_samples: int = 1, generator: torch.Generator | None = None) -> Tensor:
        """Reparameterised samples ``[S, N, D]`` (see :func:`sample_vmf`)."""
        return sample_vmf(self.loc, self.concentration, n_samples, generator=generator)

    def sample(self, n_samples: int = 1, generator: torch.Generator | None = None) -> Tensor:
        """Samples ``[S, N, D]`` without gradient."""
        with torch.no_grad():
            return self.rsample(n_samples, generator=generator)
