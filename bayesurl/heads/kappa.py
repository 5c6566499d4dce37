"""The concentration (kappa) head of the vMF-based URL methods.

MCInfoNCE, ELK, nivMF and HIB predict a vMF posterior ``vMF(mu(x), kappa(x))`` per input; mu is
the normalised embedding and kappa comes from a 3-layer MLP on the embedding (URL appendix
B.3-B.6). Its initial value is "either randomly initialized or warmed up to 0.001" (URL B.3):
the warm-up shifts the head's output so that its mean uncertainty ``u = 1/kappa`` on the first
batch is ``warmup_u``. The head is never zero-initialised (PyTorch's default initialisation is
kept): the thesis (chapter 5, "pretrained visual uncertainties") reports that a zero-initialised
uncertainty head fails to train (spec METHODS.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_finite, check_ndim

__all__ = ["KappaHead", "inverse_softplus"]


def inverse_softplus(y: Tensor | float) -> Tensor:
    """``x`` with ``softplus(x) = y`` for ``y > 0`` (stable for large and small ``y``)."""
    y = torch.as_tensor(y)
    if not y.is_floating_point():
        y = y.to(torch.get_default_dtype())
    if bool((y <= 0).any()):
        raise ValueError("`y` must be positive")
    # log(exp(y) - 1) = y + log(1 - exp(-y))
    return y + torch.log(-torch.expm1(-y))


class KappaHead(nn.Module):
    """3-layer MLP ``[N, D] -> [N]`` predicting a positive vMF concentration kappa(x).

    ``kappa = softplus(MLP(e)) + min_kappa`` (URL appendix B.3-B.6: "a 3-layer MLP attached to
    the embeddings"); the uncertainty of the methods is ``u(x) = 1/kappa(x)``.

    Parameters
    ----------
    in_dim : int
        Embedding dimension D.
    hidden_dim : int, optional
        Width of the two hidden layers (default ``max(in_dim, 16)``).
    warmup_u : float, optional
        If given, the first call of :meth:`warmup_` (done by the methods on their first
        training batch) shifts the output so that the batch's mean ``1/kappa`` equals
        ``warmup_u`` (URL B.3: 0.001). ``None`` keeps the random initialisation.
    min_kappa : float
        Lower bound added to the softplus output, keeps ``u`` finite.

    Examples
    --------
    >>> head = KappaHead(8)
    >>> head(torch.randn(5, 8)).shape
    torch.Size([5])
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int | None = None,
        warmup_u: float | None = None,
        min_kappa: float = 1e-4,
    ) -> None:
        super().__init__()
        if int(in_dim) != in_dim or in_dim < 1:
            raise ValueError(f"`in_dim` must be a positive integer, got {in_dim}")
        if warmup_u is not None and not (math.isfinite(warmup_u) and warmup_u > 0):
            raise ValueError(f"`warmup_u` must be a positive finite float or None, got {warmup_u}")
        if not min_kappa >= 0:
            raise ValueError(f"`min_kappa` must be >= 0, got {min_kappa}")
        h = int(hidden_dim) if hidden_dim is not None else max(int(in_dim), 16)
        self.in_dim = int(in_dim)
        self.warmup_u = warmup_u
        self.min_kappa = float(min_kappa)
        self.mlp = nn.Sequential(
            nn.Linear(self.in_dim, h),
            nn.LeakyReLU(),
            nn.Linear(h, h),
            nn.LeakyReLU(),
            nn.Linear(h, 1),
        )
        # saved in checkpoints so a resumed run does not warm up twice
        self.register_buffer("warmed_up", torch.tensor(warmup_u is None))

    def forward(self, embedding: Tensor) -> Tensor:
        """Concentrations ``kappa [N] > 0`` for embeddings ``[N, D]`` (unnormalised is fine)."""
        check_ndim(embedding, "embedding", 2)
        if embedding.shape[1] != self.in_dim:
            raise ValueError(
                f"`embedding` must have {self.in_dim} columns, got {embedding.shape[1]}"
            )
        return F.softplus(self.mlp(embedding).squeeze(-1)) + self.min_kappa

    @torch.no_grad()
    def warmup_(self, embedding: Tensor) -> bool:
        """Shift the last bias so that ``mean(1/kappa) = warmup_u`` on this batch (once).

        Returns ``True`` if the shift was applied now, ``False`` if there is nothing to do
        (no ``warmup_u`` or already warmed up). Under ``torch.distributed`` the ranks average
        their shifts (every rank must call it on its first batch).
        """
        if bool(self.warmed_up) or self.warmup_u is None:
            return False
        check_finite(embedding, "embedding")
        last: nn.Linear = self.mlp[-1]
        target = 1.0 / self.warmup_u - self.min_kappa
        if target <= 0:
            raise ValueError("`warmup_u` must be below 1/min_kappa")
        # solve mean(1 / (softplus(a + shift) + min_kappa)) = warmup_u by bisection in shift
        a = self.mlp(embedding).squeeze(-1)
        lo = float(inverse_softplus(torch.tensor(target, dtype=torch.float64))) - float(a.max())
        hi = lo + float(a.max() - a.min()) + 1.0
        lo -= 1.0

        def mean_u(shift: float) -> float:
            return float((1.0 / (F.softplus(a + shift) + self.min_kappa)).mean())

        while mean_u(lo) < self.warmup_u:  # widen until bracketed (mean_u decreases in shift)
            lo -= 2.0 * (hi - lo)
        while mean_u(hi) > self.warmup_u:
            hi += 2.0 * (hi - lo)
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if mean_u(mid) > self.warmup_u:
                lo = mid
            else:
                hi = mid
        shift = torch.tensor(0.5 * (lo + hi), dtype=last.bias.dtype, device=last.bias.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every rank warms up on its own first batch: agree on one shift
            torch.distributed.all_reduce(shift)
            shift /= torch.distributed.get_world_size()
        last.bias.add_(shift)
        self.warmed_up.fill_(True)
        return True
