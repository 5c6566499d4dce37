"""Low-level ``torch.distributed`` helpers shared by training and evaluation.

Rank and world size, torchrun initialisation, variable-length gathers, the contiguous shard of
an index range that each rank owns, a pass of every rank's shard past every rank in bounded
chunks (:func:`ring_chunks`, the gallery pass of the sharded exact search), and a
row exchange (:class:`RowExchange`) that brings a fixed set of other ranks' rows to a rank.

Every helper degrades to the single-process behaviour when no process group is initialised
(or the group has one rank), so one code path serves one process as the ``W = 1`` case.
The training loop's DDP wrapping (:func:`wrap_ddp`) and distributed sampling
(:func:`distributed_loader`) live here too: :func:`bayesurl.training.fit` runs unchanged under
``torchrun``, wrapping the method in :class:`~torch.nn.parallel.DistributedDataParallel`
(gradients are averaged over ranks, so ``R`` ranks with per-rank batch ``B`` and a mean-reduced
loss follow the same path as one process on the global batch ``R * B``), replacing the loader's
sampler by a :class:`~torch.utils.data.distributed.DistributedSampler` and letting only rank 0
print and write checkpoints.
"""

from __future__ import annotations

import gc
import math
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from bayesurl._checks import check_int

__all__ = [
    "DistInfo",
    "RankFailedError",
    "RowExchange",
    "Shards",
    "all_gather_tensors",
    "barrier",
    "broadcast_state",
    "cleanup",
    "distributed_loader",
    "get_rank",
    "get_world_size",
    "init_from_env",
    "is_distributed",
    "is_main_process",
    "launch_local",
    "launch_rank",
    "launched_by_torchrun",
    "raise_if_any",
    "ring_chunks",
    "shard_range",
    "shard_sizes",
    "wrap_ddp",
]

#: Bytes of one chunk of a rank's shard sent past the other ranks by :func:`ring_chunks`
#: (two such receive buffers per rank).
RING_CHUNK_BYTES = 8 * 2**20


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = torch.device("cpu")


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_distributed(group: dist.ProcessGroup | None = None) -> bool:
    """True when a process group (``group`` or the default) with more than one rank exists."""
    return _initialised() and dist.get_world_size(group) > 1


def get_rank(group: dist.ProcessGroup | None = None) -> int:
    """Rank of this process in ``group`` (0 when not distributed)."""
    return dist.get_rank(group) if _initialised() else 0


def get_world_size(group: dist.ProcessGroup | None = None) -> int:
    """Number of processes in ``group`` (1 when not distributed)."""
    return dist.get_world_size(group) if _initialised() else 1


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
        ``gloo``; also ``gloo`` when this machine's ranks (``LOCAL_WORLD_SIZE``) outnumber
        its GPUs, which NCCL refuses to share between ranks.
    device : str or None
        ``"cpu"`` forces CPU; ``None`` uses ``cuda:LOCAL_RANK`` when CUDA is available
        (``cuda:LOCAL_RANK % device_count`` when the ranks outnumber the GPUs: two ranks on
        one GPU share it).

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
    gpus = torch.cuda.device_count() if use_cuda else 0
    dev = torch.device("cuda", local_rank % gpus) if use_cuda else torch.device(device or "cpu")
    if world == 1:
        return DistInfo(0, 1, 0, None, dev)
    shared = _env_int("LOCAL_WORLD_SIZE", world) > gpus  # NCCL: one rank per GPU
    backend = backend or ("nccl" if use_cuda and not shared else "gloo")
    if use_cuda:
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world)
    return DistInfo(rank, world, local_rank, backend, dev)


class RankFailedError(RuntimeError):
    """A rank of :func:`launch_local` failed; the message names it and ends with its error."""


def launched_by_torchrun() -> bool:
    """True when this process was started by ``torchrun`` with more than one process.

    Reads ``WORLD_SIZE`` (a value that is not an integer counts as launched, so that
    :func:`init_from_env` names the bad variable).
    """
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return True


def launch_rank() -> int:
    """This process's torchrun ``RANK`` before any process group exists (0 when not launched).

    For output decided before the group is initialised (a command's first notice); after
    initialisation use :func:`is_main_process`.
    """
    if not launched_by_torchrun():
        return 0
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0  # init_from_env names the bad variable


def _free_port() -> int:
    """A TCP port free on the loopback interface now (the rendezvous port of
    :func:`launch_local`, as ``torchrun --standalone`` picks one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _local_rank_main(
    local_rank: int,
    fn: Callable[..., object],
    args: tuple[object, ...],
    env: dict[str, str],
    threads: int,
) -> None:
    """Body of one process of :func:`launch_local`: torchrun's variables, then ``fn(*args)``."""
    os.environ.update(env)
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(local_rank)
    torch.set_num_threads(threads)
    code = fn(*args)
    if isinstance(code, int) and code != 0:
        sys.exit(code)


def launch_local(
    fn: Callable[..., object],
    nprocs: int,
    args: Sequence[object] = (),
    *,
    threads: int | None = None,
    start_method: str | None = None,
) -> None:
    """Run ``fn(*args)`` as the ``nprocs`` ranks of a one-machine job, forked from this process.

    What ``torchrun --standalone --nproc_per_node nprocs`` does, without its launcher: each
    process gets torchrun's environment (``RANK`` = ``LOCAL_RANK`` = its index,
    ``WORLD_SIZE`` = ``LOCAL_WORLD_SIZE`` = ``nprocs``, ``MASTER_ADDR`` = 127.0.0.1 and a free
    ``MASTER_PORT``), so code written for torchrun (:func:`init_from_env`) runs unchanged. With
    the ``fork`` start method (the default where the platform has it) the ranks start from this
    interpreter's already imported modules: torchrun's launcher imports torch once more and
    every rank imports everything again, about 1.8 s of a 2-rank ``bayesurl evaluate`` on a
    2-core CPU (``benchmarks/evaluator.py --distributed``). This process
    waits (blocked, not polling) and returns when every rank has finished; when one rank fails
    the others are stopped.

    Fork only from a process that has run no parallel CPU kernels (OpenMP's thread pool does
    not survive a fork) and has not initialised CUDA; ``bayesurl evaluate --nproc-per-node``
    forks right after parsing its arguments.

    Parameters
    ----------
    fn : callable
        Module-level function run on every rank; a non-zero ``int`` return is its exit status.
    nprocs : int
        Number of ranks ``W >= 1``.
    args : sequence
        Positional arguments of ``fn`` (pickled only with the ``spawn`` start method).
    threads : int, optional
        Intra-op threads per rank; default ``OMP_NUM_THREADS`` when set, else this process's
        ``torch.get_num_threads() // nprocs`` (at least 1), so the ranks share the cores.
    start_method : {"fork", "spawn", "forkserver"}, optional
        Default ``"fork"`` where available, else ``"spawn"``.

    Raises
    ------
    ValueError
        If ``nprocs`` or ``threads`` is not a positive integer, or this process is already a
        rank of a torchrun / process-group job.
    RuntimeError
        If CUDA is initialised in this process (forked ranks could not use it).
    RankFailedError
        If a rank failed: the message names the rank and ends with its error (the rank's
        traceback is the exception's ``__cause__``).
    """
    import torch.multiprocessing as mp

    nprocs = check_int(nprocs, "nprocs", low=1)
    threads = _rank_threads(threads, nprocs)
    if _initialised() or launched_by_torchrun():
        raise ValueError(
            "`nprocs`: this process is already one rank of a distributed job "
            f"(WORLD_SIZE={os.environ.get('WORLD_SIZE')}); launch with torchrun or with "
            "launch_local, not both"
        )
    start_method = _start_method(start_method)
    try:
        mp.start_processes(
            _local_rank_main,
            args=(fn, tuple(args), _local_env(nprocs), threads),
            nprocs=nprocs,
            join=True,
            start_method=start_method,
        )
    except mp.ProcessRaisedException as exc:
        lines = [ln for ln in str(exc.msg).strip().splitlines() if ln.strip()]
        raise RankFailedError(
            f"rank {exc.error_index} of {nprocs} failed: {lines[-1] if lines else 'unknown error'}"
        ) from exc
    except mp.ProcessExitedException as exc:
        raise RankFailedError(
            f"rank {exc.error_index} of {nprocs} exited with status {exc.exit_code}"
        ) from exc


def _rank_threads(threads: int | None, nprocs: int) -> int:
    """Intra-op threads per rank: ``threads``, else ``OMP_NUM_THREADS`` when set, else this
    process's threads shared by the ``nprocs`` ranks (at least 1)."""
    if threads is None:
        raw = os.environ.get("OMP_NUM_THREADS")
        threads = int(raw) if raw and raw.isdigit() and int(raw) > 0 else None
        threads = threads or max(1, torch.get_num_threads() // nprocs)
    return check_int(threads, "threads", low=1)


def _local_env(nprocs: int) -> dict[str, str]:
    """torchrun's environment of a one-machine job of ``nprocs`` ranks, less each rank's own
    (``RANK``, ``LOCAL_RANK``): rendezvous on a free loopback port."""
    return {
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }


def _start_method(start_method: str | None) -> str:
    """``start_method`` checked (default ``"fork"`` where available, else ``"spawn"``); a fork
    is refused once CUDA is initialised."""
    import torch.multiprocessing as mp

    methods = mp.get_all_start_methods()
    start_method = start_method or ("fork" if "fork" in methods else "spawn")
    if start_method not in methods:
        raise ValueError(f"`start_method` must be one of {methods}, got {start_method!r}")
    if start_method == "fork" and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA is initialised in this process, so forked ranks could not use it: call "
            "launch_local before any CUDA work, pass start_method='spawn', or use torchrun"
        )
    return start_method


def _comm_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where small control tensors are communicated: this rank's GPU for NCCL, else CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard_range(n: int, rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Rows ``[start, stop)`` of ``n`` that ``rank`` owns: contiguous, sizes differing by <= 1.

    The first ``n % world_size`` ranks get one row more (``numpy.array_split``'s rule); a rank
    gets no row when ``n < world_size``. Defaults: this process's rank and world size.
    """
    rank = get_rank() if rank is None else rank
    world_size = get_world_size() if world_size is None else world_size
    if n < 0 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"invalid shard: n={n}, rank={rank}, world_size={world_size}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def shard_sizes(
    n_local: int, device: torch.device | str = "cpu", group: dist.ProcessGroup | None = None
) -> list[int]:
    """Row counts of every rank's shard, in rank order (``[n_local]`` when not distributed).

    ``device`` is where the size tensor is communicated (CUDA for NCCL).
    """
    if not is_distributed(group):
        return [int(n_local)]
    local = torch.tensor([int(n_local)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, local, group=group)
    return [int(s.item()) for s in sizes]


def all_gather_tensors(tensor: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """Concatenate ``tensor`` of every rank along dim 0; the lengths may differ between ranks.

    Sizes are exchanged first, each rank pads to the longest, and the padding is cut off after
    the gather, so row ``i`` of rank ``r`` ends up at offset ``sum(n_0..n_{r-1}) + i``. Other
    dimensions, dtype and device must agree across ranks. Not differentiable. Returns
    ``tensor`` itself when not distributed.

    Parameters
    ----------
    tensor : Tensor
        ``[n_r, ...]`` on this rank (on the backend's device: CPU for gloo, CUDA for nccl).
    group : ProcessGroup, optional
        Default: the default process group.

    Returns
    -------
    Tensor
        ``[sum_r n_r, ...]``, ordered by rank.
    """
    if not is_distributed(group):
        return tensor
    if tensor.ndim == 0:
        raise ValueError("`tensor` must have at least one dimension to gather along dim 0")
    lengths = shard_sizes(tensor.shape[0], tensor.device, group)
    longest = max(lengths)
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    chunks = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(chunks, padded.contiguous(), group=group)
    return torch.cat([c[:n] for c, n in zip(chunks, lengths)], dim=0)


def ring_chunks(
    local: Tensor,
    sizes: Sequence[int],
    *,
    chunk_bytes: int = RING_CHUNK_BYTES,
    group: dist.ProcessGroup | None = None,
) -> Iterator[tuple[int, Tensor]]:
    """Every rank's shard, in rank order, as ``(global row offset, rows)`` chunks on every rank.

    Collective: every rank of ``group`` must iterate to the end. The owner of each chunk
    broadcasts it; the next chunk is received while the caller works on the current one (two
    receive buffers), so a rank holds its own shard plus two chunks of at most
    ``chunk_bytes``, never the whole ``N x D`` set. A rank's own shard is yielded once, whole
    (a view, no copy), when its turn comes: it posts the broadcasts of all its chunks at once
    (sends from its own rows, no buffer) and works on the whole shard meanwhile, so the
    caller sees ``1 + (other ranks' chunks)`` pieces, not one per ``chunk_bytes`` (measured
    at N = 60k, D = 256, W = 2, 5 instead of 8 top-k merges per query). Not distributed:
    yields ``(0, local)`` once.

    Parameters
    ----------
    local : Tensor
        ``[n_r, ...]`` this rank's shard (rows ``offset_r .. offset_r + n_r`` of the whole).
    sizes : sequence of int
        Every rank's ``n_r`` (:func:`shard_sizes`).
    chunk_bytes : int
        Largest chunk sent at once.
    group : ProcessGroup, optional
        Default: the default process group.
    """
    if not is_distributed(group):
        yield 0, local
        return
    rank = dist.get_rank(group)
    rows = max(1, chunk_bytes // (math.prod(local.shape[1:]) * local.element_size()))
    plan = []  # (owner, global offset, local start, length)
    offset = 0
    for r, n_r in enumerate(sizes):
        for start in range(0, n_r, rows):
            plan.append((r, offset + start, start, min(rows, n_r - start)))
        offset += n_r
    own = [i for i, p in enumerate(plan) if p[0] == rank]  # contiguous in the plan
    tail = tuple(local.shape[1:])
    bufs = [local.new_empty((min(rows, max(sizes, default=0)), *tail)) for _ in range(2)]
    posted: dict[int, tuple[Tensor, dist.Work | None]] = {}

    def post(i: int) -> None:
        """Post chunk ``i``'s broadcast: a send of this rank's rows, or a receive."""
        if i in posted or i >= len(plan):
            return
        owner, _, start, length = plan[i]
        src = dist.get_global_rank(group, owner) if group is not None else owner
        t = local[start : start + length].contiguous() if owner == rank else bufs[i % 2][:length]
        posted[i] = (t, dist.broadcast(t, src=src, group=group, async_op=True))

    post(0)
    sent: list[dist.Work | None] = []
    i = 0
    while i < len(plan):
        if plan[i][0] == rank:  # this rank's turn: every send at once, the whole shard
            for j in own:
                post(j)
            sent += [posted.pop(j)[1] for j in own]
            i = own[-1] + 1
            post(i)  # the next rank's first chunk arrives meanwhile (the buffers are free)
            yield plan[own[0]][1], local
            continue
        t, work = posted.pop(i)
        if work is not None:
            work.wait()
        post(i + 1)
        yield plan[i][1], t
        i += 1
    for work in sent:  # this rank's sends have completed once every peer received them
        if work is not None:
            work.wait()


@dataclass(frozen=True)
class Shards:
    """How ``N`` rows are split, contiguously and in rank order, over the ranks of a group.

    Rank ``r`` owns rows ``offset_r .. offset_r + sizes[r]`` (a size may be 0). The methods
    are the collectives a sharded computation needs; with one rank (:meth:`local`) they are
    the identity, so the single-process code is the ``W = 1`` case of the sharded one.

    Attributes
    ----------
    sizes : tuple of int
        Every rank's row count.
    rank : int
        This process's rank in ``group``.
    group : ProcessGroup or None
        The process group (None: the default group, or no group with one rank).
    """

    sizes: tuple[int, ...]
    rank: int = 0
    group: dist.ProcessGroup | None = None

    @classmethod
    def local(cls, n: int) -> Shards:
        """All ``n`` rows in this process (no communication, even under a process group)."""
        return cls((int(n),))

    @classmethod
    def of(
        cls,
        n_local: int,
        device: torch.device | str = "cpu",
        group: dist.ProcessGroup | None = None,
    ) -> Shards:
        """The shards of ``group`` (collective: exchanges every rank's ``n_local``)."""
        return cls(tuple(shard_sizes(n_local, device, group)), get_rank(group), group)

    @property
    def world_size(self) -> int:
        return len(self.sizes)

    @property
    def active(self) -> bool:
        """True with more than one rank (communication needed)."""
        return len(self.sizes) > 1

    @property
    def n(self) -> int:
        """Total number of rows."""
        return sum(self.sizes)

    @property
    def offset(self) -> int:
        """Global id of this rank's first row."""
        return sum(self.sizes[: self.rank])

    def global_ids(self, device: torch.device | str = "cpu") -> Tensor:
        """Global ids of this rank's rows."""
        return torch.arange(self.offset, self.offset + self.sizes[self.rank], device=device)

    def chunks(self, local: Tensor, chunk_bytes: int | None = None) -> Iterator[tuple[int, Tensor]]:
        """Every rank's shard past this rank (:func:`ring_chunks`; ``(0, local)`` alone)."""
        if not self.active:
            return iter([(0, local)])
        if chunk_bytes is None:
            chunk_bytes = RING_CHUNK_BYTES  # read at call time (tests shrink it)
        return ring_chunks(local, self.sizes, chunk_bytes=chunk_bytes, group=self.group)

    def gather(self, local: Tensor) -> Tensor:
        """Every rank's ``local`` concatenated along dim 0 in rank order (``local`` alone)."""
        return all_gather_tensors(local, self.group) if self.active else local

    def sum(self, value: float) -> float:
        """Sum of ``value`` over the ranks."""
        if not self.active:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=_comm_device(self.group))
        return float(self.gather(t).sum())


class RowExchange:
    """Brings a fixed set of rows, owned by various ranks, to this rank; reusable per tensor.

    Built once from the global row ids this rank needs (collective); :meth:`fetch` then sends
    those rows of any ``[n_r, ...]`` shard with the same row layout (e.g. each posterior draw)
    with one ``all_to_all``. With one rank ``fetch`` returns ``local[ids]``.

    Parameters
    ----------
    needed : Tensor
        1-D int64 global row ids (any order, duplicates allowed) this rank wants.
    shards : Shards
        The row layout.

    Attributes
    ----------
    ids : Tensor
        The distinct needed ids, ascending; :meth:`fetch` returns their rows in this order.
    """

    def __init__(self, needed: Tensor, shards: Shards) -> None:
        self.shards = shards
        self.ids = torch.unique(needed.long())
        dev = needed.device
        if not shards.active:
            self.send_local = self.ids
            return
        world, group = shards.world_size, shards.group
        bounds = torch.tensor([0, *shards.sizes], dtype=torch.long, device=dev).cumsum(0)
        owner = torch.searchsorted(bounds[1:], self.ids, right=True)
        self.recv_counts = torch.bincount(owner, minlength=world).tolist()
        # tell every owner which of its rows this rank wants
        counts = torch.tensor(self.recv_counts, dtype=torch.long, device=dev)
        send_counts = torch.empty_like(counts)
        dist.all_to_all_single(send_counts, counts, group=group)
        self.send_counts = send_counts.tolist()
        wanted = torch.empty(sum(self.send_counts), dtype=torch.long, device=dev)
        dist.all_to_all_single(wanted, self.ids, self.send_counts, self.recv_counts, group=group)
        self.send_local = wanted - shards.offset

    def fetch(self, local: Tensor) -> Tensor:
        """Rows ``ids`` of the whole tensor whose shard on this rank is ``local``."""
        send = local.index_select(0, self.send_local)
        if not self.shards.active:
            return send
        out = local.new_empty((self.ids.numel(), *local.shape[1:]))
        dist.all_to_all_single(
            out, send, self.recv_counts, self.send_counts, group=self.shards.group
        )
        return out


def raise_if_any(error: BaseException | None, group: dist.ProcessGroup | None = None) -> None:
    """Collective: raise on every rank when any rank of ``group`` has an ``error``.

    A rank that rejected its own input raises its error; the others raise a ``ValueError``
    naming the first failing rank and repeating its message, so no rank waits forever in a
    later collective and whichever rank a launcher reports first tells what went wrong. Not
    distributed: raises ``error`` if given.
    """
    if not is_distributed(group):
        if error is not None:
            raise error
        return
    flags = all_gather_tensors(torch.tensor([error is not None], device=_comm_device(group)), group)
    bad = flags.nonzero().flatten().tolist()
    if not bad:
        return
    messages: list[object] = [None] * dist.get_world_size(group)
    dist.all_gather_object(messages, None if error is None else str(error), group=group)
    if error is not None:
        raise error
    others = f" (and rank(s) {bad[1:]})" if len(bad) > 1 else ""
    raise ValueError(f"rank {bad[0]} rejected its input{others}: {messages[bad[0]]}")


def broadcast_state(
    module: torch.nn.Module,
    src: int = 0,
    *,
    buffers_only: bool = False,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Collective: overwrite ``module``'s parameters and buffers with those of rank ``src``.

    After DDP training the parameters agree, but buffers updated in the last forward pass
    (BatchNorm running statistics) are each rank's own, while the checkpoint holds rank 0's:
    a sharded evaluation must embed every shard with that one model. No-op when not
    distributed.
    """
    if not is_distributed(group):
        return
    tensors = list(module.buffers()) if buffers_only else [*module.parameters(), *module.buffers()]
    src = dist.get_global_rank(group, src) if group is not None else src
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src=src, group=group)


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
    if not _initialised():
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    gc.collect()
    dist.destroy_process_group()


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
