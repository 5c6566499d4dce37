"""Probabilistic class proxies for proxy-based losses (ELK, nivMF).

ELK models each class c as an isotropic vMF ``rho_c = vMF(mu_c, kappa_c)`` (URL appendix B.4);
nivMF as a non-isotropic vMF with one concentration per embedding dimension,
``nivMF(mu_c, K_c = diag(kappa_c))`` (Kirchhof et al., ECCV 2022, section 3.2, eq. 4; reprinted
in the thesis). Both return plain tensors: unit directions ``[C, D]`` and positive
concentrations, ``[C]`` for isotropic and ``[C, D]`` for non-isotropic proxies, multiplied by
``kappa_scale`` (the hyper-parameter t of URL B.4, "the concentrations of these classes are
scaled up by t").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_int
from bayesurl.heads.kappa import inverse_softplus

__all__ = ["NonIsotropicVMFProxies", "VMFProxies"]


class _Proxies(nn.Module):
    """Learnable unit directions ``[C, D]`` and raw concentrations of a given shape."""

    def __init__(
        self,
        num_classes: int,
        dim: int,
        kappa_scale: float,
        init_kappa: float,
        learn_kappa: bool,
        kappa_shape: Callable[[int, int], tuple[int, ...]],
    ) -> None:
        super().__init__()
        check_int(num_classes, "num_classes", low=2)
        check_int(dim, "dim", low=2)
        if not kappa_scale > 0:
            raise ValueError(f"`kappa_scale` must be positive, got {kappa_scale}")
        if not init_kappa > 0:
            raise ValueError(f"`init_kappa` must be positive, got {init_kappa}")
        self.num_classes, self.dim = int(num_classes), int(dim)
        self.kappa_scale = float(kappa_scale)
        self.direction = nn.Parameter(torch.randn(self.num_classes, self.dim))
        raw = inverse_softplus(torch.full(kappa_shape(self.num_classes, self.dim), init_kappa))
        self.raw_kappa = nn.Parameter(raw, requires_grad=learn_kappa)


class VMFProxies(_Proxies):
    """Isotropic vMF class proxies ``vMF(mu_c, t * kappa_c)`` (URL appendix B.4).

    Parameters
    ----------
    num_classes : int
        Number of classes C.
    dim : int
        Embedding dimension D.
    kappa_scale : float
        The multiplier t of the learned concentrations (URL B.4 tunes t in [8, 64]).
    shared_kappa : bool
        One concentration shared by all classes instead of one per class.
    learn_kappa : bool
        Learn the concentrations (default) or keep them fixed at ``init_kappa``.
    init_kappa : float
        Initial concentration before scaling.

    Examples
    --------
    >>> mu, kappa = VMFProxies(10, 8, kappa_scale=16.0)()
    >>> mu.shape, kappa.shape
    (torch.Size([10, 8]), torch.Size([10]))
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        kappa_scale: float = 16.0,
        shared_kappa: bool = False,
        learn_kappa: bool = True,
        init_kappa: float = 1.0,
    ) -> None:
        super().__init__(
            num_classes, dim, kappa_scale, init_kappa, learn_kappa,
            lambda c, d: (1 if shared_kappa else c,),
        )  # fmt: skip
        self.shared_kappa = bool(shared_kappa)

    def forward(self) -> tuple[Tensor, Tensor]:
        """``(mu [C, D], kappa [C])``: unit directions and scaled concentrations."""
        mu = F.normalize(self.direction, dim=-1)
        kappa = self.kappa_scale * F.softplus(self.raw_kappa).expand(self.num_classes)
        return mu, kappa


class NonIsotropicVMFProxies(_Proxies):
    """Non-isotropic vMF class proxies ``nivMF(mu_c, diag(t * kappa_c))`` (ECCV22 nivMF, eq. 4).

    Each class has a direction ``mu_c`` on the sphere and a positive concentration per
    embedding dimension ``kappa_c [D]`` (URL appendix B.5).

    Parameters
    ----------
    num_classes : int
        Number of classes C.
    dim : int
        Embedding dimension D.
    kappa_scale : float
        The multiplier t of the learned concentrations (URL B.5 uses ELK's t in [8, 64]).
    learn_kappa : bool
        Learn the concentrations (default) or keep them fixed at ``init_kappa``.
    init_kappa : float
        Initial concentration of every dimension before scaling (isotropic start).
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        kappa_scale: float = 16.0,
        learn_kappa: bool = True,
        init_kappa: float = 1.0,
    ) -> None:
        super().__init__(
            num_classes, dim, kappa_scale, init_kappa, learn_kappa, lambda c, d: (c, d)
        )

    def forward(self) -> tuple[Tensor, Tensor]:
        """``(mu [C, D], kappa [C, D])``: unit directions and per-dimension concentrations."""
        mu = F.normalize(self.direction, dim=-1)
        return mu, self.kappa_scale * F.softplus(self.raw_kappa)
