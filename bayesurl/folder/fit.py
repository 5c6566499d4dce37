"""Fit a folder's post-hoc u on its cached features (step 3 of :mod:`bayesurl.folder`):
on positive pairs (:func:`fit_wrapper`, labels unused) or cross-fitted on the other folds
(:func:`crossfit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from bayesurl.distributions.gaussian_mixture import MIN_POINTS
from bayesurl.folder.encode import Features
from bayesurl.folder.methods import (
    CROSSFIT_FOLDS,
    FIT_PLANS,
    FOLDER_COMPONENTS,
    FOLDER_K,
    FolderMethod,
)
from bayesurl.posthoc.wrap import wrap
from bayesurl.search import knn

__all__ = ["crossfit", "fit_pairs", "fit_wrapper", "fold_ids"]


def _pair_batches(views: Tensor, batch_size: int, generator: torch.Generator) -> list[Any]:
    """Shuffled batches of the two views: ``(x1, x2)`` and the instance ids."""
    order = torch.randperm(views.shape[0], generator=generator)
    out = []
    for b in range(0, len(order), batch_size):
        i = order[b : b + batch_size]
        if len(i) >= 2:
            out.append(((views[i, 0], views[i, 1]), i))
    return out


def _stacked(pairs: list[Any]) -> list[Any]:
    """The same batches with both views stacked and each image its own class."""
    return [(torch.cat([x1, x2]), torch.cat([i, i])) for (x1, x2), i in pairs]


def _neighbour_pairs(feats: Tensor) -> Tensor:
    """``[M, 2, D]``: each row of ``feats`` beside its nearest other row (cosine, ties to the
    lowest index: :func:`bayesurl.search.knn`)."""
    _, nn_ids = knn(feats, 1)
    return torch.stack([feats, feats[nn_ids[:, 0]]], dim=1)


def fit_pairs(method: FolderMethod, fx: Features, fit_ids: set[int]) -> Tensor:
    """The positive pairs ``[M, 2, D]`` ``method`` is fitted on (see :mod:`bayesurl.folder`)."""
    if FIT_PLANS[method].augmented:
        return fx.views[:, :2]
    keep = torch.tensor([int(i) in fit_ids for i in fx.ids.tolist()], dtype=torch.bool)
    sample = fx.feats[keep]
    if len(sample) < 2:
        raise ValueError(
            f"post-hoc {method.value!r} needs at least 2 readable images to fit on, "
            f"got {len(sample)}"
        )
    return _neighbour_pairs(sample)


def fit_wrapper(
    method: FolderMethod,
    views: Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    wrapper_options: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The post-hoc wrapper of ``method`` fitted on the positive pairs ``views``
    ``[M, 2, D]`` (labels unused), with ``wrapper_options`` on top of the plan's."""
    dim = views.shape[-1]
    pairs = _pair_batches(views, batch_size, generator)
    if not pairs:
        raise ValueError(
            f"post-hoc {method.value!r} needs at least 2 readable images with views to fit on"
        )
    plan = FIT_PLANS[method]
    encoder = plan.encoder(dim)
    wrapped = wrap(encoder, method.value, **plan.options(encoder, dim), **(wrapper_options or {}))
    hyper = {"epochs": epochs, "lr": lr} if plan.trains else {}
    batches = pairs if plan.pairs else _stacked(pairs)
    report = wrapped.fit(batches, **plan.fit, **hyper, progress=False)
    wrapped.eval()
    return wrapped, report


def fold_ids(labels: Tensor | None, n: int, folds: int, generator: torch.Generator) -> Tensor:
    """Fold of each of ``n`` images: a seeded permutation dealt round-robin, class by class
    when there are labels (every class spread over every fold)."""
    fold = torch.empty(n, dtype=torch.long)
    groups = [torch.arange(n)] if labels is None else [
        (labels == c).nonzero().squeeze(1) for c in torch.unique(labels)
    ]  # fmt: skip
    dealt = 0
    for idx in groups:
        idx = idx[torch.randperm(len(idx), generator=generator)]
        fold[idx] = (torch.arange(len(idx)) + dealt) % folds
        dealt += len(idx)
    return fold


def crossfit(
    method: FolderMethod, fx: Features, fit_ids: set[int], labelled: bool,
    generator: torch.Generator, wrapper_options: Mapping[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Any], int]:  # fmt: skip
    """u of every image from the wrapper fitted on the fit sample's features in the other
    folds (:data:`CROSSFIT_FOLDS`), so no image is scored by a density or neighbour list that
    holds it; the labels of the other folds' images are used where the method needs them.

    Returns u ``[N]``, the fit report and the number of fit-sample images.
    """
    n = fx.feats.shape[0]
    in_fit = torch.tensor([int(i) in fit_ids for i in fx.ids.tolist()], dtype=torch.bool)
    labels = fx.labels if labelled and method is not FolderMethod.KNN else None
    folds = min(CROSSFIT_FOLDS, n)
    fold = fold_ids(labels, n, folds, generator)
    refs = [in_fit & (fold != f) for f in range(folds)]
    smallest = min(int(r.sum()) for r in refs)
    if smallest < 2:
        raise ValueError(
            f"post-hoc {method.value!r} needs at least 2 readable images outside each of its "
            f"{folds} folds to fit on, got {smallest}"
        )
    options: dict[str, Any] = {}
    if method is FolderMethod.KNN:
        options["k"] = min(FOLDER_K, smallest)
    elif method is FolderMethod.GMM and labels is None:
        options["components"] = max(1, min(FOLDER_COMPONENTS, smallest // MIN_POINTS["full"]))
    options.update(wrapper_options or {})  # the user's options win over the folder's defaults
    u = torch.empty(n, dtype=fx.feats.dtype)
    reports = []
    for f, ref in enumerate(refs):
        wrapped = wrap(nn.Identity(), method.value, **options)
        batch = fx.feats[ref] if labels is None else (fx.feats[ref], labels[ref])
        try:
            reports.append(wrapped.fit([batch], progress=False))
        except ValueError as exc:
            raise ValueError(
                f"post-hoc {method.value!r} on fold {f + 1} of {folds}: {exc}"
            ) from exc
        with torch.no_grad():
            u[fold == f] = wrapped(fx.feats[fold == f]).uncertainty.cpu()
    report = {
        "folds": folds,
        **{("kmeans_components" if k == "components" else k): v for k, v in options.items()},
        "labels_used": labels is not None,
        "reference_images": [r["n_reference"] for r in reports],
        "fit_seconds": sum(r["fit_seconds"] for r in reports),
    }
    for key in ("shrinkage_used", "components", "dropped_components"):
        if key in reports[0]:
            report[key] = [r[key] for r in reports]
    return u, report, int(in_fit.sum())
