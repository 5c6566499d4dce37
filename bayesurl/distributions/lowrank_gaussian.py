"""Batched Gaussian with a low-rank plus diagonal covariance, ``Sigma = V V^T + diag(d)``.

The embedding distribution of HET-XL (URL appendix B.7, eq. 6; Collier et al. 2023): each input
``x`` gets a mean ``mu(x)`` in embedding space and a covariance ``V(x) V(x)^T + diag(d(x))``
whose rank-``R`` factor ``V`` and diagonal ``d`` come from a linear layer. Everything here costs
``O(N D R^2 + N R^3)``; the dense ``D x D`` matrix is only formed on request
(:attr:`LowRankGaussian.covariance_matrix`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from bayesurl._checks import check_finite, check_ndim

__all__ = ["LowRankGaussian"]


class LowRankGaussian:
    """``N(loc, V V^T + diag(d))`` for a batch of ``N`` inputs in ``D`` dimensions.

    HET-XL's embedding distribution (URL appendix B.7, eq. 6). The log-determinant uses the
    matrix determinant lemma (Harville 1997, thm. 18.1.1)

    ``log det(D + V V^T) = sum_j log d_j + log det(I_R + V^T D^{-1} V)``

    and :meth:`log_prob` the Woodbury identity, both through one ``R x R`` Cholesky factor per
    input (the capacitance matrix). Samples are ``mu + V z_R + sqrt(d) z_D`` with independent
    standard normal ``z`` (reparameterised, differentiable in every parameter).

    Parameters
    ----------
    loc : Tensor
        Means ``[N, D]``.
    cov_factor : Tensor
        Low-rank factors ``V`` ``[N, D, R]`` (``R >= 1``; zeros are allowed).
    cov_diag : Tensor
        Diagonal variances ``d`` ``[N, D]``, non-negative. Zeros are allowed for sampling
        (the distribution is then degenerate); :meth:`log_det`, :meth:`log_prob` and
        :meth:`entropy` need ``d > 0``.

    Raises
    ------
    ValueError
        On mismatched shapes, non-finite or negative ``cov_diag`` entries.

    Examples
    --------
    >>> import torch
    >>> g = LowRankGaussian(torch.zeros(2, 3), torch.ones(2, 3, 1), torch.ones(2, 3))
    >>> g.rsample(5).shape
    torch.Size([5, 2, 3])
    >>> g.log_det()  # log det(I + 1 1^T) = log 4
    tensor([1.3863, 1.3863])
    """

    def __init__(self, loc: Tensor, cov_factor: Tensor, cov_diag: Tensor) -> None:
        check_ndim(loc, "loc", 2)
        check_ndim(cov_factor, "cov_factor", 3)
        check_ndim(cov_diag, "cov_diag", 2)
        n, d = loc.shape
        if cov_factor.shape[:2] != (n, d) or cov_factor.shape[2] < 1:
            raise ValueError(
                f"`cov_factor` must be [N, D, R] = [{n}, {d}, R >= 1] to match `loc`, "
                f"got {tuple(cov_factor.shape)}"
            )
        if cov_diag.shape != (n, d):
            raise ValueError(
                f"`cov_diag` must be [N, D] = [{n}, {d}] to match `loc`, "
                f"got {tuple(cov_diag.shape)}"
            )
        for name, t in (("loc", loc), ("cov_factor", cov_factor), ("cov_diag", cov_diag)):
            check_finite(t.detach(), name)
        if bool((cov_diag.detach() < 0).any()):
            raise ValueError("`cov_diag` holds variances and must be non-negative")
        self.loc = loc
        self.cov_factor = cov_factor
        self.cov_diag = cov_diag

    # -- shapes -------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Number of inputs ``N``."""
        return self.loc.shape[0]

    @property
    def dim(self) -> int:
        """Embedding dimension ``D``."""
        return self.loc.shape[1]

    @property
    def rank(self) -> int:
        """Rank ``R`` of the low-rank factor."""
        return self.cov_factor.shape[2]

    @property
    def mean(self) -> Tensor:
        """The means ``[N, D]``."""
        return self.loc

    @property
    def variance(self) -> Tensor:
        """Marginal variances ``diag(Sigma)`` ``[N, D]``."""
        return self.cov_diag + self.cov_factor.pow(2).sum(-1)

    @property
    def covariance_matrix(self) -> Tensor:
        """Dense covariances ``[N, D, D]`` (memory ``N D^2``; for checks and small ``D``)."""
        v = self.cov_factor
        return v @ v.transpose(-1, -2) + torch.diag_embed(self.cov_diag)

    # -- sampling -----------------------------------------------------------------------------
    def rsample(
        self,
        n_samples: int | torch.Size | tuple[int, ...] = 1,
        generator: torch.Generator | None = None,
        shared_diag_noise: bool = False,
    ) -> Tensor:
        """Reparameterised samples ``[S, N, D]`` (``S = n_samples``).

        Parameters
        ----------
        n_samples : int
            Number of samples ``S`` per input (a 1-tuple is accepted for
            ``torch.distributions`` compatibility).
        generator : torch.Generator, optional
            Source of randomness (on the device of ``loc``) for reproducible draws.
        shared_diag_noise : bool
            Scale one standard-normal scalar per sample and input by ``sqrt(d)`` instead of
            one per dimension: samples of ``N(loc, V V^T + sqrt(d) sqrt(d)^T)``, not of this
            distribution (the URL HET-XL code's draw; :class:`~bayesurl.heads.HetXLHead`).
        """
        if isinstance(n_samples, (tuple, torch.Size)):
            if len(n_samples) != 1:
                raise ValueError(f"`n_samples` must be an int or a 1-tuple, got {n_samples}")
            n_samples = n_samples[0]
        s = int(n_samples)
        if s < 1:
            raise ValueError(f"`n_samples` must be >= 1, got {n_samples}")
        n, d, r = self.cov_factor.shape
        opts = {"dtype": self.loc.dtype, "device": self.loc.device, "generator": generator}
        z_r = torch.randn(s, n, r, **opts)
        z_d = torch.randn(s, n, 1 if shared_diag_noise else d, **opts)
        low_rank = torch.einsum("ndr,snr->snd", self.cov_factor, z_r)
        # sqrt with a finite gradient at d = 0 (degenerate directions): exact 0 there
        d_pos = self.cov_diag.clamp_min(torch.finfo(self.cov_diag.dtype).tiny)
        std = torch.where(self.cov_diag > 0, d_pos.sqrt(), torch.zeros_like(d_pos))
        return self.loc + low_rank + std * z_d

    def sample(self, n_samples: int = 1, generator: torch.Generator | None = None) -> Tensor:
        """Samples ``[S, N, D]`` without gradient (see :meth:`rsample`)."""
        with torch.no_grad():
            return self.rsample(n_samples, generator)

    # -- densities ----------------------------------------------------------------------------
    def _check_positive_diag(self) -> None:
        if bool((self.cov_diag.detach() <= 0).any()):
            raise ValueError("`cov_diag` must be strictly positive for densities / log det")

    def _capacitance_cholesky(self) -> Tensor:
        """Cholesky factor of ``I_R + V^T D^{-1} V`` ``[N, R, R]``."""
        vt_dinv = self.cov_factor.transpose(-1, -2) / self.cov_diag.unsqueeze(-2)  # [N, R, D]
        cap = vt_dinv @ self.cov_factor
        cap = cap + torch.eye(self.rank, dtype=cap.dtype, device=cap.device)
        return torch.linalg.cholesky(cap)

    def log_det(self) -> Tensor:
        """``log det Sigma`` ``[N]`` by the matrix determinant lemma.

        HET-XL's alternative uncertainty (URL section 4.1: ``u(x) = det Sigma(x)``; the log is
        monotone, so the ranking is the same and it stays finite in high dimension).
        """
        self._check_positive_diag()
        chol = self._capacitance_cholesky()
        log_det_cap = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
        return torch.log(self.cov_diag).sum(-1) + log_det_cap

    def mahalanobis(self, value: Tensor) -> Tensor:
        """Squared Mahalanobis distance ``(x - mu)^T Sigma^{-1} (x - mu)`` by Woodbury.

        ``value`` is ``[N, D]`` or ``[S, N, D]``; returns ``[N]`` or ``[S, N]``.
        """
        self._check_positive_diag()
        if value.shape[-2:] != self.loc.shape:
            raise ValueError(
                f"`value` must end in [N, D] = {tuple(self.loc.shape)}, got {tuple(value.shape)}"
            )
        diff = value - self.loc
        diff_dinv = diff / self.cov_diag
        first = (diff * diff_dinv).sum(-1)
        proj = torch.einsum("...nd,ndr->...nr", diff_dinv, self.cov_factor)  # V^T D^-1 diff
        chol = self._capacitance_cholesky()
        # solve L y = proj for each n; value may carry a leading sample dim
        sol = torch.linalg.solve_triangular(chol, proj.unsqueeze(-1), upper=False).squeeze(-1)
        return first - sol.pow(2).sum(-1)

    def log_prob(self, value: Tensor) -> Tensor:
        """Log-density of ``value`` (``[N, D]`` or ``[S, N, D]``)."""
        maha = self.mahalanobis(value)
        return -0.5 * (self.dim * math.log(2 * math.pi) + self.log_det() + maha)

    def entropy(self) -> Tensor:
        """Differential entropy ``[N]``: ``D/2 (1 + log 2 pi) + 1/2 log det Sigma``."""
        return 0.5 * self.dim * (1.0 + math.log(2 * math.pi)) + 0.5 * self.log_det()

    def to(self, *args, **kwargs) -> LowRankGaussian:
        """A copy with every tensor moved like :meth:`torch.Tensor.to`."""
        return LowRankGaussian(
            self.loc.to(*args, **kwargs),
            self.cov_factor.to(*args, **kwargs),
            self.cov_diag.to(*args, **kwargs),
        )

    def __repr__(self) -> str:
        return f"LowRankGaussian(N={self.batch_size}, D={self.dim}, R={self.rank})"
