"""DataLoaders that are seeded and aware of ``torch.distributed``.

URL trains with an aggregated batch over several GPUs (Kirchhof et al., 2023, Sec. 3.2,
"Training infrastructure"); :func:`make_loader` shards a data set with
:class:`torch.utils.data.DistributedSampler` whenever a process group is initialised (or ranks
are given explicitly) and otherwise shuffles with a seeded generator, so runs repeat exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from bayesurl._checks import check_int

__all__ = ["TransformedLoader", "UnpaddedDistributedSampler", "make_loader", "set_epoch"]


class UnpaddedDistributedSampler(DistributedSampler):
    """:class:`DistributedSampler` that never pads: rank ``r`` gets items ``r, r + R, ...``.

    The stock sampler repeats items so every rank gets the same count, which would count
    those items twice in an evaluation gathered across ranks. Without padding the shards
    partition the data set exactly (their sizes differ by at most one). Shuffling and
    ``set_epoch`` work as in the parent.
    """

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]
        else:
            order = list(range(len(self.dataset)))  # type: ignore[arg-type]
        return iter(order[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        n = len(self.dataset)  # type: ignore[arg-type]
        return max(0, -(-(n - self.rank) // self.num_replicas))


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool,
    num_workers: int = 0,
    distributed: bool | None = None,
    num_replicas: int | None = None,
    rank: int | None = None,
    seed: int = 0,
    drop_last: bool = False,
    pad: bool = True,
    **loader_kwargs: Any,
) -> DataLoader:
    """Build a seeded :class:`~torch.utils.data.DataLoader`, sharded under torch.distributed.

    Parameters
    ----------
    dataset : Dataset
        Map-style data set (every set of :mod:`bayesurl.data` pickles, so workers work).
    batch_size : int
        Per-process batch size.
    shuffle : bool
        Reshuffle every epoch (seeded; call :func:`set_epoch` under distributed sampling).
    num_workers : int
        Worker processes.
    distributed : bool, optional
        ``None``: shard when ``torch.distributed`` is initialised or ``num_replicas``/``rank``
        are given; ``True``: always shard (needs an initialised group or explicit ranks);
        ``False``: never.
    num_replicas, rank : int, optional
        Explicit sharding (otherwise taken from the process group).
    seed : int
        Seed of the shuffling order and of the workers' base seed.
    drop_last : bool
        Drop the last incomplete batch (and, when sharding, the tail that does not divide
        evenly; otherwise :class:`DistributedSampler` pads by repeating items).
    pad : bool
        When sharding without ``drop_last``: ``True`` pads like :class:`DistributedSampler`
        (equal shard sizes, needed for lock-step training); ``False`` uses
        :class:`UnpaddedDistributedSampler` so the shards partition the data exactly (for
        evaluation).
    **loader_kwargs
        Further :class:`~torch.utils.data.DataLoader` arguments (``collate_fn``,
        ``pin_memory``, ``persistent_workers`` -- kept only with workers --, ``timeout``...).

    Returns
    -------
    DataLoader
        Its ``sampler`` is a :class:`DistributedSampler` when sharding.
    """
    check_int(batch_size, "batch_size", low=1)
    check_int(num_workers, "num_workers", low=0)
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError("`dataset` is empty")
    taken = sorted(set(loader_kwargs) & {"sampler", "batch_sampler", "generator"})
    if taken:
        raise TypeError(f"make_loader() builds the DataLoader's {taken[0]!r} itself")
    sampler = _sampler(
        dataset, num_replicas, rank, distributed=distributed, shuffle=shuffle, seed=seed,
        drop_last=drop_last, pad=pad,
    )  # fmt: skip
    persistent = bool(loader_kwargs.pop("persistent_workers", False)) and num_workers > 0
    return DataLoader(
        dataset,
        batch_size=int(batch_size),
        shuffle=bool(shuffle) if sampler is None else False,
        sampler=sampler,
        num_workers=int(num_workers),
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(int(seed)),
        persistent_workers=persistent,
        **loader_kwargs,
    )


def _sampler(
    dataset: Dataset,
    num_replicas: int | None,
    rank: int | None,
    *,
    distributed: bool | None,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    pad: bool,
) -> DistributedSampler | None:
    """The sharding sampler :func:`make_loader` asks for (``None``: no sharding)."""
    explicit = num_replicas is not None or rank is not None
    group = dist.is_available() and dist.is_initialized()
    if distributed is None:
        distributed = explicit or group
    if not distributed:
        return None
    if not (explicit or group):
        raise ValueError(
            "`distributed=True` needs an initialised torch.distributed process group or "
            "explicit `num_replicas` and `rank`"
        )
    if num_replicas is not None:
        check_int(num_replicas, "num_replicas", low=1)
    if rank is not None and num_replicas is not None and not 0 <= rank < num_replicas:
        raise ValueError(f"`rank` must be in [0, {num_replicas}), got {rank}")
    sampler_cls = DistributedSampler if pad or drop_last else UnpaddedDistributedSampler
    return sampler_cls(
        dataset,
        num_replicas=num_replicas,
        rank=rank,
        shuffle=shuffle,
        seed=int(seed),
        drop_last=drop_last,
    )


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Tell a sharding sampler which epoch starts so each epoch gets a new (seeded) order.

    A no-op for non-distributed loaders, whose seeded generator already advances per epoch.
    """
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        sampler.set_epoch(int(epoch))


class TransformedLoader:
    """A loader whose ``(x, y)`` batches are moved to ``device`` and transformed there.

    The data sets keep ``uint8`` images and are normalised / augmented per batch on the
    training device (:func:`~bayesurl.data.default_transform`,
    :func:`~bayesurl.data.default_augmentation`); this wraps a loader of such batches for a
    consumer that wants ready inputs (a training loop, a post-hoc ``fit``). Re-iterable: each
    pass starts a pass of ``loader`` and draws fresh augmentations.

    Parameters
    ----------
    loader : iterable
        Yields ``(x, y)`` batches (e.g. :func:`make_loader`); ``len(loader)`` is passed on.
    transform : nn.Module
        Applied to each ``x`` on ``device`` (``nn.Identity()`` only moves it).
    device : torch.device or str
        Where the batches go (CPU by default).
    """

    def __init__(
        self,
        loader: Iterable[tuple[Tensor, Tensor]],
        transform: nn.Module,
        device: torch.device | str = "cpu",
    ) -> None:
        self.loader, self.device = loader, torch.device(device)
        self.transform = transform.to(self.device)
        self.dataset = getattr(loader, "dataset", None)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        # the loader's iterator starts here, as ``iter(DataLoader)`` does (it draws the
        # workers' base seed from the loader's generator), so a consumer that calls ``iter``
        # sees the batches a plain DataLoader would give it
        batches = iter(self.loader)
        return (
            (self.transform(x.to(self.device)), torch.as_tensor(y).to(self.device))
            for x, y in batches
        )
