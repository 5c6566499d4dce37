"""The TaU-SimCLR loss: SimCLR with an input-dependent temperature (TaU Algorithm 1).

For ``2N`` rows ``z = cat(z1, z2)`` (L2-normalised views of ``N`` images) and inverse
temperatures ``a = 1/tau`` the loss of row ``i`` with positive partner ``p(i)`` is

``l_i = -a_i z_i^T z_p(i) + log sum_{j != i} exp(a_i z_i^T z_j)``

(TaU eq. 1 with ``tau`` replaced by ``tau(t(x_i))``, section 2), averaged over the ``2N``
rows. With a constant ``a = 1/tau`` this is exactly SimCLR's NT-Xent at temperature ``tau``.

The reference-code variant (``variant="reference"``, docs/concepts/fidelity.rst; TaU code
``src/objectives/simclr.py``, class ``TaU_SimCLR``, mhw32/temperature-as-uncertainty-public
d6c6f05, lines 61-83) removes the positive from the denominator (``j not in {i, p(i)}``),
scales each row's denominator by that row's own inverse temperature
(``var = temp.repeat(1, n)``, line 70) and the positive logit of both rows of a pair by view
1's (``pos * temp1 / t``, line 79). The code's ``eps = 1e-6`` added to the denominator sum is
left out (a relative change below ``1e-6 e^{-1/scale}``).
"""

from __future__ import annotations

from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_finite, check_ndim, check_same_length
from bayesurl.heads.temperature import inverse_temperature

__all__ = ["TaULoss", "TaUVariant", "tau_simclr_loss"]


class TaUVariant(str, Enum):
    """Which TaU-SimCLR loss to use (TaU Algorithm 1; docs/concepts/fidelity.rst)."""

    #: each row scaled by its own 1/tau, positive in the denominator (TaU section 2)
    PAPER = "paper"
    #: positive removed from the denominator, each row's denominator by its own 1/tau, the
    #: positive logit of both rows by view 1's (reference code)
    REFERENCE = "reference"


def _variant(variant: str | TaUVariant) -> TaUVariant:
    try:
        return TaUVariant(str(getattr(variant, "value", variant)).lower())
    except ValueError:
        valid = ", ".join(v.value for v in TaUVariant)
        raise ValueError(f"unknown `variant` {variant!r}; valid: {valid}") from None


def tau_simclr_loss(
    z1: Tensor,
    z2: Tensor,
    s1: Tensor,
    s2: Tensor,
    *,
    scale: float = 0.1,
    variant: str | TaUVariant = TaUVariant.PAPER,
    reduction: str = "mean",
) -> Tensor:
    """TaU-SimCLR loss of two views (TaU Algorithm 1).

    Parameters
    ----------
    z1, z2 : Tensor
        ``[N, D]`` embeddings of view 1 and view 2 of the same ``N`` images (normalised here).
    s1, s2 : Tensor
        ``[N]`` temperature logits; ``1/tau = sigmoid(s) / scale``.
    scale : float
        Lower bound of the temperature; ``s -> inf`` gives SimCLR at ``tau = scale``.
    variant : {"paper", "reference"}
        See :class:`TaUVariant`.
    reduction : {"mean", "none"}
        ``"none"`` returns the ``[2N]`` per-row losses (view-1 rows first).

    Returns
    -------
    Tensor
        The scalar mean loss, or per-row losses.
    """
    check_ndim(z1, "z1", 2)
    check_ndim(z2, "z2", 2)
    check_ndim(s1, "s1", 1)
    check_ndim(s2, "s2", 1)
    check_same_length(("z1", z1), ("z2", z2), ("s1", s1), ("s2", s2))
    if z1.shape[1] != z2.shape[1]:
        raise ValueError(f"`z1` has {z1.shape[1]} features but `z2` has {z2.shape[1]}")
    if z1.shape[0] < 2:
        raise ValueError(f"`z1` needs at least 2 images for negatives, got {z1.shape[0]}")
    for name, t in (("z1", z1), ("z2", z2)):
        check_finite(t, name)
    for name, t in (("s1", s1), ("s2", s2)):  # s = inf is the SimCLR limit; NaN is not
        if bool(torch.isnan(t.detach()).any()):
            raise ValueError(f"`{name}` contains NaN")
    if reduction not in ("mean", "none"):
        raise ValueError(f"`reduction` must be 'mean' or 'none', got {reduction!r}")
    v = _variant(variant)
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    a = inverse_temperature(torch.cat([s1, s2]), scale)
    logits = (z @ z.T) * a.unsqueeze(1)  # row i scaled by its own 1/tau
    idx = torch.arange(2 * n, device=z.device)
    partner = torch.cat([idx[n:], idx[:n]])
    pos = logits[idx, partner]
    mask = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    if v is TaUVariant.REFERENCE:
        mask[idx, partner] = True
        pos = (z * z[partner]).sum(-1) * a[:n].repeat(2)  # both rows by view 1's 1/tau
    denom = torch.logsumexp(logits.masked_fill(mask, float("-inf")), dim=1)
    loss = denom - pos
    return loss.mean() if reduction == "mean" else loss


class TaULoss(nn.Module):
    """Module form of :func:`tau_simclr_loss` (TaU Algorithm 1).

    Parameters
    ----------
    scale : float
        Lower bound of the temperature (0.1 in the paper).
    variant : {"paper", "reference"}
        See :class:`TaUVariant`.
    """

    def __init__(self, scale: float = 0.1, variant: str | TaUVariant = "paper") -> None:
        super().__init__()
        self.scale = float(scale)
        self.variant = _variant(variant)
        inverse_temperature(torch.zeros(()), self.scale)  # validates scale

    def forward(self, z1: Tensor, z2: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
        """Scalar TaU-SimCLR loss of two views."""
        return tau_simclr_loss(z1, z2, s1, s2, scale=self.scale, variant=self.variant)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, variant={self.variant.value}"
