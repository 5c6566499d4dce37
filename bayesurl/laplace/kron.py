"""Kronecker-factored (EKFAC) curvature of the contrastive loss (LAM section 3, beyond diagonal).

For a pair ``(i, j)`` and a linear layer with parameters ``[W | b]`` (row-major, ``D x F'``,
``F' = F + 1`` with a bias), the layer output ``y_t = W x_t + b`` has Jacobian
``I_D (x) abar_t^T`` with ``abar_t = (x_t, 1)``. If the embedding ``z`` is ``M_t y_t``
to first order (``M_t = dz / dy_t``: the identity for the last layer, from autograd for an
earlier layer of an MLP head) the pair's GGN (LAM eq. 6) is a signed sum of four Kronecker
products::

    sum_{s, t in {i, j}}  X_st (x) abar_s abar_t^T,       X_st = M_s^T H_st M_t,

with ``H = [[H_ii, H_ij], [H_ij^T, H_jj]]`` the ``2D x 2D`` output Hessian of the pair
(:mod:`bayesurl.laplace.curvature` lists its blocks; ``fixed`` drops ``H_ij``, negatives
inside the margin enter negated). Every block is ``alpha I + U C U^T`` with
``U = [u_i, u_j]``: rank two beyond a multiple of the identity.

The Frobenius-nearest Kronecker product ``G (x) A`` of the summed GGN (Van Loan and
Pitsianis, 1993: the best rank-one approximation of the rearranged matrix) is found here by
alternating least squares over the cached layer inputs and the pairs, never forming the GGN::

    G <- sum_terms X_st <abar_s abar_t^T, A> / ||A||^2,
    A <- sum_terms abar_s abar_t^T <X_st, G> / ||G||^2,

``O(P (D^2 + F^2))`` per iteration. Its eigenbases ``Q_G``, ``Q_A`` define the EKFAC
posterior (George et al., 2018): the curvature along each eigen-direction ``q_d (x) q_f`` is
replaced by the exact GGN's ``S_df = (q_d (x) q_f)^T GGN (q_d (x) q_f)`` -- the diagonal of
``Q^T GGN Q`` -- computed in ``O(P (D^2 + F^2 + D F))``. Clamping ``S`` at 0 is the PSD fix
(the diagonal clamp of LAM eq. 9 in a rotated basis), so the posterior precision
``Q diag(beta relu(S) + lambda) Q^T`` is diagonal in a known orthonormal basis: its log
determinant, samples and linearised predictive are closed-form. With ``Q = I`` ``S`` is the
GGN diagonal of :func:`~bayesurl.laplace.curvature.ggn_diagonal`.

Design and measured numbers: docs/concepts/laplace.rst, "Beyond the diagonal".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bayesurl._checks import check_int
from bayesurl.laplace.curvature import (
    Approximation,
    Geometry,
    _enum,
    contributing_pairs,
    split_pairs,
)

__all__ = [
    "DenseBlocks",
    "LowRankBlocks",
    "KronPosterior",
    "augment",
    "cat_blocks",
    "contrastive_blocks",
    "dense_ggn",
    "eigencorrected_curvature",
    "kron_factors",
    "kron_eigenbasis",
    "linearised_trace",
    "nearest_kronecker_svd",
    "rotated_diagonal_projection",
]

_EPS = 1e-12


def augment(inputs: Tensor, bias: bool) -> Tensor:
    """Layer inputs ``[N, F]`` with a column of ones appended when the layer has a bias."""
    if not bias:
        return inputs
    return torch.cat([inputs, inputs.new_ones(inputs.shape[0], 1)], dim=1)


@dataclass
class LowRankBlocks:
    """Output-Hessian blocks ``alpha I + U C U^T`` of ``P`` pairs (last layer, ``M = I``).

    Attributes
    ----------
    i, j : Tensor
        ``[P]`` rows of the two members in the cached inputs.
    u : Tensor
        ``[P, D, 2]`` normalised outputs ``(u_i, u_j)``.
    alpha : Tensor
        ``[P, 3]`` identity coefficients of the ``ii``, ``ij``, ``jj`` blocks.
    coef : Tensor
        ``[P, 3, 2, 2]`` low-rank coefficients; block ``ji`` is the transpose of ``ij``.
    cross : bool
        Whether the ``ij`` blocks are present (``False`` for ``fixed``).
    """

    i: Tensor
    j: Tensor
    u: Tensor
    alpha: Tensor
    coef: Tensor
    cross: bool

    @property
    def dim(self) -> int:
        return self.u.shape[1]

    def weighted_sum(self, w: Tensor) -> Tensor:
        """``sum_p sum_st w[p, st] X_st`` for ``w [P, 3]`` (``ij`` counted with ``ji``)."""
        w = _cross_twice(w, self.cross)
        a = (w * self.alpha).sum()
        c = (w[:, :, None, None] * self.coef).sum(1)  # [P, 2, 2]
        c = 0.5 * (c + c.transpose(1, 2))
        left = torch.bmm(self.u, c)  # [P, D, 2]
        d = self.dim
        out = left.permute(1, 0, 2).reshape(d, -1) @ self.u.permute(1, 0, 2).reshape(d, -1).T
        return out + a * torch.eye(d, dtype=out.dtype, device=out.device)

    def inner(self, g: Tensor) -> Tensor:
        """``<X_st, G>`` for a symmetric ``G``, ``[P, 3]``."""
        d = self.dim
        gu = (g @ self.u.permute(1, 0, 2).reshape(d, -1)).reshape(d, -1, 2).permute(1, 0, 2)
        k = torch.einsum("pda,pdb->pab", self.u, gu)  # [P, 2, 2]
        return self.alpha * torch.diagonal(g).sum() + (self.coef * k[:, None]).sum((2, 3))

    def rotated_diagonal(self, q: Tensor) -> Tensor:
        """``diag(Q^T X_st Q)`` for each pair and block, ``[P, 3, D]``."""
        ut = torch.einsum("pda,dk->pak", self.u, q)  # [P, 2, D]
        quad = torch.einsum("psab,pak,pbk->psk", self.coef, ut, ut)
        return self.alpha[:, :, None] + quad

    def dense(self) -> Tensor:
        """The blocks as dense ``[P, 3, D, D]`` matrices."""
        eye = torch.eye(self.dim, dtype=self.u.dtype, device=self.u.device)
        low = torch.einsum("pda,psab,peb->psde", self.u, self.coef, self.u)
        return self.alpha[:, :, None, None] * eye + low


@dataclass
class DenseBlocks:
    """Pulled-back blocks ``X_st = M_s^T H_st M_t`` as dense ``[P, 3, D_l, D_l]`` matrices.

    Used for a hidden layer of an MLP head (``M_t`` from autograd); attributes as in
    :class:`LowRankBlocks` with ``x`` in place of ``u``, ``alpha``, ``coef``.
    """

    i: Tensor
    j: Tensor
    x: Tensor
    cross: bool

    @property
    def dim(self) -> int:
        return self.x.shape[-1]

    def weighted_sum(self, w: Tensor) -> Tensor:
        w = _cross_twice(w, self.cross)
        out = torch.einsum("ps,psde->de", w, self.x)
        return 0.5 * (out + out.T)

    def inner(self, g: Tensor) -> Tensor:
        return (self.x * g).sum((2, 3))

    def rotated_diagonal(self, q: Tensor) -> Tensor:
        return torch.einsum("psde,dk,ek->psk", self.x, q, q)

    def dense(self) -> Tensor:
        return self.x


Blocks = LowRankBlocks | DenseBlocks


def _cross_twice(w: Tensor, cross: bool) -> Tensor:
    # the ji block equals the transposed ij block and enters the sum once more
    scale = w.new_tensor([1.0, 2.0 if cross else 0.0, 1.0])
    return w * scale


def contrastive_blocks(
    z: Tensor,
    indices_tuple: tuple[Tensor, ...],
    *,
    approximation: Approximation | str = "fixed",
    geometry: Geometry | str = "arccos",
    margin: float = 0.2,
    weight: float = 1.0,
) -> LowRankBlocks:
    """Low-rank output-Hessian blocks of the contributing pairs (LAM eqs. 6-9, supplement).

    Parameters
    ----------
    z : Tensor
        ``[N, D]`` unnormalised embeddings (the last layer's outputs).
    indices_tuple : tuple of Tensor
        PML pairs ``(a1, p, a2, n)`` or triplets ``(a, p, n)`` into the ``N`` rows.
    approximation, geometry, margin
        As in :func:`~bayesurl.laplace.curvature.ggn_diagonal`.
    weight : float
        Multiplies every block (online LAM's ``N / b`` scale, ``1/S`` over weight samples).

    Returns
    -------
    LowRankBlocks
        ``P`` rows (positive pairs, then the negatives inside the margin; may be empty).
    """
    approximation = _enum(Approximation, approximation, "approximation")
    geometry = _enum(Geometry, geometry, "geometry")
    pairs = tuple(t.to(z.device) for t in split_pairs(indices_tuple, z.shape[0]))
    sets = contributing_pairs(z, pairs, approximation, float(margin))
    cross = approximation is not Approximation.FIXED
    if not sets:
        empty = torch.zeros(0, dtype=torch.long, device=z.device)
        return LowRankBlocks(
            empty,
            empty,
            z.new_zeros(0, z.shape[1], 2),
            z.new_zeros(0, 3),
            z.new_zeros(0, 3, 2, 2),
            cross,
        )
    i = torch.cat([s[0] for s in sets])
    j = torch.cat([s[1] for s in sets])
    sign = torch.cat([z.new_full((s[0].numel(),), s[2]) for s in sets]) * float(weight)
    z1, z2 = z[i], z[j]
    n1 = z1.norm(dim=1).clamp_min(_EPS)
    n2 = z2.norm(dim=1).clamp_min(_EPS)
    u1, u2 = z1 / n1[:, None], z2 / n2[:, None]
    c = (u1 * u2).sum(1)
    zero, one = torch.zeros_like(c), torch.ones_like(c)
    if geometry is Geometry.EUCLIDEAN:
        # A = (I - u_i u_i^T)/n_i^2, C = (I - u_j u_j^T)/n_j^2
        a_ii, a_jj = one, one
        c_ii = torch.stack([-one, zero, zero, zero], 1)
        c_jj = torch.stack([zero, zero, zero, -one], 1)
    else:
        # A = (c I + u_i u_j^T + u_j u_i^T - 3c u_i u_i^T)/n_i^2, C likewise with u_j
        a_ii, a_jj = c, c
        c_ii = torch.stack([-3 * c, one, one, zero], 1)
        c_jj = torch.stack([zero, one, one, -3 * c], 1)
    # B = (-I + u_i u_i^T + u_j u_j^T - c u_i u_j^T)/(n_i n_j) in both geometries
    a_ij = -one
    c_ij = torch.stack([one, -c, zero, one], 1)
    s_ii, s_jj, s_ij = sign / n1**2, sign / n2**2, sign / (n1 * n2)
    if not cross:
        s_ij = torch.zeros_like(s_ij)
    alpha = torch.stack([a_ii * s_ii, a_ij * s_ij, a_jj * s_jj], 1)
    coef = torch.stack([c_ii * s_ii[:, None], c_ij * s_ij[:, None], c_jj * s_jj[:, None]], 1)
    return LowRankBlocks(i, j, torch.stack([u1, u2], 2), alpha, coef.reshape(-1, 3, 2, 2), cross)


def _input_weights(inputs: Tensor, blocks: Blocks, a: Tensor) -> Tensor:
    """``<abar_s abar_t^T, A> = abar_s^T A abar_t`` for the ``ii``, ``ij``, ``jj`` terms."""
    xa = inputs @ a
    quad = (xa * inputs).sum(1)
    cols = [quad[blocks.i], quad[blocks.j]]
    cross = (xa[blocks.i] * inputs[blocks.j]).sum(1) if blocks.cross else torch.zeros_like(cols[0])
    return torch.stack([cols[0], cross, cols[1]], 1)


def _input_sum(inputs: Tensor, blocks: Blocks, g: Tensor) -> Tensor:
    """``sum_p sum_st g[p, st] abar_s abar_t^T`` (symmetric) for ``g [P, 3]``.

    One ``[F', N] @ [N, F']`` product: the pair weights are first gathered per input row
    (``abar^T (W abar)`` with the sparse ``N x N`` pair-weight matrix ``W``).
    """
    right = inputs * _row_sum(inputs.shape[0], blocks, g[:, 0], g[:, 2])[:, None]
    if blocks.cross:
        right = right.index_add(0, blocks.i, inputs[blocks.j] * g[:, 1:2])
        right = right.index_add(0, blocks.j, inputs[blocks.i] * g[:, 1:2])
    out = inputs.T @ right
    return 0.5 * (out + out.T)


def _row_sum(n: int, blocks: Blocks, at_i: Tensor, at_j: Tensor) -> Tensor:
    """Per-row totals: ``at_i`` added at each pair's ``i`` row and ``at_j`` at its ``j`` row."""
    rows = at_i.new_zeros((n, *at_i.shape[1:]))
    rows.index_add_(0, blocks.i, at_i)
    rows.index_add_(0, blocks.j, at_j)
    return rows


def kron_factors(
    blocks: Blocks,
    inputs: Tensor,
    *,
    max_iter: int = 100,
    tol: float | None = None,
    init: Tensor | None = None,
    memory: tuple | None = None,
    info: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """Frobenius-nearest Kronecker product ``G (x) A`` of the pair GGN by ALS (Van Loan).

    Parameters
    ----------
    blocks : LowRankBlocks or DenseBlocks
        Output-side blocks of the pairs (:func:`contrastive_blocks`).
    inputs : Tensor
        ``[N, F']`` cached layer inputs (:func:`augment` for a bias).
    max_iter : int
        Most ALS iterations (each: a ``G`` step then an ``A`` step). ALS is a power
        iteration on the rearranged matrix, converging as ``(sigma_2 / sigma_1)^2``.
    tol : float, optional
        Stop when the unit-norm ``G`` moves by less than ``tol`` (Frobenius) in an
        iteration; default ``1e-4`` in float32, ``1e-8`` in float64.
    init : Tensor, optional
        ``A`` to start from (warm start; default: see Notes).
    memory : tuple, optional
        An extra term of the approximated sum (online LAM's decayed running curvature):
        ``(c, G0, A0)`` for ``c G0 (x) A0``, or ``(c, Q_G, Q_A, S)`` for the EKFAC curvature
        ``c (Q_G (x) Q_A) diag(S) (Q_G (x) Q_A)^T`` (``S [D, F']``).
    info : dict, optional
        Receives ``n_iter`` (iterations run) and ``change`` (the last step of ``G``).

    Notes
    -----
    Without ``init`` the ALS starts at ``A = sum_terms tr(X_st) abar_s abar_t^T`` (the
    ``A`` step from ``G = I``), which on class-clustered features was one iteration from
    convergence.

    Returns
    -------
    (Tensor, Tensor)
        ``G [D, D]`` and ``A [F', F']``, symmetric, scaled so ``||A||_F = 1`` and ``tr A >= 0``.

    Raises
    ------
    ValueError
        If the sum is zero (no pairs and no memory).
    """
    check_int(max_iter, "max_iter", low=1)
    if tol is None:
        tol = 1e-4 if inputs.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-8
    a = _start_a(blocks, inputs, memory) if init is None else 0.5 * (init + init.T)
    a = _unit_a(a)
    g = _g_step(blocks, inputs, a, memory)
    g_unit = g / g.norm()
    change, n_done = float("inf"), 0
    for n_done in range(1, int(max_iter) + 1):  # noqa: B007 - reported after the loop
        a = _input_sum(inputs, blocks, blocks.inner(g_unit))
        if memory is not None:
            a = a + _memory_a(memory, g_unit)
        a = _unit_a(a)
        g = _g_step(blocks, inputs, a, memory)
        new = g / g.norm()
        # G is defined up to sign only through A's convention; compare directions
        change = float(torch.minimum((new - g_unit).norm(), (new + g_unit).norm()))
        g_unit = new
        if change < tol:
            break
    if info is not None:
        info.update(n_iter=n_done, change=change)
    return g, a


def _start_a(blocks: Blocks, inputs: Tensor, memory: tuple | None) -> Tensor:
    """The ALS start without ``init``: half a step from ``G = I``.

    ``A = sum_terms abar_s abar_t^T tr(X_st)``, a closer start than ``A = I`` (the ``G`` step
    from it is usually converged already); ``I`` where that sum is zero.
    """
    eye = torch.eye(blocks.dim, dtype=inputs.dtype, device=inputs.device)
    a = _input_sum(inputs, blocks, blocks.inner(eye))
    if memory is not None:
        a = a + _memory_a(memory, torch.eye(blocks.dim, dtype=a.dtype, device=a.device))
    if not bool(a.norm() > 0):
        a = torch.eye(inputs.shape[1], dtype=inputs.dtype, device=inputs.device)
    return a


def _unit_a(a: Tensor) -> Tensor:
    """``A`` scaled to ``||A||_F = 1`` with ``tr A >= 0`` (the sign convention of ``G (x) A``)."""
    a = a / a.norm()
    if float(torch.diagonal(a).sum()) < 0:
        a = -a
    return a


def _g_step(blocks: Blocks, inputs: Tensor, a: Tensor, memory: tuple | None) -> Tensor:
    """The least-squares ``G`` for a unit-norm ``A``; raises when it is zero or not finite."""
    g = blocks.weighted_sum(_input_weights(inputs, blocks, a))
    if memory is not None:
        g = g + _memory_g(memory, a)
    if not bool((g * g).sum() > 0) or not bool(torch.isfinite(g).all()):
        raise ValueError("the pair GGN is zero or not finite: no usable curvature")
    return g


def _memory_g(memory: tuple, a: Tensor) -> Tensor:
    """G step of the memory term for a given ``A`` (see :func:`kron_factors`)."""
    if len(memory) == 3:
        c, g0, a0 = memory
        return c * (a0 * a).sum() * g0
    c, q_g, q_a, s = memory
    w = torch.einsum("fk,fg,gk->k", q_a, a, q_a)  # q_f^T A q_f
    return c * (q_g * (s @ w)) @ q_g.T


def _memory_a(memory: tuple, g: Tensor) -> Tensor:
    """A step of the memory term for a given ``G``: the G step with the factors' roles swapped."""
    if len(memory) == 3:
        c, g0, a0 = memory
        return _memory_g((c, a0, g0), g)
    c, q_g, q_a, s = memory
    return _memory_g((c, q_a, q_g, s.T), g)


def kron_eigenbasis(g: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """Orthonormal eigenvectors ``(Q_G, Q_A)`` of the symmetrised factors (columns)."""
    return torch.linalg.eigh(0.5 * (g + g.T))[1], torch.linalg.eigh(0.5 * (a + a.T))[1]


def eigencorrected_curvature(blocks: Blocks, inputs: Tensor, q_g: Tensor, q_a: Tensor) -> Tensor:
    """EKFAC curvature ``S[d, f] = (q_d (x) q_f)^T GGN (q_d (x) q_f)``, ``[D, F']``.

    The diagonal of ``(Q_G (x) Q_A)^T GGN (Q_G (x) Q_A)`` (George et al., 2018), without
    forming the GGN; unclamped. With identity bases it is the GGN diagonal of
    :func:`~bayesurl.laplace.curvature.ggn_diagonal` in ``[W | b]`` layout.
    """
    at = inputs @ q_a
    di = blocks.rotated_diagonal(q_g)  # [P, 3, D]
    # the ii / jj terms share each input row's (q_f . abar)^2: gather them per row first
    rows = _row_sum(inputs.shape[0], blocks, di[:, 0], di[:, 2])  # [N, D]
    s = rows.T @ (at * at)
    if blocks.cross:
        s = s + 2.0 * (di[:, 1].T @ (at[blocks.i] * at[blocks.j]))
    return s


def rotated_diagonal_projection(
    s: Tensor, q_g_old: Tensor, q_a_old: Tensor, q_g: Tensor, q_a: Tensor
) -> Tensor:
    """Diagonal, in the basis ``Q_G (x) Q_A``, of ``Q_old diag(S) Q_old^T``, ``[D, F']``.

    ``(R_G^2) S (R_A^2)^T`` with ``R = Q^T Q_old``: carries a curvature kept in one
    eigenbasis into another exactly as far as its diagonal goes (online LAM).
    """
    rg = (q_g.T @ q_g_old) ** 2
    ra = (q_a.T @ q_a_old) ** 2
    return rg @ s @ ra.T


def linearised_trace(z: Tensor, r: Tensor, c: Tensor, full: bool = False) -> tuple[Tensor, ...]:
    """``tr Cov(u)`` (and ``Cov(u)``) for ``Cov(z) = R diag(c) R^T`` and ``u = z / ||z||``.

    The normalisation is linearised: ``Cov(u) = P Cov(z) P`` with
    ``P = (I - u u^T) / ||z||``, so ``tr Cov(u) = (sum c ||r||^2 - sum c (R^T u)^2) / ||z||^2``.

    Parameters
    ----------
    z : Tensor
        ``[N, D]`` mean outputs.
    r : Tensor
        ``[D, K]`` (shared) or ``[N, D, K]`` (per input) columns.
    c : Tensor
        ``[N, K]`` non-negative variances along those columns.
    full : bool
        Also return ``Cov(u) [N, D, D]``.

    Returns
    -------
    tuple of Tensor
        ``(u [N, D], trace [N])`` and, with ``full``, ``cov [N, D, D]``.
    """
    norm2 = (z * z).sum(1).clamp_min(torch.finfo(z.dtype).tiny)
    u = z / norm2.sqrt()[:, None]
    if r.ndim == 2:
        ru = u @ r
        col = (r * r).sum(0)[None, :]
    else:
        ru = torch.einsum("nd,ndk->nk", u, r)
        col = (r * r).sum(1)
    trace = ((c * col).sum(1) - (c * ru * ru).sum(1)) / norm2
    if not full:
        return u, trace
    rr = r if r.ndim == 3 else r.expand(z.shape[0], *r.shape)
    proj = rr - u[:, :, None] * ru[:, None, :]  # (I - u u^T) R
    cov = torch.einsum("ndk,nk,nek->nde", proj, c, proj) / norm2[:, None, None]
    return u, trace, cov


# ---------------------------------------------------------------------- dense references
def dense_ggn(blocks: Blocks, inputs: Tensor) -> Tensor:
    """The pair GGN as a dense ``[D F', D F']`` matrix in ``[W | b]`` row-major order.

    ``O(P D^2 F'^2)`` memory-light loop; for tests and exact references on small layers.
    """
    x = blocks.dense()
    d, f = x.shape[-1], inputs.shape[1]
    out = inputs.new_zeros(d * f, d * f)
    ai, aj = inputs[blocks.i], inputs[blocks.j]
    terms = [(0, ai, ai), (2, aj, aj)]
    if blocks.cross:
        terms.append((1, ai, aj))
    for k, left, right in terms:
        y = torch.einsum("pf,pg->pfg", left, right)
        blk = torch.einsum("pde,pfg->dfeg", x[:, k], y).reshape(d * f, d * f)
        out = out + (blk + blk.T if k == 1 else blk)
    return out


def nearest_kronecker_svd(matrix: Tensor, d: int, f: int) -> tuple[Tensor, Tensor]:
    """Van Loan's nearest ``G (x) A`` to a dense ``[d f, d f]`` matrix (SVD, reference).

    Returns ``(G, A)`` with ``||A||_F = 1`` and ``tr A >= 0``.
    """
    r = matrix.reshape(d, f, d, f).permute(0, 2, 1, 3).reshape(d * d, f * f)
    uu, sv, vv = torch.linalg.svd(r, full_matrices=False)
    g = (uu[:, 0] * sv[0]).reshape(d, d)
    a = vv[0].reshape(f, f)
    if float(torch.diagonal(a).sum()) < 0:
        g, a = -g, -a
    return g, a


# ---------------------------------------------------------------------- posterior state
def cat_blocks(parts: list[LowRankBlocks]) -> LowRankBlocks:
    """Concatenate blocks whose ``i``, ``j`` already index one shared input cache."""
    if not parts:
        raise ValueError("no blocks to concatenate")
    return LowRankBlocks(
        torch.cat([b.i for b in parts]),
        torch.cat([b.j for b in parts]),
        torch.cat([b.u for b in parts]),
        torch.cat([b.alpha for b in parts]),
        torch.cat([b.coef for b in parts]),
        parts[0].cross,
    )


def shift_blocks(blocks: LowRankBlocks, offset: int) -> LowRankBlocks:
    """The same blocks with row indices moved by ``offset`` (batches in one input cache)."""
    return LowRankBlocks(
        blocks.i + offset, blocks.j + offset, blocks.u, blocks.alpha, blocks.coef, blocks.cross
    )


class KronPosterior:
    """Eigenbasis ``Q_G (x) Q_A`` of an EKFAC posterior over one linear layer ``[W | b]``.

    Holds the Kronecker factors and their eigenvectors; the curvature ``S`` in that basis
    (flattened row-major ``[D F']``) is kept by the caller, as the diagonal case keeps its
    GGN diagonal, so the posterior precision is ``Q diag(beta relu(S) + lambda~) Q^T`` with
    ``lambda~`` the prior's diagonal in the basis (exact for a scalar prior).

    Parameters
    ----------
    out_features, in_features : int
        ``D`` and ``F`` of the layer.
    bias : bool
        Whether the layer has a bias (``F' = F + 1``).
    """

    def __init__(self, out_features: int, in_features: int, bias: bool) -> None:
        self.d, self.f, self.bias = int(out_features), int(in_features), bool(bias)
        self.g: Tensor | None = None
        self.a: Tensor | None = None
        self.q_g: Tensor | None = None
        self.q_a: Tensor | None = None

    @property
    def fitted(self) -> bool:
        return self.q_g is not None

    @property
    def width(self) -> int:
        """``F'``: input width including the bias column."""
        return self.f + int(self.bias)

    # -- layouts: parameters_to_vector (W row-major, then b) <-> [W | b] row-major
    def to_rowmajor(self, vec: Tensor) -> Tensor:
        """``[..., P]`` parameter-vector entries as ``[..., D, F']``."""
        w = vec[..., : self.d * self.f].reshape(*vec.shape[:-1], self.d, self.f)
        if not self.bias:
            return w
        return torch.cat([w, vec[..., self.d * self.f :, None]], dim=-1)

    def from_rowmajor(self, mat: Tensor) -> Tensor:
        """``[..., D, F']`` as ``[..., P]`` parameter-vector entries."""
        w = mat[..., : self.f].reshape(*mat.shape[:-2], self.d * self.f)
        if not self.bias:
            return w
        return torch.cat([w, mat[..., self.f]], dim=-1)

    def basis(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """``(Q_G, Q_A)``; identities (the prior's basis) before the first fit."""
        if self.q_g is None or self.q_a is None:
            kw = {"dtype": like.dtype, "device": like.device}
            return torch.eye(self.d, **kw), torch.eye(self.width, **kw)
        return self.q_g, self.q_a

    # -- fitting
    def update(
        self,
        blocks: LowRankBlocks,
        inputs: Tensor,
        s_old: Tensor | None = None,
        *,
        decay: float = 0.0,
        clamp_batch: bool = False,
        warm_start: bool = True,
        memory: str = "ekfac",
        max_iter: int = 100,
        tol: float | None = None,
    ) -> tuple[Tensor, dict]:
        """New factors, eigenbasis and curvature for ``decay * old + GGN(blocks)``.

        With ``decay = 0`` (or nothing fitted) this is a fit from scratch. Otherwise the ALS
        approximates ``decay G_old (x) A_old + GGN`` warm-started at ``A_old``, and the
        curvature is ``decay * proj(S_old) + S_new`` with ``proj`` the exact diagonal of the
        old EKFAC curvature in the new basis (:func:`rotated_diagonal_projection`).
        ``clamp_batch`` clamps ``S_new`` at 0 first (online LAM, the per-batch ReLU of
        eq. 9). ``warm_start=False`` starts that ALS from scratch instead (the same target).
        ``memory`` is what stands for the old curvature in the ALS: ``"ekfac"`` (default) the
        old EKFAC curvature ``Q_old diag(S_old) Q_old^T`` itself, ``"factors"`` the old
        Kronecker product ``G_old (x) A_old`` (a moving average of the factors).

        Returns
        -------
        (Tensor, dict)
            Raw curvature ``[P]`` (parameter-vector length, basis order ``[D F']``) and the
            ALS report (``n_iter``, ``change``).
        """
        keep = decay > 0 and self.fitted and s_old is not None
        info: dict = {}
        if blocks.i.numel() == 0 and not keep:
            raise ValueError("no pairs contribute curvature and there is nothing to keep")
        if memory not in ("ekfac", "factors"):
            raise ValueError(f"`memory` must be 'ekfac' or 'factors', got {memory!r}")
        if not keep:
            mem = None
        elif memory == "factors":
            mem = (float(decay), self.g, self.a)
        else:
            old_g, old_a = self.basis(inputs)
            mem = (float(decay), old_g, old_a, s_old.reshape(self.d, self.width))
        g, a = kron_factors(
            blocks,
            inputs,
            max_iter=max_iter,
            tol=tol,
            init=self.a if keep and warm_start else None,
            memory=mem,
            info=info,
        )
        q_g, q_a = kron_eigenbasis(g, a)
        s = eigencorrected_curvature(blocks, inputs, q_g, q_a)
        if clamp_batch:
            s = s.clamp_min(0.0)
        if keep:
            old_g, old_a = self.basis(inputs)
            s = s + float(decay) * rotated_diagonal_projection(
                s_old.reshape(self.d, self.width), old_g, old_a, q_g, q_a
            )
        self.g, self.a, self.q_g, self.q_a = g, a, q_g, q_a
        return s.reshape(-1), info

    # -- posterior quantities
    def prior_in_basis(self, prior: Tensor) -> Tensor:
        """Diagonal of ``Q^T diag(lambda) Q`` (scalar: unchanged), basis order."""
        if prior.ndim == 0:
            return prior
        q_g, q_a = self.basis(prior)
        lam = self.to_rowmajor(prior)
        return ((q_g * q_g).T @ lam @ (q_a * q_a)).reshape(-1)

    def to_params(self, x: Tensor) -> Tensor:
        """Basis coordinates ``[..., D F']`` as parameter vectors ``[..., P]``."""
        q_g, q_a = self.basis(x)
        mat = x.reshape(*x.shape[:-1], self.d, self.width)
        return self.from_rowmajor(q_g @ mat @ q_a.T)

    def output_variances(self, phi: Tensor, variance: Tensor) -> Tensor:
        """``c [N, D]``: ``Cov(y) = Q_G diag(c) Q_G^T`` for posterior variances in the basis."""
        _, q_a = self.basis(variance)
        at = augment(phi, self.bias) @ q_a
        return (at * at) @ variance.reshape(self.d, self.width).T

    def state_dict(self, like: Tensor) -> dict[str, Tensor]:
        """Factors and eigenvectors (zero factors and identities before the first fit)."""
        q_g, q_a = self.basis(like)
        g = self.g if self.g is not None else torch.zeros_like(q_g)
        a = self.a if self.a is not None else torch.zeros_like(q_a)
        return {"kron_g": g, "kron_a": a, "eigvecs_g": q_g, "eigvecs_a": q_a}

    def load_state_dict(self, state: dict, dtype: torch.dtype, device: torch.device) -> None:
        shapes = {
            "kron_g": (self.d, self.d),
            "eigvecs_g": (self.d, self.d),
            "kron_a": (self.width, self.width),
            "eigvecs_a": (self.width, self.width),
        }
        out = {}
        for key, shape in shapes.items():
            if key not in state:
                raise ValueError(f"`state` has no {key!r} (a Kronecker posterior needs it)")
            t = torch.as_tensor(state[key])
            if tuple(t.shape) != shape:
                raise ValueError(f"`state['{key}']` has shape {tuple(t.shape)}, expected {shape}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"`state['{key}']` is not finite")
            out[key] = t.to(dtype=dtype, device=device).clone()
        self.g, self.a = out["kron_g"], out["kron_a"]
        self.q_g, self.q_a = out["eigvecs_g"], out["eigvecs_a"]

    def apply(self, fn) -> None:  # noqa: ANN001 - a tensor map (Module._apply)
        """Map every held tensor through ``fn`` (device / dtype moves)."""
        for name in ("g", "a", "q_g", "q_a"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, fn(t))
