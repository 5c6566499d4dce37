"""Closed-form diagonal GGN of the contrastive loss for a linear last layer (LAM section 3).

The contrastive loss of LAM eq. 1 on L2-normalised embeddings ``u = z / ||z||`` with
``z = W phi + b`` is ``0.5 ||u_i - u_j||^2`` for positive pairs and
``0.5 max(0, m - ||u_i - u_j||)^2`` for negative pairs. Its GGN (LAM eq. 6) is

    sum_{(i,j)} J_ij^T H_ij J_ij,     J_ij = [J_i; J_j],  J_i = d z_i / d theta,

where ``H_ij`` is the ``2D x 2D`` Hessian of the per-pair loss with respect to the two
*unnormalised* outputs ``(z_i, z_j)``. For a linear layer ``J_i = I_D (x) phi_i^T`` (plus
``I_D`` for the bias), so only the diagonals of the three ``D x D`` blocks
``H_ij = [[A, B], [B^T, C]]`` enter the diagonal GGN:

    diag_W[d, f] = sum_pairs A_dd phi_i,f^2 + 2 B_dd phi_i,f phi_j,f + C_dd phi_j,f^2
    diag_b[d]    = sum_pairs A_dd + 2 B_dd + C_dd

which is one matrix product ``[D, N] @ [N, F]`` for the ``A`` and ``C`` terms (summed per
row first) and one ``[D, P] @ [P, F]`` for the cross terms ``B`` -- no autograd, no BackPACK.

Blocks used (``u_k = z_k/||z_k||``, ``n_k = ||z_k||``, ``c = u_i . u_j``, ``P_k = (I - u_k
u_k^T)/n_k``), for a *positive* pair; negative pairs inside the margin use the negated blocks
(``H_n = -H_p``, LAM eq. 6) and negatives outside the margin contribute nothing:

``euclidean`` (normalisation linearised, part of the model; LAM eq. 6 with ``H_p = [[I, -I],
[-I, I]]`` w.r.t. ``u``, pulled back through ``P_k``)::

    A = P_i^2 = (I - u_i u_i^T) / n_i^2,   C = (I - u_j u_j^T) / n_j^2,
    B = -P_i P_j = -(I - u_i u_i^T - u_j u_j^T + c u_i u_j^T) / (n_i n_j).

``arccos`` (normalisation inside the loss, ``0.5||u_i - u_j||^2 = 1 - cos(z_i, z_j)``; the
exact Hessian of ``1 - cos`` w.r.t. the unnormalised outputs, LAM supplement)::

    A = (c I + u_i u_j^T + u_j u_i^T - 3 c u_i u_i^T) / n_i^2,
    C = (c I + u_i u_j^T + u_j u_i^T - 3 c u_j u_j^T) / n_j^2,
    B = (-I + u_i u_i^T + u_j u_j^T - c u_i u_j^T) / (n_i n_j).

These ``A`` and ``C`` equal the reference code's ``H_11`` / ``H_22`` (StochMan fork,
``stochman/hessian.py``), and ``diag(B)`` equals the diagonal of its ``H_12``. The reference
combines the three projected blocks of its ``full``/``pos`` variants as ``m11 - 2 m12 + m22``,
a sign carried over from the Euclidean case where ``B = -I`` is *not* folded into ``m12``;
for arccos ``B`` already carries its sign, so the true GGN is ``m11 + 2 m12 + m22`` -- the
combination used here (checked against ``torch.func.hessian`` in the tests).

Approximations (LAM eqs. 7-9): ``positive`` drops the negative pairs, ``fixed`` drops the
cross blocks (``B = 0``), ``full`` keeps everything. The sum can be negative for ``fixed``
and ``full``; :func:`ggn_diagonal` clamps it at 0 unless ``clamp=False`` (the posterior
accumulates the raw sum and clamps the total, reporting :func:`clamped_fraction`).
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import Tensor, nn

from bayesurl._checks import check_finite, check_tensor

__all__ = [
    "Approximation",
    "Geometry",
    "HessianStructure",
    "clamped_fraction",
    "ggn_diagonal",
    "ggn_diagonal_linear",
    "output_hessian_diagonals",
    "split_pairs",
]

_EPS = 1e-12


class Approximation(str, Enum):
    """PSD fix of the contrastive output Hessian (LAM eqs. 7-9)."""

    FIXED = "fixed"
    POSITIVE = "positive"
    FULL = "full"


class Geometry(str, Enum):
    """Where the L2 normalisation lives (LAM section 3, "Hessian of the contrastive loss")."""

    EUCLIDEAN = "euclidean"
    ARCCOS = "arccos"


class HessianStructure(str, Enum):
    """Posterior curvature structure (laplace-torch's word): diagonal or Kronecker (EKFAC)."""

    DIAG = "diag"
    KRON = "kron"


def _enum(cls: type[Enum], value: object, name: str) -> Enum:
    try:
        return cls(value.value if isinstance(value, Enum) else str(value).lower())
    except ValueError:
        valid = ", ".join(m.value for m in cls)
        raise ValueError(f"`{name}` must be one of {valid}; got {value!r}") from None


def split_pairs(indices_tuple: tuple[Tensor, ...], n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Normalise a PML indices tuple to pairs ``(a1, p, a2, n)``.

    Accepts pytorch-metric-learning's pair form ``(a1, p, a2, n)`` and its triplet form
    ``(a, p, n)`` (read as positive pairs ``(a, p)`` and negative pairs ``(a, n)``).

    Parameters
    ----------
    indices_tuple : tuple of Tensor
        Index tensors into a batch of ``n`` rows.
    n : int
        Number of rows the indices point into.

    Returns
    -------
    tuple of Tensor
        ``(a1, p, a2, n)`` as 1-D int64 tensors.
    """
    if not isinstance(indices_tuple, (tuple, list)) or len(indices_tuple) not in (3, 4):
        raise ValueError(
            "`indices_tuple` must be a PML tuple (a1, p, a2, n) or a triplet tuple (a, p, n)"
        )
    idx = [torch.as_tensor(t).reshape(-1) for t in indices_tuple]
    if len(idx) == 3:
        idx = [idx[0], idx[1], idx[0], idx[2]]
    for name, t in zip(("a1", "p", "a2", "n"), idx):
        if t.is_floating_point() or t.is_complex():
            raise ValueError(f"`indices_tuple` entry {name} must hold integer indices")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
            raise ValueError(f"`indices_tuple` entry {name} has indices outside [0, {n})")
    a1, p, a2, ng = (t.long() for t in idx)
    if a1.numel() != p.numel() or a2.numel() != ng.numel():
        raise ValueError(
            f"`indices_tuple`: a1/p have {a1.numel()}/{p.numel()} entries and a2/n have "
            f"{a2.numel()}/{ng.numel()}; each pair needs one of each"
        )
    return a1, p, a2, ng


def output_hessian_diagonals(
    z1: Tensor, z2: Tensor, geometry: Geometry | str
) -> tuple[Tensor, Tensor, Tensor]:
    """Diagonals of the positive-pair output-Hessian blocks w.r.t. the unnormalised outputs.

    Implements the blocks listed in the module docstring (LAM eq. 6 and its supplement).

    Parameters
    ----------
    z1, z2 : Tensor
        ``[P, D]`` unnormalised layer outputs of the two members of each pair.
    geometry : Geometry or str
        ``"euclidean"`` or ``"arccos"``.

    Returns
    -------
    tuple of Tensor
        ``(diag A, diag B, diag C)``, each ``[P, D]``, for a positive pair
        (negate all three for a negative pair inside the margin).
    """
    geometry = _enum(Geometry, geometry, "geometry")
    n1 = z1.norm(dim=1, keepdim=True).clamp_min(_EPS)
    n2 = z2.norm(dim=1, keepdim=True).clamp_min(_EPS)
    u1, u2 = z1 / n1, z2 / n2
    c = (u1 * u2).sum(dim=1, keepdim=True)
    u11, u22, u12 = u1 * u1, u2 * u2, u1 * u2
    if geometry is Geometry.EUCLIDEAN:
        a = (1.0 - u11) / n1**2
        cc = (1.0 - u22) / n2**2
        b = -(1.0 - u11 - u22 + c * u12) / (n1 * n2)
    else:
        a = (c + 2.0 * u12 - 3.0 * c * u11) / n1**2
        cc = (c + 2.0 * u12 - 3.0 * c * u22) / n2**2
        b = (-1.0 + u11 + u22 - c * u12) / (n1 * n2)
    return a, b, cc


def contributing_pairs(
    z: Tensor,
    pairs: tuple[Tensor, Tensor, Tensor, Tensor],
    approximation: Approximation,
    margin: float,
) -> list[tuple[Tensor, Tensor, float]]:
    """The pair sets with a non-zero GGN and their signs (LAM eqs. 6-9).

    Positive pairs ``(a1, p)`` with sign ``+1``; unless ``approximation`` is ``positive``,
    the negative pairs ``(a2, n)`` inside the margin (``||u_a - u_n|| < margin``) with sign
    ``-1``. Empty sets are left out. Shared by :func:`ggn_diagonal_linear` and the
    Kronecker curvature of :mod:`bayesurl.laplace.kron`.
    """
    a1, p, a2, ng = pairs
    out: list[tuple[Tensor, Tensor, float]] = []
    if a1.numel():
        out.append((a1, p, 1.0))
    if approximation is not Approximation.POSITIVE and a2.numel():
        u = z / z.norm(dim=1, keepdim=True).clamp_min(_EPS)
        inside = (u[a2] - u[ng]).norm(dim=1) < float(margin)
        if bool(inside.any()):
            out.append((a2[inside], ng[inside], -1.0))
    return out


def _pair_terms(
    z: Tensor,
    phi2: Tensor,
    phi: Tensor,
    i: Tensor,
    j: Tensor,
    sign: float,
    geometry: Geometry,
    cross: bool,
) -> tuple[Tensor, Tensor]:
    """One pair set's ``(diag_W, diag_b)``. The diagonal blocks are summed per row first,
    ``s_k = sum_{pairs with i = k} A + sum_{pairs with j = k} C``, so they cost one
    ``[D, N] @ [N, F]`` product (``phi2 = phi^2``) however many pairs share the rows (every
    triplet of a batch repeats its anchor); only the cross blocks need a product per pair."""
    a, b, c = output_hessian_diagonals(z[i], z[j], geometry)
    per_row = torch.zeros_like(z).index_add_(0, i, a).index_add_(0, j, c)
    hw = per_row.T @ phi2
    hb = per_row.sum(0)
    if cross:
        hw = hw + 2.0 * (b.T @ (phi[i] * phi[j]))
        hb = hb + 2.0 * b.sum(0)
    return sign * hw, sign * hb


def ggn_diagonal_linear(
    weight: Tensor,
    bias: Tensor | None,
    features: Tensor,
    indices_tuple: tuple[Tensor, ...],
    *,
    approximation: Approximation | str = "fixed",
    geometry: Geometry | str = "arccos",
    margin: float = 0.2,
    clamp: bool = True,
) -> Tensor:
    """:func:`ggn_diagonal` for explicit weights ``weight [D, F]`` and ``bias [D]`` or None.

    Used by online LAM to evaluate the GGN at sampled weights (LAM eq. 5). Parameters and
    return value as in :func:`ggn_diagonal`.
    """
    approximation = _enum(Approximation, approximation, "approximation")
    geometry = _enum(Geometry, geometry, "geometry")
    phi = check_tensor(features, "features", ndim=2)
    if not phi.is_floating_point():
        raise ValueError("`features` must be a floating-point tensor")
    check_tensor(weight, "weight", ndim=2)
    if weight.shape[1] != phi.shape[1]:
        raise ValueError(
            f"`features` has {phi.shape[1]} columns but the layer expects {weight.shape[1]}"
        )
    if not float(margin) > 0:
        raise ValueError(f"`margin` must be positive, got {margin}")
    a1, p, a2, ng = split_pairs(indices_tuple, phi.shape[0])
    a1, p, a2, ng = (t.to(phi.device) for t in (a1, p, a2, ng))
    phi = phi.to(weight.dtype)
    with torch.no_grad():
        z = phi @ weight.T
        if bias is not None:
            z = z + bias
        hw = torch.zeros_like(weight)
        hb = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        cross = approximation is not Approximation.FIXED
        phi2 = phi * phi
        for i, j, sign in contributing_pairs(z, (a1, p, a2, ng), approximation, margin):
            w, b = _pair_terms(z, phi2, phi, i, j, sign, geometry, cross)
            hw, hb = hw + w, hb + b
        out = hw.reshape(-1) if bias is None else torch.cat([hw.reshape(-1), hb])
        return out.clamp_min(0.0) if clamp else out


def ggn_diagonal(
    layer: nn.Linear,
    features: Tensor,
    indices_tuple: tuple[Tensor, ...],
    *,
    approximation: Approximation | str = "fixed",
    geometry: Geometry | str = "arccos",
    margin: float = 0.2,
    clamp: bool = True,
) -> Tensor:
    """Diagonal GGN of the contrastive loss over a linear last layer (LAM eqs. 6-9).

    Closed form for ``z = W phi + b`` (see the module docstring for the exact output-Hessian
    blocks); sums over pairs, never averages.

    Parameters
    ----------
    layer : nn.Linear
        The last layer; the diagonal is over
        ``torch.nn.utils.parameters_to_vector(layer.parameters())`` (weight row-major, then
        bias).
    features : Tensor
        ``[N, F]`` inputs of ``layer``.
    indices_tuple : tuple of Tensor
        pytorch-metric-learning pairs ``(a1, p, a2, n)`` (or triplets ``(a, p, n)``) into
        the ``N`` rows.
    approximation : {"fixed", "positive", "full"}
        PSD fix of LAM eqs. 7-9.
    geometry : {"euclidean", "arccos"}
        Normalisation linearised in the model, or kept inside the loss.
    margin : float
        Negative margin ``m``; negatives with ``||u_a - u_n|| >= m`` contribute nothing.
    clamp : bool
        Clamp the summed diagonal at 0 (default). ``False`` returns the raw sum, which is
        what a posterior accumulating over batches needs.

    Returns
    -------
    Tensor
        ``[P]`` diagonal, dtype and device of the layer's weight.
    """
    if not isinstance(layer, nn.Linear):
        raise ValueError(f"`layer` must be an nn.Linear, got {type(layer).__name__}")
    return ggn_diagonal_linear(
        layer.weight,
        layer.bias,
        features,
        indices_tuple,
        approximation=approximation,
        geometry=geometry,
        margin=margin,
        clamp=clamp,
    )


def clamped_fraction(diagonal: Tensor) -> float:
    """Fraction of entries of a raw GGN diagonal that are negative (zeroed by the clamp).

    A value near 1 means the posterior equals the prior (docs/concepts/laplace.rst, "The contrastive
    loss and its Hessian").
    """
    if diagonal.numel() == 0:
        raise ValueError("`diagonal` is empty")
    check_finite(diagonal, "diagonal")
    return float((diagonal < 0).double().mean())
