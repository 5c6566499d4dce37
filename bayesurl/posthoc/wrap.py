"""One call that adds u(x) to any trained encoder (thesis chapter 5; TaU section 4; LAM sec. 3;
the kNN, Mahalanobis and feature-density scores of :mod:`bayesurl.posthoc.reference`)."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from bayesurl.posthoc.base import MethodEncoder, PosthocWrapper, as_encoder, wrapper_class

__all__ = ["MethodEncoder", "as_encoder", "wrap"]


def wrap(encoder: nn.Module, method: str = "pvu", **options: Any) -> PosthocWrapper:
    """Wrap a trained encoder so that it also returns an uncertainty ``u(x)``.

    The returned module gives ``emb, u = wrapped(x)`` (also usable as an
    :class:`~bayesurl.types.Output`), where ``emb`` is the encoder's embedding bit for bit and
    only ``u`` is added; it has ``fit(loader, ...)``, ``state_dict`` / ``load_state_dict``,
    ``save(path)`` and ``load(path, encoder)``, and ``sample(x, n)`` for ``"laplace"``.

    Parameters
    ----------
    encoder : nn.Module
        Any module mapping inputs to embeddings ``[N, D]``, or a trained
        :class:`~bayesurl.methods.base.Method` (its ``Output.embedding`` is used, through
        :class:`MethodEncoder`). It is frozen: kept in eval mode and never updated.
    method : {"pvu", "tau", "laplace", "knn", "mahalanobis", "gmm"}
        - ``"pvu"``: pretrained visual uncertainties, a loss-prediction head trained on cached
          embeddings with the ranking loss (thesis section 5.3); options of
          :class:`~bayesurl.posthoc.pvu.PVU` (``classifier``, ``task``, ``loss``, ...).
        - ``"tau"``: post-hoc Temperature as Uncertainty, a temperature head trained with the
          TaU-SimCLR loss on two views (TaU section 4); options of
          :class:`~bayesurl.posthoc.tau.PosthocTaU`.
        - ``"laplace"``: last-layer Laplace of an encoder that ends in an ``nn.Linear``
          (LAM section 3); options of :class:`~bayesurl.posthoc.laplace.LaplaceWrapper`.
        - ``"knn"``: mean cosine distance to the ``k`` nearest reference embeddings (Sun et
          al., 2022); no labels; options of :class:`~bayesurl.posthoc.reference.KNNWrapper`.
        - ``"mahalanobis"``: squared Mahalanobis distance to the nearest class mean under a
          shared, Ledoit-Wolf-shrunk covariance (Lee et al., 2018); ``fit`` needs labelled
          batches; options of :class:`~bayesurl.posthoc.reference.MahalanobisWrapper`.
        - ``"gmm"``: ``-log`` density of a Gaussian mixture of the embeddings, one component
          per class (DDU, Mukhoti et al., 2023) or ``components=K`` k-means clusters; options
          of :class:`~bayesurl.posthoc.reference.GMMWrapper`.

        The last three train nothing: ``fit(loader)`` encodes the reference set once.
    **options
        Passed to the wrapper's constructor.

    Raises
    ------
    ValueError
        For an unknown method or option, or an encoder the method cannot use.

    Examples
    --------
    >>> enc = nn.Sequential(nn.Flatten(), nn.Linear(784, 32))
    >>> wrapped = wrap(enc, "pvu", embed_dim=32)
    >>> emb, u = wrapped(torch.zeros(2, 1, 28, 28))  # doctest: +SKIP
    """
    cls = wrapper_class(method)
    params = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(options) - set(params))
    if unknown:
        valid = sorted(k for k in params if k not in ("self", "encoder"))
        raise ValueError(
            f"unknown option(s) {unknown} for method {method!r}; valid: {', '.join(valid)}"
        )
    return cls(as_encoder(encoder), **options)
