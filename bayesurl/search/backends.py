"""Search objects: the exact search and faiss's as pytorch-metric-learning ``knn_func``
objects (:class:`KnnFunc`), the names ``search=`` accepts, and the check of any such object's
answer."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from bayesurl._checks import check_int
from bayesurl.search.core import DEFAULT_MEMORY_BUDGET
from bayesurl.search.exact import knn, knn_query

__all__ = ["SEARCHES", "ExactSearch", "FaissSearch", "KnnFunc", "checked_ids", "resolve_search"]


@runtime_checkable
class KnnFunc(Protocol):
    """A neighbour search with pytorch-metric-learning's ``knn_func`` contract.

    ``search(query, k, reference, ref_includes_query) -> (distances, indices)``: for each row
    of ``query`` the ``k`` nearest rows of ``reference``, nearest first, as ``[M, k]``
    similarities (or distances) and ``[M, k]`` integer ids into ``reference``. With
    ``ref_includes_query`` the query set is the reference set and a query is not its own
    neighbour. :class:`ExactSearch` and :class:`FaissSearch` are two; any callable of this
    shape (a ``pytorch_metric_learning.utils.inference.CustomKNN`` or ``FaissKNN``) is one.
    """

    def __call__(
        self, query: Tensor, k: int, reference: Tensor, ref_includes_query: bool = False
    ) -> tuple[Tensor, Tensor]: ...


class ExactSearch:
    """The exact cosine search as a :class:`KnnFunc` (``search="torch"``).

    Self is excluded by index, ties go to the lowest index, memory is bounded by chunks
    (:func:`~bayesurl.search.knn`, :func:`~bayesurl.search.knn_query`).

    Parameters
    ----------
    memory_budget : int
        Bytes for one similarity chunk when called on its own; inside
        :class:`~bayesurl.evaluation.Evaluator` the evaluator's ``memory_budget`` (shared by
        its ranks) applies.
    """

    name = "torch"

    def __init__(self, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> None:
        self.memory_budget = check_int(memory_budget, "memory_budget", low=1)

    def __call__(
        self, query: Tensor, k: int, reference: Tensor, ref_includes_query: bool = False
    ) -> tuple[Tensor, Tensor]:
        """``(similarities, indices)``, ``[M, k]`` each (see :class:`KnnFunc`)."""
        if ref_includes_query:
            return knn(reference, k, memory_budget=self.memory_budget, backend=self.name)
        return knn_query(query, reference, k, memory_budget=self.memory_budget, backend=self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(memory_budget={self.memory_budget})"


class FaissSearch(ExactSearch):
    """faiss's exact inner-product index (``IndexFlatIP``, CPU, float32) as a
    :class:`KnnFunc` (``search="faiss"``); tie order is faiss's own."""

    name = "faiss"


#: The names ``search=`` accepts, and the object each stands for.
SEARCHES: dict[str, type[ExactSearch]] = {"torch": ExactSearch, "faiss": FaissSearch}


def resolve_search(search: object, name: str = "search") -> KnnFunc:
    """The search object of ``search``: a name of :data:`SEARCHES` or a :class:`KnnFunc`.

    Raises
    ------
    ValueError
        Naming ``name`` for an unknown name or an object that is not callable.
    """
    if isinstance(search, str):
        if search not in SEARCHES:
            raise ValueError(
                f"`{name}` must be one of {tuple(SEARCHES)} or a knn_func object, got {search!r}"
            )
        return SEARCHES[search]()
    if not callable(search):
        raise ValueError(
            f"`{name}` must be a name {tuple(SEARCHES)} or a callable "
            "(query, k, reference, ref_includes_query) -> (distances, indices), got "
            f"{type(search).__name__}"
        )
    return search  # type: ignore[return-value]


def checked_ids(found: object, n: int, k: int, name: str = "search") -> Tensor:
    """The ``[n, k]`` int64 neighbour ids of a search object's answer over ``n`` rows that
    exclude themselves, checked (:class:`KnnFunc`).

    Raises
    ------
    ValueError
        Naming ``name`` when the answer is not ``(distances, indices)`` of that shape, holds
        ids outside ``[0, n)`` or lists a query as its own neighbour.
    """
    if not (isinstance(found, (tuple, list)) and len(found) == 2):
        raise ValueError(f"`{name}` must return (distances, indices), got {type(found).__name__}")
    ids = found[1]
    if not isinstance(ids, Tensor):
        ids = torch.as_tensor(np.asarray(ids))
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
        raise ValueError(f"`{name}` returned indices of dtype {ids.dtype}, expected integers")
    if tuple(ids.shape) != (n, k):
        raise ValueError(
            f"`{name}` returned indices of shape {tuple(ids.shape)}, expected {(n, k)}"
        )
    ids = ids.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ValueError(f"`{name}` returned ids outside [0, {n})")
    if bool((ids == torch.arange(n, device=ids.device)[:, None]).any()):
        raise ValueError(
            f"`{name}` listed a query as its own neighbour with ref_includes_query=True"
        )
    return ids
