"""Non-isotropic vMF (nivMF) class proxies with a Monte-Carlo expected likelihood kernel.

nivMF density of a proxy with direction mu and concentrations ``K = diag(kappa)`` (ECCV22
nivMF paper, section 3.2, eq. 4 and supplement B, eqs. 19-22; reprinted in the thesis):

``log p(z) = log C_D(||K mu||) + log D(K) + ||K mu|| cos(K z, K mu)``,
``log D(K) = sum_d log kappa_d - log ||K mu||``

(``D(K)`` is the paper's heuristic normaliser; with ``K = c I`` the density is the vMF density
times the constant ``c^(D-1)``). That is ``density="eccv22"``. The URL benchmark code
(``nivmf_elk_sim`` in mkirchhof/url) computes instead

``log p(z) = log C_D(||K mu||) + sum_d log kappa_d - 2 log ||K mu|| + ||K mu|| cos(z, K mu)``,

the angle between the *unstretched* sample and ``K mu`` and twice the ``log ||K mu||``; this
``density="url"`` is the default, as it produced the published URL numbers. With
``K = c I`` both reduce to the vMF density times a constant (``c^(D-1)`` and ``c^(D-2)``).
The nivMF loss (URL appendix B.5, eq. 4; ECCV22 eq. 6) is
ProxyNCA over ``approx_elk_sim(zeta, rho_c) = log (1/S) sum_s p_c(z_s)``, ``z_s ~ zeta`` the
image's vMF posterior, with S = 16 samples shared by all classes.

``normalizer="url_poly"`` replaces the exact ``log C_D(||K mu||)`` by the URL code's
polynomial fit evaluated at D = 10 whatever the embedding dimension, as ``nivmf_elk_sim``
does (:mod:`bayesurl.losses.normalizer`); the exact value is the default.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from bayesurl._checks import check_concentration, check_finite, check_floating
from bayesurl.distributions.vmf import _sample_vmf
from bayesurl.heads.proxies import NonIsotropicVMFProxies
from bayesurl.losses._base import (
    ProxyLoss,
    check_embeddings,
    check_kappa,
)
from bayesurl.losses.elk import _check_class_labels
from bayesurl.losses.mcinfonce import _check_n_samples
from bayesurl.losses.normalizer import (
    URL_POLY_NIVMF_DIM,
    VmfNormalizer,
    check_normalizer,
    log_normalizer,
)

__all__ = ["NivMFLoss", "nivmf_elk_logits", "nivmf_log_density", "nivmf_loss"]


def _check_proxies(
    proxy_mu: Tensor, proxy_kappa: Tensor, dim: int | None = None, name: str = "z"
) -> None:
    check_embeddings(proxy_mu, "proxy_mu")
    if proxy_kappa.shape != proxy_mu.shape:
        raise ValueError(
            f"`proxy_kappa` must have the shape of `proxy_mu` {tuple(proxy_mu.shape)}, "
            f"got {tuple(proxy_kappa.shape)}"
        )
    check_concentration(proxy_kappa, "proxy_kappa", positive=True, allow_inf=False)
    if dim is not None and proxy_mu.shape[1] != dim:
        raise ValueError(f"`proxy_mu` has dimension {proxy_mu.shape[1]}, `{name}` has {dim}")


_DENSITIES = ("url", "eccv22")


def _check_density(density: str) -> str:
    if density not in _DENSITIES:
        raise ValueError(f"`density` must be one of {_DENSITIES}, got {density!r}")
    return density


def nivmf_log_density(
    z: Tensor,
    proxy_mu: Tensor,
    proxy_kappa: Tensor,
    density: str = "url",
    normalizer: str | VmfNormalizer = VmfNormalizer.EXACT,
) -> Tensor:
    """``log p_c(z)`` of the nivMF class proxies at unit vectors z (ECCV22 eq. 4 / URL code).

    Parameters
    ----------
    z : Tensor
        ``[..., D]`` points on the sphere (normalised internally).
    proxy_mu : Tensor
        ``[C, D]`` proxy directions (normalised internally).
    proxy_kappa : Tensor
        ``[C, D]`` positive per-dimension concentrations.
    density : {"url", "eccv22"}
        ``"url"`` (default): ``cos(z, K mu)`` and ``- 2 log ||K mu||`` (URL benchmark code);
        ``"eccv22"``: ``cos(K z, K mu)`` and ``- log ||K mu||`` (ECCV22 eq. 4). See the
        module docstring.
    normalizer : {"exact", "url_poly"}
        ``log C_D(||K mu||)`` exact (default) or the URL code's fit at D = 10.

    Returns
    -------
    Tensor
        ``[..., C]`` log densities.
    """
    _check_density(density)
    norm = check_normalizer(normalizer)
    check_floating(z, "z")
    check_finite(z.detach(), "z")
    _check_proxies(proxy_mu, proxy_kappa, z.shape[-1])
    dtype = torch.promote_types(z.dtype, proxy_mu.dtype)  # a half z with float proxies
    z, proxy_mu, proxy_kappa = z.to(dtype), proxy_mu.to(dtype), proxy_kappa.to(dtype)
    mu = F.normalize(proxy_mu, dim=-1)
    z = F.normalize(z, dim=-1)
    kmu = proxy_kappa * mu  # K mu, [C, D]
    kmu_norm = kmu.norm(dim=-1)  # [C]
    dim = URL_POLY_NIVMF_DIM if norm is VmfNormalizer.URL_POLY else mu.shape[-1]
    log_c = log_normalizer(kmu_norm, dim, norm)
    if density == "url":
        cos = (z @ kmu.T) / kmu_norm  # cos(z, K mu), ||z|| = 1
        log_d = torch.log(proxy_kappa).sum(-1) - 2.0 * torch.log(kmu_norm)
        return log_c + log_d + kmu_norm * cos
    # cos(Kz, K mu) = z^T K^2 mu / (||K z|| ||K mu||), without materialising [..., C, D]
    k2 = proxy_kappa * proxy_kappa
    dot = z @ (k2 * mu).T
    kz_norm = torch.sqrt((z * z) @ k2.T)
    cos = dot / (kz_norm * kmu_norm)
    log_d = torch.log(proxy_kappa).sum(-1) - torch.log(kmu_norm)
    return log_c + log_d + kmu_norm * cos


def nivmf_elk_logits(
    mu: Tensor,
    kappa: Tensor | float,
    proxy_mu: Tensor,
    proxy_kappa: Tensor,
    n_samples: int = 16,
    generator: torch.Generator | None = None,
    density: str = "url",
    normalizer: str | VmfNormalizer = VmfNormalizer.EXACT,
) -> Tensor:
    """``[N, C]`` Monte-Carlo log expected likelihood ``log (1/S) sum_s p_c(z_s)`` (ECCV22 eq. 5).

    ``z_s ~ vMF(mu_n, kappa_n)`` (S reparameterised samples per input, shared by the classes);
    ``density`` and ``normalizer`` as in :func:`nivmf_log_density`.
    """
    check_embeddings(mu, "mu")
    k = check_kappa(kappa, mu, "kappa")
    n = _check_n_samples(n_samples)
    return _nivmf_elk_logits(mu, k, proxy_mu, proxy_kappa, n, generator, density, normalizer)


def _nivmf_elk_logits(
    mu: Tensor,
    kappa: Tensor,
    proxy_mu: Tensor,
    proxy_kappa: Tensor,
    n_samples: int,
    generator: torch.Generator | None,
    density: str = "url",
    normalizer: str | VmfNormalizer = VmfNormalizer.EXACT,
) -> Tensor:
    """:func:`nivmf_elk_logits` of validated ``mu [N, D]`` and ``kappa [N]`` (proxies checked)."""
    z = _sample_vmf(mu, kappa, n_samples, generator)  # [S, N, D]
    logp = nivmf_log_density(z, proxy_mu, proxy_kappa, density, normalizer)  # [S, N, C]
    return torch.logsumexp(logp, dim=0) - math.log(n_samples)


def nivmf_loss(
    mu: Tensor,
    kappa: Tensor | float,
    labels: Tensor,
    proxy_mu: Tensor,
    proxy_kappa: Tensor,
    n_samples: int = 16,
    generator: torch.Generator | None = None,
    reduction: str = "mean",
    density: str = "url",
) -> Tensor:
    """nivMF ProxyNCA (URL appendix B.5, eq. 4): cross-entropy over :func:`nivmf_elk_logits`."""
    logits = nivmf_elk_logits(mu, kappa, proxy_mu, proxy_kappa, n_samples, generator, density)
    _check_class_labels(labels, mu, proxy_mu.shape[0])
    return F.cross_entropy(logits, labels, reduction=reduction)


class NivMFLoss(ProxyLoss):
    """nivMF ProxyNCA as a pytorch-metric-learning loss with learnable nivMF proxies (URL B.5).

    ``loss(embeddings, labels, kappa=kappa)``: a :class:`~bayesurl.losses._base.ProxyLoss`
    (labels needed, no ``indices_tuple`` nor ``ref_emb``) over Monte-Carlo log expected
    likelihoods; the proxies are parameters of the loss.

    Parameters
    ----------
    num_classes, embedding_size : int
        Number of classes C and embedding dimension D.
    kappa_scale : float
        t, the multiplier of the proxies' concentrations (URL: ELK's t in [8, 64]).
    n_samples : int
        Monte-Carlo samples S of the image posterior (URL: 16).
    learn_proxy_kappa : bool
        Learn the per-dimension proxy concentrations.
    density : {"url", "eccv22"}
        The nivMF density (:func:`nivmf_log_density`); default the URL benchmark code's.
    normalizer : {"exact", "url_poly"}
        ``log C_D`` exact (default) or the URL code's fit at D = 10 (module docstring).
    **kwargs
        Passed to ``BaseMetricLossFunction``.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        kappa_scale: float = 16.0,
        n_samples: int = 16,
        learn_proxy_kappa: bool = True,
        density: str = "url",
        normalizer: str | VmfNormalizer = VmfNormalizer.EXACT,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.density = _check_density(density)
        self.normalizer = check_normalizer(normalizer)
        self.proxies = NonIsotropicVMFProxies(
            num_classes, embedding_size, kappa_scale, learn_proxy_kappa
        )
        self.n_samples = _check_n_samples(n_samples)
        self.generator: torch.Generator | None = None

    def _proxy_logits(
        self, embeddings: Tensor, kappa: Tensor, proxy_mu: Tensor, proxy_kappa: Tensor
    ) -> Tensor:
        return _nivmf_elk_logits(
            embeddings,
            kappa,
            proxy_mu,
            proxy_kappa,
            self.n_samples,
            self.generator,
            self.density,
            self.normalizer,
        )
