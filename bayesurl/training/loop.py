"""The training entry point: :func:`fit` trains every method of the URL benchmark and LAM.

URL (Kirchhof et al., 2023), section 4 "Training infrastructure" and appendix B: every method is
trained with LAMB, a linear warm-up followed by cosine annealing, and gradient accumulation of
micro-batches into a large aggregated batch; self-supervised methods (InfoNCE, MCInfoNCE) see
two augmented views of each image. :func:`fit` checks its arguments, builds the optimiser and
schedule, restores a checkpoint, and runs a :class:`~bayesurl.training.trainer.Trainer` whose
hooks (:mod:`bayesurl.training.hooks`, given as ``hooks=[...]``) carry everything else: an
evaluation per epoch, checkpoints, LAM's online Hessian update
(:class:`~bayesurl.laplace.lam.OnlineLaplaceUpdate`); ``progress`` shows the bar. The old
keywords ``checkpoint_dir``, ``keep_epoch_checkpoints`` and ``eval_fn`` still install their hook,
with a :class:`DeprecationWarning` naming it. Mixed precision
on GPU, seeded runs, bit-identical resume on CPU, and DistributedDataParallel under
``torchrun`` (:mod:`bayesurl.distributed`).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

import torch

from bayesurl import distributed as D
from bayesurl._checks import check_device, check_number, check_output_dir
from bayesurl.methods.base import Method
from bayesurl.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    RESUME_KEYS,
    check_serialisable,
    load_checkpoint,
)
from bayesurl.training.hooks import Checkpointing, EpochEvaluation, ProgressBar, device_of
from bayesurl.training.optim import WarmupCosine, build_optimizer, build_scheduler
from bayesurl.training.result import TrainResult
from bayesurl.training.seed import seed_everything
from bayesurl.training.trainer import Augment, Hook, Trainer, TrainPlan

__all__ = ["AmpMode", "fit"]


class AmpMode(str, Enum):
    """Mixed-precision modes of :func:`fit`.

    ``auto`` uses bf16 autocast on CUDA devices that support it, fp16 autocast with a
    :class:`torch.amp.GradScaler` on other CUDA devices, and full precision on CPU.
    """

    AUTO = "auto"
    OFF = "off"
    BF16 = "bf16"
    FP16 = "fp16"


def _resolve_amp(amp: str | AmpMode, device: torch.device) -> torch.dtype | None:
    try:
        mode = AmpMode(str(getattr(amp, "value", amp)).lower())
    except ValueError:
        valid = ", ".join(m.value for m in AmpMode)
        raise ValueError(f"unknown `amp` mode {amp!r}; valid modes: {valid}") from None
    if mode is AmpMode.OFF:
        return None
    if device.type != "cuda":
        if mode is AmpMode.FP16:
            raise ValueError("`amp='fp16'` needs a CUDA device; use 'bf16', 'off' or 'auto'")
        return torch.bfloat16 if mode is AmpMode.BF16 else None
    if mode is AmpMode.AUTO:
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if mode is AmpMode.BF16 else torch.float16


def _recorded_kwargs(method: Method) -> dict[str, Any] | None:
    """The constructor kwargs a method records (``hparams`` / ``init_kwargs``), if plain."""
    for attr in ("hparams", "init_kwargs"):
        record = getattr(method, attr, None)
        if isinstance(record, Mapping):
            try:
                check_serialisable(dict(record), f"method.{attr}")
            except ValueError as exc:
                warnings.warn(
                    f"{exc}; the checkpoint cannot rebuild the method by name (pass "
                    "`method_kwargs` with plain values to fit)",
                    stacklevel=3,
                )
                return None
            return dict(record)
    return None


#: fit arguments that plan the run: resuming with other values would silently re-plan it
_RESUME_PLAN_KEYS = (
    "epochs",
    "optimizer",
    "lr",
    "min_lr",
    "warmup_steps",
    "grad_accum",
    "steps_per_epoch",
)


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively: how a value reads back from a checkpoint."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _check_resume_matches(
    ckpt: Mapping[str, Any],
    path: str | os.PathLike[str],
    method: Method,
    method_kwargs: Mapping[str, Any] | None,
    config: Mapping[str, Any],
) -> None:
    """Refuse to resume a checkpoint of another method, other constructor options or another
    plan: each would train on silently, e.g. ``hib`` weights into ``mcinfonce``
    (same layout), or a cosine schedule re-planned for a new ``epochs``."""
    where = f"checkpoint {str(path)!r} does not fit this run"
    spec = ckpt.get("method")
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: it records no method")
    have = method.name or type(method).__name__
    if spec.get("name") != have:
        raise ValueError(f"{where}: it was written by method {spec.get('name')!r}, not {have!r}")
    saved = spec.get("kwargs")
    if isinstance(saved, Mapping) and method_kwargs is not None:
        now = _plain(dict(method_kwargs))
        saved = _plain(dict(saved))
        diff = sorted(
            k for k in set(saved) | set(now) if saved.get(k, "<unset>") != now.get(k, "<unset>")
        )
        if diff:
            desc = ", ".join(
                f"{k}: saved {saved.get(k, '<unset>')!r}, now {now.get(k, '<unset>')!r}"
                for k in diff
            )
            raise ValueError(f"{where}: the method's constructor options differ ({desc})")
    saved_cfg = ckpt.get("config")
    if isinstance(saved_cfg, Mapping):
        diff = [
            k
            for k in _RESUME_PLAN_KEYS
            if k in saved_cfg and _plain(saved_cfg[k]) != _plain(config.get(k))
        ]
        if diff:
            desc = ", ".join(f"{k}: saved {saved_cfg[k]!r}, now {config.get(k)!r}" for k in diff)
            raise ValueError(
                f"{where}: resume continues the saved plan, but {desc}; pass the saved values "
                "(to train longer, start a new run from its weights with "
                "`load_method_from_checkpoint`)"
            )


def _check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
    return value


def fit(
    method: Method,
    train_loader: Iterable[Any],
    *,
    epochs: int = 1,
    optimizer: str = "lamb",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    optimizer_kwargs: Mapping[str, Any] | None = None,
    warmup_epochs: float = 0.0,
    warmup_steps: int | None = None,
    min_lr: float = 0.0,
    grad_accum: int = 1,
    clip_grad: float | None = None,
    amp: str | AmpMode = "auto",
    seed: int | None = None,
    augment: Augment | None = None,
    resume: str | os.PathLike[str] | None = None,
    method_kwargs: Mapping[str, Any] | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    ddp_kwargs: Mapping[str, Any] | None = None,
    hooks: Sequence[Hook] = (),
    **deprecated: Any,
) -> TrainResult:
    """Train ``method`` on ``train_loader`` (URL section 4 and appendix B training recipe).

    Each optimiser step accumulates the gradients of ``grad_accum`` micro-batches, each loss
    divided by the number of micro-batches in its group, so ``k`` micro-batches of a
    mean-reduced loss give the gradient of one batch ``k`` times larger (URL: 16 x 128 = 2048).
    The learning rate follows :func:`~bayesurl.training.optim.warmup_cosine_factor` per
    optimiser step (:class:`~bayesurl.training.trainer.Trainer`). After each epoch:
    ``method.on_epoch_end``, then the ``hooks`` in order (:mod:`bayesurl.training.hooks`):
    an evaluation (:class:`~bayesurl.training.hooks.EpochEvaluation`), checkpoints
    (:class:`~bayesurl.training.hooks.Checkpointing`, last, so the evaluation is part of
    them), LAM's online Hessian update, an EMA of the weights::

        fit(method, loader, epochs=4, hooks=[EpochEvaluation(eval_fn), Checkpointing("runs/ce")])

    Parameters
    ----------
    method : Method
        Anything following the :class:`~bayesurl.methods.Method` contract; its
        ``training_loss((x, y))`` is minimised.
    train_loader : iterable with ``len``
        Yields ``(x, y)`` (or ``((x1, x2), y)`` for two-view methods); usually a
        :class:`~torch.utils.data.DataLoader`. Under torch.distributed its sampler is replaced by
        a :class:`~torch.utils.data.distributed.DistributedSampler`
        (:func:`~bayesurl.distributed.distributed_loader`).
    epochs : int
        Total number of epochs of the run (including those done before ``resume``).
    optimizer : {"lamb", "adamw", "adam", "sgd"} or torch.optim.Optimizer
        See :func:`~bayesurl.training.optim.build_optimizer`. An optimiser instance over the
        method's parameters is used as it is (``lr``, ``weight_decay`` and
        ``optimizer_kwargs`` are then not applied; the schedule scales its learning rate by
        the warm-up / cosine factor, which stays 1 with ``min_lr = lr`` and no warm-up).
    lr, weight_decay : float
        Peak learning rate and weight decay.
    optimizer_kwargs : mapping or None
        Extra optimiser arguments (``betas``, ``eps``, ``momentum``...).
    warmup_epochs : float
        Linear warm-up length in epochs (URL: 5 of 32); ignored when ``warmup_steps`` is given.
    warmup_steps : int or None
        Linear warm-up length in optimiser steps.
    min_lr : float
        Learning rate at the end of the cosine.
    grad_accum : int
        Micro-batches per optimiser step.
    clip_grad : float or None
        Clip the global gradient norm to this value before each step.
    amp : {"auto", "off", "bf16", "fp16"}
        Mixed precision; ``auto`` is bf16 (or fp16 with a GradScaler) on CUDA and off on CPU.
    seed : int or None
        Seeds Python, numpy and torch before training (:func:`seed_everything`).
    augment : callable or None
        Batch augmentation ``augment(x) -> x``; two-view methods get two independent draws.
    resume : path-like or None
        A checkpoint to continue from; the run is bit-identical to an uninterrupted one on CPU
        when the loader, method and arguments are the same.
    method_kwargs : mapping or None
        Constructor kwargs of ``method`` stored in the checkpoint so that
        :func:`~bayesurl.training.load_method_from_checkpoint` can rebuild it (plain values
        only). Defaults to the record the method keeps of them (``method.hparams`` or
        ``method.init_kwargs``); a record holding modules is not stored (with a warning).
    device : str, torch.device or None
        Train here (the method is moved); ``None`` keeps the method's device.
    progress : bool
        Show a tqdm bar with the running loss (rank 0 only).
    ddp_kwargs : mapping or None
        Extra :class:`~torch.nn.parallel.DistributedDataParallel` arguments (default
        ``find_unused_parameters=True``).
    hooks : sequence of Hook
        The run's behaviours beyond the loop (:mod:`bayesurl.training.hooks`), called in
        order after the progress bar; a hook with a ``key`` is saved in checkpoints and
        restored on resume.
    **deprecated
        ``checkpoint_dir``, ``keep_epoch_checkpoints`` and ``eval_fn`` still work, with a
        :class:`DeprecationWarning`: they append ``EpochEvaluation(eval_fn)`` and
        ``Checkpointing(checkpoint_dir, keep_epochs=keep_epoch_checkpoints)`` to ``hooks``.

    Returns
    -------
    TrainResult

    Raises
    ------
    ValueError
        On bad arguments (unknown optimiser or amp mode, ``epochs < 1``, ``grad_accum < 1``, an
        empty loader, kwargs a checkpoint cannot hold) or an unusable ``resume`` checkpoint.
    FloatingPointError
        If a loss is NaN or infinite; the message names the epoch and step.
    """
    _warn_deprecated(deprecated)
    if not isinstance(method, Method):
        raise TypeError(f"`method` must be a bayesurl Method, got {type(method).__name__}")
    _check_schedule(epochs, grad_accum, warmup_steps, warmup_epochs, lr, min_lr)
    if clip_grad is not None and not (math.isfinite(clip_grad) and clip_grad > 0):
        raise ValueError(f"`clip_grad` must be a positive number or None, got {clip_grad}")
    check_number(weight_decay, "weight_decay", low=0.0)
    method_kwargs = _method_record(method, method_kwargs)
    device = check_device(device if device is not None else device_of(method), "device")
    # the old keywords' checkpoint directory is checked now, before any epoch runs
    all_hooks = [*([ProgressBar()] if progress else []), *hooks, *_deprecated_hooks(deprecated)]
    method.to(device)
    amp_dtype = _resolve_amp(amp, device)
    if seed is not None:
        seed_everything(seed)
    if D.is_distributed() and hasattr(train_loader, "dataset"):
        train_loader = D.distributed_loader(train_loader, seed=seed or 0)
    plan = TrainPlan(epochs, _n_batches(train_loader), grad_accum)
    steps = round(warmup_epochs * plan.steps_per_epoch) if warmup_steps is None else warmup_steps
    n_warmup = min(int(steps), plan.total_steps)
    min_factor = min_lr / lr if lr > 0 else 0.0
    opt = _optimizer(method, optimizer, lr, weight_decay, optimizer_kwargs)
    sched = build_scheduler(opt, plan.total_steps, n_warmup, min_factor)
    config = {
        "epochs": epochs, "optimizer": _optimizer_name(optimizer), "lr": float(lr),
        "weight_decay": float(weight_decay), "warmup_steps": n_warmup, "min_lr": float(min_lr),
        "grad_accum": grad_accum, "clip_grad": clip_grad, "amp": str(getattr(amp, "value", amp)),
        "seed": seed, "steps_per_epoch": plan.steps_per_epoch, "total_steps": plan.total_steps,
        "world_size": D.get_world_size(),
    }  # fmt: skip
    header = _checkpoint_header(method, method_kwargs, config)
    for hook in all_hooks:
        if isinstance(hook, Checkpointing) and hook.header is None:
            hook.header = header
    trainer = Trainer(
        method, train_loader, opt, sched, plan, device, amp_dtype=amp_dtype,
        clip_grad=clip_grad, augment=augment, hooks=all_hooks, ddp_kwargs=ddp_kwargs,
    )  # fmt: skip
    if resume is not None:
        _resume(trainer, resume, method_kwargs, config)
        # the schedule follows this call's arguments (LambdaLR restored the saved ones)
        sched.lr_lambdas[0] = WarmupCosine(plan.total_steps, n_warmup, min_factor)
    return trainer.run()


#: fit's keywords that a hook replaced, and what to write instead
_DEPRECATED = {
    "checkpoint_dir": "hooks=[..., Checkpointing(checkpoint_dir)]",
    "keep_epoch_checkpoints": "hooks=[..., Checkpointing(checkpoint_dir, keep_epochs=True)]",
    "eval_fn": "hooks=[EpochEvaluation(eval_fn), ...]",
}


def _warn_deprecated(kwargs: Mapping[str, Any]) -> None:
    """A :class:`DeprecationWarning` per old keyword of fit, naming its replacement."""
    unknown = [k for k in kwargs if k not in _DEPRECATED]
    if unknown:
        raise TypeError(f"fit() got an unexpected keyword argument {unknown[0]!r}")
    for name in kwargs:
        warnings.warn(
            f"fit's `{name}` is deprecated; use {_DEPRECATED[name]} (bayesurl.training.hooks)",
            DeprecationWarning,
            stacklevel=3,
        )


def _deprecated_hooks(kwargs: Mapping[str, Any]) -> list[Hook]:
    """The hooks of fit's old keywords, in the order they installed them: the evaluation,
    then the checkpoint."""
    eval_fn = kwargs.get("eval_fn")
    directory = kwargs.get("checkpoint_dir")
    out: list[Hook] = [] if eval_fn is None else [EpochEvaluation(eval_fn)]
    if directory is not None:
        check_output_dir(directory, "checkpoint_dir")
        keep = bool(kwargs.get("keep_epoch_checkpoints", False))
        out.append(Checkpointing(directory, keep_epochs=keep))
    return out


def _method_record(method: Method, method_kwargs: Mapping[str, Any] | None) -> Any:
    """The constructor kwargs a checkpoint stores: the given ones (checked) or the record."""
    if method_kwargs is None:
        return _recorded_kwargs(method)
    method_kwargs = dict(method_kwargs)
    check_serialisable(method_kwargs, "method_kwargs")
    return method_kwargs


def _checkpoint_header(
    method: Method, method_kwargs: Mapping[str, Any] | None, config: Mapping[str, Any]
) -> dict[str, Any]:
    """What every checkpoint of the run holds besides the trainer's resume state."""
    return {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "method": {
            "name": method.name or type(method).__name__,
            "registered": bool(method.name),
            "kwargs": method_kwargs,
        },
        "config": config,
    }


def _resume(
    trainer: Trainer,
    path: str | os.PathLike[str],
    method_kwargs: Mapping[str, Any] | None,
    config: Mapping[str, Any],
) -> None:
    """Continue the run of checkpoint ``path`` (refused for another method or plan)."""
    # CPU first: RNG and generator states must stay on the CPU; the optimiser moves its
    # state to the parameters' device itself
    ckpt = load_checkpoint(path, map_location="cpu", require=RESUME_KEYS)
    _check_resume_matches(ckpt, path, trainer.method, method_kwargs, config)
    try:
        trainer.load_resume_state(ckpt)
    except ValueError as exc:
        raise ValueError(f"checkpoint {str(path)!r} does not fit this run: {exc}") from None


def _check_schedule(
    epochs: int,
    grad_accum: int,
    warmup_steps: int | None,
    warmup_epochs: float,
    lr: float,
    min_lr: float,
) -> None:
    _check_positive_int(epochs, "epochs")
    _check_positive_int(grad_accum, "grad_accum")
    if warmup_steps is not None:
        _check_positive_int(warmup_steps, "warmup_steps", minimum=0)
    if not (math.isfinite(warmup_epochs) and warmup_epochs >= 0):
        raise ValueError(f"`warmup_epochs` must be a finite number >= 0, got {warmup_epochs}")
    check_number(lr, "lr", low=0.0)
    if not (math.isfinite(min_lr) and 0 <= min_lr <= lr):
        raise ValueError(f"`min_lr` must lie in [0, lr={lr}], got {min_lr}")


def _n_batches(loader: Iterable[Any]) -> int:
    try:
        n_batches = len(loader)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError("`train_loader` must have a length (e.g. a DataLoader)") from None
    if n_batches == 0:
        raise ValueError("`train_loader` yields no batches")
    return n_batches


def _optimizer(
    method: Method,
    optimizer: str | torch.optim.Optimizer,
    lr: float,
    weight_decay: float,
    optimizer_kwargs: Mapping[str, Any] | None,
) -> torch.optim.Optimizer:
    """The optimiser over the method's trainable parameters (an instance is used as is)."""
    params = [p for p in method.parameters() if p.requires_grad]
    if not params:
        raise ValueError("`method` has no trainable parameters")
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    return build_optimizer(
        params, optimizer, lr=lr, weight_decay=weight_decay, **dict(optimizer_kwargs or {})
    )


def _optimizer_name(optimizer: str | torch.optim.Optimizer) -> str:
    if isinstance(optimizer, torch.optim.Optimizer):
        return type(optimizer).__name__.lower()
    return str(getattr(optimizer, "value", optimizer))
