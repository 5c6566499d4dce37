"""Gaussians fitted to a reference set of features: class-conditional or k-means components.

The densities behind two training-free uncertainty scores of pretrained features:

- **Mahalanobis distance** (Lee et al., 2018, "A simple unified framework for detecting
  out-of-distribution samples and adversarial attacks", eq. 2): one Gaussian per class with a
  covariance shared by all classes, ``u(x) = min_c (x - mu_c)^T Sigma^-1 (x - mu_c)``;
- **feature-space density** (Mukhoti et al., 2023, "Deep deterministic uncertainty: a new
  simple baseline", DDU): one Gaussian per class with its own covariance (Gaussian
  discriminant analysis), ``u(x) = -log q(x) = -log sum_c pi_c N(x; mu_c, Sigma_c)``.

Everything is computed in float64 on the device of the features:

- covariances are accumulated from centred rows (two passes over the in-memory features: the
  means, then the scatter), chunk by chunk, so the ``[N, D]`` float64 copy is never formed;
- at ``D`` in the thousands and a few hundred points per class the empirical covariance is
  singular, so it is shrunk towards a scaled identity,
  ``Sigma = (1 - a) S + a (tr S / D) I`` (:func:`shrunk_covariance`), with the
  Ledoit-Wolf intensity ``a`` (Ledoit & Wolf, 2004, "A well-conditioned estimator for
  large-dimensional covariance matrices"; scikit-learn's ``LedoitWolf`` estimator) or a
  given one;
- a covariance is kept as its Cholesky factor ``L`` (``Sigma = L L^T``): squared Mahalanobis
  distances are ``||L^-1 (x - mu)||^2`` by triangular solves, log-determinants
  ``2 sum log diag L``; no inverse is formed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from bayesurl._checks import (
    check_finite,
    check_floating,
    check_int,
    check_min_points,
    check_ndim,
    check_number,
)

__all__ = [
    "MIN_POINTS",
    "GaussianMixture",
    "check_shrinkage",
    "fit_gaussians",
    "kmeans",
    "kmeans_plus_plus",
    "ledoit_wolf_shrinkage",
    "shrunk_covariance",
]

#: Fewest points a component needs: a class mean and the pooled covariance (``"tied"``), or a
#: covariance of its own (``"full"``: at 2 points the two centred rows are opposite and the
#: Ledoit-Wolf intensity is exactly 0, so a singular covariance stays singular; 3 give it > 0).
MIN_POINTS = {"tied": 2, "full": 3}
#: rows per chunk of the float64 passes (a ``[ROWS, D]`` float64 block: 40 MiB at D = 1,280)
ROWS = 4096
_LOG_2PI = math.log(2 * math.pi)


def _chunks(n: int, rows: int = ROWS) -> Iterator[slice]:
    for lo in range(0, n, rows):
        yield slice(lo, min(lo + rows, n))


@dataclass
class _Scatter:
    """Sums of centred rows ``y``: ``sum y y^T`` (float64), ``sum ||y||^4`` and the count."""

    scatter: Tensor
    quartic: float = 0.0
    n: int = 0

    def add(self, y: Tensor) -> None:
        self.scatter.addmm_(y.T, y)
        self.quartic += float((y * y).sum(1).square().sum())
        self.n += int(y.shape[0])


def ledoit_wolf_shrinkage(scatter: Tensor, quartic: float, n: int) -> float:
    """The Ledoit-Wolf shrinkage intensity of centred data from its sums.

    With ``S = scatter / n`` (the empirical covariance of ``n`` centred rows ``y_i``),
    ``mu = tr S / D``, ``beta = (sum ||y_i||^4 / n - ||S||_F^2) / (D n)`` and
    ``delta = ||S - mu I||_F^2 / D``, the intensity is ``min(beta, delta) / delta`` (Ledoit &
    Wolf, 2004, lemma 3.2 and theorem 3.2 in scikit-learn's finite-sample form,
    ``sklearn.covariance.ledoit_wolf_shrinkage``); 0 when ``S`` is a multiple of ``I``.

    Parameters
    ----------
    scatter : Tensor
        ``sum_i y_i y_i^T`` ``[D, D]`` of centred rows (float64).
    quartic : float
        ``sum_i ||y_i||^4``.
    n : int
        The number of rows.

    Returns
    -------
    float
        The intensity in ``[0, 1]``.
    """
    check_ndim(scatter, "scatter", 2)
    if scatter.shape[0] != scatter.shape[1]:
        raise ValueError(f"`scatter` must be square [D, D], got {tuple(scatter.shape)}")
    n = check_int(n, "n", low=1)
    d = scatter.shape[0]
    if d == 1:
        return 0.0
    s = scatter / n
    trace = float(torch.diagonal(s).sum())
    mu = trace / d
    delta_ = float(s.square().sum())
    beta = (quartic / n - delta_) / (d * n)
    delta = (delta_ - 2.0 * mu * trace + d * mu * mu) / d
    if delta <= 0.0:
        return 0.0
    beta = min(max(beta, 0.0), delta)
    return beta / delta


def shrunk_covariance(scatter: Tensor, n: int, shrinkage: float) -> Tensor:
    """``(1 - a) S + a (tr S / D) I`` with ``S = scatter / n`` (scikit-learn's
    ``shrunk_covariance``)."""
    s = scatter / n
    d = s.shape[0]
    out = s.mul(1.0 - shrinkage)
    out.diagonal().add_(shrinkage * float(torch.diagonal(s).sum()) / d)
    return out


def check_shrinkage(shrinkage: str | float, name: str = "shrinkage") -> str | float:
    """``"ledoit_wolf"`` (any case, ``-`` or ``_``) or a number in ``[0, 1]``; else ValueError
    naming ``name``."""
    if isinstance(shrinkage, str):
        if shrinkage.lower().replace("-", "_") != "ledoit_wolf":
            raise ValueError(
                f"`{name}` must be 'ledoit_wolf' or a number in [0, 1], got {shrinkage!r}"
            )
        return "ledoit_wolf"
    return check_number(shrinkage, name, low=0.0, high=1.0)


@dataclass
class GaussianMixture:
    """``sum_k pi_k N(mu_k, Sigma_k)`` with each ``Sigma_k = L_k L_k^T`` kept as its Cholesky
    factor (float64).

    Parameters
    ----------
    means : Tensor
        ``[K, D]``.
    scale_tril : Tensor
        ``[K, D, D]`` lower-triangular factors, or ``[1, D, D]``: one covariance shared by
        every component (tied).
    log_weights : Tensor
        ``[K]`` log mixing weights ``log pi_k``.
    """

    means: Tensor
    scale_tril: Tensor
    log_weights: Tensor

    @property
    def tied(self) -> bool:
        """One covariance for every component."""
        return self.scale_tril.shape[0] == 1 and self.means.shape[0] > 1

    def log_det(self) -> Tensor:
        """``log det Sigma_k`` ``[K]`` (or ``[1]`` tied): ``2 sum log diag L_k``."""
        return 2.0 * torch.diagonal(self.scale_tril, dim1=-2, dim2=-1).log().sum(-1)

    def mahalanobis(self, x: Tensor) -> Tensor:
        """Squared Mahalanobis distances ``(x - mu_k)^T Sigma_k^-1 (x - mu_k)`` ``[N, K]``.

        Float64 on the mixture's device, by triangular solves in chunks of rows: tied, one
        solve ``L^-1 x`` and the differences to the whitened means; otherwise one solve of
        ``x - mu_k`` per component.
        """
        check_ndim(x, "x", 2)
        means, tril = self.means, self.scale_tril
        if x.shape[1] != means.shape[1]:
            raise ValueError(
                f"`x` has {x.shape[1]} features, the Gaussians were fitted on {means.shape[1]}"
            )
        out = torch.empty(x.shape[0], means.shape[0], dtype=torch.float64, device=means.device)
        white_means = (
            torch.linalg.solve_triangular(tril[0], means.T, upper=False) if self.tied else None
        )
        for rows in _chunks(x.shape[0]):
            xb = x[rows].to(device=means.device, dtype=torch.float64)
            if white_means is not None:
                z = torch.linalg.solve_triangular(tril[0], xb.T, upper=False)
                for k in range(means.shape[0]):
                    out[rows, k] = (z - white_means[:, k : k + 1]).square().sum(0)
                continue
            for k in range(means.shape[0]):
                z = torch.linalg.solve_triangular(tril[k], (xb - means[k]).T, upper=False)
                out[rows, k] = z.square().sum(0)
        return out

    def component_log_prob(self, x: Tensor) -> Tensor:
        """``log pi_k + log N(x; mu_k, Sigma_k)`` ``[N, K]`` (float64)."""
        d = self.means.shape[1]
        log_norm = -0.5 * (d * _LOG_2PI + self.log_det())
        return self.log_weights + log_norm - 0.5 * self.mahalanobis(x)

    def log_prob(self, x: Tensor) -> Tensor:
        """``log sum_k pi_k N(x; mu_k, Sigma_k)`` ``[N]`` (float64; scikit-learn's
        ``GaussianMixture.score_samples``)."""
        return torch.logsumexp(self.component_log_prob(x), dim=1)


def fit_gaussians(
    x: Tensor,
    labels: Tensor,
    *,
    covariance: str = "full",
    shrinkage: str | float = "ledoit_wolf",
    name: str = "labels",
) -> tuple[GaussianMixture, dict[str, object]]:
    """One Gaussian per label of ``x``: the means, covariance(s) and weights ``n_k / N``.

    ``covariance="tied"`` pools the class-centred scatter into one covariance
    ``S = (1/N) sum_c sum_{i in c} (x_i - mu_c)(x_i - mu_c)^T`` (Lee et al., 2018, eq. 2;
    scikit-learn: ``EmpiricalCovariance(assume_centered=True)`` /
    ``LedoitWolf(assume_centered=True)`` of the class-centred rows); ``"full"`` gives each
    class its own, ``S_c = (1/n_c) sum_{i in c} (x_i - mu_c)(x_i - mu_c)^T`` (DDU's Gaussian
    discriminant analysis; scikit-learn: ``LedoitWolf()`` of the class's rows). Each is shrunk
    (:func:`shrunk_covariance`) and factored by Cholesky, in float64.

    Parameters
    ----------
    x : Tensor
        ``[N, D]`` reference features (any floating dtype; read in float64 chunks).
    labels : Tensor
        ``[N]`` integer component of each row (classes, or k-means clusters).
    covariance : {"full", "tied"}
        A covariance per component, or one shared.
    shrinkage : "ledoit_wolf" or float
        The Ledoit-Wolf intensity (default) or a fixed one in ``[0, 1]`` (0: the empirical
        covariance, which needs more points than dimensions).
    name : str
        How the caller names ``labels`` in errors.

    Returns
    -------
    mixture : GaussianMixture
        Components in ascending label order (float64, on ``x``'s device).
    report : dict
        ``labels`` (the sorted label values), ``counts``, ``shrinkage`` (the intensity of each
        covariance).

    Raises
    ------
    ValueError
        If a component has fewer than :data:`MIN_POINTS` points, the empirical covariance is
        asked for with no more points than dimensions, or a covariance is not positive
        definite (all points of a component equal), naming the argument.
    """
    check_ndim(x, "x", 2)
    check_finite(x, "x")
    check_min_points(x, "x", 2)
    if covariance not in ("full", "tied"):
        raise ValueError(f"`covariance` must be 'full' or 'tied', got {covariance!r}")
    shrinkage = check_shrinkage(shrinkage, "shrinkage")
    labels = labels.to(x.device).long()
    if labels.shape != (x.shape[0],):
        raise ValueError(f"`{name}` must be [N] with N = {x.shape[0]}, got {tuple(labels.shape)}")
    values, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    _check_component_sizes(values, counts, MIN_POINTS[covariance], covariance, name)
    k, n = len(values), x.shape[0]
    means = _component_means(x, inverse, counts)
    trils, intensities = [], []
    for j, idx in enumerate(_component_rows(inverse, k, covariance)):
        acc = _centred_scatter(x, idx, inverse, means)
        dof = acc.n - (k if covariance == "tied" else 1)  # rank of the centred scatter
        what = "the shared covariance" if covariance == "tied" else f"component {int(values[j])}"
        tril, a = _shrunk_cholesky(acc, shrinkage, dof, what)
        trils.append(tril)
        intensities.append(a)
    log_weights = (counts.to(means.dtype) / n).log()
    mixture = GaussianMixture(means, torch.stack(trils), log_weights)
    report = {
        "labels": values.tolist(),
        "counts": counts.tolist(),
        "shrinkage": intensities,
    }
    return mixture, report


def _check_component_sizes(
    values: Tensor, counts: Tensor, least: int, covariance: str, name: str
) -> None:
    """Raise unless every component has ``least`` points, naming up to five that do not."""
    small = [(int(v), int(c)) for v, c in zip(values, counts) if int(c) < least]
    if small:
        raise ValueError(
            f"every component needs at least {least} reference points (covariance="
            f"{covariance!r}); `{name}` "
            + ", ".join(f"{v} has {c}" for v, c in small[:5])
            + (" ..." if len(small) > 5 else "")
        )


def _component_means(x: Tensor, inverse: Tensor, counts: Tensor) -> Tensor:
    """``[K, D]`` float64 means of the rows of each component (``inverse``: row -> component)."""
    f64 = {"dtype": torch.float64, "device": x.device}
    sums = torch.zeros(len(counts), x.shape[1], **f64)
    for rows in _chunks(x.shape[0]):
        sums.index_add_(0, inverse[rows], x[rows].to(**f64))
    return sums / counts.to(**f64)[:, None]


def _component_rows(inverse: Tensor, k: int, covariance: str) -> list[Tensor]:
    """The row indices behind each covariance: all rows (``"tied"``) or each component's."""
    if covariance == "tied":
        return [torch.arange(len(inverse), device=inverse.device)]
    return [(inverse == j).nonzero().squeeze(1) for j in range(k)]


def _centred_scatter(x: Tensor, idx: Tensor, inverse: Tensor, means: Tensor) -> _Scatter:
    """The float64 sums of the rows ``idx`` of ``x``, each centred on its component's mean."""
    d = x.shape[1]
    acc = _Scatter(torch.zeros(d, d, dtype=torch.float64, device=x.device))
    for rows in _chunks(len(idx)):
        i = idx[rows]
        acc.add(x[i].to(dtype=torch.float64, device=x.device) - means[inverse[i]])
    return acc


def _shrunk_cholesky(
    acc: _Scatter, shrinkage: str | float, dof: int, what: str
) -> tuple[Tensor, float]:
    """Cholesky factor of the shrunk covariance of ``acc`` and its shrinkage intensity.

    ``dof`` is the rank of the centred scatter; ``what`` names the covariance in errors.
    """
    d = acc.scatter.shape[0]
    if shrinkage == 0.0 and dof < d:
        raise ValueError(
            f"{what} has {acc.n} reference points in {d} dimensions (D > n): its empirical "
            "covariance is singular; pass `shrinkage`='ledoit_wolf' or a value in (0, 1]"
        )
    a = (
        ledoit_wolf_shrinkage(acc.scatter, acc.quartic, acc.n)
        if shrinkage == "ledoit_wolf"
        else float(shrinkage)
    )
    cov = shrunk_covariance(acc.scatter, acc.n, a)
    tril, info = torch.linalg.cholesky_ex(cov)
    if int(info) != 0 or not bool(torch.isfinite(tril).all()):
        raise ValueError(
            f"{what} is not positive definite (shrinkage {a:.3g}, {acc.n} points in {d} "
            "dimensions, trace "
            f"{float(torch.diagonal(cov).sum()):.3g}): the points do not vary in every "
            "direction; pass a larger `shrinkage`, or check that the features differ"
        )
    return tril, a


def _sq_dists(x: Tensor, centres: Tensor) -> Tensor:
    """``||x_i - c_j||^2`` ``[N, K]`` (float64, the expansion clamped at 0)."""
    d = (x * x).sum(1, keepdim=True) - 2.0 * x @ centres.T + (centres * centres).sum(1)
    return d.clamp_min_(0.0)


def kmeans_plus_plus(x: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """``k`` initial centres ``[k, D]`` (float64) by k-means++ seeding (Arthur & Vassilvitskii,
    2007): the first uniformly, each next with probability proportional to its squared
    distance to the nearest chosen one."""
    x64 = x.to(torch.float64)
    n = x64.shape[0]
    first = int(torch.randint(n, (1,), generator=generator))
    centres = [x64[first]]
    closest = _sq_dists(x64, x64[first : first + 1])[:, 0]
    for _ in range(1, k):
        total = float(closest.sum())
        if total <= 0.0:  # fewer distinct points than centres
            nxt = int(torch.randint(n, (1,), generator=generator))
        else:
            p = (closest / total).cpu()
            nxt = int(torch.multinomial(p, 1, generator=generator))
        centres.append(x64[nxt])
        closest = torch.minimum(closest, _sq_dists(x64, x64[nxt : nxt + 1])[:, 0])
    return torch.stack(centres)


def kmeans(
    x: Tensor,
    k: int,
    *,
    init: Tensor | None = None,
    max_iter: int = 300,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Lloyd's k-means in float64: centres ``[k, D]`` and the label of each row ``[N]``.

    Iterates assignment (nearest centre, ties to the lowest index) and update (the mean of
    each cluster) until no label changes or ``max_iter`` (scikit-learn's ``KMeans`` with
    ``algorithm="lloyd", tol=0`` stops at the same point from the same ``init``). A cluster
    left empty takes the point farthest from its centre.

    Parameters
    ----------
    x : Tensor
        ``[N, D]`` points.
    k : int
        Clusters, ``1 <= k <= N``.
    init : Tensor, optional
        ``[k, D]`` initial centres (default: :func:`kmeans_plus_plus` with ``generator``).
    max_iter : int
        Upper bound on the Lloyd iterations.
    generator : torch.Generator, optional
        Seeds the k-means++ draws (CPU generator).
    """
    check_ndim(x, "x", 2)
    check_floating(x, "x")
    check_finite(x, "x")
    check_min_points(x, "x", 1)
    n = x.shape[0]
    k = check_int(k, "k", low=1, high=n)
    x64 = x.to(torch.float64)
    if init is None:
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        centres = kmeans_plus_plus(x64, k, gen)
    else:
        centres = init.to(x64).clone()
        if centres.shape != (k, x.shape[1]):
            raise ValueError(f"`init` must be [{k}, {x.shape[1]}], got {tuple(centres.shape)}")
    labels = torch.full((n,), -1, dtype=torch.long, device=x.device)
    for _ in range(int(max_iter)):
        dist = _sq_dists(x64, centres)
        new = dist.argmin(1)
        if torch.equal(new, labels):
            break
        labels = new
        counts = torch.bincount(labels, minlength=k)
        sums = torch.zeros_like(centres).index_add_(0, labels, x64)
        centres = sums / counts.clamp_min(1).to(sums)[:, None]
        empty = (counts == 0).nonzero().squeeze(1).tolist()
        if empty:
            far = dist.gather(1, labels[:, None])[:, 0].argsort(descending=True)
            for j, i in zip(empty, far.tolist()):
                centres[j] = x64[i]
    return centres, labels
