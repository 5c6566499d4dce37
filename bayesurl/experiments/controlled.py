"""The MCInfoNCE controlled experiment: a known probabilistic generative process, contrastive
pairs drawn from it, an encoder trained on them, and metrics that check whether the encoder
recovered the true posteriors up to a rotation.

Kirchhof, Kasneci & Oh (2023), "Probabilistic Contrastive Learning Recovers the Correct
Aleatoric Uncertainty of Ambiguous Inputs", ICML -- section 5.1 and appendix B (B.1 networks,
B.2 rejection sampling of pairs, eq. 53, B.3 parameters, Table 6).

The pieces are small and composable:

- :class:`VMFGenerator`: ``x ~ U[0,1]^D``; posteriors ``P(z|x) = vMF(mu(x), kappa(x))`` with
  ``mu`` a width-10 three-layer LeakyReLU MLP normalised onto ``S^{D-1}`` and ``kappa`` a
  two-layer MLP whose softplus output is mapped affinely in log space so that the 1,000
  calibration inputs span ``[kappa_min, kappa_max]`` exactly (appendix B.1). It draws
  contrastive triplets ``(x, x+, x-)`` by rejection sampling with the exact vMF normalisers
  (:func:`positive_probability`, eq. 53) and uniform negatives (eq. 4).
- :class:`ProbabilisticEncoder`: two MLPs ``D-10D-50D-50D-50D-50D-50D-10D-D`` for
  ``mu_hat`` and ``kappa_hat``; ``kappa_hat`` is initialised to the generator's range.
- :func:`train_encoder`: phase-wise training (``mu_hat`` first with rolled in-batch negatives,
  then ``kappa_hat`` with ``M`` sampled negatives), Adam, learning rate x0.1 at each quarter;
  its schedule is one checked :class:`EncoderTraining`.
- :func:`posterior_recovery_metrics`: Spearman correlation and mean absolute difference of the
  pairwise cosines (location) and of kappa (certainty) (section 5.1, "Metrics").
- :func:`run_controlled`: one seed end to end, returning a JSON-ready dict.

The contrastive losses are the library's (:mod:`bayesurl.losses`); :func:`make_loss` adapts
them to the ``(anchor, positive, negatives)`` form of this experiment.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from bayesurl._checks import check_finite, check_ndim, check_same_length, check_tensor
from bayesurl.distributions.vmf import sample_vmf, vmf_log_normalizer
from bayesurl.evaluation.functional import rank_correlation
from bayesurl.training.optim import even_milestones, multistep_factor

_log = logging.getLogger(__name__)

__all__ = [
    "ControlledConfig",
    "EncoderTraining",
    "LossFn",
    "ProbabilisticEncoder",
    "VMFGenerator",
    "lr_at",
    "make_loss",
    "mlp",
    "pairwise_cosines",
    "plot_recovery",
    "positive_probability",
    "posterior_recovery_metrics",
    "run_controlled",
    "select_mu_init",
    "smoothness_loss",
    "spearman",
    "train_encoder",
]

#: ``loss(mu_a, kappa_a, mu_p, kappa_p, mu_n, kappa_n, n_samples, generator) -> scalar``;
#: ``mu_n [B, M, D]`` / ``kappa_n [B, M]`` or ``None`` for rolled in-batch negatives.
LossFn = Callable[
    [Tensor, Tensor, Tensor, Tensor, "Tensor | None", "Tensor | None", int, "torch.Generator"],
    Tensor,
]


# --------------------------------------------------------------------------------------------
# networks
# --------------------------------------------------------------------------------------------
def _reset_linear(layer: nn.Linear, generator: torch.Generator | None) -> None:
    """PyTorch's default ``nn.Linear`` initialisation, drawn from ``generator``."""
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5.0), generator=generator)
    if layer.bias is not None:
        bound = 1.0 / math.sqrt(layer.in_features)
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)


def mlp(
    widths: list[int],
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Sequential:
    """LeakyReLU MLP with linear layers ``widths[0] -> widths[1] -> ... -> widths[-1]``.

    The architecture of appendix B.1 (after Zimmermann et al. 2021): LeakyReLU between the
    linear layers, none after the last one.

    Parameters
    ----------
    widths : list of int
        Layer widths including input and output, at least two entries.
    generator : torch.Generator, optional
        Source of the (PyTorch-default) initialisation, for reproducible networks.
    dtype : torch.dtype, optional
        Parameter dtype.
    """
    if len(widths) < 2 or min(widths) < 1:
        raise ValueError(f"`widths` needs >= 2 positive entries, got {widths}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        lin = nn.Linear(a, b, dtype=dtype)
        with torch.no_grad():
            _reset_linear(lin, generator)
        layers.append(lin)
        if i < len(widths) - 2:
            layers.append(nn.LeakyReLU())
    return nn.Sequential(*layers)


class _LogKappaRescale(nn.Module):
    """``kappa = exp(scale * softplus(s) + shift)`` with ``scale, shift`` fixed buffers chosen so
    that calibration inputs span ``[kappa_min, kappa_max]`` exactly (appendix B.1)."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones((), dtype=dtype))
        self.register_buffer("shift", torch.zeros((), dtype=dtype))

    @torch.no_grad()
    def calibrate(self, raw: Tensor, kappa_min: float, kappa_max: float) -> None:
        s = F.softplus(raw)
        lo, hi = s.min(), s.max()
        if not bool(hi > lo):
            raise ValueError("the kappa network is constant on the calibration inputs")
        scale = (math.log(kappa_max) - math.log(kappa_min)) / (hi - lo)
        self.scale.copy_(scale)
        self.shift.copy_(math.log(kappa_max) - scale * hi)

    def forward(self, raw: Tensor) -> Tensor:
        return torch.exp(self.scale * F.softplus(raw) + self.shift)


def _check_kappa_range(kappa_min: float, kappa_max: float) -> None:
    if not (0.0 < kappa_min < kappa_max < math.inf):
        raise ValueError(
            f"need 0 < `kappa_min` < `kappa_max` < inf, got kappa_min={kappa_min}, "
            f"kappa_max={kappa_max}"
        )


def positive_probability(cos: Tensor, kappa_pos: float, dim: int) -> Tensor:
    """Probability that two latents with cosine ``cos`` form a positive pair (MCI eq. 53).

    ``C(k) e^{k c} / (C(k) e^{k c} + C(0))`` with ``k = kappa_pos`` and the exact vMF
    normalisers ``C`` on ``S^{dim-1}``: the vMF positive density against the uniform negative
    density (equal priors). For ``dim = 10``, ``kappa_pos = 20`` it is 0.99894 at ``c = 0.9``
    and 0.2408 at ``c = 0.5``.

    Parameters
    ----------
    cos : Tensor
        Cosines ``z^T z+`` in ``[-1, 1]`` (any shape).
    kappa_pos : float
        Concentration of the positive distribution ``vMF(z+; z, kappa_pos)`` (eq. 3).
    dim : int
        Latent dimension ``D``.
    """
    check_finite(cos, "cos")
    if not kappa_pos > 0:
        raise ValueError(f"`kappa_pos` must be > 0, got {kappa_pos}")
    k = torch.tensor(float(kappa_pos), dtype=torch.float64)
    logit = vmf_log_normalizer(k, dim) - vmf_log_normalizer(torch.zeros((), dtype=k.dtype), dim)
    return torch.sigmoid(kappa_pos * cos + logit.to(cos.dtype).to(cos.device))


def smoothness_loss(x: Tensor, mu: Tensor) -> Tensor:
    """Smoothness objective of the authors' generator code (not in the paper's text).

    Over all pairs ``i <= j`` of a batch: ``mean((||x_i - x_j|| - d_ij)^2 (sqrt 2 - d_ij)^4)``
    with ``d_ij = 1 - mu_i^T mu_j / 2`` (the weight is not differentiated). Pulls distances on
    the sphere towards distances in ``x``, mostly for near pairs.
    """
    i, j = torch.triu_indices(x.shape[0], x.shape[0], device=x.device)
    dx = (x[i] - x[j]).norm(dim=-1)
    dz = 1.0 - (mu[i] * mu[j]).sum(-1) / 2.0
    return ((dx - dz) ** 2 * (math.sqrt(2.0) - dz.detach()) ** 4).mean()


def _smoothen(
    net: nn.Module,
    dim: int,
    steps: int,
    *,
    generator: torch.Generator | None,
    dtype: torch.dtype,
    batch_size: int = 64,
    lr: float = 0.01,
) -> None:
    """Fit ``normalize(net(x))`` to :func:`smoothness_loss` with Adam (authors' generator)."""
    optim = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        x = torch.rand((batch_size, dim), generator=generator, dtype=dtype)
        loss = smoothness_loss(x, F.normalize(net(x), dim=-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()


class VMFGenerator(nn.Module):
    """Probabilistic generative process with vMF posteriors (MCI section 3, appendix B.1-B.2).

    ``x ~ U[0,1]^D``; ``P(z|x) = vMF(z; mu(x), kappa(x))`` with ``mu`` an MLP
    ``D-10-10-D`` (LeakyReLU, normalised onto the sphere) and ``kappa`` an MLP ``D-10-1`` whose
    softplus output is rescaled in log space so that ``n_calibration`` uniform inputs span
    ``[kappa_min, kappa_max]`` exactly. The networks are re-initialised while the smallest
    pairwise cosine of ``mu`` over 1,000 inputs exceeds ``max_min_cosine`` (collapse guard of
    appendix B.1). The generator is frozen (no trainable parameters).

    Parameters
    ----------
    dim : int
        ``D``, dimension of both ``x`` and ``z`` (``>= 2``).
    kappa_min, kappa_max : float
        Posterior concentration range (Table 6: 16 and 32 for "ambiguous" and D = 2).
    kappa_pos : float
        Concentration of the positive-pair distribution (eq. 3), 20 in all experiments.
    hidden : int
        Width of the hidden layers (10).
    max_min_cosine : float
        Re-initialise while ``min cos(mu_i, mu_j) > max_min_cosine`` (0.5).
    n_calibration : int
        Number of uniform inputs used to calibrate the kappa range and check the spread (1000).
    generator : torch.Generator, optional
        Source of every random number of the initialisation.
    dtype : torch.dtype, optional
        Parameter dtype (default float32).
    max_tries : int
        Give up (ValueError) after this many re-initialisations.
    smooth_steps : int
        If > 0, fit ``mu`` for this many Adam steps to :func:`smoothness_loss` after each
        initialisation, before the spread check (0: off). Not in the paper's text; the
        authors' code does it with 5,000 steps (batch 64, lr 0.01), which spreads ``mu``
        more evenly over the sphere.
    acceptance : {"eq53", "vmf"}
        Rejection rule of the positives. ``"eq53"`` (default, the paper's appendix B.2 and
        the authors' code): accept a uniform candidate with the posterior probability of eq.
        53 that it is positive. That draws from ``U(z+) P(pos | z, z+)``, a flattened vMF:
        the accepted latent cosines are more spread than ``vMF(kappa_pos)`` (mean 0.948 vs
        A_2(20) = 0.975 in D = 2, 0.60 vs 0.80 in D = 10). ``"vmf"``: accept with probability
        ``exp(kappa_pos (z_ref^T z - 1))``, proportional to the vMF density of eq. 3, which
        draws exactly ``vMF(z+; z_ref, kappa_pos)`` when the latent marginal is uniform (the
        paper's assumption in Proposition 4.1).
    """

    def __init__(
        self,
        dim: int,
        kappa_min: float = 16.0,
        kappa_max: float = 32.0,
        *,
        kappa_pos: float = 20.0,
        hidden: int = 10,
        max_min_cosine: float = 0.5,
        n_calibration: int = 1000,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        max_tries: int = 1000,
        smooth_steps: int = 0,
        acceptance: str = "eq53",
    ) -> None:
        super().__init__()
        if acceptance not in ("eq53", "vmf"):
            raise ValueError(f"`acceptance` must be 'eq53' or 'vmf', got {acceptance!r}")
        self.acceptance = acceptance
        if smooth_steps < 0:
            raise ValueError(f"`smooth_steps` must be >= 0, got {smooth_steps}")
        if dim < 2:
            raise ValueError(f"`dim` must be >= 2, got {dim}")
        _check_kappa_range(kappa_min, kappa_max)
        if not kappa_pos > 0:
            raise ValueError(f"`kappa_pos` must be > 0, got {kappa_pos}")
        if n_calibration < 2:
            raise ValueError(f"`n_calibration` must be >= 2, got {n_calibration}")
        self.dim = dim
        self.kappa_min = float(kappa_min)
        self.kappa_max = float(kappa_max)
        self.kappa_pos = float(kappa_pos)
        self.n_reinit = 0
        dtype = dtype or torch.get_default_dtype()
        self.kappa_rescale = _LogKappaRescale(dtype)
        x_cal = torch.rand((n_calibration, dim), generator=generator, dtype=dtype)
        self.register_buffer("x_calibration", x_cal)
        for tries in range(max_tries):
            self.mu_net = mlp([dim, hidden, hidden, dim], generator=generator, dtype=dtype)
            self.kappa_net = mlp([dim, hidden, 1], generator=generator, dtype=dtype)
            if smooth_steps:
                _smoothen(self.mu_net, dim, smooth_steps, generator=generator, dtype=dtype)
            with torch.no_grad():
                mu = F.normalize(self.mu_net(x_cal), dim=-1)
                min_cos = float((mu @ mu.T).min())
                raw = self.kappa_net(x_cal).squeeze(-1)
            if min_cos <= max_min_cosine and bool(F.softplus(raw).max() > F.softplus(raw).min()):
                self.n_reinit = tries
                break
        else:
            raise ValueError(f"no generator with min cosine <= {max_min_cosine} in {max_tries}")
        self.kappa_rescale.calibrate(raw, kappa_min, kappa_max)
        self.min_cosine = min_cos
        self.requires_grad_(False)

    @property
    def _like(self) -> Tensor:
        return self.x_calibration

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior parameters ``(mu [N, D], kappa [N])`` of inputs ``x [N, D]``."""
        mu = F.normalize(self.mu_net(x), dim=-1)
        kappa = self.kappa_rescale(self.kappa_net(x).squeeze(-1))
        return mu, kappa

    def sample_x(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` inputs ``x ~ U[0,1]^D`` on the generator's device and dtype."""
        like = self._like
        return torch.rand((n, self.dim), generator=generator, dtype=like.dtype, device=like.device)

    def sample_z(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One latent ``z ~ vMF(mu(x), kappa(x))`` per row of ``x``."""
        mu, kappa = self(x)
        return sample_vmf(mu, kappa, 1, generator=generator)[0]

    def sample_positives(
        self,
        z_ref: Tensor,
        *,
        oversampling: int = 16,
        generator: torch.Generator | None = None,
        max_rounds: int = 10_000,
    ) -> Tensor:
        """One positive input ``x+`` per reference latent by rejection sampling (appendix B.2).

        Candidates ``x ~ U[0,1]^D`` with ``z ~ P(z|x)`` are accepted with probability
        :func:`positive_probability` of ``z_ref^T z``; the first accepted candidate of each row
        is kept, which is an exact draw from ``P(x+ | z_ref)``.

        Parameters
        ----------
        z_ref : Tensor
            ``[B, D]`` reference latents.
        oversampling : int
            Candidates per still-unmatched row and round.
        generator : torch.Generator, optional
            Random source.
        max_rounds : int
            Raise after this many rounds.
        """
        check_ndim(z_ref, "z_ref", 2)
        b = z_ref.shape[0]
        x_pos = torch.empty((b, self.dim), dtype=z_ref.dtype, device=z_ref.device)
        need = torch.ones(b, dtype=torch.bool, device=z_ref.device)
        for _ in range(max_rounds):
            idx = need.nonzero(as_tuple=True)[0]
            m = idx.numel()
            if m == 0:
                return x_pos
            xc = self.sample_x(m * oversampling, generator)
            zc = self.sample_z(xc, generator).view(m, oversampling, self.dim)
            cos = (z_ref[idx].unsqueeze(1) * zc).sum(-1).clamp(-1.0, 1.0)
            if self.acceptance == "vmf":
                p = torch.exp(self.kappa_pos * (cos - 1.0))
            else:
                p = positive_probability(cos, self.kappa_pos, self.dim)
            u = torch.rand(p.shape, generator=generator, dtype=p.dtype, device=p.device)
            acc = u < p
            has = acc.any(dim=1)
            first = acc.to(torch.int8).argmax(dim=1)
            rows = has.nonzero(as_tuple=True)[0]
            x_pos[idx[rows]] = xc.view(m, oversampling, self.dim)[rows, first[rows]]
            need[idx[rows]] = False
        raise RuntimeError(
            f"rejection sampling left {int(need.sum())} rows without a positive after "
            f"{max_rounds} rounds of {oversampling} candidates (acceptance={self.acceptance!r}, "
            f"D = {self.dim}): their reference latents lie where the generator's latent "
            "marginal is thin; raise `max_rounds` / `oversampling`, or use acceptance='eq53', "
            "which accepts far more candidates in high D"
        )

    def sample_triplets(
        self,
        n: int,
        n_negatives: int = 0,
        *,
        oversampling: int = 16,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Contrastive training data ``(x [n, D], x+ [n, D], x- [n, M, D] | None)``.

        References are uniform, positives are rejection-sampled
        (:meth:`sample_positives`), and the ``M = n_negatives`` negatives are uniform inputs
        (eq. 4 / appendix B.2); ``n_negatives = 0`` returns ``None`` (rolled in-batch negatives).
        """
        if n < 1 or n_negatives < 0:
            raise ValueError(f"need `n` >= 1 and `n_negatives` >= 0, got {n}, {n_negatives}")
        x = self.sample_x(n, generator)
        z = self.sample_z(x, generator)
        x_pos = self.sample_positives(z, oversampling=oversampling, generator=generator)
        x_neg = None
        if n_negatives > 0:
            x_neg = self.sample_x(n * n_negatives, generator).view(n, n_negatives, self.dim)
        return x, x_pos, x_neg


class ProbabilisticEncoder(nn.Module):
    """Encoder ``x -> (mu_hat(x), kappa_hat(x))`` of the controlled experiment (appendix B.1).

    Two independent MLPs ``D-10D-50D-50D-50D-50D-50D-10D-D`` (LeakyReLU) for ``mu_hat``
    (normalised onto the sphere) and ``kappa_hat`` (last layer to a scalar, then
    ``exp(scale * softplus(.) + shift)``, with ``scale, shift`` fixed so that
    ``x_calibration`` spans ``[kappa_min, kappa_max]`` at initialisation).

    Parameters
    ----------
    dim : int
        Input dimension of ``x`` (``D``).
    x_calibration : Tensor
        ``[N, D]`` inputs on which ``kappa_hat`` is initialised to ``[kappa_min, kappa_max]``.
    kappa_min, kappa_max : float
        Initial range of ``kappa_hat`` (the generator's range).
    latent_dim : int, optional
        Output dimension ``D'`` (default ``dim``); the hidden widths scale with it.
    generator : torch.Generator, optional
        Source of the initialisation.
    """

    def __init__(
        self,
        dim: int,
        x_calibration: Tensor,
        kappa_min: float = 16.0,
        kappa_max: float = 32.0,
        *,
        latent_dim: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        _check_kappa_range(kappa_min, kappa_max)
        x_cal = check_tensor(x_calibration, "x_calibration", ndim=2, min_points=2)
        if x_cal.shape[1] != dim:
            raise ValueError(f"`x_calibration` must have {dim} columns, got {x_cal.shape[1]}")
        d = latent_dim or dim
        widths = [dim, 10 * d] + [50 * d] * 5 + [10 * d]
        dtype = x_cal.dtype
        self.mu_net = mlp([*widths, d], generator=generator, dtype=dtype)
        self.kappa_net = mlp([*widths, 1], generator=generator, dtype=dtype)
        self.kappa_rescale = _LogKappaRescale(dtype)
        with torch.no_grad():
            self.kappa_rescale.calibrate(self.kappa_net(x_cal).squeeze(-1), kappa_min, kappa_max)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(mu_hat [N, D'], kappa_hat [N])`` for inputs ``x [..., N, D]``."""
        mu = F.normalize(self.mu_net(x), dim=-1)
        kappa = self.kappa_rescale(self.kappa_net(x).squeeze(-1))
        return mu, kappa


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------
def _mean_abs_diff(a: Tensor, b: Tensor, chunk: int = 1 << 22) -> float:
    """``mean |a - b|`` accumulated in float64, in chunks (no full-size temporaries)."""
    total = torch.zeros((), dtype=torch.float64, device=a.device)
    for i in range(0, a.numel(), chunk):
        da = a[i : i + chunk].to(torch.float64)
        total += (da - b[i : i + chunk].to(torch.float64)).abs().sum()
    return float(total / a.numel())


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation of two 1-D tensors, as a float (MCI Table 1 / 3 "Rank Corr.").

    The library's :func:`bayesurl.evaluation.rank_correlation` (Pearson correlation of average
    ranks, ties as in :func:`scipy.stats.spearmanr`), except that a constant input gives
    ``nan`` (undefined, as scipy) instead of an error, so that a run whose kappa network
    collapsed to one value still reports its other metrics.
    """
    for x in (a, b):
        if isinstance(x, Tensor) and x.ndim == 1 and x.numel() >= 2 and bool((x == x[0]).all()):
            return math.nan
    return float(rank_correlation(a, b))


def pairwise_cosines(mu: Tensor, *, chunk: int = 1024) -> Tensor:
    """Cosines ``mu_i^T mu_j`` of all pairs ``i < j`` of unit vectors, flattened row-major.

    Computed in row chunks so that 10^4 inputs (5 * 10^7 pairs) need no ``N x N`` index tensor.
    """
    mu = check_tensor(mu, "mu", ndim=2, min_points=2)
    mu = F.normalize(mu, dim=-1)
    n = mu.shape[0]
    parts = []
    for i0 in range(0, n - 1, chunk):
        i1 = min(i0 + chunk, n - 1)
        block = mu[i0:i1] @ mu.T  # [c, n]
        cols = torch.arange(n, device=mu.device)
        rows = torch.arange(i0, i1, device=mu.device)
        parts.append(block[cols.unsqueeze(0) > rows.unsqueeze(1)])
    return torch.cat(parts)


def posterior_recovery_metrics(
    mu_true: Tensor,
    kappa_true: Tensor,
    mu_pred: Tensor,
    kappa_pred: Tensor,
    *,
    max_pairs: int | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """How well predicted vMF posteriors match the true ones, up to a rotation (MCI sec. 5.1).

    Location: ``mu_pred_i^T mu_pred_j`` against ``mu_true_i^T mu_true_j`` over all pairs
    ``i < j`` -- invariant to any orthogonal ``R`` with ``mu_pred = R mu_true``. Certainty:
    ``kappa_pred`` against ``kappa_true``. Each is scored by the mean absolute difference
    (``*_mae``; the authors' code computes ``mean(sqrt((a - b)^2))``, reported as "RMSE" in
    Table 1) and Spearman's rank correlation (``*_spearman``).

    Parameters
    ----------
    mu_true, mu_pred : Tensor
        ``[N, D]`` and ``[N, D']`` mean directions.
    kappa_true, kappa_pred : Tensor
        ``[N]`` concentrations.
    max_pairs : int, optional
        Score a uniform random subset of this many pairs (with replacement) instead of all
        ``N (N - 1) / 2``: for cheap evaluations during training.
    generator : torch.Generator, optional
        Random source of the pair subset.

    Returns
    -------
    dict
        ``location_mae``, ``location_spearman``, ``certainty_mae``, ``certainty_spearman``,
        ``n_points``, ``n_pairs``.
    """
    mu_true = check_tensor(mu_true, "mu_true", ndim=2, min_points=2).detach()
    mu_pred = check_tensor(mu_pred, "mu_pred", ndim=2, min_points=2).detach()
    kappa_true = check_tensor(kappa_true, "kappa_true", ndim=1).detach()
    kappa_pred = check_tensor(kappa_pred, "kappa_pred", ndim=1).detach()
    check_same_length(
        ("mu_true", mu_true), ("kappa_true", kappa_true), ("mu_pred", mu_pred),
        ("kappa_pred", kappa_pred),
    )  # fmt: skip
    n = mu_true.shape[0]
    if max_pairs is None:
        c_true = pairwise_cosines(mu_true)
        c_pred = pairwise_cosines(mu_pred)
    else:
        if max_pairs < 2:
            raise ValueError(f"`max_pairs` must be >= 2, got {max_pairs}")
        dev = mu_true.device
        i = torch.randint(0, n, (max_pairs,), generator=generator, device=dev)
        j = (i + torch.randint(1, n, (max_pairs,), generator=generator, device=dev)) % n
        ut, up = F.normalize(mu_true, dim=-1), F.normalize(mu_pred, dim=-1)
        c_true = (ut[i] * ut[j]).sum(-1)
        c_pred = (up[i] * up[j]).sum(-1)
    kt, kp = kappa_true.to(torch.float64), kappa_pred.to(torch.float64)
    return {
        "location_mae": _mean_abs_diff(c_true, c_pred),
        "location_spearman": spearman(c_true, c_pred),
        "certainty_mae": float((kt - kp).abs().mean()),
        "certainty_spearman": spearman(kt, kp),
        "n_points": n,
        "n_pairs": int(c_true.numel()),
    }


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------
def _decay_factor(step: int, n_batches: int, *, phasewise: bool, decay: float) -> float:
    """x ``decay`` after each quarter (joint), or after the first quarter of each half
    (phase-wise), by the library's step decay (:func:`bayesurl.training.multistep_factor`)."""
    quarters = even_milestones(n_batches, 4)
    if not phasewise:
        return multistep_factor(step, quarters, decay)
    return multistep_factor(step, quarters[:1] if step < quarters[1] else quarters[2:], decay)


def lr_at(step: int, n_batches: int, lr: float, *, phasewise: bool, decay: float = 0.1) -> float:
    """Learning rate of ``step`` (appendix B.3: x ``decay`` after each quarter of training).

    Joint training: ``lr * decay^q`` in quarter ``q``. Phase-wise training (the authors'
    schedule): each half restarts Adam at ``lr * decay^(s / n_batches)`` (``s`` its first step)
    and drops it by ``decay`` after its first quarter, i.e. ``lr, lr/10`` for ``mu_hat`` and
    ``lr/sqrt(10), lr/(10 sqrt(10))`` for ``kappa_hat``. The drops are the library's step decay
    (:func:`bayesurl.training.multistep_factor` at :func:`bayesurl.training.even_milestones`).
    """
    if not 0 <= step < n_batches:
        raise ValueError(f"`step` must be in [0, {n_batches}), got {step}")
    factor = _decay_factor(step, n_batches, phasewise=phasewise, decay=decay)
    if not phasewise:
        return lr * factor
    start = 0 if 2 * step < n_batches else n_batches // 2
    return lr * decay ** (start / n_batches) * factor


def _triplet_loss(
    enc: ProbabilisticEncoder,
    loss_fn: LossFn,
    x: Tensor,
    x_pos: Tensor,
    x_neg: Tensor | None,
    n_samples: int,
    generator: torch.Generator | None,
) -> Tensor:
    """``loss_fn`` on the encoded anchors, positives and negatives (``None``: rolled)."""
    mu_a, k_a = enc(x)
    mu_p, k_p = enc(x_pos)
    mu_n = k_n = None
    if x_neg is not None:
        mu_n, k_n = enc(x_neg)
    return loss_fn(mu_a, k_a, mu_p, k_p, mu_n, k_n, n_samples, generator)


@dataclass(frozen=True)
class EncoderTraining:
    """How :func:`train_encoder` trains (MCI appendix B.3, B.6, Table 6); checked when built.

    Phase-wise (default): the first half of the batches trains ``mu_hat`` only, with
    ``mu_negatives`` sampled negatives per anchor (0: the rolled in-batch positives serve as
    negatives); the second half trains ``kappa_hat`` only with ``n_negatives`` uniform negatives
    per anchor. Joint (``phasewise=False``): both networks throughout, ``n_negatives``
    negatives. Adam; learning rate from :func:`lr_at`.

    Parameters
    ----------
    n_batches : int
        Total number of batches (Table 6: 8,192 for D = 2, 100,000 for D = 10).
    batch_size, n_samples : int
        Anchors per batch and MC samples per posterior (512 and 512 in Table 6).
    n_negatives, mu_negatives : int
        ``M`` in the kappa (or joint) phase, and in the mu phase (0 = rolled in-batch).
    phasewise : bool
        Train ``mu_hat`` then ``kappa_hat`` (True) or both jointly.
    lr, lr_decay : float
        Initial Adam learning rate (1e-4) and its factor per quarter.
    kappa_lr : float, optional
        Base learning rate of ``kappa_hat`` (its phase starts there, x ``lr_decay`` after
        the third quarter; joint: x ``lr_decay`` per quarter). Default: :func:`lr_at`.
    oversampling : int
        Rejection-sampling candidates per row and round.
    eval_every : int
        Evaluate every this many batches (0: never) and after the last batch.
    progress : bool
        Show a tqdm bar.

    Raises
    ------
    ValueError
        If ``n_batches < 2``, ``batch_size < 2``, ``n_samples < 1`` or a negative count.
    """

    n_batches: int
    batch_size: int = 512
    n_samples: int = 512
    n_negatives: int = 1
    mu_negatives: int = 0
    phasewise: bool = True
    lr: float = 1e-4
    lr_decay: float = 0.1
    kappa_lr: float | None = None
    oversampling: int = 16
    eval_every: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.n_batches < 2:
            raise ValueError(f"`n_batches` must be >= 2, got {self.n_batches}")
        counts_ok = self.batch_size >= 2 and self.n_samples >= 1
        if not counts_ok or min(self.n_negatives, self.mu_negatives) < 0:
            raise ValueError(
                f"need `batch_size` >= 2, `n_samples` >= 1, negatives >= 0; got {self.batch_size}, "
                f"{self.n_samples}, {self.n_negatives}, {self.mu_negatives}"
            )

    def phase(self, step: int) -> str:
        """``"mu"`` / ``"kappa"`` (the halves of phase-wise training) or ``"joint"``."""
        if not self.phasewise:
            return "joint"
        return "mu" if 2 * step < self.n_batches else "kappa"

    def negatives(self, phase: str) -> int:
        """``M`` of ``phase`` (0: rolled in-batch negatives)."""
        return self.mu_negatives if phase == "mu" else self.n_negatives

    def lr_of(self, network: str, step: int) -> float:
        """Learning rate of ``network`` (``"mu"`` or ``"kappa"``) at ``step``."""
        if network == "mu" or self.kappa_lr is None:
            return lr_at(
                step, self.n_batches, self.lr, phasewise=self.phasewise, decay=self.lr_decay
            )
        # the kappa network's own base rate, same quarter drops
        factor = _decay_factor(step, self.n_batches, phasewise=self.phasewise, decay=self.lr_decay)
        return self.kappa_lr * factor

    def eval_due(self, step: int) -> bool:
        """Whether an evaluation follows ``step``."""
        every = self.eval_every > 0 and (step + 1) % self.eval_every == 0
        return every or step == self.n_batches - 1


_TRAINING_FIELDS = frozenset(f.name for f in fields(EncoderTraining))


def _training_options(options: EncoderTraining | None, settings: dict[str, Any]) -> EncoderTraining:
    """``options`` with ``settings`` replacing its fields (or built from ``settings``)."""
    unknown = sorted(set(settings) - _TRAINING_FIELDS)
    if unknown:
        raise TypeError(f"train_encoder() got an unexpected keyword argument {unknown[0]!r}")
    if options is None:
        if "n_batches" not in settings:
            raise TypeError("train_encoder() needs `n_batches` (or an EncoderTraining)")
        return EncoderTraining(**settings)
    if not isinstance(options, EncoderTraining):
        raise TypeError(f"`options` must be an EncoderTraining, got {type(options).__name__}")
    return replace(options, **settings) if settings else options


def _phase_optimizer(enc: ProbabilisticEncoder, phase: str, lr: float) -> torch.optim.Adam:
    """A fresh Adam over the networks ``phase`` trains (the others frozen), one named group
    per network."""
    enc.requires_grad_(False)
    groups = []
    for name, net in (("mu", enc.mu_net), ("kappa", enc.kappa_net)):
        if phase in (name, "joint"):
            net.requires_grad_(True)
            groups.append({"params": list(net.parameters()), "name": name})
    return torch.optim.Adam(groups, lr=lr)


def _evaluation(
    enc: ProbabilisticEncoder,
    eval_fn: Callable[[], dict[str, float]],
    step: int,
    phase: str,
    mean_loss: float,
) -> dict[str, float]:
    """One history record: ``eval_fn`` in eval mode after batch ``step``, logged."""
    enc.eval()
    with torch.no_grad():
        rec = {"batch": step + 1, "loss": mean_loss, **eval_fn()}
    enc.train()
    _log.info(
        "batch %d (%s): %s", step + 1, phase,
        ", ".join(f"{k} {v:.4g}" for k, v in rec.items() if k != "batch"),
    )  # fmt: skip
    return rec


def train_encoder(
    gen: VMFGenerator,
    enc: ProbabilisticEncoder,
    loss_fn: LossFn,
    options: EncoderTraining | None = None,
    *,
    generator: torch.Generator | None = None,
    eval_fn: Callable[[], dict[str, float]] | None = None,
    **settings: Any,
) -> list[dict[str, float]]:
    """Train ``enc`` on contrastive triplets from ``gen`` (MCI appendix B.3, B.6).

    The schedule (phase-wise or joint, learning rates, negatives) is ``options``::

        train_encoder(gen, enc, loss_fn, EncoderTraining(n_batches=8192), generator=g)
        train_encoder(gen, enc, loss_fn, n_batches=8192, generator=g)  # the same run

    Parameters
    ----------
    gen : VMFGenerator
        The data-generating process.
    enc : ProbabilisticEncoder
        Encoder, trained in place.
    loss_fn : LossFn
        Contrastive loss on posteriors, see :func:`make_loss`.
    options : EncoderTraining, optional
        The schedule; without it ``settings`` must name ``n_batches``.
    generator : torch.Generator, optional
        Random source of the data and the MC samples.
    eval_fn : callable, optional
        Returns a metrics dict; called every ``eval_every`` batches and after the last one,
        recorded in the history with the batch index and mean loss.
    **settings
        :class:`EncoderTraining` fields replacing those of ``options``.

    Returns
    -------
    list of dict
        The evaluation history (empty if ``eval_fn`` is None).
    """
    opts = _training_options(options, settings)
    history: list[dict[str, float]] = []
    optim: torch.optim.Optimizer | None = None
    phase = ""
    running, n_run = 0.0, 0
    bar = tqdm(range(opts.n_batches), disable=not opts.progress, desc="train", leave=False)
    for b in bar:
        if opts.phase(b) != phase:
            phase = opts.phase(b)
            optim = _phase_optimizer(enc, phase, opts.lr)
        assert optim is not None
        for g in optim.param_groups:
            g["lr"] = opts.lr_of(g["name"], b)
        with torch.no_grad():
            x, x_pos, x_neg = gen.sample_triplets(
                opts.batch_size, opts.negatives(phase), oversampling=opts.oversampling,
                generator=generator,
            )  # fmt: skip
        loss = _triplet_loss(enc, loss_fn, x, x_pos, x_neg, opts.n_samples, generator)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        running += float(loss.detach())
        n_run += 1
        if opts.progress and b % 50 == 0:
            bar.set_postfix(phase=phase, loss=f"{running / n_run:.4f}")
        if eval_fn is not None and opts.eval_due(b):
            history.append(_evaluation(enc, eval_fn, b, phase, running / n_run))
            running, n_run = 0.0, 0
    enc.requires_grad_(True)
    return history


def _mu_candidate(enc: ProbabilisticEncoder, j: int, seed: int) -> ProbabilisticEncoder:
    """Candidate ``j`` of :func:`select_mu_init`: a copy of ``enc``, its ``mu_net``
    re-initialised from its own seed for ``j > 0``."""
    cand = copy.deepcopy(enc)
    if j > 0:
        g_init = torch.Generator().manual_seed(seed + 40_000 + j)
        with torch.no_grad():
            for layer in cand.mu_net:
                if isinstance(layer, nn.Linear):
                    _reset_linear(layer, g_init)
    return cand


def _warm_up_mu(
    cand: ProbabilisticEncoder,
    gen: VMFGenerator,
    loss_fn: LossFn,
    steps: int,
    *,
    batch_size: int,
    n_samples: int,
    lr: float,
    oversampling: int,
    generator: torch.Generator,
) -> None:
    """``steps`` Adam steps of ``cand.mu_net`` alone, with rolled in-batch negatives."""
    cand.requires_grad_(False)
    cand.mu_net.requires_grad_(True)
    optim = torch.optim.Adam(cand.mu_net.parameters(), lr=lr)
    for _ in range(steps):
        with torch.no_grad():
            x, x_pos, _ = gen.sample_triplets(
                batch_size, 0, oversampling=oversampling, generator=generator
            )
        loss = _triplet_loss(cand, loss_fn, x, x_pos, None, n_samples, generator)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()


def select_mu_init(
    gen: VMFGenerator,
    enc: ProbabilisticEncoder,
    loss_fn: LossFn,
    *,
    n_inits: int,
    warmup: int,
    batch_size: int = 512,
    n_samples: int = 512,
    lr: float = 1e-4,
    val_batches: int = 8,
    seed: int = 0,
    oversampling: int = 16,
    progress: bool = True,
) -> dict[str, Any]:
    """Best of ``n_inits`` initialisations of ``mu_hat`` by a short warm-up (a restart guard).

    Phase-wise training can get stuck in its mu phase: one of our five D = 2 seeds ended it at
    location rank 0.87 (a folded map that more batches do not undo). Candidate 0 is ``enc``'s
    own ``mu_net``; candidates 1.. are fresh PyTorch-default initialisations from their own
    seeds (the ``kappa_net`` is shared, so the losses compare like with like). Each trains its
    ``mu_net`` for ``warmup`` batches with rolled in-batch negatives on one common data stream
    and is scored by the contrastive loss on ``val_batches`` fixed validation batches with
    fixed MC samples: no generator ground truth is used. ``enc.mu_net`` is set to the winner's
    *initial* weights; nothing is drawn from the caller's generator, so when candidate 0 wins
    the run is identical to one without the guard.

    Parameters
    ----------
    gen, enc, loss_fn
        As in :func:`train_encoder`; ``enc.mu_net`` is replaced in place.
    n_inits : int
        Number of candidate initialisations (1: keep ``enc``).
    warmup : int
        Warm-up batches per candidate.
    batch_size, n_samples, lr, oversampling
        Warm-up settings (those of the mu phase).
    val_batches : int
        Validation batches of ``batch_size`` anchors.
    seed : int
        Seed of the candidates, the warm-up data and the validation data.
    progress : bool
        Show a tqdm bar.

    Returns
    -------
    dict
        ``chosen`` (candidate index) and ``val_losses`` (one per candidate).
    """
    if n_inits < 1 or warmup < 0 or val_batches < 1:
        raise ValueError(
            f"need `n_inits` >= 1, `warmup` >= 0, `val_batches` >= 1; got {n_inits}, {warmup}, "
            f"{val_batches}"
        )
    if n_inits == 1:
        return {"chosen": 0, "val_losses": []}
    g_val = torch.Generator().manual_seed(seed + 30_000)
    with torch.no_grad():
        val = [gen.sample_triplets(batch_size, 0, generator=g_val)[:2] for _ in range(val_batches)]
    initial_states, losses = [], []
    for j in tqdm(range(n_inits), disable=not progress, desc="mu inits", leave=False):
        cand = _mu_candidate(enc, j, seed)
        initial_states.append(copy.deepcopy(cand.mu_net.state_dict()))
        # the same warm-up stream and the same validation MC samples for every candidate
        _warm_up_mu(
            cand, gen, loss_fn, warmup, batch_size=batch_size, n_samples=n_samples, lr=lr,
            oversampling=oversampling, generator=torch.Generator().manual_seed(seed + 20_000),
        )  # fmt: skip
        g_mc = torch.Generator().manual_seed(seed + 50_000)
        with torch.no_grad():
            total = sum(
                float(_triplet_loss(cand, loss_fn, x, x_pos, None, n_samples, g_mc))
                for x, x_pos in val
            )
        losses.append(total / val_batches)
    chosen = int(torch.tensor(losses).argmin())
    enc.mu_net.load_state_dict(initial_states[chosen])
    return {"chosen": chosen, "val_losses": losses}


# --------------------------------------------------------------------------------------------
# losses: thin adapters to bayesurl.losses
# --------------------------------------------------------------------------------------------
def _rolled(mu_p: Tensor, k_p: Tensor) -> tuple[Tensor, Tensor]:
    """Rolled in-batch negatives: anchor ``i`` gets the positive of anchor ``i - 1``, M = 1."""
    return torch.roll(mu_p, 1, 0).unsqueeze(1), torch.roll(k_p, 1, 0).unsqueeze(1)


def make_loss(
    name: str,
    *,
    kappa_pos: float = 20.0,
    hib_scale: float = 1.0,
    hib_bias: float = 0.0,
    divide_positive: bool = False,
) -> LossFn:
    """The library loss ``name`` in the experiment's ``(anchor, positive, M negatives)`` form.

    - ``"mcinfonce"``: :func:`bayesurl.losses.mcinfonce.mcinfonce_loss` (MCI eq. 7) with
      inverse temperature ``kappa_pos``; ``divide_positive=False`` is the reference code's
      denominator ``e^{pos} + mean_m e^{neg_m}``, ``True`` eq. 7 as printed
      ``(e^{pos} + sum_m e^{neg_m}) / M``. Only the latter tends to the objective of
      Proposition 4.1 as M grows: with the true ``mu`` and ``kappa_hat = c kappa`` on exact
      vMF positives, M = 8 or 32, it is minimal at c = 1, the reference form at c >= 4
      (``docs/controlled_experiment.rst``). Both agree for M = 1.
    - ``"elk"``: :func:`bayesurl.losses.elk.elk_contrastive_loss` (MCI appendix B.5, eq. 55),
      similarities ``kappa_pos * log ELK``, the negatives summed as in the MCI code.
    - ``"hib"``: :func:`bayesurl.losses.hib.hib_loss` (MCI appendix B.4, eq. 54: the
      different-pair term ``-log(1 - p)``), ``p = E sigmoid(a z^T z' + b)`` with
      ``a = hib_scale``, ``b = hib_bias`` (the authors' tuned a = 1, b = 0); ``log sigmoid``
      averaged over the samples as in the MCI code (``mc_average="outside"``); its second
      division of the negative term by M is not reproduced (:mod:`bayesurl.losses.hib`).

    ``mu_n = None`` means rolled in-batch negatives (M = 1): anchor ``i`` is contrasted with
    the positive of anchor ``i - 1`` (drawn afresh from its posterior; same distribution as the
    authors' reuse of the positive's samples).
    """
    name = name.lower()
    if name == "mcinfonce":
        from bayesurl.losses.mcinfonce import mcinfonce_loss

        def loss(mu_a, k_a, mu_p, k_p, mu_n, k_n, n_samples, generator):  # type: ignore[no-untyped-def]
            if mu_n is None:
                mu_n, k_n = _rolled(mu_p, k_p)
            return mcinfonce_loss(
                mu_a, k_a, mu_p, k_p, mu_n, k_n, n_samples=n_samples,
                kappa_pos_scale=kappa_pos, divide_positive=divide_positive,
                denominator="positive", generator=generator,
            )  # fmt: skip

        return loss
    if name == "elk":
        from bayesurl.losses.elk import elk_contrastive_loss

        def loss(mu_a, k_a, mu_p, k_p, mu_n, k_n, n_samples, generator):  # type: ignore[no-untyped-def]
            if mu_n is None:
                mu_n, k_n = _rolled(mu_p, k_p)
            return elk_contrastive_loss(
                mu_a, k_a, mu_p, k_p, mu_n, k_n, scale=kappa_pos, negatives="sum"
            )  # fmt: skip

        return loss
    if name == "hib":
        from bayesurl.losses.hib import hib_loss

        def loss(mu_a, k_a, mu_p, k_p, mu_n, k_n, n_samples, generator):  # type: ignore[no-untyped-def]
            if mu_n is None:
                mu_n, k_n = _rolled(mu_p, k_p)
            return hib_loss(
                mu_a, k_a, mu_p, k_p, mu_n, k_n, n_samples=n_samples, scale=hib_scale,
                bias=hib_bias, negative_term="log1m_p", eps=0.0, mc_average="outside",
                generator=generator,
            )  # fmt: skip

        return loss
    raise ValueError(f"unknown `loss` {name!r}; choose one of 'mcinfonce', 'elk', 'hib'")


# --------------------------------------------------------------------------------------------
# one run
# --------------------------------------------------------------------------------------------
@dataclass
class ControlledConfig:
    """Settings of one controlled-experiment run (MCI Table 6; defaults: the D = 2 row).

    ``n_negatives`` is M in the kappa phase (or throughout with ``phasewise=False``),
    ``mu_negatives`` M in the mu phase (0: rolled in-batch). ``n_eval`` fresh inputs are scored
    with :func:`posterior_recovery_metrics`; ``eval_pairs`` subsamples pairs for the
    intermediate evaluations every ``eval_every`` batches (the final one uses all pairs).
    ``mu_inits > 1`` (phase-wise only) picks ``mu_hat``'s initialisation by
    :func:`select_mu_init` with ``mu_warmup`` warm-up batches per candidate.
    """

    dim: int = 2
    loss: str = "mcinfonce"
    seed: int = 0
    kappa_min: float = 16.0
    kappa_max: float = 32.0
    kappa_pos: float = 20.0
    batch_size: int = 512
    n_batches: int = 8192
    n_samples: int = 512
    n_negatives: int = 1
    mu_negatives: int = 0
    phasewise: bool = True
    lr: float = 1e-4
    lr_decay: float = 0.1
    kappa_lr: float | None = None
    hib_scale: float = 1.0
    hib_bias: float = 0.0
    divide_positive: bool = False
    n_eval: int = 10_000
    eval_every: int = 0
    eval_pairs: int = 200_000
    dtype: str = "float32"
    smooth_steps: int = 0
    acceptance: str = "eq53"
    mu_inits: int = 1
    mu_warmup: int = 512
    extra: dict[str, Any] = field(default_factory=dict)

    def training(self, *, progress: bool = True) -> EncoderTraining:
        """The schedule :func:`train_encoder` follows for this run: every
        :class:`EncoderTraining` field this config also has (the others at their defaults)."""
        shared = {
            f.name: getattr(self, f.name) for f in fields(EncoderTraining) if hasattr(self, f.name)
        }
        return EncoderTraining(**shared, progress=progress)


def plot_recovery(
    mu_true: Tensor,
    kappa_true: Tensor,
    mu_pred: Tensor,
    kappa_pred: Tensor,
    path: str,
    *,
    n_points: int = 500,
    title: str = "",
) -> None:
    """Save a two-panel figure like MCI Fig. 2 / the authors' diagnostics (Agg backend).

    Left: predicted against true pairwise cosines of the first ``n_points`` inputs; right:
    predicted against true kappa, with the identity line (exact recovery lies on it).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = min(n_points, mu_true.shape[0])
    c_t = pairwise_cosines(mu_true[:n].detach()).cpu()
    c_p = pairwise_cosines(mu_pred[:n].detach()).cpu()
    k_t, k_p = kappa_true.detach().cpu(), kappa_pred.detach().cpu()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
    a1.scatter(c_t, c_p, s=1, alpha=0.2)
    a1.plot([-1, 1], [-1, 1], "k--", lw=0.8)
    a1.set(xlabel="true cosine mu(x1)^T mu(x2)", ylabel="predicted cosine", title="location")
    a2.scatter(k_t, k_p, s=2, alpha=0.3)
    lo, hi = float(k_t.min()), float(k_t.max())
    a2.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    a2.set(xlabel="true kappa(x)", ylabel="predicted kappa_hat(x)", title="certainty")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_controlled(
    config: ControlledConfig, *, progress: bool = True, plot_path: str | None = None
) -> dict[str, Any]:
    """Run one seed of the controlled experiment end to end (MCI section 5.1).

    Seeds one :class:`torch.Generator` with ``config.seed`` and draws from it, in order, the
    generator networks, the encoder initialisation, the ``n_eval`` evaluation inputs, then the
    training data and MC samples.

    Returns
    -------
    dict
        ``config`` (as a dict), ``metrics`` (final, all pairs), ``initial_metrics`` (before
        training), ``history``, ``generator`` (re-inits, min cosine), ``seconds``.
    """
    dtype = {"float32": torch.float32, "float64": torch.float64}.get(config.dtype)
    if dtype is None:
        raise ValueError(f"`dtype` must be 'float32' or 'float64', got {config.dtype!r}")
    loss_fn = make_loss(
        config.loss, kappa_pos=config.kappa_pos, hib_scale=config.hib_scale,
        hib_bias=config.hib_bias, divide_positive=config.divide_positive,
    )  # fmt: skip
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(config.seed)
    gen = VMFGenerator(
        config.dim, config.kappa_min, config.kappa_max, kappa_pos=config.kappa_pos,
        generator=g, dtype=dtype, smooth_steps=config.smooth_steps,
        acceptance=config.acceptance,
    )  # fmt: skip
    enc = ProbabilisticEncoder(
        config.dim, gen.x_calibration, config.kappa_min, config.kappa_max, generator=g
    )
    x_eval = gen.sample_x(config.n_eval, g)
    eval_g = torch.Generator().manual_seed(config.seed + 10_000)

    def evaluate(max_pairs: int | None) -> dict[str, float]:
        with torch.no_grad():
            mu_t, k_t = gen(x_eval)
            mu_p, k_p = enc(x_eval)
        return posterior_recovery_metrics(
            mu_t, k_t, mu_p, k_p, max_pairs=max_pairs, generator=eval_g
        )

    selection = {"chosen": 0, "val_losses": []}
    if config.mu_inits > 1 and config.phasewise:
        selection = select_mu_init(
            gen, enc, loss_fn, n_inits=config.mu_inits, warmup=config.mu_warmup,
            batch_size=config.batch_size, n_samples=config.n_samples, lr=config.lr,
            seed=config.seed, progress=progress,
        )  # fmt: skip
    initial = evaluate(config.eval_pairs)
    history = train_encoder(
        gen, enc, loss_fn, config.training(progress=progress), generator=g,
        eval_fn=(lambda: evaluate(config.eval_pairs)) if config.eval_every else None,
    )  # fmt: skip
    t_train = time.perf_counter() - t0
    enc.eval()
    final = evaluate(None)
    with torch.no_grad():
        mu_t, k_t = gen(x_eval)
        mu_hat, k_hat = enc(x_eval)
    if plot_path is not None:
        plot_recovery(mu_t, k_t, mu_hat, k_hat, plot_path, title=f"{config.loss}, D={config.dim}")
    return {
        "config": asdict(config),
        "metrics": final,
        "initial_metrics": initial,
        "kappa_hat_range": [float(k_hat.min()), float(k_hat.max())],
        "history": history,
        "generator": {"reinitialisations": gen.n_reinit, "min_cosine": gen.min_cosine},
        "mu_init_selection": selection,
        "seconds": {"train": t_train, "total": time.perf_counter() - t0},
    }
