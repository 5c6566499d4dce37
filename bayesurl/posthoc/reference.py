"""Post-hoc u(x) that trains nothing: a density or a neighbour list of reference features.

Each wrapper runs the frozen encoder once over a reference set (``fit(loader)``: its
``[N, D]`` embeddings are held in memory, in the encoder's dtype, with the labels where the
loader yields them) and keeps only what its score needs:

- ``"knn"`` (:class:`KNNWrapper`): the L2-normalised reference embeddings; ``u`` is the mean
  cosine distance ``1 - cos`` to the ``k`` nearest of them, or the distance to the ``k``-th
  (Sun et al., 2022, "Out-of-distribution detection with deep nearest neighbors"); no labels;
- ``"mahalanobis"`` (:class:`MahalanobisWrapper`): class means and one shared covariance;
  ``u`` is the squared Mahalanobis distance to the nearest class mean (Lee et al., 2018, "A
  simple unified framework for detecting out-of-distribution samples and adversarial
  attacks", eq. 2); labels needed;
- ``"gmm"`` (:class:`GMMWrapper`): a Gaussian mixture, one component per class (DDU's
  feature-space density, Mukhoti et al., 2023, "Deep deterministic uncertainty: a new simple
  baseline") or per k-means cluster (no labels); ``u = -log q(x)``.

The Gaussians are fitted in float64 with Ledoit-Wolf shrinkage and kept as Cholesky factors
(:mod:`bayesurl.distributions.gaussian_mixture`); their buffers stay float64 whatever dtype
the module is cast to, and ``u`` comes back in the embedding's dtype.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bayesurl._checks import check_int
from bayesurl._modules import device_of
from bayesurl.data.batch import iterate, unpack_batch
from bayesurl.distributions.gaussian_mixture import (
    MIN_POINTS,
    GaussianMixture,
    check_shrinkage,
    fit_gaussians,
    kmeans,
)
from bayesurl.posthoc.base import (
    PosthocWrapper,
    check_embedding_width,
    register_wrapper,
)
from bayesurl.search.core import DEFAULT_MEMORY_BUDGET, chunk_rows, normalize

__all__ = ["GMMWrapper", "KNNReduce", "KNNWrapper", "MahalanobisWrapper", "ReferenceWrapper"]


class ReferenceWrapper(PosthocWrapper):
    """Base of the wrappers fitted on the reference set's embeddings in one encoder pass.

    Subclasses name their fitted buffers in ``STATE`` (those in ``FLOAT64`` stay float64),
    implement :meth:`fit_features` and :meth:`uncertainty_from`, and list their options in
    :meth:`config`. The buffers are empty until fitted; :func:`~bayesurl.posthoc.load` gives
    them the saved shapes.

    Parameters
    ----------
    encoder : nn.Module
        Maps inputs to embeddings ``[N, D]``; frozen.
    embed_dim : int, optional
        D, checked against the reference embeddings when given (a loaded wrapper records it).
    """

    STATE: ClassVar[tuple[str, ...]] = ()
    FLOAT64: ClassVar[tuple[str, ...]] = ()
    #: the method needs the loader's labels
    needs_labels: ClassVar[bool] = False

    def __init__(self, encoder: nn.Module, *, embed_dim: int | None = None) -> None:
        super().__init__(encoder)
        self.embed_dim = None if embed_dim is None else check_int(embed_dim, "embed_dim", low=1)
        for name in self.STATE:
            dtype = torch.float64 if name in self.FLOAT64 else torch.float32
            self.register_buffer(name, torch.empty(0, dtype=dtype, device=device_of(encoder)))

    # -- fitting ------------------------------------------------------------------------------
    def embeddings_of(self, loader: Iterable[Any], progress: bool) -> tuple[Tensor, Tensor | None]:
        """The encoder's embeddings ``[N, D]`` of every batch of ``loader`` and the labels
        ``[N]`` (``None`` when the batches have none); one pass, no gradients."""
        # a stateless encoder (an identity on features) computes where its inputs are
        stateful = any(True for _ in self.encoder.parameters()) or any(
            True for _ in self.encoder.buffers()
        )
        dev = device_of(self.encoder) if stateful else None
        embs: list[Tensor] = []
        labels: list[Tensor] = []
        with torch.no_grad():
            for batch in iterate(loader, progress, f"{self.method}: reference embeddings"):
                x, y = unpack_batch(batch, name="loader")
                if not isinstance(x, Tensor):
                    raise ValueError(
                        f"method={self.method!r} fits on single-view batches x or (x, y), got a "
                        "pair of views"
                    )
                if embs and (y is None) != (not labels):
                    raise ValueError("`loader`: some batches have labels and others do not")
                e = self.embed(x if dev is None else x.to(dev)).detach()
                if self.embed_dim is not None:
                    check_embedding_width(e, self.embed_dim, f"{self.method} wrapper")
                embs.append(e)
                if y is not None:
                    labels.append(y.to(e.device))
        if not embs:
            raise ValueError("`loader` yielded no data")
        return torch.cat(embs), (torch.cat(labels) if labels else None)

    def fit(self, loader: Iterable[Any], *, progress: bool = True) -> dict[str, Any]:
        """Encode the reference set once and fit the score on its embeddings.

        Parameters
        ----------
        loader : iterable
            Yields ``x`` or ``(x, y)`` batches (labels where the method needs them); a list
            ``[(features, labels)]`` of an identity encoder's inputs works too.
        progress : bool
            tqdm bar over the batches.

        Returns
        -------
        dict
            ``n_reference``, ``fit_seconds`` and what the method reports.
        """
        t0 = time.perf_counter()
        emb, labels = self.embeddings_of(loader, progress)
        if self.needs_labels and labels is None:
            raise ValueError(self._no_labels_message())
        report = self.fit_features(emb, labels)
        self.embed_dim = int(emb.shape[1])
        self.fitted = True
        return {"n_reference": int(emb.shape[0]), **report,
                "fit_seconds": time.perf_counter() - t0}  # fmt: skip

    def _no_labels_message(self) -> str:
        return (
            f"`loader` yields no labels, and method={self.method!r} fits one Gaussian per "
            "class: yield (x, y) batches"
        )

    def fit_features(
        self, embeddings: Tensor, labels: Tensor | None
    ) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- prediction ---------------------------------------------------------------------------
    def check_embedding(self, embedding: Tensor) -> None:
        if self.embed_dim is not None:
            check_embedding_width(embedding, self.embed_dim, f"{self.method} wrapper")

    @staticmethod
    def _like(u: Tensor, embedding: Tensor) -> Tensor:
        """``u`` on the embedding's device, in its dtype when that is floating."""
        dtype = embedding.dtype if embedding.is_floating_point() else u.dtype
        return u.to(device=embedding.device, dtype=dtype)

    # -- persistence --------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {"embed_dim": self.embed_dim}

    def _load_head_state(self, state: dict[str, Tensor]) -> None:
        # the fitted buffers' shapes are the saved ones (empty until then)
        dev = device_of(self.encoder)
        for name in self.STATE:
            saved = state.get(name)
            if isinstance(saved, Tensor):
                self._buffers[name] = torch.empty(saved.shape, dtype=saved.dtype, device=dev)
        super()._load_head_state(state)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> ReferenceWrapper:
        # move the float64 buffers with the module, never lower their precision: a
        # ``.float()`` or ``.half()`` of the wrapper must not round its Cholesky factors
        keep = {n: self._buffers[n] for n in self.FLOAT64 if self._buffers.get(n) is not None}
        super()._apply(fn, recurse)
        for name, old in keep.items():
            device = fn(torch.empty(0, dtype=torch.float64, device=old.device)).device
            self._buffers[name] = old.to(device=device, dtype=torch.float64)
        return self


class KNNReduce(str, Enum):
    """How :class:`KNNWrapper` reduces the ``k`` nearest cosine distances to one u."""

    #: mean of the k distances (the protocols' ``feature_knn``)
    MEAN = "mean"
    #: the k-th distance alone (Sun et al., 2022)
    KTH = "kth"


@register_wrapper("knn")
class KNNWrapper(ReferenceWrapper):
    """k-nearest-neighbour distance to the reference embeddings (Sun et al., 2022).

    ``u(x) = mean_{j <= k} (1 - cos(e(x), r_(j)))`` over the ``k`` reference embeddings
    ``r_(j)`` most similar to ``e(x)`` (``reduce="mean"``), or ``1 - cos(e(x), r_(k))``
    (``reduce="kth"``: Sun et al.'s score, whose Euclidean distance of normalised vectors
    ``sqrt(2 - 2 cos)`` ranks inputs the same way). The similarities are block products of
    the normalised rows in the reference's dtype, the queries taken in chunks whose
    ``[B, N]`` block stays within 256 MiB. No labels.

    Cost: fit stores ``N x D`` normalised embeddings (the reference's dtype); a prediction is
    one ``[B, N]`` similarity product per query batch.

    Parameters
    ----------
    encoder : nn.Module
        Maps inputs to embeddings ``[N, D]``; frozen.
    k : int
        Neighbours, ``1 <= k <= N``.
    reduce : {"mean", "kth"}
        Mean of the k distances, or the k-th.
    embed_dim : int, optional
        D (checked against the reference embeddings).
    """

    STATE = ("reference",)

    def __init__(
        self,
        encoder: nn.Module,
        *,
        k: int = 10,
        reduce: str | KNNReduce = "mean",
        embed_dim: int | None = None,
    ) -> None:
        super().__init__(encoder, embed_dim=embed_dim)
        self.k = check_int(k, "k", low=1)
        try:
            self.reduce = KNNReduce(str(getattr(reduce, "value", reduce)).lower())
        except ValueError:
            raise ValueError(f"`reduce` must be 'mean' or 'kth', got {reduce!r}") from None

    def config(self) -> dict[str, Any]:
        return {**super().config(), "k": self.k, "reduce": self.reduce.value}

    def fit_features(self, embeddings: Tensor, labels: Tensor | None) -> dict[str, Any]:
        if embeddings.shape[0] < self.k:
            raise ValueError(
                f"`k` = {self.k} neighbours, but the reference set has {embeddings.shape[0]} "
                "points; pass a smaller `k` or more reference data"
            )
        if not embeddings.is_floating_point():
            embeddings = embeddings.float()
        self.reference = normalize(embeddings)
        return {"k": self.k}

    def uncertainty_from(self, embedding: Tensor) -> Tensor:
        self.check_fitted()
        ref = self.reference
        q = embedding.detach().to(device=ref.device, dtype=ref.dtype)
        # the k largest similarities by block products: u is a sum of their values, which a
        # near tie cannot change beyond its gap, so the exact search's tie rules add nothing
        qn = normalize(q)
        rows = chunk_rows(ref.shape[0], ref.dtype, DEFAULT_MEMORY_BUDGET)
        u = torch.empty(q.shape[0], dtype=ref.dtype, device=ref.device)
        for lo in range(0, q.shape[0], rows):
            sims = (qn[lo : lo + rows] @ ref.T).topk(self.k, dim=1).values
            dist = 1.0 - sims
            u[lo : lo + rows] = dist.mean(1) if self.reduce is KNNReduce.MEAN else dist[:, -1]
        return self._like(u, embedding)


class _GaussianWrapper(ReferenceWrapper):
    """Shared part of the Gaussian wrappers: the fitted mixture in float64 buffers."""

    STATE = ("means", "scale_tril", "log_weights", "components_of")
    FLOAT64 = ("means", "scale_tril", "log_weights")

    def __init__(
        self, encoder: nn.Module, *, shrinkage: str | float, embed_dim: int | None
    ) -> None:
        super().__init__(encoder, embed_dim=embed_dim)
        self.shrinkage = check_shrinkage(shrinkage, "shrinkage")

    def config(self) -> dict[str, Any]:
        return {**super().config(), "shrinkage": self.shrinkage}

    @property
    def mixture(self) -> GaussianMixture:
        """The fitted :class:`~bayesurl.distributions.gaussian_mixture.GaussianMixture`."""
        self.check_fitted()
        return GaussianMixture(self.means, self.scale_tril, self.log_weights)

    def _store(self, mixture: GaussianMixture, components: list[int]) -> None:
        self.means = mixture.means
        self.scale_tril = mixture.scale_tril
        self.log_weights = mixture.log_weights
        self.components_of = torch.tensor(components, dtype=torch.long, device=self.means.device)


@register_wrapper("mahalanobis")
class MahalanobisWrapper(_GaussianWrapper):
    """Squared Mahalanobis distance to the nearest class mean (Lee et al., 2018, eq. 2).

    Fitted on labelled reference embeddings: class means ``mu_c`` and the covariance
    ``Sigma`` of the class-centred embeddings, shared by every class (a tied Gaussian
    discriminant analysis), shrunk towards ``(tr S / D) I`` by Ledoit-Wolf (or ``shrinkage``)
    and factored by Cholesky in float64. ``u(x) = min_c (e(x) - mu_c)^T Sigma^-1 (e(x) - mu_c)``
    by triangular solves.

    Cost: fit holds the ``N x D`` reference embeddings, accumulates one ``D x D`` float64
    scatter (``N D^2`` flops) and factors it (``D^3 / 3``); a prediction is one triangular
    solve per query (``D^2``) plus ``C D``; the state is ``D^2 + C D`` float64.

    Parameters
    ----------
    encoder : nn.Module
        Maps inputs to embeddings ``[N, D]``; frozen.
    shrinkage : "ledoit_wolf" or float
        Ledoit-Wolf's intensity (default) or a fixed one in ``[0, 1]``; 0 (the empirical
        covariance, Lee et al.'s) needs more reference points than dimensions plus classes.
    embed_dim : int, optional
        D (checked against the reference embeddings).

    Raises
    ------
    ValueError
        In ``fit``: batches without labels, a class with fewer than 2 reference points, or a
        covariance that is singular without shrinkage.
    """

    needs_labels = True

    def __init__(
        self,
        encoder: nn.Module,
        *,
        shrinkage: str | float = "ledoit_wolf",
        embed_dim: int | None = None,
    ) -> None:
        super().__init__(encoder, shrinkage=shrinkage, embed_dim=embed_dim)

    def _no_labels_message(self) -> str:
        return (
            "`loader` yields no labels, and method='mahalanobis' fits one mean per class: "
            "yield (x, y) batches, or use method='gmm' with `components`=K (k-means) or "
            "method='knn', which need none"
        )

    def fit_features(self, embeddings: Tensor, labels: Tensor | None) -> dict[str, Any]:
        mixture, report = fit_gaussians(
            embeddings, labels, covariance="tied", shrinkage=self.shrinkage, name="labels"
        )
        self._store(mixture, report["labels"])
        return {"classes": len(report["labels"]), "shrinkage_used": report["shrinkage"][0]}

    def class_distances(self, embedding: Tensor) -> Tensor:
        """Squared Mahalanobis distances to every class mean ``[N, C]`` (float64; the classes
        in the ascending label order of ``components_of``)."""
        self.check_fitted()
        return self.mixture.mahalanobis(embedding.detach())

    def uncertainty_from(self, embedding: Tensor) -> Tensor:
        return self._like(self.class_distances(embedding).min(1).values, embedding)


@register_wrapper("gmm")
class GMMWrapper(_GaussianWrapper):
    """Negative log-density of a Gaussian mixture of the features (DDU; Mukhoti et al., 2023).

    ``q(x) = sum_k pi_k N(e(x); mu_k, Sigma_k)`` with one component per class of the reference
    labels (``components=None``, DDU's Gaussian discriminant analysis) or per cluster of
    k-means on the reference embeddings (``components=K``, labels unused; k-means++ seeding
    from ``seed``, then Lloyd). Weights ``pi_k = n_k / N``; each ``Sigma_k`` the component's
    covariance (``covariance="full"``, DDU) or one pooled covariance (``"tied"``), shrunk by
    Ledoit-Wolf (or ``shrinkage``) and factored by Cholesky in float64.
    ``u(x) = -log q(x)``, a logsumexp over the components.

    Cost: fit holds the ``N x D`` reference embeddings and one ``D x D`` float64 scatter per
    component (``N D^2`` flops, ``K D^3 / 3`` to factor); a prediction is ``K`` triangular
    solves per query (``K D^2``); the state is ``K D^2`` float64 (``"tied"``: ``D^2``).

    Parameters
    ----------
    encoder : nn.Module
        Maps inputs to embeddings ``[N, D]``; frozen.
    components : int, optional
        ``None``: one component per class (the loader must yield labels); ``K``: k-means
        clusters.
    covariance : {"full", "tied"}
        A covariance per component (DDU), or one shared.
    shrinkage : "ledoit_wolf" or float
        Ledoit-Wolf's intensity (default) or a fixed one in ``[0, 1]``.
    seed : int
        Seed of the k-means++ draws.
    embed_dim : int, optional
        D (checked against the reference embeddings).

    Raises
    ------
    ValueError
        In ``fit``: ``components=None`` with batches without labels, a component with fewer
        than 2 reference points, or a covariance that is singular without shrinkage.
    """

    def __init__(
        self,
        encoder: nn.Module,
        *,
        components: int | None = None,
        covariance: str = "full",
        shrinkage: str | float = "ledoit_wolf",
        seed: int = 0,
        embed_dim: int | None = None,
    ) -> None:
        super().__init__(encoder, shrinkage=shrinkage, embed_dim=embed_dim)
        self.components = None if components is None else check_int(components, "components", low=1)
        if covariance not in ("full", "tied"):
            raise ValueError(f"`covariance` must be 'full' or 'tied', got {covariance!r}")
        self.covariance = covariance
        self.seed = check_int(seed, "seed")

    @property
    def needs_labels(self) -> bool:  # type: ignore[override]
        return self.components is None

    def _no_labels_message(self) -> str:
        return (
            "`loader` yields no labels, and method='gmm' with `components`=None fits one "
            "Gaussian per class: yield (x, y) batches, or pass `components`=K for K k-means "
            "components"
        )

    def config(self) -> dict[str, Any]:
        return {**super().config(), "components": self.components,
                "covariance": self.covariance, "seed": self.seed}  # fmt: skip

    def fit_features(self, embeddings: Tensor, labels: Tensor | None) -> dict[str, Any]:
        name = "labels"
        dropped = 0
        if self.components is not None:
            least = MIN_POINTS[self.covariance] * self.components
            if embeddings.shape[0] < least:
                raise ValueError(
                    f"`components` = {self.components} k-means components need at least "
                    f"{least} reference points ({MIN_POINTS[self.covariance]} each), got "
                    f"{embeddings.shape[0]}"
                )
            labels, dropped = self._clusters(embeddings)
            name = "components"
        mixture, report = fit_gaussians(
            embeddings, labels, covariance=self.covariance, shrinkage=self.shrinkage, name=name
        )
        self._store(mixture, report["labels"])
        return {
            "components": len(report["labels"]),
            "dropped_components": dropped,
            "component_sizes": report["counts"],
            "shrinkage_used": report["shrinkage"],
        }

    def _clusters(self, embeddings: Tensor) -> tuple[Tensor, int]:
        """k-means labels of the reference embeddings, and how many clusters were dropped.

        A Gaussian needs :data:`~bayesurl.distributions.gaussian_mixture.MIN_POINTS` points;
        k-means++ likes to seed outliers, so a smaller cluster is dropped (with a warning and
        in the fit report), its points join the nearest remaining centre and Lloyd runs again
        from the others.
        """
        least = MIN_POINTS[self.covariance]
        gen = torch.Generator().manual_seed(self.seed)
        centres, labels = kmeans(embeddings, self.components, generator=gen)
        dropped = 0
        while True:
            sizes = torch.bincount(labels, minlength=centres.shape[0])
            keep = sizes >= least
            if bool(keep.all()):
                break
            dropped += int((~keep).sum())
            centres, labels = kmeans(embeddings, int(keep.sum()), init=centres[keep])
        if dropped:
            warnings.warn(
                f"method='gmm': {dropped} of the `components` = {self.components} k-means "
                f"clusters held fewer than {least} reference points and were dropped; the "
                "mixture has "
                f"{self.components - dropped} components",
                stacklevel=4,
            )
        return labels, dropped

    def log_density(self, embedding: Tensor) -> Tensor:
        """``log q(e)`` ``[N]`` (float64)."""
        return self.mixture.log_prob(embedding.detach())

    def uncertainty_from(self, embedding: Tensor) -> Tensor:
        return self._like(-self.log_density(embedding), embedding)
