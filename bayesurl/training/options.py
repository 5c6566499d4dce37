"""The settings of one training run, checked once when built: :class:`FitOptions`.

URL (Kirchhof et al., 2023), section 4 "Training infrastructure" and appendix B: LAMB, a linear
warm-up followed by cosine annealing, gradient accumulation of micro-batches into a large
aggregated batch. :func:`~bayesurl.training.fit` reads these settings; the method, the loader
and the hooks (objects with state) are its arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from bayesurl._checks import check_device, check_input_file, check_int, check_number
from bayesurl.training.checkpoint import check_serialisable
from bayesurl.training.optim import check_optimizer_kwargs
from bayesurl.training.trainer import Augment

__all__ = ["AmpMode", "FitOptions"]


class AmpMode(str, Enum):
    """Mixed-precision modes of :class:`FitOptions`.

    ``auto`` uses bf16 autocast on CUDA devices that support it, fp16 autocast with a
    :class:`torch.amp.GradScaler` on other CUDA devices, and full precision on CPU.
    """

    AUTO = "auto"
    OFF = "off"
    BF16 = "bf16"
    FP16 = "fp16"


@dataclass(frozen=True)
class FitOptions:
    """How :func:`~bayesurl.training.fit` trains a method; checked once, when built.

    The training recipe of URL (Kirchhof et al., 2023, section 4 "Training infrastructure" and
    appendix B): LAMB (``optimizer="lamb"``), a linear warm-up (5 of 32 epochs) followed by
    cosine annealing to ``min_lr``, and ``grad_accum`` micro-batches per optimiser step (16 x
    128 = 2048 images). A recipe's ``[train]`` table (:class:`bayesurl.runs.TrainConfig`)
    holds the serialisable part of these settings together with the loader's; the run
    pipeline builds a :class:`FitOptions` from it.

    Parameters
    ----------
    epochs : int
        Total number of epochs of the run (including those done before ``resume``).
    optimizer : {"lamb", "adamw", "adam", "sgd"} or torch.optim.Optimizer
        See :func:`~bayesurl.training.optim.build_optimizer`. An optimiser instance over the
        method's parameters is used as it is (``lr`` and ``weight_decay`` are then not
        applied, and ``optimizer_kwargs`` beside it are refused; the schedule scales its
        learning rate by the warm-up / cosine factor, which stays 1 with ``min_lr = lr`` and
        no warm-up). :func:`~bayesurl.training.fit` refuses an instance that holds none of
        the method's trainable parameters (it would train nothing) and warns when it holds
        only some.
    lr, weight_decay : float
        Peak learning rate and weight decay (both >= 0).
    optimizer_kwargs : mapping or None
        Extra optimiser arguments (``betas``, ``eps``, ``momentum``...).
    warmup_epochs : float
        Linear warm-up length in epochs (URL: 5 of 32); ignored when ``warmup_steps`` is given.
    warmup_steps : int or None
        Linear warm-up length in optimiser steps.
    min_lr : float
        Learning rate at the end of the cosine, in ``[0, lr]``.
    grad_accum : int
        Micro-batches per optimiser step; each loss is divided by the number of micro-batches
        in its group, so ``k`` micro-batches of a mean-reduced loss give the gradient of one
        batch ``k`` times larger.
    clip_grad : float or None
        Clip the global gradient norm to this value before each step.
    amp : {"auto", "off", "bf16", "fp16"}
        Mixed precision (any case; stored as an :class:`AmpMode`); ``auto`` is bf16 (or fp16
        with a GradScaler) on CUDA and off on CPU.
    seed : int or None
        Seeds Python, numpy and torch before training
        (:func:`~bayesurl.training.seed_everything`).
    augment : callable or None
        Batch augmentation ``augment(x) -> x``; two-view methods get two independent draws.
    resume : path-like or None
        A checkpoint to continue from; the run is bit-identical to an uninterrupted one on CPU
        when the loader, method and settings are the same.
    method_kwargs : mapping or None
        Constructor kwargs of the method stored in the checkpoint so that
        :func:`~bayesurl.training.load_method_from_checkpoint` can rebuild it (plain values
        only). ``None``: the record the method keeps of them (``method.hparams`` or
        ``method.init_kwargs``); a record holding modules is not stored (with a warning).
    device : str, torch.device or None
        Train here (the method is moved); ``None`` keeps the method's device.
    progress : bool
        Show a tqdm bar with the running loss (rank 0 only).
    ddp_kwargs : mapping or None
        Extra :class:`~torch.nn.parallel.DistributedDataParallel` arguments (default
        ``find_unused_parameters=True``).

    Raises
    ------
    ValueError
        Naming the argument: ``epochs`` or ``grad_accum`` below 1 or not whole, a negative
        ``warmup_steps``, a negative or non-finite ``lr``, ``weight_decay`` or
        ``warmup_epochs``, ``min_lr`` outside ``[0, lr]``, a non-positive ``clip_grad``, a
        ``seed`` outside ``[0, 2**32)``, an unknown optimiser name or ``amp`` mode, an
        ``optimizer_kwargs`` key the optimiser does not take (or any beside an optimiser
        instance), ``method_kwargs`` a checkpoint cannot hold, a device this machine lacks.
    TypeError
        Naming the argument: a setting of the wrong type (``epochs="5"``, ``augment`` not
        callable, ``progress`` not a bool, ``optimizer_kwargs`` not a mapping).
    FileNotFoundError
        If ``resume`` names no file.

    Examples
    --------
    >>> from bayesurl.training import FitOptions, fit
    >>> url = FitOptions(epochs=32, optimizer="lamb", lr=1e-3, warmup_epochs=5, grad_accum=16)
    >>> fit(method, loader, url, hooks=[Checkpointing("runs/ce")])  # doctest: +SKIP
    >>> fit(method, loader, url, epochs=2)  # a field replaced for one call  # doctest: +SKIP
    """

    epochs: int = 1
    optimizer: str | torch.optim.Optimizer = "lamb"
    lr: float = 1e-3
    weight_decay: float = 0.0
    optimizer_kwargs: Mapping[str, Any] | None = None
    warmup_epochs: float = 0.0
    warmup_steps: int | None = None
    min_lr: float = 0.0
    grad_accum: int = 1
    clip_grad: float | None = None
    amp: str | AmpMode = AmpMode.AUTO
    seed: int | None = None
    augment: Augment | None = None
    resume: str | os.PathLike[str] | None = None
    method_kwargs: Mapping[str, Any] | None = None
    device: str | torch.device | None = None
    progress: bool = True
    ddp_kwargs: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "epochs", check_int(self.epochs, "epochs", low=1))
        object.__setattr__(self, "grad_accum", check_int(self.grad_accum, "grad_accum", low=1))
        if self.warmup_steps is not None:
            steps = check_int(self.warmup_steps, "warmup_steps", low=0)
            object.__setattr__(self, "warmup_steps", steps)
        check_number(self.warmup_epochs, "warmup_epochs", low=0.0)
        check_number(self.lr, "lr", low=0.0)
        check_number(self.min_lr, "min_lr", low=0.0)
        if self.min_lr > self.lr:
            raise ValueError(f"`min_lr` must lie in [0, lr={self.lr}], got {self.min_lr}")
        check_number(self.weight_decay, "weight_decay", low=0.0)
        if self.clip_grad is not None:
            check_number(self.clip_grad, "clip_grad", low=0.0, low_open=True)
        if self.seed is not None:
            object.__setattr__(self, "seed", check_int(self.seed, "seed", low=0, high=2**32 - 1))
        for name in ("optimizer_kwargs", "ddp_kwargs"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f"`{name}` must be a mapping or None, got {type(value).__name__}")
        if self.augment is not None and not callable(self.augment):
            raise TypeError(
                f"`augment` must be callable or None, got {type(self.augment).__name__}"
            )
        if not isinstance(self.progress, bool):
            raise TypeError(f"`progress` must be True or False, got {self.progress!r}")
        if self.resume is not None:
            check_input_file(self.resume, "resume")
        if isinstance(self.optimizer, torch.optim.Optimizer):
            if self.optimizer_kwargs:
                raise ValueError(
                    "`optimizer_kwargs` are not applied to an optimiser instance: give them to "
                    "its constructor, or name the optimiser (optimizer='sgd')"
                )
        else:
            check_optimizer_kwargs(self.optimizer, self.optimizer_kwargs or {})
        try:
            amp = AmpMode(str(getattr(self.amp, "value", self.amp)).lower())
        except ValueError:
            valid = ", ".join(m.value for m in AmpMode)
            raise ValueError(f"unknown `amp` mode {self.amp!r}; valid modes: {valid}") from None
        object.__setattr__(self, "amp", amp)
        object.__setattr__(self, "device", check_device(self.device, "device"))
        if self.method_kwargs is not None:
            check_serialisable(dict(self.method_kwargs), "method_kwargs")
            object.__setattr__(self, "method_kwargs", dict(self.method_kwargs))
