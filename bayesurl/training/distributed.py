"""torch.distributed helpers: torchrun setup, DDP wrapping, samplers and variable-length gathers.

The training loop (:func:`bayesurl.training.fit`) runs unchanged under ``torchrun``: it wraps
the method in :class:`~torch.nn.parallel.DistributedDataParallel` (gradients are averaged over
ranks, so ``R`` ranks with per-rank batch ``B`` and a mean-reduced loss follow the same path as
one process on the global batch ``R * B``), replaces the loader's sampler by a
:class:`~torch.utils.data.distributed.DistributedSampler`, and lets only rank 0 print and write
checkpoints. The evaluator gathers embeddings of every rank with :func:`all_gather_tensors`
(issue 3, section 2).

Every helper degrades to the single-process behaviour when no process group is initialised.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

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


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = torch.device("cpu")


def is_distributed() -> bool:
    """True when a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    """Global rank of this process (0 when not distributed)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    """Number of processes in the job (1 when not distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """True on rank 0, and in a single-process run."""
    return get_rank() == 0


def init_from_env(backend: str | None = None, device: str | None = None) -> DistInfo:
    """Initialise the default process group from torchrun's environment variables.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and ``MASTER_ADDR`` / ``MASTER_PORT`` through
    the ``env://`` init method). Without ``WORLD_SIZE`` (or with ``WORLD_SIZE=1``) nothing is
    initialised and rank 0 of 1 is returned, so the same script runs with and without torchrun.

    Parameters
    ----------
    backend : {"gloo", "nccl"} or None
        ``None`` picks ``nccl`` when CUDA is available and ``device`` is not ``"cpu"``, else
        ``gloo``.
    device : str or None
        ``"cpu"`` forces CPU; ``None`` uses ``cuda:LOCAL_RANK`` when CUDA is available.

    Returns
    -------
    DistInfo
        Rank, world size, local rank, backend and the device this rank should use.

    Raises
    ------
    ValueError
        If an environment variable is not an integer or ``RANK`` is out of range.
    """

    def _env_int(name: str, default: int) -> int:
        raw = os.environ.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None

    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"invalid RANK={rank} / WORLD_SIZE={world}")
    use_cuda = torch.cuda.is_available() and device != "cpu"
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device(device or "cpu")
    if world == 1:
        return DistInfo(0, 1, 0, None, dev)
    backend = backend or ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world)
    return DistInfo(rank, world, local_rank, backend, dev)


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


def all_gather_tensors(tensor: Tensor) -> Tensor:
    """Concatenate ``tensor`` of every rank along dim 0; the lengths may differ between ranks.

    Sizes are exchanged first, each rank pads to the longest, and the padding is cut off after
    the gather, so row ``i`` of rank ``r`` ends up at offset ``sum(n_0..n_{r-1}) + i``. Other
    dimensions, dtype and device must agree across ranks. Not differentiable. Returns
    ``tensor`` itself when not distributed.

    Parameters
    ----------
    tensor : Tensor
        ``[n_r, ...]`` on this rank (on the backend's device: CPU for gloo, CUDA for nccl).

    Returns
    -------
    Tensor
        ``[sum_r n_r, ...]``, ordered by rank.
    """
    if not is_distributed():
        return tensor
    if tensor.ndim == 0:
        raise ValueError("`tensor` must have at least one dimension to gather along dim 0")
    world = dist.get_world_size()
    local = torch.tensor([tensor.shape[0]], device=tensor.device, dtype=torch.int64)
    sizes = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(sizes, local)
    lengths = [int(s.item()) for s in sizes]
    longest = max(lengths)
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    chunks = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(chunks, padded.contiguous())
    return torch.cat([c[:n] for c, n in zip(chunks, lengths)], dim=0)


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if is_distributed():
        dist.barrier()


def cleanup() -> None:
    """Tear the default process group down in order, if one is initialised.

    Every rank first waits at a barrier (no rank leaves while a peer still communicates, e.g.
    rank 0 evaluating after a gather), then objects still holding the group -- the
    ``DistributedDataParallel`` reducer of a finished :func:`~bayesurl.training.fit` sits in
    a reference cycle -- are collected, and only then is the group destroyed. Without this
    order a ``gloo`` rank that finished first could abort at exit ("terminate called without
    an active exception", SIGABRT) while its peer was still working.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    gc.collect()
    dist.destroy_process_group()
