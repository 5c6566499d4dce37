"""Training hooks: every behaviour of the loop beyond forward, backward and step.

A :class:`~bayesurl.training.trainer.Hook` is called by the
:class:`~bayesurl.training.trainer.Trainer` at fixed points of a run, in the spirit of PyTorch
Lightning's callbacks: the trainer keeps the loop (micro-batches, accumulation, mixed
precision, DDP, the schedule) and a new behaviour (evaluation per epoch, checkpoints, a
progress bar, the online Laplace update of LAM eq. 5 in
:mod:`bayesurl.laplace.lam`, an EMA of the weights...) is a hook
rather than another keyword of :func:`~bayesurl.training.fit`. A hook with a ``key`` and a
``state_dict`` is saved in every checkpoint under that key and restored on resume.

Events, in the order of one epoch: ``on_epoch_start``; per micro-batch ``on_backward_end``;
per optimiser step ``on_step_end``; ``on_epoch_end`` (the epoch's record is already in
``trainer.result.history``; hooks run in list order, so an evaluation placed before the
checkpoint is part of it). ``on_fit_start`` / ``on_fit_end`` frame the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from bayesurl import distributed as D
from bayesurl._checks import check_output_dir
from bayesurl.distributed import broadcast_state
from bayesurl.training.checkpoint import check_serialisable, save_checkpoint
from bayesurl.training.trainer import Hook, Trainer

__all__ = [
    "Checkpointing",
    "EpochEvaluation",
    "ExponentialMovingAverage",
    "ProgressBar",
]


class ProgressBar(Hook):
    """A tqdm bar per epoch with the running loss and learning rate (rank 0 only)."""

    def __init__(self) -> None:
        self.bar: Any = None

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        if not trainer.main:
            return
        from tqdm.auto import tqdm

        desc = f"epoch {epoch + 1}/{trainer.plan.epochs}"
        self.bar = tqdm(total=trainer.plan.n_batches, desc=desc)

    def on_backward_end(self, trainer: Trainer, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def on_step_end(self, trainer: Trainer) -> None:
        if self.bar is not None:
            running = trainer.epoch_loss / max(trainer.n_seen, 1)
            self.bar.set_postfix(loss=f"{running:.4g}", lr=f"{trainer.result.lrs[-1]:.3g}")

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class EpochEvaluation(Hook):
    """``eval_fn(method, epoch) -> mapping of numbers`` after each epoch, stored as
    ``record["eval"]``; the method is in eval mode and, under DDP, holds rank 0's buffers (the
    checkpointed model) on every rank, so ``eval_fn`` may gather across ranks."""

    def __init__(self, eval_fn: Callable[[Any, int], Mapping[str, Any]]) -> None:
        if not callable(eval_fn):
            raise TypeError(f"`eval_fn` must be callable, got {type(eval_fn).__name__}")
        self.eval_fn = eval_fn

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        method = trainer.method
        if trainer.distributed:
            broadcast_state(method, 0, buffers_only=True)
        method.eval()
        evaluated = self.eval_fn(method, record["epoch"] - 1)
        method.train()
        record["eval"] = {
            str(k): (float(v) if isinstance(v, (int, float, Tensor)) else v)
            for k, v in dict(evaluated or {}).items()
        }
        check_serialisable(record["eval"], "eval_fn result")


class Checkpointing(Hook):
    """Rank 0 writes ``directory/last.pt`` after every epoch (and ``epoch_{k}.pt`` with
    ``keep_epochs``): ``header`` (format, method, config) plus the trainer's resume state.

    Given to :func:`~bayesurl.training.fit` (``hooks=[..., Checkpointing("runs/ce")]``, last,
    so an evaluation hook before it is part of the checkpoint), it gets the run's header
    (the method's name and constructor options, fit's plan) from ``fit``;
    :func:`~bayesurl.training.load_method_from_checkpoint` rebuilds the method from it and
    ``fit(..., resume=directory / "last.pt")`` continues the run.

    Parameters
    ----------
    directory : path-like
        Where to write; checked (writable) when the hook is made, before any epoch runs.
    header : mapping, optional
        What every checkpoint holds besides the resume state (``fit`` fills it when ``None``).
    keep_epochs : bool
        Also keep ``epoch_{k}.pt`` for every epoch ``k`` (1-based).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        header: Mapping[str, Any] | None = None,
        keep_epochs: bool = False,
    ) -> None:
        self.directory = check_output_dir(directory, "directory")
        self.header = None if header is None else dict(header)
        self.keep_epochs = bool(keep_epochs)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        state = trainer.resume_state()  # every rank: it gathers the RNG states
        last = self.directory / "last.pt"
        if trainer.main:
            if self.header is None:
                raise ValueError("Checkpointing has no header: give it to fit (hooks=[...])")
            state = {**self.header, **state}
            trainer.result.checkpoint = save_checkpoint(state, last)
            if self.keep_epochs:
                save_checkpoint(state, self.directory / f"epoch_{record['epoch']}.pt")
        else:
            trainer.result.checkpoint = last
        D.barrier()


class ExponentialMovingAverage(Hook):
    """An exponential moving average of the trainable parameters, updated after every
    optimiser step: ``avg <- decay * avg + (1 - decay) * theta`` (Polyak averaging), starting
    at the weights of the first step's end. Saved in checkpoints (:attr:`key`).
    :meth:`copy_to` writes the average into a module of the same layout.
    """

    key = "ema"

    def __init__(self, decay: float = 0.999) -> None:
        if not 0.0 <= float(decay) < 1.0:
            raise ValueError(f"`decay` must lie in [0, 1), got {decay}")
        self.decay = float(decay)
        self.average: dict[str, Tensor] = {}

    def on_step_end(self, trainer: Trainer) -> None:
        with torch.no_grad():
            for name, p in trainer.method.named_parameters():
                if not p.requires_grad:
                    continue
                if name not in self.average:
                    self.average[name] = p.detach().clone()
                else:
                    self.average[name].mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)

    def copy_to(self, module: torch.nn.Module) -> None:
        """Write the averaged parameters into ``module`` (names as in the trained method)."""
        params = dict(module.named_parameters())
        with torch.no_grad():
            for name, value in self.average.items():
                params[name].copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "average": dict(self.average)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.decay = float(state["decay"])
        self.average = {k: v.clone() for k, v in dict(state["average"]).items()}
