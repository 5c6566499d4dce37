"""DataLoaders that are seeded and aware of ``torch.distributed``.

URL trains with an aggregated batch over several GPUs (Kirchhof et al., 2023, Sec. 3.2,
"Training infrastructure"); :func:`make_loader` shards a data set with
:class:`torch.utils.data.DistributedSampler` whenever a process group is initialised (or ranks
are given explicitly) and otherwise shuffles with a seeded generator, so runs repeat exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = ["make_loader", "set_epoch"]


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
    collate_fn: Callable[[list[Any]], Any] | None = None,
    pin_memory: bool = False,
    persistent_workers: bool = False,
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
    collate_fn : callable, optional
        Passed to the DataLoader.
    pin_memory, persistent_workers : bool
        Passed to the DataLoader.

    Returns
    -------
    DataLoader
        Its ``sampler`` is a :class:`DistributedSampler` when sharding.
    """
    if int(batch_size) < 1:
        raise ValueError(f"`batch_size` must be positive, got {batch_size}")
    if int(num_workers) < 0:
        raise ValueError(f"`num_workers` must be >= 0, got {num_workers}")
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError("`dataset` is empty")
    explicit = num_replicas is not None or rank is not None
    group = dist.is_available() and dist.is_initialized()
    if distributed is None:
        distributed = explicit or group
    if distributed and not (explicit or group):
        raise ValueError(
            "`distributed=True` needs an initialised torch.distributed process group or "
            "explicit `num_replicas` and `rank`"
        )
    generator = torch.Generator().manual_seed(int(seed))
    sampler = None
    if distributed:
        if num_replicas is not None and int(num_replicas) < 1:
            raise ValueError(f"`num_replicas` must be positive, got {num_replicas}")
        if rank is not None and num_replicas is not None and not 0 <= rank < num_replicas:
            raise ValueError(f"`rank` must be in [0, {num_replicas}), got {rank}")
        sampler = DistributedSampler(
            dataset,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=int(seed),
            drop_last=drop_last,
        )
    return DataLoader(
        dataset,
        batch_size=int(batch_size),
        shuffle=bool(shuffle) if sampler is None else False,
        sampler=sampler,
        num_workers=int(num_workers),
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        drop_last=drop_last,
        generator=generator,
        persistent_workers=persistent_workers and num_workers > 0,
    )


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Tell a sharding sampler which epoch starts so each epoch gets a new (seeded) order.

    A no-op for non-distributed loaders, whose seeded generator already advances per epoch.
    """
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        sampler.set_epoch(int(epoch))
