"""The one reader of data-loader batches: ``(x, y)``, ``x``, ``((x1, x2), y)`` or a dict.

Every consumer of a loader (the training loop, the methods' ``training_loss``, the post-hoc
wrappers, :class:`~bayesurl.laplace.MetricLaplace`) reads its batches with
:func:`unpack_batch`, so the accepted shapes and the error for a bad batch are the same
everywhere. Two augmented views of each image (URL section 4.1: InfoNCE / MCInfoNCE; TaU
section 2) travel as a pair ``x = (x1, x2)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from bayesurl._checks import check_same_length

__all__ = ["INPUT_KEYS", "LABEL_KEYS", "iterate", "loader_items", "unpack_batch"]

#: dict keys read as the inputs ``x`` (exactly one may be present)
INPUT_KEYS = ("x", "input", "inputs", "image", "images", "pixel_values")
#: dict keys read as the labels ``y`` (at most one may be present)
LABEL_KEYS = ("y", "label", "labels", "target", "targets")

_FORMS = "x, (x, y), ((x1, x2), y) or a dict with an input key and a label key"


def _describe(batch: Any) -> str:
    if isinstance(batch, Tensor):
        return f"a tensor of shape {tuple(batch.shape)}"
    if isinstance(batch, (tuple, list)):
        return f"a {type(batch).__name__} of length {len(batch)}"
    return f"a {type(batch).__name__}"


def _from_dict(batch: Mapping[str, Any], name: str) -> tuple[Any, Any]:
    unknown = sorted(str(k) for k in batch if k not in INPUT_KEYS + LABEL_KEYS)
    xs = [k for k in INPUT_KEYS if k in batch]
    ys = [k for k in LABEL_KEYS if k in batch]
    if unknown or len(xs) != 1 or len(ys) > 1:
        raise ValueError(
            f"`{name}` is a dict with keys {sorted(map(str, batch))}; it needs exactly one "
            f"input key of {list(INPUT_KEYS)} and at most one label key of {list(LABEL_KEYS)}, "
            "and nothing else"
        )
    return batch[xs[0]], (batch[ys[0]] if ys else None)


def _check_x(x: Any, name: str) -> None:
    if isinstance(x, Tensor):
        if x.ndim < 1:
            raise ValueError(f"the inputs of `{name}` must be a batch [N, ...], got a scalar")
        return
    if (
        isinstance(x, (tuple, list))
        and len(x) == 2
        and all(isinstance(v, Tensor) and v.ndim >= 1 for v in x)
    ):
        return
    raise ValueError(
        f"the inputs of `{name}` must be a tensor [N, ...] or a pair of views (x1, x2), got "
        f"{_describe(x)}; yield {_FORMS}"
    )


def unpack_batch(
    batch: Any, *, labels: bool = False, views: bool = False, name: str = "batch"
) -> tuple[Tensor | tuple[Tensor, Tensor], Tensor | None]:
    """Split one loader batch into inputs ``x`` and labels ``y``.

    Accepted forms: a tensor ``x``; ``(x,)``; ``(x, y)``; ``((x1, x2), y)`` (two views of each
    image); a dict with one input key (:data:`INPUT_KEYS`, e.g. ``"image"``) and at most one
    label key (:data:`LABEL_KEYS`, e.g. ``"label"``). Nothing is dropped: any other element or
    key is an error. ``y`` is returned as a tensor (lists and arrays are converted) of the
    inputs' length; neither ``x`` nor ``y`` is copied or moved. What the inputs must look like
    beyond that (dimensions, equal shapes of two views) is checked by the consumer.

    Parameters
    ----------
    batch : Any
        What the data loader yielded.
    labels : bool
        Require labels ``y`` (supervised training, MetricLaplace's pairs).
    views : bool
        Read a bare pair of two same-shaped tensors ``(x1, x2)`` as two views without labels
        (post-hoc TaU). Otherwise such a pair is ambiguous -- it could be ``(x, y)`` -- and is
        an error.
    name : str
        Name of the batch in error messages.

    Returns
    -------
    x : Tensor or tuple of Tensor
        The inputs ``[N, ...]``, or the pair of views ``(x1, x2)``.
    y : Tensor or None
        The labels ``[N]`` (``None`` where the batch holds none).

    Raises
    ------
    ValueError
        For any other structure, missing labels where ``labels`` is set, an ambiguous pair,
        labels that are not a batch, or labels whose length differs from the inputs'.

    Examples
    --------
    >>> x, y = unpack_batch((torch.zeros(4, 1, 28, 28), torch.arange(4)))
    >>> (x1, x2), y = unpack_batch(((torch.zeros(4, 3), torch.ones(4, 3)), torch.arange(4)))
    >>> x, y = unpack_batch({"image": torch.zeros(4, 3), "label": [0, 1, 0, 1]})
    """
    if isinstance(batch, Mapping):
        x, y = _from_dict(batch, name)
    elif isinstance(batch, Tensor):
        x, y = batch, None
    elif isinstance(batch, (tuple, list)) and len(batch) == 1:
        x, y = batch[0], None
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        if isinstance(x, Tensor) and isinstance(y, Tensor) and x.ndim > 1 and x.shape == y.shape:
            if not views:
                raise ValueError(
                    f"ambiguous `{name}`: two tensors of equal shape {tuple(x.shape)} look like "
                    "two views; yield ((x1, x2), y) for two views or (x, y) with labels y [N]"
                )
            x, y = (x, y), None
    else:
        raise ValueError(f"cannot read `{name}`: got {_describe(batch)}; yield {_FORMS}")
    _check_x(x, name)
    if y is None:
        if labels:
            raise ValueError(
                f"`{name}` must be a pair (x, y) with labels y (or ((x1, x2), y) for two "
                f"views), got {_describe(batch)} without labels"
            )
        return x, None
    if not isinstance(y, Tensor):
        try:
            y = torch.as_tensor(y)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(
                f"the labels of `{name}` must be a tensor or array-like [N], got {type(y).__name__}"
            ) from exc
    if y.ndim < 1:
        raise ValueError(f"the labels `y` of `{name}` must be a batch [N], got a scalar")
    check_same_length(("x", x[0] if isinstance(x, (tuple, list)) else x), ("y", y))
    return x, y


def loader_items(loader: Iterable[Any]) -> int | None:
    """How many items (images) a pass over ``loader`` yields, where it can tell without
    iterating: a :class:`torch.utils.data.DataLoader` over a sized sampler; else ``None``."""
    size = getattr(loader, "batch_size", None)
    sampler = getattr(loader, "sampler", None)
    if not isinstance(size, int) or size < 1 or sampler is None:
        return None
    try:
        n = len(sampler)
    except TypeError:
        return None
    return n - n % size if getattr(loader, "drop_last", False) else n


def _batch_items(batch: Any) -> int:
    """The items of one batch: the length of its first tensor (``x``, ``(x, y)``,
    ``((x1, x2), y)``)."""
    while isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    return len(batch) if isinstance(batch, Tensor) and batch.ndim else 1


def iterate(
    loader: Iterable[Any], progress: bool, desc: str, *, total: int | None = None
) -> Iterator[Any]:
    """The batches of ``loader``, with a tqdm bar (unless ``progress`` is False) that counts
    the items (images) toward ``total`` with their rate and time left; ``total`` defaults to
    :func:`loader_items`."""
    if not progress:
        yield from loader
        return
    from tqdm.auto import tqdm

    total = loader_items(loader) if total is None else total
    with tqdm(total=total, desc=desc, unit="img", leave=False) as bar:
        for batch in loader:
            yield batch
            bar.update(_batch_items(batch))
