"""torch.distributed helpers: torchrun setup, DDP wrapping, samplers and variable-length gathers.

The training loop (:func:`bayesurl.training.fit`) runs unchanged under ``torchrun``: it wraps
the method in :class:`~torch.nn.parallel.DistributedDataParallel` (gradients are averaged over
ranks, so ``R`` ranks with per-rank batch ``B`` and a mean-reduced loss follow the same path as
one process on the global batch ``R * B``), replaces the loader's sampler by a
:class:`~torch.utils.data.distributed.DistributedSampler`, and lets only rank 0 print and write
checkpoints. The rank / world-size / gather helpers are :mod:`bayesurl.distributed`'s
(re-exported here); the evaluator shards its search with them.

Every helper degrades to the single-process behaviour when no process group is initialised.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from bayesurl.distributed import (  # the generic helpers live one layer down
    DistInfo,
    all_gather_tensors,
    barrier,
    cleanup,
    get_rank,
    get_world_size,
    init_from_env,
    is_distributed,
    is_main_process,
)

__all__ = [
    "DistInfo",
    "all_gather_tensors",
    "barrier",
    "cleanup",
    "distributed_loader",
    "get_rank",
    "get_world_size",
    "init_from_env",
    "is_distributed",
    "is_main_process",
    "wrap_ddp",
]


def wrap_ddp(model: nn.Module, **ddp_kwargs: Any) -> nn.Module:
    """Wrap ``model`` in :class:`~torch.nn.parallel.DistributedDataParallel` when distributed.

    On CUDA ``device_ids`` defaults to the model's device. Returns ``model`` unchanged in a
    single-process run.
    """
    if not is_distributed():
        return model
    from torch.nn.parallel import DistributedDataParallel

    param = next(model.parameters(), None)
    if param is not None and param.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [param.device.index])
    return DistributedDataParallel(model, **ddp_kwargs)


def distributed_loader(
    loader: DataLoader, *, seed: int = 0, shuffle: bool | None = None
) -> DataLoader:
    """A copy of ``loader`` whose sampler is a :class:`DistributedSampler` over the same data.

    The per-rank batch size stays ``loader.batch_size``; the global batch is ``world_size``
    times larger. Returns ``loader`` unchanged when not distributed, or when it already uses a
    :class:`DistributedSampler`.

    Parameters
    ----------
    loader : DataLoader
        Built with ``batch_size`` (not a custom ``batch_sampler``).
    seed : int
        Seed of the sampler's per-epoch shuffling (``seed + epoch``).
    shuffle : bool or None
        ``None`` shuffles when ``loader`` used a :class:`RandomSampler`.

    Raises
    ------
    ValueError
        If ``loader`` uses a custom batch sampler (``batch_size`` is None).
    """
    if not is_distributed() or isinstance(loader.sampler, DistributedSampler):
        return loader
    if loader.batch_size is None:
        raise ValueError(
            "`loader` uses a custom batch_sampler; build it with a DistributedSampler yourself"
        )
    if shuffle is None:
        shuffle = isinstance(loader.sampler, RandomSampler)
    sampler = DistributedSampler(
        loader.dataset, shuffle=shuffle, seed=seed, drop_last=loader.drop_last
    )
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=loader.generator,
        persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False,
    )
