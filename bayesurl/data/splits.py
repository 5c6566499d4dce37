"""Zero-shot class splits, validation splits and seeded subsampling.

The URL benchmark (Kirchhof et al., 2023, Sec. 3.2) evaluates representations on classes that
were never seen in training: upstream (train) and downstream (test) classes are disjoint, and
hyper-parameters are chosen on a validation split made by dividing the train classes in half
again (following Roth et al., 2020). The helpers here build such splits from a label vector or
any data set with ``targets`` and return index tensors; :func:`bayesurl.data.subset` turns them
into data sets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from bayesurl._checks import check_int

from .base import get_targets, subset

__all__ = [
    "capped",
    "zero_shot_split",
    "split_classes",
    "stratified_split",
    "stratified_subsample",
    "check_disjoint",
]


def _generator(seed: int | None) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(int(seed))


def _as_class_list(classes: Iterable[int] | Tensor, name: str) -> list[int]:
    t = torch.as_tensor(list(classes) if not isinstance(classes, Tensor) else classes)
    if t.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D list of class labels, got shape {tuple(t.shape)}")
    if t.is_floating_point() and bool((t != t.round()).any()):
        raise ValueError(f"`{name}` must hold integer class labels")
    out = [int(c) for c in t.tolist()]
    if len(set(out)) != len(out):
        raise ValueError(f"`{name}` lists a class more than once")
    return out


def check_disjoint(**class_sets: Iterable[int]) -> None:
    """Raise :class:`ValueError` if any two of the named class sets share a class.

    Parameters
    ----------
    **class_sets : iterable of int
        Named class lists, e.g. ``check_disjoint(upstream=[0, 1], downstream=[2, 3])``. The
        zero-shot protocol (URL Sec. 3.2) requires upstream and downstream classes to be
        disjoint.
    """
    items = [(name, {int(c) for c in cs}) for name, cs in class_sets.items()]
    for i, (na, a) in enumerate(items):
        for nb, b in items[i + 1 :]:
            common = sorted(a & b)
            if common:
                raise ValueError(f"`{na}` and `{nb}` must be disjoint; both hold {common[:10]}")


def split_classes(
    classes: Sequence[int] | Tensor,
    n_first: int | None = None,
    *,
    seed: int | None = None,
) -> tuple[list[int], list[int]]:
    """Split a list of classes into two disjoint groups.

    Without a seed the first ``n_first`` classes in the given order form the first group;
    with a seed the classes are permuted first (``torch.randperm`` with a generator seeded by
    ``seed``, so the result is reproducible and independent of global RNG state).

    Parameters
    ----------
    classes : sequence of int
        Distinct class labels.
    n_first : int, optional
        Size of the first group; defaults to ``len(classes) // 2`` (the halving of URL Sec. 3.2).
    seed : int, optional
        Seed of the permutation; ``None`` keeps the given order.

    Returns
    -------
    first, second : list of int
        Disjoint class lists, each in increasing order, covering ``classes``.
    """
    cls = _as_class_list(classes, "classes")
    if len(cls) < 2:
        raise ValueError(f"`classes` needs at least 2 classes to split, got {len(cls)}")
    k = len(cls) // 2 if n_first is None else int(n_first)
    if not 1 <= k <= len(cls) - 1:
        raise ValueError(f"`n_first` must be in [1, {len(cls) - 1}], got {n_first}")
    if seed is not None:
        perm = torch.randperm(len(cls), generator=_generator(seed)).tolist()
        cls = [cls[i] for i in perm]
    return sorted(cls[:k]), sorted(cls[k:])


def zero_shot_split(
    labels_or_dataset: Any,
    upstream: Iterable[int] | None = None,
    downstream: Iterable[int] | None = None,
    *,
    n_upstream: int | None = None,
    seed: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Indices of the upstream (train) and downstream (test) classes of a zero-shot split.

    URL Sec. 3.2: models train on upstream classes only and are evaluated on disjoint
    downstream classes. Classes can be given explicitly or drawn by a seeded permutation:

    * ``upstream`` and ``downstream`` given: used as is (must be disjoint and present);
    * only one given: the other is every remaining class of the labels;
    * neither: the sorted classes (permuted first when ``seed`` is set) are cut after
      ``n_upstream`` (default: half, rounded down).

    Parameters
    ----------
    labels_or_dataset : Tensor, array, sequence or Dataset
        ``[N]`` integer labels, or a data set with ``targets``.
    upstream, downstream : iterable of int, optional
        Explicit class lists.
    n_upstream : int, optional
        Number of upstream classes when neither list is given.
    seed : int, optional
        Seed of the class permutation when neither list is given.

    Returns
    -------
    upstream_indices, downstream_indices : Tensor
        Increasing ``int64`` positions into ``labels_or_dataset``; disjoint.

    Raises
    ------
    ValueError
        On empty labels, fewer than two classes, overlapping lists, classes absent from the
        labels, or an empty side.
    """
    y = get_targets(labels_or_dataset)
    if y.numel() == 0:
        raise ValueError("`labels_or_dataset` is empty; a zero-shot split needs labelled data")
    present = sorted(set(y.unique().tolist()))
    if len(present) < 2:
        raise ValueError(
            f"`labels_or_dataset` holds a single class ({present}); a zero-shot split needs at "
            "least two classes"
        )
    if upstream is None and downstream is None:
        if (
            n_upstream is not None
            and not 1 <= check_int(n_upstream, "n_upstream") <= len(present) - 1
        ):
            raise ValueError(f"`n_upstream` must be in [1, {len(present) - 1}], got {n_upstream}")
        up, down = split_classes(present, n_upstream, seed=seed)
    else:
        up = _as_class_list(upstream, "upstream") if upstream is not None else None
        down = _as_class_list(downstream, "downstream") if downstream is not None else None
        if up is None:
            up = [c for c in present if c not in set(down)]  # type: ignore[arg-type]
        if down is None:
            down = [c for c in present if c not in set(up)]
        check_disjoint(upstream=up, downstream=down)
        for name, cls in (("upstream", up), ("downstream", down)):
            if not cls:
                raise ValueError(f"`{name}` is empty; both sides need at least one class")
            absent = sorted(set(cls) - set(present))
            if absent:
                raise ValueError(
                    f"`{name}` lists classes absent from the labels: {absent[:10]} "
                    f"(present: {present[:20]}{'...' if len(present) > 20 else ''})"
                )
    up_mask = torch.isin(y, torch.tensor(up, dtype=torch.int64))
    down_mask = torch.isin(y, torch.tensor(down, dtype=torch.int64))
    return up_mask.nonzero().flatten(), down_mask.nonzero().flatten()


def stratified_split(
    labels_or_dataset: Any,
    fraction: float,
    *,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Hold out ``fraction`` of every class (instance split, same classes on both sides).

    Used for held-out upstream data (the in-distribution side of OOD AUROC,
    docs/concepts/zero_shot.rst) and for data sets without an official split (scikit-learn digits).

    Parameters
    ----------
    labels_or_dataset : Tensor, array, sequence or Dataset
        ``[N]`` integer labels or a data set with ``targets``.
    fraction : float
        Share of each class that goes to the second part, in ``(0, 1)``. Each class with at
        least two items keeps at least one item on each side.
    seed : int
        Seed of the per-class shuffles.

    Returns
    -------
    kept, held_out : Tensor
        Increasing disjoint ``int64`` positions covering the input.
    """
    y = get_targets(labels_or_dataset)
    if y.numel() == 0:
        raise ValueError("`labels_or_dataset` is empty")
    if not 0.0 < float(fraction) < 1.0:
        raise ValueError(f"`fraction` must be in (0, 1), got {fraction}")
    gen = _generator(seed)
    keep, held = [], []
    for c in y.unique().tolist():
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(idx.numel(), generator=gen)]
        n_held = round(float(fraction) * idx.numel())
        if idx.numel() >= 2:
            n_held = min(max(n_held, 1), idx.numel() - 1)
        held.append(idx[:n_held])
        keep.append(idx[n_held:])
    return torch.cat(keep).sort().values, torch.cat(held).sort().values


def stratified_subsample(
    labels_or_dataset: Any,
    n: int | None,
    *,
    seed: int = 0,
) -> Tensor:
    """Seeded class-balanced subsample of at most ``n`` positions.

    Each class keeps a share proportional to its frequency (largest remainders fill the
    rest), so a small quick-benchmark set still covers every class.

    Parameters
    ----------
    labels_or_dataset : Tensor, array, sequence or Dataset
        ``[N]`` integer labels or a data set with ``targets``.
    n : int or None
        Target size; ``None`` or ``n >= N`` keeps everything.
    seed : int
        Seed of the per-class shuffles.

    Returns
    -------
    Tensor
        Increasing ``int64`` positions.
    """
    y = get_targets(labels_or_dataset)
    if n is None or int(n) >= y.numel():
        return torch.arange(y.numel())
    n = int(n)
    if n < 1:
        raise ValueError(f"`n` must be positive, got {n}")
    classes, counts = y.unique(return_counts=True)
    exact = counts.double() * n / y.numel()
    quota = exact.floor().long()
    rest = n - int(quota.sum())
    if rest > 0:
        order = torch.argsort(exact - quota.double(), descending=True, stable=True)
        quota[order[:rest]] += 1
    gen = _generator(seed)
    out = []
    for c, q in zip(classes.tolist(), quota.tolist()):
        idx = (y == c).nonzero().flatten()
        out.append(idx[torch.randperm(idx.numel(), generator=gen)[:q]])
    return torch.cat(out).sort().values


def capped(dataset: Any, n: int | None, seed: int = 0) -> Any:
    """``dataset`` cut to a seeded class-balanced subset of at most ``n`` items
    (:func:`stratified_subsample`); itself when ``n`` is ``None`` or not below its size."""
    if n is None or n >= len(dataset):
        return dataset
    return subset(dataset, stratified_subsample(dataset, n, seed=seed))
