"""Last-layer Laplace posterior of an embedding network: post-hoc and online LAM (LAM sec. 3).

The posterior over the parameters ``theta`` of the final ``nn.Linear`` (weight row-major, then
bias; ``parameters_to_vector`` order) is the diagonal Gaussian

    q(theta) = N(theta*, diag(beta * relu(H) + lambda)^-1)          (LAM eq. 3)

with ``H`` the accumulated (unclamped) contrastive GGN diagonal of :func:`ggn_diagonal`,
``beta`` the ``hessian_scale`` (post-hoc tempering, LAM Table 4) and ``lambda`` the prior
precision. The embedding is ``u = normalize(W phi + b)`` with ``phi`` the input of the last
layer; whatever the model does after that layer is not used (it is assumed to be the L2
normalisation or nothing).

Post-hoc mode (:class:`PosthocMetricLaplace`): :meth:`fit` sums ``H`` over the training set.
Online mode (:class:`OnlineMetricLaplace`): :meth:`~OnlineMetricLaplace.online_step` takes an
expected gradient over weight samples from ``q`` (LAM eq. 4) and updates
``H <- (1 - alpha) H + (N / b) relu(H_batch)`` (LAM eq. 5, each batch clamped as in eq. 9).

``hessian_structure="kron"`` replaces the diagonal by an EKFAC posterior
``N(theta*, (Q diag(beta relu(S) + lambda) Q^T)^-1)`` with ``Q = Q_G (x) Q_A`` the eigenbasis of
the nearest Kronecker product of the pair GGN (:mod:`bayesurl.laplace.kron`); ``H`` then holds
``S``, the exact GGN curvature along each direction of ``Q``, and every quantity above (prior,
evidence, samples, predictive) is taken in that basis. Online, the factors are refitted each
step by an ALS of ``(1 - alpha) C_old + (N / b) GGN_batch`` with ``C_old = Q diag(S) Q^T`` the
current EKFAC curvature, and ``S <- (1 - alpha) proj(S) + (N / b) relu(S_batch)`` with
``proj`` the exact diagonal of the old curvature in the new basis and the per-batch clamp of
LAM eq. 9. (A moving average of the factors alone, ``(1 - alpha) G (x) A``, gave 2-3x wrong
predictive traces for ``positive`` / ``full`` in ``benchmarks/laplace.py``; see the docs.)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from bayesurl._checks import check_finite, check_int, check_labels, check_tensor, match_module_dtype
from bayesurl._modules import eval_mode
from bayesurl.data.batch import unpack_batch
from bayesurl.laplace.curvature import (
    Approximation,
    Geometry,
    HessianStructure,
    _enum,
    clamped_fraction,
    ggn_diagonal_linear,
    split_pairs,
)
from bayesurl.laplace.kron import (
    KronPosterior,
    augment,
    cat_blocks,
    contrastive_blocks,
    linearised_trace,
    shift_blocks,
)
from bayesurl.types import Output

__all__ = [
    "LAPLACE_CLASSES",
    "BaseMetricLaplace",
    "DiagMetricLaplace",
    "DiagOnlineMetricLaplace",
    "DiagPosthocMetricLaplace",
    "KronMetricLaplace",
    "KronOnlineMetricLaplace",
    "KronPosthocMetricLaplace",
    "HessianMiner",
    "HessianPairs",
    "LaplaceMode",
    "MetricLaplace",
    "OnlineBatch",
    "OnlineScale",
    "OnlineMetricLaplace",
    "PosthocMetricLaplace",
    "kappa_from_trace",
    "loss_miner",
]

Miner = Callable[[Tensor, Tensor], tuple[Tensor, ...]]
#: maps a batch curvature to its mean over the processes of a data-parallel run
Reduce = Callable[[Tensor], Tensor]


class LaplaceMode(str, Enum):
    """When the posterior is formed: after training (``posthoc``) or during it (``online``)."""

    POSTHOC = "posthoc"
    ONLINE = "online"


class HessianPairs(str, Enum):
    """Which mined negative pairs enter the Hessian.

    The contrastive loss is flat for a negative pair outside the margin, so its GGN there is
    0 (``inside_margin``). The LAM code (``laplace_online_model.py`` lines 132-148,
    FrederikWarburg/bayesian-metric-learning e0188f4) passes every tuple its
    ``TripletMarginMiner`` returns to the Hessian calculator, which has no margin test
    (``all_mined``, default with the ``triplets`` miner of :class:`HessianMiner`: the pair set
    measured best on most of four roads, docs/concepts/laplace.rst, "Which pairs enter the
    Hessian").
    """

    INSIDE_MARGIN = "inside_margin"
    ALL_MINED = "all_mined"


class HessianMiner(str, Enum):
    """Which tuples of a batch the Hessian is mined from (when ``fit`` gets no ``miner``).

    ``hard``: the hardest positive and the hardest negative of every anchor (PML's
    ``BatchEasyHardMiner("hard", "hard")``). ``loss_pairs``: every positive pair and every
    negative pair inside the margin, the pairs with a non-zero contrastive loss (PML's
    ``PairMarginMiner(0, margin)``; LAM section 3, "Hard negative mining"). ``triplets``:
    the LAM code's ``TripletMarginMiner(margin, "all")``, every triplet with
    ``d(a, n) - d(a, p) < margin``, at most :data:`MAX_TRIPLETS` of them per batch (a
    seeded subsample, as the LAM code's ``max_pairs``; default).
    """

    HARD = "hard"
    LOSS_PAIRS = "loss_pairs"
    TRIPLETS = "triplets"


#: the LAM code's ``max_pairs``: triplets per batch that enter the Hessian
MAX_TRIPLETS = 5000


class _CappedMiner:
    """A PML miner whose triplets are subsampled to at most ``cap`` per batch (seeded)."""

    def __init__(self, miner: Miner, cap: int, seed: int = 0) -> None:
        self.miner, self.cap = miner, int(cap)
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, ...]:
        tup = self.miner(embeddings, labels)
        n = len(tup[0])
        if n <= self.cap:
            return tup
        keep = torch.randperm(n, generator=self.generator)[: self.cap].to(tup[0].device)
        return tuple(t[keep] for t in tup)


class OnlineScale(str, Enum):
    """How online LAM scales a batch's Hessian before adding it (LAM eq. 5).

    ``dataset_over_batch`` (default): ``N / b``, so a pass over the data adds what the
    post-hoc fit sums. ``dataset_squared_over_tuples``: ``N^2 / #tuples`` of the LAM code
    (``scale_hessian`` defaults to ``dataset_size ** 2``, line 51, and stochman's
    ``DiagLaplace.scale`` divides by ``min(n_triplets, max_pairs)``, line 149).
    """

    DATASET_OVER_BATCH = "dataset_over_batch"
    DATASET_SQUARED_OVER_TUPLES = "dataset_squared_over_tuples"


@dataclass
class OnlineBatch:
    """What the Hessian update of one online step needs (LAM eq. 5).

    Attributes
    ----------
    phi : Tensor
        ``[N, F]`` last-layer inputs, detached.
    pairs : tuple of Tensor
        The Hessian miner's indices tuple.
    thetas : Tensor
        ``[S, P]`` the last-layer draws of the step.
    scale : float
        ``dataset_size / batch_size``.
    n_pairs : int
        Pairs with a non-zero Hessian.
    """

    phi: Tensor
    pairs: tuple[Tensor, ...]
    thetas: Tensor
    scale: float
    n_pairs: int


def _progress(it: Iterable, enabled: bool, desc: str, total: int | None = None) -> Iterable:
    if not enabled:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, desc=desc, total=total, leave=False)


def loss_miner(margin: float) -> Miner:
    """PML's ``PairMarginMiner(0, margin)``: the pairs with a non-zero contrastive loss
    (LAM eq. 1), the loss pairs of contrastive and online LAM training."""
    from pytorch_metric_learning.miners import PairMarginMiner

    return PairMarginMiner(pos_margin=0.0, neg_margin=margin)


def _find_last_linear(model: nn.Module, last_layer: str | nn.Module | None) -> nn.Linear:
    if last_layer is None:
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise ValueError("`model` has no nn.Linear layer to use as the last layer")
        return linears[-1]
    if isinstance(last_layer, str):
        try:
            layer = model.get_submodule(last_layer)
        except AttributeError:
            raise ValueError(f"`last_layer`: model has no submodule {last_layer!r}") from None
    else:
        layer = last_layer
        if not any(m is layer for m in model.modules()):
            raise ValueError("`last_layer` is not a submodule of `model`")
    if not isinstance(layer, nn.Linear):
        raise ValueError(f"`last_layer` must be an nn.Linear, got {type(layer).__name__}")
    return layer


def kappa_from_trace(trace: Tensor, dim: int) -> Tensor:
    """vMF concentration moment-matched to an embedding covariance of trace ``trace``.

    For unit vectors ``E||u||^2 = 1``, so the mean resultant length of the predictive is
    ``R^2 = ||E u||^2 = 1 - tr Cov(u)`` to second order. The linearised trace exceeds 1 for
    broad posteriors, where ``1 - t`` would clip every input to the same ``kappa``; the
    matching ``R^2 = 1 / (1 + t)`` (equal to ``1 - t`` up to ``O(t^2)``) stays in ``(0, 1]``
    and keeps the ranking of inputs. Sra's approximation (docs/concepts/uncertainty.rst, "Samples";
    LAM section 3 "Von Mises-Fisher distribution") then gives ``kappa = R (D - R^2) / (1 - R^2)``.

    Parameters
    ----------
    trace : Tensor
        ``[N]`` trace ``t`` of the covariance of the normalised embedding (non-negative).
    dim : int
        Embedding dimension ``D``.

    Returns
    -------
    Tensor
        ``[N]`` concentration, positive (``inf`` where ``t = 0``).
    """
    check_finite(trace, "trace")
    t = trace.clamp_min(0.0)
    r2 = 1.0 / (1.0 + t)
    r = r2.sqrt()
    return r * (dim - r2) * (1.0 + t) / t


def _evidence_argmax(
    h: Tensor,
    theta2: float,
    bounds: tuple[float, float],
    n_iter: int,
    clamped: float | None = None,
) -> float:
    """Scalar ``lambda`` maximising ``-0.5 lam theta2 + 0.5 sum log(lam / (h + lam))``.

    The derivative ``0.5 (sum_i h_i / (lam (h_i + lam)) - theta2)`` decreases in ``lam``;
    its root is found by bisection on ``log lam``, clipped to ``bounds``. ``h`` holds the
    (clamped, scaled) curvature eigenvalues: the diagonal, or EKFAC's ``S``.
    """
    if not 0 < bounds[0] < bounds[1]:
        raise ValueError(f"`bounds` must be increasing positive numbers, got {bounds}")
    if not bool((h > 0).any()):
        frac = "" if clamped is None else f" (clamped fraction {clamped:.3f})"
        raise ValueError(
            f"the clamped Hessian is zero{frac}: the posterior equals the prior and the "
            "marginal likelihood has no maximum in `prior_precision`"
        )
    lo, hi = math.log(bounds[0]), math.log(bounds[1])

    def grad(log_lam: float) -> float:
        lam = math.exp(log_lam)
        return float((h / (lam * (h + lam))).sum()) - theta2

    if grad(hi) > 0:
        best = hi
    elif grad(lo) < 0:
        best = lo
    else:
        for _ in range(n_iter):
            mid = 0.5 * (lo + hi)
            if grad(mid) > 0:
                lo = mid
            else:
                hi = mid
        best = 0.5 * (lo + hi)
    return math.exp(best)


class BaseMetricLaplace:
    """Last-layer Laplace over an embedding network (LAM section 3, eq. 3).

    The lattice follows laplace-torch: a mode (:class:`PosthocMetricLaplace`,
    :class:`OnlineMetricLaplace`) and a Hessian structure (:class:`DiagMetricLaplace`,
    :class:`KronMetricLaplace`) combine into the four concrete classes of :data:`LAPLACE_CLASSES`.
    The structure classes implement the few steps where the posterior's basis matters (the
    prior in that basis, noise as parameters, accumulating the curvature, the closed-form
    predictive, persistence); everything else lives here. Use :func:`MetricLaplace` to build
    one. Parameters as in :func:`MetricLaplace`.
    """

    mode: ClassVar[str] = ""
    hessian_structure: ClassVar[HessianStructure]

    def __init__(
        self,
        model: nn.Module,
        last_layer: str | nn.Module | None = None,
        *,
        approximation: Approximation | str = "fixed",
        geometry: Geometry | str = "arccos",
        prior_precision: float | Tensor = 1.0,
        margin: float = 0.2,
        hessian_scale: float = 1.0,
        hessian_pairs: HessianPairs | str = HessianPairs.ALL_MINED,
        hessian_miner: HessianMiner | str = HessianMiner.TRIPLETS,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"`model` must be an nn.Module, got {type(model).__name__}")
        self.model = model
        self.last_layer = _find_last_linear(model, last_layer)
        self.approximation = _enum(Approximation, approximation, "approximation")
        self.geometry = _enum(Geometry, geometry, "geometry")
        if not float(margin) > 0:
            raise ValueError(f"`margin` must be positive, got {margin}")
        self.margin = float(margin)
        self.hessian_pairs = _enum(HessianPairs, hessian_pairs, "hessian_pairs")
        self.hessian_miner = _enum(HessianMiner, hessian_miner, "hessian_miner")
        self._miner: Miner | None = None
        if not float(hessian_scale) > 0:
            raise ValueError(f"`hessian_scale` must be positive, got {hessian_scale}")
        self.hessian_scale = float(hessian_scale)
        w = self.last_layer.weight
        self.n_params = sum(p.numel() for p in self.last_layer.parameters())
        self.hessian = torch.zeros(self.n_params, dtype=w.dtype, device=w.device)
        self.prior_precision = prior_precision
        self.n_pairs = 0
        #: one dict per fit / online epoch: pairs used and fraction of clamped entries
        self.fit_report: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ parameters
    @property
    def prior_precision(self) -> Tensor:
        """Prior precision ``lambda`` (scalar tensor or ``[P]``)."""
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value: float | Tensor) -> None:
        w = self.last_layer.weight
        t = torch.as_tensor(value, dtype=w.dtype, device=w.device).detach().clone()
        if t.ndim > 1 or (t.ndim == 1 and t.numel() not in (1, self.n_params)):
            raise ValueError(
                f"`prior_precision` must be a scalar or have {self.n_params} entries, "
                f"got shape {tuple(t.shape)}"
            )
        check_finite(t, "prior_precision")
        if bool((t <= 0).any()):
            raise ValueError("`prior_precision` must be positive")
        self._prior_precision = t.reshape(()) if t.numel() == 1 else t

    @property
    def mean(self) -> Tensor:
        """Posterior mean ``theta*``: the last layer's current parameters, ``[P]``."""
        return parameters_to_vector(self.last_layer.parameters()).detach()

    # ------------------------------------------------------------------ structure steps
    def _prior_in_basis(self, prior: Tensor) -> Tensor:
        """The prior's diagonal in the posterior's eigenbasis."""
        raise NotImplementedError

    def _to_params(self, x: Tensor) -> Tensor:
        """Eigenbasis coordinates ``[..., P]`` as parameter-vector offsets."""
        raise NotImplementedError

    def _posthoc_start(self, reset: bool) -> dict[str, Any]:
        """The post-hoc accumulator: from ``H = 0`` (``reset``) or the current ``H``."""
        return {"theta": self.mean, "reset": reset}

    def _posthoc_batch(self, acc: dict[str, Any], phi: Tensor, tup: tuple[Tensor, ...]) -> None:
        """Add one batch's pairs at the mean ``acc["theta"]`` to the post-hoc accumulator."""
        raise NotImplementedError

    def _posthoc_hessian(self, acc: dict[str, Any]) -> Tensor:
        """The curvature ``H`` of the post-hoc accumulator."""
        raise NotImplementedError

    def _online_hessian(self, batch: OnlineBatch, decay: float, reduce: Reduce | None) -> Tensor:
        """LAM eq. 5 for one batch: ``H`` decayed by ``decay`` plus the batch's curvature."""
        raise NotImplementedError

    def _closed_form(self, phi: Tensor, full: bool = False) -> tuple[Tensor, ...]:
        """``(u, tr Cov(u))`` (and ``Cov(u) [N, D, D]``) from last-layer inputs ``phi``."""
        raise NotImplementedError

    def _structure_state(self) -> dict[str, Any]:
        """What :meth:`state_dict` stores besides ``H`` for this structure."""
        return {}

    def _load_structure_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`_structure_state`."""

    def apply(self, fn: Callable[[Tensor], Tensor]) -> None:
        """Map every posterior tensor through ``fn`` (move / cast it with its model)."""
        self.hessian = fn(self.hessian)
        self.prior_precision = fn(self.prior_precision)

    @property
    def posterior_precision(self) -> Tensor:
        """``beta * relu(H) + lambda``, ``[P]``, in the posterior's eigenbasis.

        ``diag``: the parameters themselves. ``kron``: the directions ``Q_G (x) Q_A``
        (row-major ``[D, F']`` order), ``H`` the eigen-corrected curvature ``S`` and
        ``lambda`` the prior's diagonal in that basis (exact for a scalar prior).
        """
        prior = self._prior_in_basis(self.prior_precision)
        return self.hessian_scale * self.hessian.clamp_min(0.0) + prior

    @property
    def posterior_variance(self) -> Tensor:
        """Posterior variance ``1 / posterior_precision``, ``[P]`` (eigenbasis for ``kron``)."""
        return 1.0 / self.posterior_precision

    @property
    def clamped_fraction(self) -> float:
        """Fraction of entries of the accumulated ``H`` that the clamp at 0 removes."""
        return clamped_fraction(self.hessian)

    def _split(self, theta: Tensor) -> tuple[Tensor, Tensor | None]:
        d, f = self.last_layer.out_features, self.last_layer.in_features
        w = theta[..., : d * f].reshape(*theta.shape[:-1], d, f)
        b = theta[..., d * f :] if self.last_layer.bias is not None else None
        return w, b

    def _check_embedding_dim(self) -> None:
        """D = 1 has no direction to be uncertain about (u would be NaN)."""
        d = self.last_layer.out_features
        if d < 2:
            raise ValueError(
                f"`last_layer` has out_features={d}: the normalised embedding lives on "
                "S^0 = {-1, +1}, which has no direction to be uncertain about (u would be "
                "NaN); MetricLaplace needs an embedding dimension D >= 2 (pick the embedding "
                "layer with `last_layer=`)"
            )

    # ------------------------------------------------------------------ features
    @contextlib.contextmanager
    def _capture(self) -> Iterator[dict[str, Tensor]]:
        store: dict[str, Tensor] = {}

        def hook(module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            store["phi"] = inputs[0]

        handle = self.last_layer.register_forward_pre_hook(hook)
        try:
            yield store
        finally:
            handle.remove()

    def features(self, x: Any) -> Tensor:
        """Input ``phi [N, F]`` of the last layer for a batch ``x`` (one model forward pass).

        ``x`` is moved to the device of the last layer's weight (the model's device) and a
        floating ``x`` to the model's dtype (float64 batches into a float32 model work); NaN /
        inf in ``x`` raise naming ``x``.
        """
        if isinstance(x, Tensor):
            check_finite(x, "x")
            x = match_module_dtype(x.to(self.last_layer.weight.device), self.model)
        with self._capture() as store:
            self.model(x)
        if "phi" not in store:
            raise ValueError("`last_layer` was not called in the model's forward pass")
        phi = store["phi"]
        if phi.ndim != 2:
            raise ValueError(
                f"`last_layer` input must be [N, F] features, got shape {tuple(phi.shape)}"
            )
        return phi

    @property
    def hessian_margin(self) -> float:
        """The margin the Hessian applies to negative pairs (``inf``: every mined pair)."""
        if self.hessian_pairs is HessianPairs.ALL_MINED:
            return math.inf
        return self.margin

    def _default_miner(self) -> Miner:
        """The Hessian miner of :attr:`hessian_miner` (:class:`HessianMiner`), built once
        (the ``triplets`` subsample draws from one seeded stream per posterior)."""
        if self._miner is None:
            from pytorch_metric_learning import miners

            if self.hessian_miner is HessianMiner.HARD:
                self._miner = miners.BatchEasyHardMiner(pos_strategy="hard", neg_strategy="hard")
            elif self.hessian_miner is HessianMiner.LOSS_PAIRS:
                self._miner = loss_miner(self.margin)
            else:
                triplets = miners.TripletMarginMiner(margin=self.margin, type_of_triplets="all")
                self._miner = _CappedMiner(triplets, MAX_TRIPLETS)
        return self._miner

    @staticmethod
    def _loss_miner(margin: float) -> Miner:
        return loss_miner(margin)

    def _count_pairs(self, z: Tensor, tup: tuple[Tensor, ...]) -> int:
        a1, p, a2, n = split_pairs(tup, z.shape[0])
        count = a1.numel()
        if self.approximation is not Approximation.POSITIVE and a2.numel():
            u = F.normalize(z, dim=1)
            a2, n = a2.to(z.device), n.to(z.device)
            count += int(((u[a2] - u[n]).norm(dim=1) < self.hessian_margin).sum())
        return count

    # ------------------------------------------------------------------ post-hoc fit
    def fit(
        self,
        loader: Iterable[Any],
        miner: Miner | None = None,
        *,
        reset: bool = True,
        progress: bool = True,
    ) -> BaseMetricLaplace:
        """Accumulate the GGN diagonal over ``loader`` at the current weights (LAM eq. 3, 6).

        Parameters
        ----------
        loader : iterable of (x, y)
            Training batches with class labels.
        miner : callable, optional
            ``miner(embeddings, labels) -> indices_tuple`` (any PML miner). Default: the
            miner of :attr:`hessian_miner` (:class:`HessianMiner`); which of its negatives
            enter the Hessian is :attr:`hessian_pairs`. Pairs are formed within each batch.
        reset : bool
            Start from ``H = 0`` (default) or add to the current ``H``.
        progress : bool
            Show a tqdm bar.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            If no batch gave a pair, or the Hessian is not finite.
        """
        self._check_embedding_dim()
        miner = miner if miner is not None else self._default_miner()
        acc = self._posthoc_start(reset)
        n_pairs = 0
        total = len(loader) if hasattr(loader, "__len__") else None
        with eval_mode(self.model), torch.no_grad():
            for batch in _progress(loader, progress, "LAM fit", total):
                x, y = unpack_batch(batch, labels=True)
                phi = self.features(x)
                y = check_labels(y, phi.shape[0]).to(phi.device)
                z = F.linear(phi, self.last_layer.weight, self.last_layer.bias)
                tup = miner(F.normalize(z, dim=1), y)
                n_pairs += self._count_pairs(z, tup)
                self._posthoc_batch(acc, phi.to(acc["theta"].dtype), tup)
        if n_pairs == 0:
            raise ValueError(
                "`miner` returned no pairs with a non-zero Hessian over the whole `loader`; "
                "the posterior would equal the prior"
            )
        h = self._posthoc_hessian(acc)
        check_finite(h, "hessian")
        self.hessian = h
        self.n_pairs = n_pairs
        report = {"mode": "posthoc", "n_pairs": n_pairs, "clamped_fraction": self.clamped_fraction}
        self.fit_report.append({**report, **self._fit_extras()})
        return self

    def _fit_extras(self) -> dict[str, Any]:
        """Structure-specific entries of a post-hoc ``fit_report`` record."""
        return {}

    # ------------------------------------------------------------------ prior precision
    def log_marginal_likelihood(self, prior_precision: float | Tensor | None = None) -> Tensor:
        """The prior-precision-dependent part of the Laplace log evidence (LAM eq. 3).

        ``-0.5 sum lambda theta*^2 + 0.5 sum log lambda - 0.5 sum log(beta relu(H) + lambda)``;
        the training loss at ``theta*`` and the ``2 pi`` terms do not depend on ``lambda`` and
        are left out. For ``kron`` the last sum runs over the eigenbasis (the exact log
        determinant of the EKFAC precision for a scalar prior; a per-parameter prior enters
        through its diagonal in that basis).
        """
        lam = self.prior_precision if prior_precision is None else prior_precision
        lam = torch.as_tensor(lam, dtype=self.hessian.dtype, device=self.hessian.device)
        lam_basis = self._prior_in_basis(lam).expand(self.n_params)
        lam = lam.expand(self.n_params)
        theta = self.mean
        h = self.hessian_scale * self.hessian.clamp_min(0.0)
        return 0.5 * (-(lam * theta**2).sum() + lam.log().sum() - (h + lam_basis).log().sum())

    def optimize_prior_precision(
        self, bounds: tuple[float, float] = (1e-8, 1e8), n_iter: int = 200
    ) -> float:
        """Scalar prior precision maximising :meth:`log_marginal_likelihood`.

        The objective is concave in ``lambda`` with derivative
        ``0.5 (sum_i h_i / (lambda (h_i + lambda)) - ||theta*||^2)``, decreasing in
        ``lambda``, so its root is found by bisection on ``log lambda`` (clipped to
        ``bounds``). Sets and returns the new prior precision.

        Raises
        ------
        ValueError
            If every entry of ``H`` is clamped (the objective is then monotone).
        """
        h = (self.hessian_scale * self.hessian.clamp_min(0.0)).double()
        theta2 = float((self.mean.double() ** 2).sum())
        best = _evidence_argmax(h, theta2, bounds, n_iter, self.clamped_fraction)
        self.prior_precision = best
        return best

    # ------------------------------------------------------------------ prediction
    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws of the last layer's parameter vector from the posterior, ``[n, P]``."""
        check_int(n, "n", low=1)
        mean = self.mean
        eps = torch.randn(
            (int(n), mean.numel()), generator=generator, dtype=mean.dtype, device=mean.device
        )
        return mean + self._to_params(eps * self.posterior_variance.sqrt())

    def predictive_samples(
        self, x: Any, n: int = 100, generator: torch.Generator | None = None
    ) -> Tensor:
        """Normalised embeddings under ``n`` posterior weight samples, ``[n, N, D]``.

        Each draw is one sampled last layer applied to every input (LAM Fig. 2).
        """
        with eval_mode(self.model), torch.no_grad():
            phi = self.features(x)
            w, b = self._split(self.sample(n, generator))
            z = torch.einsum("nf,sdf->snd", phi.to(w.dtype), w)
            if b is not None:
                z = z + b[:, None, :]
            return F.normalize(z, dim=-1)

    def predictive_variance(self, x: Any) -> tuple[Tensor, Tensor]:
        """Closed-form mean and per-output variance of the unnormalised output ``z``.

        For ``z = W phi + b`` with independent Gaussian weights,
        ``var(z_d) = sum_f sigma^2_{W,df} phi_f^2 + sigma^2_{b,d}``, i.e.
        ``var = (phi^2) @ (sigma_W^2)^T + sigma_b^2`` (no sampling).

        Returns
        -------
        tuple of Tensor
            ``(z_mean [N, D], var [N, D])``.
        """
        with eval_mode(self.model), torch.no_grad():
            phi = self.features(x)
            return self._moments(phi)

    def predictive_covariance(self, x: Any) -> tuple[Tensor, Tensor]:
        """Mean embedding ``u [N, D]`` and its linearised covariance ``Cov(u) [N, D, D]``.

        ``Cov(u) = P Cov(z) P`` with ``P = (I - u u^T)/||z||`` and ``Cov(z)`` the closed-form
        output covariance of the last-layer posterior (diagonal in the outputs for ``diag``,
        ``Q_G diag(c) Q_G^T`` for ``kron``). Its trace is :meth:`predictive`'s.
        """
        with eval_mode(self.model), torch.no_grad():
            u, _, cov = self._closed_form(self.features(x), full=True)
        return u, cov

    def predictive(
        self,
        x: Any,
        n_samples: int = 0,
        generator: torch.Generator | None = None,
        *,
        u_from: str = "trace",
    ) -> Output:
        """Mean embedding and closed-form uncertainty of a batch (no sampling).

        The embedding is ``normalize(W* phi + b*)``. Its uncertainty pushes the closed-form
        output variance (:meth:`predictive_variance`) through the linearised normalisation,
        ``tr Cov(u) = sum_d var_d (1 - u_d^2) / ||z||^2``, and reports
        ``u = 1 / kappa`` with ``kappa`` the moment-matched vMF concentration of
        :func:`kappa_from_trace` (docs/concepts/uncertainty.rst, "Samples": ``u = 1/kappa_hat``).
        ``n_samples > 0`` also returns ``samples [S, N, D]`` from :meth:`predictive_samples` (for
        ECE).

        ``u_from="samples"`` (needs ``n_samples >= 2``) instead fits a vMF to the draws, as
        the LAM authors' code does (LAM section 3, "Von Mises-Fisher distribution"):
        ``R = ||mean_s u_s||`` and Sra's ``kappa = R (D - R^2) / (1 - R^2)``. It is a Monte
        Carlo estimate (noisy for few draws, biased towards certainty); the linearised
        trace, the default, needs no draws and ranks inputs the same way to second order.
        """
        if u_from not in ("trace", "samples"):
            raise ValueError(f"`u_from` must be 'trace' or 'samples', got {u_from!r}")
        if u_from == "samples" and check_int(n_samples, "n_samples") < 2:
            raise ValueError(f"`u_from='samples'` needs `n_samples` >= 2, got {n_samples}")
        self._check_embedding_dim()
        with eval_mode(self.model), torch.no_grad():
            phi = self.features(x)
            u, trace = self._closed_form(phi)
            kappa = kappa_from_trace(trace, u.shape[1])
            samples = None
            if n_samples > 0:
                w, b = self._split(self.sample(n_samples, generator))
                zs = torch.einsum("nf,sdf->snd", phi.to(w.dtype), w)
                if b is not None:
                    zs = zs + b[:, None, :]
                samples = F.normalize(zs, dim=-1)
                if u_from == "samples":
                    r2 = (samples.mean(dim=0) ** 2).sum(dim=-1).clamp(0.0, 1.0)
                    kappa = r2.sqrt() * (u.shape[1] - r2) / (1.0 - r2)
        return Output(embedding=u, uncertainty=1.0 / kappa, samples=samples, kappa=kappa)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Posterior state: ``H``, prior precision, mean and options (tensors, str, float)."""
        return {
            "hessian": self.hessian.clone(),
            "prior_precision": self.prior_precision.clone(),
            "mean": self.mean.clone(),
            "approximation": self.approximation.value,
            "geometry": self.geometry.value,
            "margin": self.margin,
            "hessian_scale": self.hessian_scale,
            "hessian_pairs": self.hessian_pairs.value,
            "hessian_miner": self.hessian_miner.value,
            "mode": self.mode,
            "n_pairs": self.n_pairs,
            "hessian_structure": self.hessian_structure.value,
            **self._structure_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (also writes ``mean`` into the last layer).

        Raises
        ------
        ValueError
            On missing keys, a size mismatch, non-finite tensors or another mode.
        """
        need = {"hessian", "prior_precision", "mean", "approximation", "geometry", "margin"}
        if not isinstance(state, dict) or not need <= set(state):
            missing = sorted(need - set(state)) if isinstance(state, dict) else sorted(need)
            raise ValueError(f"`state` is not a MetricLaplace state dict; missing {missing}")
        if state.get("mode", self.mode) != self.mode:
            raise ValueError(f"`state` is from mode {state['mode']!r}, this is {self.mode!r}")
        w = self.last_layer.weight
        h = check_tensor(state["hessian"], "state['hessian']", ndim=1).to(w.dtype)
        mean = check_tensor(state["mean"], "state['mean']", ndim=1).to(w.dtype)
        for name, t in (("hessian", h), ("mean", mean)):
            if t.numel() != self.n_params:
                raise ValueError(
                    f"`state['{name}']` has {t.numel()} entries, the last layer has "
                    f"{self.n_params} parameters"
                )
        structure = _enum(
            HessianStructure, state.get("hessian_structure", "diag"), "hessian_structure"
        )
        if structure is not self.hessian_structure:
            raise ValueError(
                f"`state` is a {structure.value!r} posterior, this is "
                f"{self.hessian_structure.value!r}"
            )
        self._load_structure_state(state)
        self.approximation = _enum(Approximation, state["approximation"], "approximation")
        self.geometry = _enum(Geometry, state["geometry"], "geometry")
        self.margin = float(state["margin"])
        self.hessian_scale = float(state.get("hessian_scale", 1.0))
        # a state saved before these options existed was fitted with the then defaults
        pairs = state.get("hessian_pairs", HessianPairs.INSIDE_MARGIN.value)
        self.hessian_pairs = _enum(HessianPairs, pairs, "hessian_pairs")
        miner = state.get("hessian_miner", HessianMiner.HARD.value)
        self.hessian_miner = _enum(HessianMiner, miner, "hessian_miner")
        self._miner = None
        self.prior_precision = state["prior_precision"]
        self.hessian = h.to(w.device).clone()
        self.n_pairs = int(state.get("n_pairs", 0))
        with torch.no_grad():
            vector_to_parameters(mean.to(w.device), self.last_layer.parameters())


class DiagMetricLaplace(BaseMetricLaplace):
    """Diagonal GGN posterior, LAM's own (section 3, eqs. 3 and 6-9).

    ``H`` holds the GGN diagonal of the last layer's parameters, so the posterior's basis is
    the parameters themselves.
    """

    hessian_structure = HessianStructure.DIAG

    def _prior_in_basis(self, prior: Tensor) -> Tensor:
        return prior

    def _to_params(self, x: Tensor) -> Tensor:
        return x

    def _batch_hessian(self, phi: Tensor, tup: tuple[Tensor, ...], theta: Tensor) -> Tensor:
        w, b = self._split(theta)
        return ggn_diagonal_linear(
            w,
            b,
            phi,
            tup,
            approximation=self.approximation,
            geometry=self.geometry,
            margin=self.hessian_margin,
            clamp=False,
        )

    def _posthoc_start(self, reset: bool) -> dict[str, Any]:
        acc = super()._posthoc_start(reset)
        acc["h"] = torch.zeros_like(self.hessian) if reset else self.hessian.clone()
        return acc

    def _posthoc_batch(self, acc: dict[str, Any], phi: Tensor, tup: tuple[Tensor, ...]) -> None:
        acc["h"] += self._batch_hessian(phi, tup, acc["theta"])

    def _posthoc_hessian(self, acc: dict[str, Any]) -> Tensor:
        return acc["h"]

    def _online_hessian(self, batch: OnlineBatch, decay: float, reduce: Reduce | None) -> Tensor:
        h_batch = torch.zeros_like(self.hessian)
        for theta in batch.thetas:
            h_batch += self._batch_hessian(batch.phi, batch.pairs, theta)
        h_batch /= batch.thetas.shape[0]
        if reduce is None:
            check_finite(h_batch, "hessian")
            return decay * self.hessian + batch.scale * h_batch.clamp_min(0.0)
        # scaled before the mean: a per-rank scale (the tuple count) still leaves one H
        h_batch = reduce(batch.scale * h_batch)
        check_finite(h_batch, "hessian")
        return decay * self.hessian + h_batch.clamp_min(0.0)

    def _moments(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        w_var, b_var = self._split(self.posterior_variance)
        phi = phi.to(w_var.dtype)
        z = F.linear(phi, self.last_layer.weight.detach(), self.last_layer.bias)
        var = (phi * phi) @ w_var.T
        if b_var is not None:
            var = var + b_var
        return z.detach(), var

    def _closed_form(self, phi: Tensor, full: bool = False) -> tuple[Tensor, ...]:
        """``tr Cov(u) = sum_d var_d (1 - u_d^2) / ||z||^2`` through the linearised
        normalisation ``P = (I - u u^T) / ||z||`` (and ``Cov(u) = P Cov(z) P`` with ``full``)."""
        z, var = self._moments(phi)
        norm2 = (z * z).sum(dim=1).clamp_min(torch.finfo(z.dtype).tiny)
        u = z / norm2.sqrt()[:, None]
        trace = (var * (1.0 - u * u)).sum(dim=1) / norm2
        if not full:
            return u, trace
        proj = torch.eye(z.shape[1], dtype=z.dtype, device=z.device) - u[:, :, None] * u[:, None]
        cov = torch.einsum("nde,ne,nfe->ndf", proj, var, proj) / norm2[:, None, None]
        return u, trace, cov


class KronMetricLaplace(BaseMetricLaplace):
    """EKFAC posterior ``N(theta*, (Q diag(beta relu(S) + lambda) Q^T)^-1)``.

    ``Q = Q_G (x) Q_A`` is the eigenbasis of the Frobenius-nearest Kronecker product of the
    pair GGN (:mod:`bayesurl.laplace.kron`); ``H`` holds ``S``, the exact GGN curvature
    along each direction of ``Q``. Post hoc, the layer inputs and pair blocks of the whole
    loader are cached (``N (F + 1)`` floats) for one ALS fit of the factors; online, each
    step refits them to the decayed EKFAC curvature plus the batch GGN.
    """

    hessian_structure = HessianStructure.KRON

    def __init__(self, model: nn.Module, last_layer: str | nn.Module | None = None, **kwargs: Any):
        super().__init__(model, last_layer, **kwargs)
        layer = self.last_layer
        #: the EKFAC eigenbasis; ``hessian`` holds the curvature ``S`` along its directions
        self._kron = KronPosterior(layer.out_features, layer.in_features, layer.bias is not None)
        #: ALS stopping rule of the Kronecker factors (``kron_factors``; None: by dtype)
        self.kron_max_iter: int = 100
        self.kron_tol: float | None = None
        #: start the ALS of an online update at the current ``A`` (False: from scratch, the
        #: A step at G = I; the warm start saved no iterations in benchmarks/laplace.py)
        self.kron_warm_start = False
        self._kron_info: dict[str, Any] = {}

    def _prior_in_basis(self, prior: Tensor) -> Tensor:
        return self._kron.prior_in_basis(prior)

    def _to_params(self, x: Tensor) -> Tensor:
        return self._kron.to_params(x)

    def _kron_blocks(self, phi: Tensor, tup: tuple[Tensor, ...], thetas: Tensor, weight: float):
        """Low-rank pair blocks at each parameter vector of ``thetas [S, P]`` (weight / S)."""
        parts = []
        for theta in thetas:
            w, b = self._split(theta)
            z = F.linear(phi, w, b)
            parts.append(
                contrastive_blocks(
                    z,
                    tup,
                    approximation=self.approximation,
                    geometry=self.geometry,
                    margin=self.hessian_margin,
                    weight=weight / thetas.shape[0],
                )
            )
        return cat_blocks(parts)

    def _kron_update(self, blocks, inputs: Tensor, decay: float, clamp_batch: bool) -> Tensor:
        h, info = self._kron.update(
            blocks,
            inputs,
            self.hessian,
            decay=decay,
            clamp_batch=clamp_batch,
            warm_start=self.kron_warm_start,
            max_iter=self.kron_max_iter,
            tol=self.kron_tol,
        )
        self._kron_info = info
        return h

    def _posthoc_start(self, reset: bool) -> dict[str, Any]:
        return {**super()._posthoc_start(reset), "inputs": [], "blocks": [], "offset": 0}

    def _posthoc_batch(self, acc: dict[str, Any], phi: Tensor, tup: tuple[Tensor, ...]) -> None:
        pair_blocks = self._kron_blocks(phi, tup, acc["theta"][None], 1.0)
        acc["blocks"].append(shift_blocks(pair_blocks, acc["offset"]))
        acc["inputs"].append(augment(phi, self.last_layer.bias is not None))
        acc["offset"] += phi.shape[0]

    def _posthoc_hessian(self, acc: dict[str, Any]) -> Tensor:
        decay = 0.0 if acc["reset"] else 1.0
        blocks, inputs = cat_blocks(acc["blocks"]), torch.cat(acc["inputs"])
        return self._kron_update(blocks, inputs, decay, clamp_batch=False)

    def _fit_extras(self) -> dict[str, Any]:
        return {"als_iterations": self._kron_info.get("n_iter")}

    def _online_hessian(self, batch: OnlineBatch, decay: float, reduce: Reduce | None) -> Tensor:
        if reduce is not None:
            raise ValueError(
                "the online `kron` update refits its factors to the batch's pairs and inputs; "
                "it has no data-parallel reduction (use hessian_structure='diag')"
            )
        blocks = self._kron_blocks(batch.phi, batch.pairs, batch.thetas, batch.scale)
        fitted = self._kron.fitted
        if blocks.i.numel() == 0 and not fitted:
            return self.hessian  # nothing seen yet: the posterior stays the prior
        inputs = augment(batch.phi, self.last_layer.bias is not None)
        return self._kron_update(blocks, inputs, decay=decay if fitted else 0.0, clamp_batch=True)

    def _kron_moments(self, phi: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(z, Q_G, c)`` with ``Cov(z) = Q_G diag(c) Q_G^T`` (closed form)."""
        var = self.posterior_variance
        phi = phi.to(var.dtype)
        z = F.linear(phi, self.last_layer.weight.detach(), self.last_layer.bias)
        c = self._kron.output_variances(phi, var)
        return z.detach(), self._kron.basis(var)[0], c

    def _moments(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        z, q_g, c = self._kron_moments(phi)
        return z, c @ (q_g * q_g).T

    def _closed_form(self, phi: Tensor, full: bool = False) -> tuple[Tensor, ...]:
        """:func:`~bayesurl.laplace.kron.linearised_trace` with ``Cov(z) = Q_G diag(c) Q_G^T``."""
        z, q_g, c = self._kron_moments(phi)
        return linearised_trace(z, q_g, c, full=full)

    def _structure_state(self) -> dict[str, Any]:
        return self._kron.state_dict(self.hessian)

    def _load_structure_state(self, state: dict[str, Any]) -> None:
        w = self.last_layer.weight
        self._kron.load_state_dict(state, w.dtype, w.device)

    def apply(self, fn: Callable[[Tensor], Tensor]) -> None:
        super().apply(fn)
        self._kron.apply(fn)


class PosthocMetricLaplace(BaseMetricLaplace):
    """Post-hoc LAM: :meth:`fit` once at the trained weights (LAM section 3, eq. 3)."""

    mode = LaplaceMode.POSTHOC.value


class OnlineMetricLaplace(BaseMetricLaplace):
    """Online LAM: expected-gradient training with a running Hessian (LAM eqs. 4-5).

    Parameters
    ----------
    model, last_layer, **kwargs
        As :func:`MetricLaplace`.
    alpha : float
        Memory of the running Hessian, ``H <- (1 - alpha) H + scale relu(H_batch)`` (LAM
        eq. 5; default 1e-3).
    dataset_size : int, optional
        ``N`` of the batch scale (:class:`OnlineScale`); needed before :meth:`online_loss`.
    n_weight_samples : int
        Last layers drawn per batch for the expected gradient (LAM eq. 4; default 1).
    init_hessian : float
        The start value of every entry of ``H``: 0 by default; the LAM code starts at
        ``dataset_size`` (stochman's ``init_hessian``).
    online_scale : OnlineScale or str
        How a batch's Hessian is scaled before it is added (:class:`OnlineScale`).
    """

    mode = LaplaceMode.ONLINE.value

    def __init__(
        self,
        model: nn.Module,
        last_layer: str | nn.Module | None = None,
        *,
        alpha: float = 1e-3,
        dataset_size: int | None = None,
        n_weight_samples: int = 1,
        init_hessian: float = 0.0,
        online_scale: OnlineScale | str = OnlineScale.DATASET_OVER_BATCH,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, last_layer, **kwargs)
        if not (math.isfinite(float(init_hessian)) and float(init_hessian) >= 0):
            raise ValueError(f"`init_hessian` must be finite and >= 0, got {init_hessian}")
        self.hessian.fill_(float(init_hessian))
        self.online_scale = _enum(OnlineScale, online_scale, "online_scale")
        if not 0.0 <= float(alpha) <= 1.0:
            raise ValueError(f"`alpha` must be in [0, 1], got {alpha}")
        check_int(n_weight_samples, "n_weight_samples", low=1)
        if dataset_size is not None:
            check_int(dataset_size, "dataset_size", low=1)
        self.alpha = float(alpha)
        self.dataset_size = None if dataset_size is None else int(dataset_size)
        self.n_weight_samples = int(n_weight_samples)
        self._loss_fn: Callable[..., Tensor] | None = None
        #: the batch of the last :meth:`online_loss` whose Hessian update is due
        self.pending: OnlineBatch | None = None

    def _default_loss(self) -> Callable[..., Tensor]:
        if self._loss_fn is None:
            from bayesurl.losses.contrastive import ContrastiveLoss

            self._loss_fn = ContrastiveLoss(margin=self.margin)
        return self._loss_fn

    def online_loss(
        self,
        x: Any,
        y: Tensor,
        *,
        miner: Miner | None = None,
        hessian_miner: Miner | None = None,
        loss_fn: Callable[..., Tensor] | None = None,
        generator: torch.Generator | None = None,
        update_hessian: bool = True,
    ) -> Tensor:
        """Expected online-LAM loss of a batch, updating ``H`` (LAM eqs. 4-5).

        For any training loop: return it from a method's ``training_loss``; the loop's
        backward and optimizer step then take the expected-gradient step of eq. 4 (this is
        what :meth:`online_step` does). With ``update_hessian=False`` step 3 waits for
        :meth:`update_hessian` (a training hook calls it after the backward pass).

        1. Mine loss pairs on the mean embeddings with ``miner`` (default
           :func:`loss_miner`, as :func:`~bayesurl.laplace.train_contrastive`) and Hessian
           pairs with ``hessian_miner`` (default as in :meth:`fit`).
        2. Draw ``n_weight_samples`` last layers ``theta_s ~ N(theta, (beta relu(H) +
           lambda)^-1)`` by reparameterisation and average ``loss_fn(u_s, y, pairs)`` over
           them; its gradient is the expected gradient of eq. 4 (the backbone runs once;
           only the last layer is resampled).
        3. ``H <- (1 - alpha) H + (dataset_size / batch_size) relu(mean_s H_batch(theta_s))``
           with ``H_batch`` the GGN diagonal of the mined pairs (eq. 5). Each batch's
           Hessian is clamped at 0 before it enters the running sum (the ReLU of LAM
           section 3, "Ensuring positive definiteness", applied per step as LAM eq. 9 and
           the ``torch.relu(hessian)`` added every step by the authors' online model since
           their commit e57a3c8, ``laplace_online_model.py`` line 157): clamping only the
           total would let negative batch curvature (``fixed`` / ``full``) cancel earlier
           positive curvature, so ``H`` stays entry-wise non-negative at every step. The
           LAM code scales by ``N^2 / #tuples`` and starts ``H`` at ``N``: ``online_scale``
           and ``init_hessian``.

        Parameters
        ----------
        x, y : Tensor
            Batch and labels.
        miner : callable, optional
            PML miner of the loss pairs; default ``PairMarginMiner(0, margin)``.
        hessian_miner : callable, optional
            PML miner of the Hessian pairs; default as in :meth:`fit`.
        loss_fn : callable, optional
            ``loss_fn(embeddings, labels, indices_tuple)``; default
            :class:`bayesurl.losses.contrastive.ContrastiveLoss` with this margin.
        generator : torch.Generator, optional
            For the weight draws.
        update_hessian : bool
            Take step 3 now (default) or keep the batch for :meth:`update_hessian`.

        Returns
        -------
        Tensor
            Scalar loss averaged over weight samples, with its autograd graph.
        """
        self._check_embedding_dim()
        if self.dataset_size is None:
            raise ValueError("`dataset_size` must be set for online LAM (H_batch is scaled N/b)")
        miner = miner if miner is not None else self._loss_miner(self.margin)
        hessian_miner = hessian_miner if hessian_miner is not None else self._default_miner()
        loss_fn = loss_fn if loss_fn is not None else self._default_loss()
        phi = self.features(x)
        y = check_labels(y, phi.shape[0], "y").to(phi.device)
        with torch.no_grad():
            z_mean = F.linear(phi, self.last_layer.weight, self.last_layer.bias)
            u_mean = F.normalize(z_mean, dim=1)
            tup = miner(u_mean, y)
            h_tup = hessian_miner(u_mean, y)
            noise = self._weight_noise(generator)
        loss = self._expected_loss(phi, y, tup, noise, loss_fn)
        with torch.no_grad():
            self.pending = self._online_batch(phi, z_mean, h_tup, noise)
        if update_hessian:
            self.update_hessian()
        return loss

    def _weight_noise(self, generator: torch.Generator | None) -> Tensor:
        """``[S, P]`` draws of ``theta_s - theta ~ N(0, posterior covariance)``, as parameters."""
        std = self.posterior_variance.sqrt()
        eps = torch.randn(
            (self.n_weight_samples, self.n_params),
            generator=generator,
            dtype=std.dtype,
            device=std.device,
        )
        return self._to_params(eps * std)

    def _expected_loss(
        self,
        phi: Tensor,
        y: Tensor,
        tup: tuple[Tensor, ...],
        noise: Tensor,
        loss_fn: Callable[..., Tensor],
    ) -> Tensor:
        """Mean of ``loss_fn`` over the last layers ``theta + noise_s`` (LAM eq. 4), with its
        autograd graph through ``phi`` and ``theta``."""
        weight, bias = self.last_layer.weight, self.last_layer.bias
        w_noise, b_noise = self._split(noise)
        loss = phi.new_zeros(())
        for s in range(self.n_weight_samples):
            z = F.linear(phi, weight + w_noise[s], None if bias is None else bias + b_noise[s])
            loss = loss + loss_fn(F.normalize(z, dim=1), y, tup)
        return loss / self.n_weight_samples

    def _online_batch(
        self, phi: Tensor, z_mean: Tensor, h_tup: tuple[Tensor, ...], noise: Tensor
    ) -> OnlineBatch:
        """What :meth:`update_hessian` needs of this batch: features, pairs, sampled weights."""
        weight, bias = self.last_layer.weight, self.last_layer.bias
        theta = parameters_to_vector([weight, bias] if bias is not None else [weight])
        return OnlineBatch(
            phi=phi.detach().to(theta.dtype),
            pairs=h_tup,
            thetas=theta + noise,
            scale=self._batch_scale(phi.shape[0], h_tup),
            n_pairs=self._count_pairs(z_mean, h_tup),
        )

    def _batch_scale(self, batch_size: int, tup: tuple[Tensor, ...]) -> float:
        """``N / b`` or the LAM code's ``N^2 / #tuples`` (:class:`OnlineScale`)."""
        n = float(self.dataset_size)
        if self.online_scale is OnlineScale.DATASET_OVER_BATCH:
            return n / batch_size
        n_tuples = len(tup[0]) if len(tup) == 3 else len(tup[0]) + len(tup[2])
        return n * n / max(n_tuples, 1)

    def update_hessian(self, reduce: Reduce | None = None) -> None:
        """Step 3 of :meth:`online_loss` for its last batch (LAM eq. 5).

        Parameters
        ----------
        reduce : callable, optional
            Maps the scaled batch curvature to its mean over the processes of a data-parallel
            run (each process saw one shard of the global batch; ``diag`` only), so every
            process keeps the same ``H``.

        Raises
        ------
        ValueError
            If no batch is pending (call :meth:`online_loss` first), or ``reduce`` is given
            for a ``kron`` posterior.
        """
        batch, self.pending = self.pending, None
        if batch is None:
            raise ValueError("no batch to update the Hessian with; call `online_loss` first")
        with torch.no_grad():
            h = self._online_hessian(batch, 1.0 - self.alpha, reduce)
        check_finite(h, "hessian")
        self.hessian = h
        self.n_pairs = batch.n_pairs

    def online_step(
        self,
        x: Any,
        y: Tensor,
        optimizer: torch.optim.Optimizer,
        *,
        miner: Miner | None = None,
        hessian_miner: Miner | None = None,
        loss_fn: Callable[..., Tensor] | None = None,
        generator: torch.Generator | None = None,
    ) -> float:
        """One online-LAM training step (LAM eqs. 4-5): :meth:`online_loss`, backward, step.

        Parameters as in :meth:`online_loss`, plus the ``optimizer`` over the model's
        parameters (including the last layer). Returns the batch loss averaged over weight
        samples.
        """
        loss = self.online_loss(
            x, y, miner=miner, hessian_miner=hessian_miner, loss_fn=loss_fn, generator=generator
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return float(loss.detach())


class DiagPosthocMetricLaplace(PosthocMetricLaplace, DiagMetricLaplace):
    """Post-hoc LAM with the diagonal GGN (LAM section 3)."""


class KronPosthocMetricLaplace(PosthocMetricLaplace, KronMetricLaplace):
    """Post-hoc LAM with the EKFAC posterior."""


class DiagOnlineMetricLaplace(OnlineMetricLaplace, DiagMetricLaplace):
    """Online LAM with the diagonal GGN (LAM eqs. 4-5)."""


class KronOnlineMetricLaplace(OnlineMetricLaplace, KronMetricLaplace):
    """Online LAM with the EKFAC posterior."""


#: the concrete class of each ``(mode, hessian_structure)``, read by :func:`MetricLaplace`
LAPLACE_CLASSES: dict[tuple[LaplaceMode, HessianStructure], type[BaseMetricLaplace]] = {
    (LaplaceMode.POSTHOC, HessianStructure.DIAG): DiagPosthocMetricLaplace,
    (LaplaceMode.POSTHOC, HessianStructure.KRON): KronPosthocMetricLaplace,
    (LaplaceMode.ONLINE, HessianStructure.DIAG): DiagOnlineMetricLaplace,
    (LaplaceMode.ONLINE, HessianStructure.KRON): KronOnlineMetricLaplace,
}


def MetricLaplace(  # noqa: N802 - factory named like the class it returns (laplace-torch style)
    model: nn.Module,
    last_layer: str | nn.Module | None = None,
    *,
    approximation: Approximation | str = "fixed",
    geometry: Geometry | str = "arccos",
    prior_precision: float | Tensor = 1.0,
    mode: str = "posthoc",
    margin: float = 0.2,
    hessian_scale: float = 1.0,
    hessian_structure: HessianStructure | str = "diag",
    hessian_pairs: HessianPairs | str = HessianPairs.ALL_MINED,
    hessian_miner: HessianMiner | str = HessianMiner.TRIPLETS,
    **online_kwargs: Any,
) -> BaseMetricLaplace:
    """Last-layer Laplace for metric learning, laplace-torch style (LAM section 3).

    Parameters
    ----------
    model : nn.Module
        Embedding network whose last ``nn.Linear`` produces the unnormalised embedding.
    last_layer : str, nn.Linear or None
        Name or module of the last layer; default: the last ``nn.Linear`` of ``model.modules()``.
    approximation : {"fixed", "positive", "full"}
        PSD fix of the output Hessian (LAM eqs. 7-9); ``fixed`` is LAM's best (Table 1).
    geometry : {"arccos", "euclidean"}
        Normalisation inside the loss or linearised in the model (LAM section 3).
    prior_precision : float or Tensor
        ``lambda``; tune it post hoc with ``optimize_prior_precision``.
    mode : {"posthoc", "online"}
        :class:`PosthocMetricLaplace` or :class:`OnlineMetricLaplace` (:class:`LaplaceMode`).
    margin : float
        Negative margin of the contrastive loss.
    hessian_scale : float
        ``beta`` multiplying the Hessian in the posterior precision (LAM Table 4 tempering).
    hessian_structure : {"diag", "kron"}
        :class:`DiagMetricLaplace` (LAM's diagonal GGN) or :class:`KronMetricLaplace` (EKFAC);
        with ``mode`` it picks the class of :data:`LAPLACE_CLASSES`, all with the same methods.
    hessian_pairs : {"all_mined", "inside_margin"}
        :class:`HessianPairs`: every mined pair enters (default, the LAM code) or negatives
        outside the margin contribute nothing (the GGN of the loss).
    hessian_miner : {"triplets", "hard", "loss_pairs"}
        :class:`HessianMiner`: the tuples the Hessian is mined from when ``fit`` (or
        ``online_loss``) gets no miner of its own; the default (the LAM code's triplets) was
        chosen by measurement (docs/concepts/laplace.rst, "Which pairs enter the Hessian").
    **online_kwargs
        Online mode only: the options of :class:`OnlineMetricLaplace` (``alpha``,
        ``dataset_size``, ``n_weight_samples``, ``init_hessian``, ``online_scale``).

    Returns
    -------
    BaseMetricLaplace

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> la = MetricLaplace(net, approximation="positive", geometry="euclidean")
    >>> x, y = torch.randn(16, 4), torch.arange(16) % 4
    >>> la = la.fit([(x, y)], progress=False)
    >>> la.predictive(x).uncertainty.shape
    torch.Size([16])
    """
    mode_ = _enum(LaplaceMode, mode, "mode")
    structure = _enum(HessianStructure, hessian_structure, "hessian_structure")
    if mode_ is LaplaceMode.POSTHOC and online_kwargs:
        raise ValueError(f"options {sorted(online_kwargs)} are for mode='online' only")
    return LAPLACE_CLASSES[mode_, structure](
        model,
        last_layer,
        approximation=approximation,
        geometry=geometry,
        prior_precision=prior_precision,
        margin=margin,
        hessian_scale=hessian_scale,
        hessian_pairs=hessian_pairs,
        hessian_miner=hessian_miner,
        **online_kwargs,
    )
