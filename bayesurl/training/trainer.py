"""The trainer: micro-batches, gradient accumulation, mixed precision, DDP and the schedule.

URL (Kirchhof et al., 2023), section 4 and appendix B: each optimiser step accumulates the
gradients of ``grad_accum`` micro-batches, each loss divided by the number of micro-batches in
its group, so ``k`` micro-batches of a mean-reduced loss give the gradient of one batch ``k``
times larger (URL: 16 x 128 = 2048); the learning rate follows the scheduler per optimiser
step. Everything else (checkpoints, evaluation per epoch, progress, LAM's online Hessian
update) is a :class:`~bayesurl.training.trainer.Hook`. :func:`bayesurl.training.fit` builds a
trainer from keyword arguments; build one directly to pass an optimiser or hooks of your own.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from bayesurl import distributed as D
from bayesurl._checks import check_device
from bayesurl.data.batch import unpack_batch
from bayesurl.methods.base import Method
from bayesurl.training.result import TrainResult
from bayesurl.training.seed import get_rng_state, set_rng_state

__all__ = ["Augment", "Hook", "TrainPlan", "Trainer", "prepare_batch"]

Augment = Callable[[Tensor], Tensor]


class Hook:
    """Base class: every event does nothing; subclasses override the ones they need."""

    #: name of the hook's state in a checkpoint ("" for a hook without state)
    key: ClassVar[str] = ""

    def on_fit_start(self, trainer: Trainer) -> None:
        """Before the first epoch of this call (after a resume has restored the state)."""

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        """Before the first batch of ``epoch`` (0-based), the method in train mode."""

    def on_backward_end(self, trainer: Trainer, loss: float) -> None:
        """After the backward pass of one micro-batch (before any optimiser step)."""

    def on_step_end(self, trainer: Trainer) -> None:
        """After one optimiser and scheduler step."""

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After an epoch; ``record`` is its (mutable) entry of ``trainer.result.history``."""

    def on_fit_end(self, trainer: Trainer) -> None:
        """After the last epoch."""

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint under :attr:`key` (tensors, strings, numbers, lists, dicts)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output on resume."""


def run_hooks(hooks: list[Hook], event: str, *args: Any) -> None:
    """Call ``event`` on every hook, in order."""
    for hook in hooks:
        getattr(hook, event)(*args)


def hook_states(hooks: list[Hook]) -> dict[str, Any]:
    """The checkpoint entry of the hooks with a :attr:`Hook.key`."""
    return {h.key: h.state_dict() for h in hooks if h.key}


def load_hook_states(hooks: list[Hook], states: Mapping[str, Any]) -> None:
    """Restore :func:`hook_states` output; a keyed hook missing from ``states`` raises."""
    for hook in hooks:
        if not hook.key:
            continue
        if hook.key not in states:
            raise ValueError(f"the checkpoint holds no state of hook {hook.key!r}")
        hook.load_state_dict(states[hook.key])


@dataclass(frozen=True)
class TrainPlan:
    """The shape of a run: epochs and micro-batches, and the optimiser steps they make.

    Attributes
    ----------
    epochs : int
        Total epochs of the run (including those before a resume).
    n_batches : int
        Micro-batches per epoch (the loader's length).
    grad_accum : int
        Micro-batches per optimiser step (the last group of an epoch may be shorter).
    """

    epochs: int
    n_batches: int
    grad_accum: int = 1

    @property
    def steps_per_epoch(self) -> int:
        """Optimiser steps per epoch, ``ceil(n_batches / grad_accum)``."""
        return math.ceil(self.n_batches / self.grad_accum)

    @property
    def total_steps(self) -> int:
        """Optimiser steps of the whole run."""
        return self.epochs * self.steps_per_epoch

    def group_size(self, index: int) -> int:
        """Micro-batches in the accumulation group of micro-batch ``index`` (0-based)."""
        start = (index // self.grad_accum) * self.grad_accum
        return min(self.grad_accum, self.n_batches - start)

    def closes_group(self, index: int) -> bool:
        """Whether micro-batch ``index`` is the last of its group (an optimiser step follows)."""
        return index % self.grad_accum == self.group_size(index) - 1


class _LossModule(nn.Module):
    """Routes ``forward`` to ``method.training_loss`` so DDP sees the loss computation."""

    def __init__(self, method: Method) -> None:
        super().__init__()
        self.method = method

    def forward(self, batch: tuple[Any, Tensor]) -> Tensor:
        return self.method.training_loss(batch)


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, tuple):
        return tuple(_to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to_device(o, device) for o in obj]
    return obj


def prepare_batch(
    batch: Any, method: Method, device: torch.device, augment: Augment | None = None
) -> tuple[Any, Tensor]:
    """Turn one loader batch into the ``(x, y)`` that ``method.training_loss`` expects.

    The batch is moved to ``device``. For a two-view method (``method.two_view``, URL section
    4.1: InfoNCE, MCInfoNCE) ``x`` becomes ``(augment(x), augment(x))`` -- two independent
    draws of the batch augmentation -- unless the loader already yields a pair ``(x1, x2)``.
    For other methods ``augment`` (if given) is applied once.

    Parameters
    ----------
    batch : tuple, list or dict
        ``(x, y)`` from the data loader (read by :func:`bayesurl.data.unpack_batch`); ``x``
        may itself be a pair of views.
    method : Method
    device : torch.device
    augment : callable or None
        ``augment(x_batch) -> x_batch``, e.g. ``bayesurl.data.transforms.TwoViews``' view.

    Raises
    ------
    ValueError
        If the batch cannot be read (labels are required for a ``supervised`` method), or a
        two-view method gets a single view and no ``augment``.
    """
    if isinstance(device, str):  # a name from a user: parsed and checked once, named
        device = check_device(device, "device")
    x, y = unpack_batch(batch, labels=method.supervised)
    x, y = _to_device(x, device), _to_device(y, device)
    is_pair = isinstance(x, (tuple, list))
    if method.two_view:
        if is_pair:
            x = (x[0], x[1])
        elif augment is not None:
            x = (augment(x), augment(x))
        else:
            raise ValueError(
                f"method {method.name or type(method).__name__!r} trains on two views; pass "
                "`augment` (a batch augmentation) or a loader that yields ((x1, x2), y)"
            )
    elif augment is not None:
        x = augment(x)
    return x, y


def loader_state(loader: Iterable[Any]) -> dict[str, Any]:
    """The shuffling state of a loader (its generators and sampler epoch), for resume."""
    state: dict[str, Any] = {}
    gen = getattr(loader, "generator", None)
    if isinstance(gen, torch.Generator):
        state["generator"] = gen.get_state()
    sampler = getattr(loader, "sampler", None)
    sgen = getattr(sampler, "generator", None)
    if isinstance(sgen, torch.Generator) and sgen is not gen:
        state["sampler_generator"] = sgen.get_state()
    if isinstance(getattr(sampler, "epoch", None), int):
        state["sampler_epoch"] = int(sampler.epoch)
    return state


def set_loader_state(loader: Iterable[Any], state: Mapping[str, Any]) -> None:
    """Restore :func:`loader_state` output."""
    gen = getattr(loader, "generator", None)
    if "generator" in state and isinstance(gen, torch.Generator):
        gen.set_state(state["generator"])
    sampler = getattr(loader, "sampler", None)
    sgen = getattr(sampler, "generator", None)
    if "sampler_generator" in state and isinstance(sgen, torch.Generator):
        sgen.set_state(state["sampler_generator"])


def _rng_states_all_ranks() -> list[dict[str, Any]]:
    mine = get_rng_state()
    if not D.is_distributed():
        return [mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered


@dataclass
class Trainer:
    """Runs ``method.training_loss`` over ``loader`` for ``plan.epochs`` epochs.

    Parameters
    ----------
    method : Method
        Trained in place (already on its device).
    loader : iterable with ``len``
        The micro-batches (under DDP already sharded, see
        :func:`~bayesurl.distributed.distributed_loader`).
    optimizer, scheduler
        A :class:`torch.optim.Optimizer` over the trainable parameters and a scheduler
        stepped once per optimiser step.
    plan : TrainPlan
    device : torch.device
    amp_dtype : torch.dtype or None
        Autocast dtype (``None``: full precision); fp16 uses a :class:`torch.amp.GradScaler`.
    clip_grad : float or None
        Clip the global gradient norm before each step.
    augment : callable or None
        See :func:`prepare_batch`.
    hooks : sequence of Hook
        Called in order at each event (:mod:`bayesurl.training.hooks`).
    ddp_kwargs : mapping or None
        Extra DistributedDataParallel arguments (default ``find_unused_parameters=True``).
    """

    method: Method
    loader: Iterable[Any]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    plan: TrainPlan
    device: torch.device
    amp_dtype: torch.dtype | None = None
    clip_grad: float | None = None
    augment: Augment | None = None
    hooks: Sequence[Hook] = ()
    ddp_kwargs: Mapping[str, Any] | None = None
    result: TrainResult = field(init=False)

    def __post_init__(self) -> None:
        self.hooks = list(self.hooks)
        self.result = TrainResult(method=self.method)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.amp_dtype is torch.float16
        )
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.distributed = D.is_distributed()
        self.rank, self.main = D.get_rank(), D.is_main_process()
        self.epoch_loss, self.n_seen = 0.0, 0

    # ------------------------------------------------------------------ state
    def resume_state(self) -> dict[str, Any]:
        """Everything a resumed run needs (collective: gathers the RNG states of all ranks)."""
        return {
            "model": self.method.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
            "epoch": self.result.epochs,
            "global_step": self.result.global_step,
            "rng": _rng_states_all_ranks(),
            "loader": loader_state(self.loader),
            "history": self.result.history,
            "hooks": hook_states(self.hooks),
        }

    def load_resume_state(self, ckpt: Mapping[str, Any]) -> None:
        """Restore :meth:`resume_state` output (RNG states and generators included).

        Raises
        ------
        ValueError
            If the model, optimiser, scheduler, scaler or hook states do not fit.
        """
        try:
            self.method.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
            if ckpt["scaler"]:
                self.scaler.load_state_dict(ckpt["scaler"])
            load_hook_states(self.hooks, ckpt.get("hooks", {}))
        except (RuntimeError, ValueError, KeyError) as exc:  # one error type for callers
            raise ValueError(str(exc)) from None
        self.result.epochs = int(ckpt["epoch"])
        self.result.global_step = int(ckpt["global_step"])
        self.result.history = list(ckpt.get("history", []))
        rngs = ckpt["rng"]
        rngs = rngs if isinstance(rngs, list) else [rngs]
        set_rng_state(rngs[self.rank] if self.rank < len(rngs) else rngs[0])
        set_loader_state(self.loader, ckpt["loader"])

    # ------------------------------------------------------------------ loop
    def run(self) -> TrainResult:
        """Train from the completed epochs to ``plan.epochs``; returns the result."""
        loss_module: nn.Module = _LossModule(self.method)
        if self.distributed:
            kwargs = {"find_unused_parameters": True, **dict(self.ddp_kwargs or {})}
            loss_module = D.wrap_ddp(loss_module, **kwargs)
        self.loss_module = loss_module
        t_start = time.perf_counter()
        run_hooks(self.hooks, "on_fit_start", self)
        for epoch in range(self.result.epochs, self.plan.epochs):
            self.run_epoch(epoch)
        run_hooks(self.hooks, "on_fit_end", self)
        self.result.train_time = time.perf_counter() - t_start
        return self.result

    def run_epoch(self, epoch: int) -> None:
        """One epoch: micro-batches, optimiser steps, then the epoch's record and hooks."""
        t_epoch = time.perf_counter()
        self.method.train()
        self.method.on_epoch_start(epoch)
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        run_hooks(self.hooks, "on_epoch_start", self, epoch)
        self.optimizer.zero_grad(set_to_none=True)
        self.epoch_loss, self.n_seen, self.step_loss = 0.0, 0, 0.0
        for i, batch in enumerate(self.loader):
            self.epoch, self.batch_index = epoch, i
            self.micro_batch(batch, i)
            if self.plan.closes_group(i):
                self.optimizer_step()
        if self.n_seen != self.plan.n_batches:
            raise ValueError(
                f"`train_loader` yielded {self.n_seen} batches in epoch {epoch + 1} but its "
                f"length is {self.plan.n_batches}"
            )
        self.method.on_epoch_end(epoch)
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "loss": self.epoch_loss / self.n_seen,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "time": time.perf_counter() - t_epoch,
            "steps": self.result.global_step,
        }
        self.result.history.append(record)
        self.result.epochs = epoch + 1
        run_hooks(self.hooks, "on_epoch_end", self, record)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def micro_batch(self, batch: Any, index: int) -> None:
        """Forward and backward of one micro-batch (gradients are accumulated)."""
        group_size = self.plan.group_size(index)
        x, y = prepare_batch(batch, self.method, self.device, self.augment)
        no_sync = getattr(self.loss_module, "no_sync", None)
        sync = (
            no_sync()
            if no_sync is not None and not self.plan.closes_group(index)
            else contextlib.nullcontext()
        )
        with sync:
            with self._autocast():
                loss = self.loss_module((x, y))
            value = self._checked_value(loss)
            self.scaler.scale(loss / group_size).backward()
        self.epoch_loss += value
        self.step_loss += value / group_size
        self.n_seen += 1
        run_hooks(self.hooks, "on_backward_end", self, value)

    def _checked_value(self, loss: Any) -> float:
        """The loss as a float; a non-finite loss on any rank stops every rank."""
        if not isinstance(loss, Tensor) or loss.ndim != 0:
            raise ValueError(
                "`method.training_loss` must return a scalar tensor, got "
                f"{getattr(loss, 'shape', type(loss).__name__)}"
            )
        value = loss.detach().float()
        finite = torch.isfinite(value)
        if self.distributed:
            flag = finite.to(torch.int64).reshape(1)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            finite = flag[0].bool()
        if not bool(finite):
            raise FloatingPointError(
                f"non-finite training loss ({value.item()} on rank {self.rank}, or on another "
                f"rank) at epoch {self.epoch + 1}, batch {self.batch_index + 1}, optimiser step "
                f"{self.result.global_step + 1}; lower the learning rate, enable clip_grad, "
                "or check the data for NaN"
            )
        return float(value.item())

    def optimizer_step(self) -> None:
        """Clip, step the optimiser and the scheduler, and record the step."""
        if self.clip_grad is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad)
        self.result.lrs.append(float(self.optimizer.param_groups[0]["lr"]))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.result.global_step += 1
        self.result.losses.append(self.step_loss)
        self.step_loss = 0.0
        run_hooks(self.hooks, "on_step_end", self)
