"""The concentration (kappa) head of the vMF-based URL methods.

MCInfoNCE, ELK, nivMF and HIB predict a vMF posterior ``vMF(mu(x), kappa(x))`` per input; mu is
the normalised embedding and kappa comes from a 3-layer MLP on the embedding (URL appendix
B.3-B.6). With ``hidden_dim=0`` the head is one linear layer: HIB (Oh et al., ICLR 2019,
arXiv:1810.00319) predicts each embedding's mean and spread as outputs of the same network
features, and LAM's HIB baseline (Warburg et al., 2023, Table 2, ref. [33]) reads its
concentration by one linear layer from the conv features; the methods then feed the head the
backbone features instead of the embedding (:class:`~bayesurl.methods._vmf.KappaInput`).
Its initial value is "either randomly initialized or warmed up to 0.001" (URL B.3): the warm-up
*rescales* the head's output by a fixed factor so that its mean uncertainty ``u = 1/kappa`` on
the first batch is ``warmup_u``, as the URL code does
(``UncertaintyWrapper.initialize_avg_uncertainty`` sets ``unc_scaler = target / mean u``, a
constant multiplier of the predicted uncertainty). A multiplicative warm-up keeps the softplus
at its initial operating point, so an optimiser step changes ``log kappa`` by about as much as
it changes the MLP output. The former additive warm-up (the last bias shifted until
``softplus ~ 1/warmup_u = 1000``) put the softplus in its linear regime, ``d kappa / d output
= 1``: an AdamW step of size ``lr = 1e-3`` then moved kappa ~ 1000 by ~1e-3, a relative change
of ~1e-6 per step, and ELK's kappa did not move in a whole benchmark run. The head is never
zero-initialised (PyTorch's default initialisation is kept): the thesis (chapter 5,
"pretrained visual uncertainties") reports that a zero-initialised uncertainty head fails to
train.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_columns, check_finite, check_int, check_ndim, check_number

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


def _mlp(in_dim: int, hidden_dim: int) -> nn.Sequential:
    """``in_dim -> hidden -> hidden -> 1`` with LeakyReLUs, or ``Linear(in_dim, 1)`` for 0."""
    if hidden_dim == 0:
        return nn.Sequential(nn.Linear(in_dim, 1))
    return nn.Sequential(
        nn.Linear(in_dim, hidden_dim),
        nn.LeakyReLU(),
        nn.Linear(hidden_dim, hidden_dim),
        nn.LeakyReLU(),
        nn.Linear(hidden_dim, 1),
    )


class KappaHead(nn.Module):
    """3-layer MLP (or one linear layer) ``[N, D] -> [N]`` predicting a vMF concentration.

    ``kappa = s * softplus(MLP(e)) + min_kappa`` (URL appendix B.3-B.6: "a 3-layer MLP attached
    to the embeddings"; HIB, Oh et al. 2019, and LAM's HIB baseline: one linear layer on the
    backbone features, ``hidden_dim=0``); the uncertainty of the methods is
    ``u(x) = 1/kappa(x)``. ``s`` is a fixed (not learned) scale, 1 unless the warm-up sets it:
    like the URL code's ``unc_scaler`` it multiplies the head's output, so
    ``d log kappa / d MLP(e) = sigmoid / softplus`` stays O(1) after a warm-up to ``u = 0.001``
    and the optimiser moves kappa on a log scale (see the module docstring).

    Parameters
    ----------
    in_dim : int
        Input dimension D (the embedding's, or the backbone features' F).
    hidden_dim : int, optional
        Width of the two hidden layers (default ``max(in_dim, 16)``); ``0``: no hidden layer,
        ``MLP`` is one ``Linear(in_dim, 1)`` (HIB's head).
    warmup_u : float, optional
        If given, the first call of :meth:`warmup_` (done by the methods on their first
        training batch) sets the scale ``s`` so that the batch's mean ``1/kappa`` equals
        ``warmup_u`` (URL B.3: 0.001). ``None`` keeps the random initialisation (``s = 1``).
    min_kappa : float
        Lower bound added to the scaled softplus output, keeps ``u`` finite (LAM's HIB: 0.01).

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
        check_int(in_dim, "in_dim", low=1)
        if warmup_u is not None and not (math.isfinite(warmup_u) and warmup_u > 0):
            raise ValueError(f"`warmup_u` must be a positive finite float or None, got {warmup_u}")
        min_kappa = check_number(min_kappa, "min_kappa", low=0.0)
        if warmup_u is not None and not warmup_u * min_kappa < 1.0:
            raise ValueError(
                f"`warmup_u` must be below 1/min_kappa = {1.0 / min_kappa:g}, got {warmup_u}"
            )
        h = (
            max(int(in_dim), 16)
            if hidden_dim is None
            else check_int(hidden_dim, "hidden_dim", low=0)
        )
        self.in_dim = int(in_dim)
        self.warmup_u = warmup_u
        self.min_kappa = min_kappa
        self.mlp = _mlp(self.in_dim, h)
        # saved in checkpoints so a resumed run does not warm up twice
        self.register_buffer("warmed_up", torch.tensor(warmup_u is None))
        # the warm-up's fixed output scale s (a buffer: saved, never optimised)
        self.register_buffer("output_scale", torch.tensor(1.0))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # type: ignore[override]
        # checkpoints written before the scale existed warmed up by shifting the last bias,
        # which is in their weights: they load with s = 1 and give the same kappa as before
        key = prefix + "output_scale"
        if prefix + "warmed_up" in state_dict and key not in state_dict:
            state_dict[key] = torch.ones_like(self.output_scale)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, embedding: Tensor) -> Tensor:
        """Concentrations ``kappa [N] > 0`` for inputs ``[N, D]`` (embeddings, unnormalised is
        fine, or backbone features)."""
        check_columns(embedding, "embedding", self.in_dim)
        raw = F.softplus(self.mlp(embedding).squeeze(-1))
        return self.output_scale.to(raw) * raw + self.min_kappa

    @torch.no_grad()
    def warmup_(self, embedding: Tensor) -> bool:
        """Set the output scale so that ``mean(1/kappa) = warmup_u`` on this batch (once).

        Returns ``True`` if the scale was set now, ``False`` if there is nothing to do (no
        ``warmup_u`` or already warmed up). Under ``torch.distributed`` the ranks agree on the
        geometric mean of their scales (every rank must call it on its first batch).
        """
        if bool(self.warmed_up) or self.warmup_u is None:
            return False
        check_finite(embedding, "embedding")
        check_ndim(embedding, "embedding", 2)
        target = float(self.warmup_u)
        # solve mean(1 / (s * r + min_kappa)) = warmup_u for log s (decreasing in s; the
        # solution exists because warmup_u < 1/min_kappa), in float64
        r = F.softplus(self.mlp(embedding).squeeze(-1)).double()

        def mean_u(log_s: float) -> float:
            return float((1.0 / (math.exp(log_s) * r + self.min_kappa)).mean())

        # min_kappa = 0 gives s = mean(1/r) / warmup_u exactly; bracket around it
        guess = math.log(float((1.0 / r).mean()) / target)
        lo, hi = guess - 1.0, guess + 1.0
        while mean_u(lo) < target:  # widen until bracketed
            lo -= 2.0 * (hi - lo)
        while mean_u(hi) > target:
            hi += 2.0 * (hi - lo)
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if mean_u(mid) > target:
                lo = mid
            else:
                hi = mid
        log_s = torch.tensor(0.5 * (lo + hi), dtype=torch.float64, device=embedding.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every rank warms up on its own first batch: agree on one scale
            torch.distributed.all_reduce(log_s)
            log_s /= torch.distributed.get_world_size()
        self.output_scale.fill_(float(log_s.exp()))
        self.warmed_up.fill_(True)
        return True
