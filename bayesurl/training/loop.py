"""The training loop: one plain PyTorch loop that trains every method of the URL benchmark.

URL (Kirchhof et al., 2023), section 4 "Training infrastructure" and appendix B: every method is
trained with LAMB, a linear warm-up followed by cosine annealing, and gradient accumulation of
micro-batches into a large aggregated batch; self-supervised methods (InfoNCE, MCInfoNCE) see
two augmented views of each image. :func:`fit` implements exactly that on top of the
:class:`~bayesurl.methods.Method` contract, with mixed precision on GPU, seeded runs,
checkpoints every epoch, bit-identical resume on CPU, and DistributedDataParallel under
``torchrun`` (:mod:`bayesurl.training.distributed`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from bayesurl._checks import check_device, check_number, check_output_dir
from bayesurl.data.batch import unpack_batch
from bayesurl.distributed import broadcast_state
from bayesurl.methods.base import Method
from bayesurl.training import distributed as D
from bayesurl.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    RESUME_KEYS,
    check_serialisable,
    load_checkpoint,
    save_checkpoint,
)
from bayesurl.training.optim import WarmupCosine, build_optimizer, build_scheduler
from bayesurl.training.seed import get_rng_state, seed_everything, set_rng_state

__all__ = ["AmpMode", "TrainResult", "fit", "prepare_batch"]

Augment = Callable[[Tensor], Tensor]


class AmpMode(str, Enum):
    """Mixed-precision modes of :func:`fit`.

    ``auto`` uses bf16 autocast on CUDA devices that support it, fp16 autocast with a
    :class:`torch.amp.GradScaler` on other CUDA devices, and full precision on CPU.
    """

    AUTO = "auto"
    OFF = "off"
    BF16 = "bf16"
    FP16 = "fp16"


@dataclass
class TrainResult:
    """What :func:`fit` returns.

    Attributes
    ----------
    method : Method
        The trained method (the same object that was passed in), in train mode.
    history : list of dict
        One record per completed epoch, including epochs before a resume: ``epoch``,
        ``loss`` (mean micro-batch loss), ``lr`` (at the end of the epoch), ``time`` (seconds),
        ``steps`` (global optimiser steps so far) and ``eval`` (what ``eval_fn`` returned).
    losses : list of float
        Loss of every optimiser step of *this* call (mean over its micro-batches).
    lrs : list of float
        Learning rate used by every optimiser step of this call (first param group).
    global_step : int
        Optimiser steps taken in the whole run.
    epochs : int
        Completed epochs.
    train_time : float
        Wall-clock seconds spent in this call.
    checkpoint : pathlib.Path or None
        ``checkpoint_dir/last.pt`` when checkpoints were written.
    """

    method: Method
    history: list[dict[str, Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    global_step: int = 0
    epochs: int = 0
    train_time: float = 0.0
    checkpoint: Path | None = None

    @property
    def final_loss(self) -> float:
        """Mean loss of the last completed epoch (NaN if none)."""
        return float(self.history[-1]["loss"]) if self.history else math.nan

    def plot(self, path: str | os.PathLike[str] | None = None) -> Any:
        """Plot the per-step loss and learning rate (matplotlib, Agg); save to ``path`` if given.

        Returns
        -------
        matplotlib.figure.Figure
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax_loss, ax_lr) = plt.subplots(1, 2, figsize=(9, 3.2))
        steps = range(self.global_step - len(self.losses) + 1, self.global_step + 1)
        ax_loss.plot(list(steps), self.losses, lw=1)
        ax_loss.set(xlabel="optimiser step", ylabel="training loss", title=self.method.name or "")
        ax_lr.plot(list(steps), self.lrs, lw=1, color="C1")
        ax_lr.set(xlabel="optimiser step", ylabel="learning rate", title="warm-up + cosine")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


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


def _loader_state(loader: Iterable[Any]) -> dict[str, Any]:
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


def _set_loader_state(loader: Iterable[Any], state: Mapping[str, Any]) -> None:
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
    plan (issue 15): each would train on silently, e.g. ``hib`` weights into ``mcinfonce``
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
    checkpoint_dir: str | os.PathLike[str] | None = None,
    keep_epoch_checkpoints: bool = False,
    resume: str | os.PathLike[str] | None = None,
    method_kwargs: Mapping[str, Any] | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    eval_fn: Callable[[Method, int], Mapping[str, Any]] | None = None,
    ddp_kwargs: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Train ``method`` on ``train_loader`` (URL section 4 and appendix B training recipe).

    Each optimiser step accumulates the gradients of ``grad_accum`` micro-batches, each loss
    divided by the number of micro-batches in its group, so ``k`` micro-batches of a
    mean-reduced loss give the gradient of one batch ``k`` times larger (URL: 16 x 128 = 2048).
    The learning rate follows :func:`~bayesurl.training.optim.warmup_cosine_factor` per
    optimiser step. After each epoch: ``method.on_epoch_end``, ``eval_fn``, and (rank 0 only) a
    checkpoint ``checkpoint_dir/last.pt`` (plus ``epoch_{k}.pt`` with
    ``keep_epoch_checkpoints``).

    Parameters
    ----------
    method : Method
        Anything following the :class:`~bayesurl.methods.Method` contract; its
        ``training_loss((x, y))`` is minimised.
    train_loader : iterable with ``len``
        Yields ``(x, y)`` (or ``((x1, x2), y)`` for two-view methods); usually a
        :class:`~torch.utils.data.DataLoader`. Under torch.distributed its sampler is replaced by
        a :class:`~torch.utils.data.distributed.DistributedSampler`
        (:func:`~bayesurl.training.distributed.distributed_loader`).
    epochs : int
        Total number of epochs of the run (including those done before ``resume``).
    optimizer : {"lamb", "adamw", "sgd"}
        See :func:`~bayesurl.training.optim.build_optimizer`.
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
    checkpoint_dir : path-like or None
        Where rank 0 writes checkpoints after every epoch.
    keep_epoch_checkpoints : bool
        Also keep ``epoch_{k}.pt`` for every epoch ``k`` (1-based).
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
    eval_fn : callable or None
        ``eval_fn(method, epoch) -> mapping of numbers`` run after each epoch, with the method
        in eval mode, on every rank (so it can gather across ranks); stored in ``history``.
        Under DDP the buffers (BatchNorm statistics of each rank's last batches) are first set
        to rank 0's, so every rank evaluates the checkpointed model;
        :func:`bayesurl.runs.predict.epoch_evaluator` gives a sharded zero-shot evaluation.
    ddp_kwargs : mapping or None
        Extra :class:`~torch.nn.parallel.DistributedDataParallel` arguments (default
        ``find_unused_parameters=True``).

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
    if not isinstance(method, Method):
        raise TypeError(f"`method` must be a bayesurl Method, got {type(method).__name__}")
    _check_positive_int(epochs, "epochs")
    _check_positive_int(grad_accum, "grad_accum")
    if warmup_steps is not None:
        _check_positive_int(warmup_steps, "warmup_steps", minimum=0)
    if not (math.isfinite(warmup_epochs) and warmup_epochs >= 0):
        raise ValueError(f"`warmup_epochs` must be a finite number >= 0, got {warmup_epochs}")
    if clip_grad is not None and not (math.isfinite(clip_grad) and clip_grad > 0):
        raise ValueError(f"`clip_grad` must be a positive number or None, got {clip_grad}")
    check_number(lr, "lr", low=0.0)
    check_number(weight_decay, "weight_decay", low=0.0)
    if not (math.isfinite(min_lr) and 0 <= min_lr <= lr):
        raise ValueError(f"`min_lr` must lie in [0, lr={lr}], got {min_lr}")
    if method_kwargs is not None:
        method_kwargs = dict(method_kwargs)
        check_serialisable(method_kwargs, "method_kwargs")
    else:
        method_kwargs = _recorded_kwargs(method)

    if device is None:
        first = next(method.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = check_device(device, "device")
    if checkpoint_dir is not None:  # before any epoch runs, not when the first one is saved
        check_output_dir(checkpoint_dir, "checkpoint_dir")
    method.to(device)
    amp_dtype = _resolve_amp(amp, device)
    if seed is not None:
        seed_everything(seed)

    distributed = D.is_distributed()
    rank, main = D.get_rank(), D.is_main_process()
    if distributed and hasattr(train_loader, "dataset"):
        train_loader = D.distributed_loader(train_loader, seed=seed or 0)
    try:
        n_batches = len(train_loader)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError("`train_loader` must have a length (e.g. a DataLoader)") from None
    if n_batches == 0:
        raise ValueError("`train_loader` yields no batches")
    steps_per_epoch = math.ceil(n_batches / grad_accum)
    total_steps = epochs * steps_per_epoch
    n_warmup = (
        int(warmup_steps) if warmup_steps is not None else round(warmup_epochs * steps_per_epoch)
    )
    n_warmup = min(n_warmup, total_steps)

    params = [p for p in method.parameters() if p.requires_grad]
    if not params:
        raise ValueError("`method` has no trainable parameters")
    opt = build_optimizer(
        params, optimizer, lr=lr, weight_decay=weight_decay, **dict(optimizer_kwargs or {})
    )
    sched = build_scheduler(opt, total_steps, n_warmup, min_lr / lr if lr > 0 else 0.0)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is torch.float16)
    config = {
        "epochs": epochs,
        "optimizer": str(getattr(optimizer, "value", optimizer)),
        "lr": float(lr),
        "weight_decay": float(weight_decay),
        "warmup_steps": n_warmup,
        "min_lr": float(min_lr),
        "grad_accum": grad_accum,
        "clip_grad": clip_grad,
        "amp": str(getattr(amp, "value", amp)),
        "seed": seed,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "world_size": D.get_world_size(),
    }

    result = TrainResult(method=method)
    start_epoch = 0
    if resume is not None:
        # CPU first: RNG and generator states must stay on the CPU; the optimiser moves its
        # state to the parameters' device itself
        ckpt = load_checkpoint(resume, map_location="cpu", require=RESUME_KEYS)
        _check_resume_matches(ckpt, resume, method, method_kwargs, config)
        try:
            method.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            sched.load_state_dict(ckpt["scheduler"])
            if ckpt["scaler"]:
                scaler.load_state_dict(ckpt["scaler"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ValueError(f"checkpoint {str(resume)!r} does not fit this run: {exc}") from None
        # the schedule follows this call's arguments (LambdaLR restored the saved ones)
        sched.lr_lambdas[0] = WarmupCosine(total_steps, n_warmup, min_lr / lr if lr > 0 else 0.0)
        start_epoch, result.global_step = int(ckpt["epoch"]), int(ckpt["global_step"])
        result.history = list(ckpt.get("history", []))
        rngs = ckpt["rng"]
        rngs = rngs if isinstance(rngs, list) else [rngs]
        set_rng_state(rngs[rank] if rank < len(rngs) else rngs[0])
        _set_loader_state(train_loader, ckpt["loader"])
        del ckpt
    result.epochs = start_epoch

    loss_module: nn.Module = _LossModule(method)
    if distributed:
        loss_module = D.wrap_ddp(
            loss_module, **{"find_unused_parameters": True, **dict(ddp_kwargs or {})}
        )
    autocast = (
        torch.autocast(device_type=device.type, dtype=amp_dtype)
        if amp_dtype is not None
        else contextlib.nullcontext()
    )
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    t_start = time.perf_counter()

    for epoch in range(start_epoch, epochs):
        t_epoch = time.perf_counter()
        method.train()
        method.on_epoch_start(epoch)
        sampler = getattr(train_loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        bar = None
        iterator: Iterable[Any] = train_loader
        if progress and main:
            from tqdm.auto import tqdm

            bar = tqdm(train_loader, total=n_batches, desc=f"epoch {epoch + 1}/{epochs}")
            iterator = bar
        opt.zero_grad(set_to_none=True)
        epoch_loss, n_seen, step_loss = 0.0, 0, 0.0
        for i, batch in enumerate(iterator):
            group_start = (i // grad_accum) * grad_accum
            group_size = min(grad_accum, n_batches - group_start)
            last_in_group = i - group_start == group_size - 1
            x, y = prepare_batch(batch, method, device, augment)
            sync = (
                loss_module.no_sync()
                if distributed and not last_in_group and hasattr(loss_module, "no_sync")
                else contextlib.nullcontext()
            )
            with sync:
                with autocast:
                    loss = loss_module((x, y))
                if not isinstance(loss, Tensor) or loss.ndim != 0:
                    raise ValueError(
                        "`method.training_loss` must return a scalar tensor, got "
                        f"{getattr(loss, 'shape', type(loss).__name__)}"
                    )
                value = loss.detach().float()
                finite = torch.isfinite(value)
                if distributed:
                    flag = finite.to(torch.int64).reshape(1)
                    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                    finite = flag[0].bool()
                if not bool(finite):
                    raise FloatingPointError(
                        f"non-finite training loss ({value.item()} on rank {rank}, or on another "
                        f"rank) at epoch {epoch + 1}, batch {i + 1}, optimiser step "
                        f"{result.global_step + 1}; lower the learning rate, enable clip_grad, "
                        "or check the data for NaN"
                    )
                scaler.scale(loss / group_size).backward()
            value_f = float(value.item())
            epoch_loss += value_f
            step_loss += value_f / group_size
            n_seen += 1
            if not last_in_group:
                continue
            if clip_grad is not None:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, clip_grad)
            result.lrs.append(float(opt.param_groups[0]["lr"]))
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            sched.step()
            result.global_step += 1
            result.losses.append(step_loss)
            step_loss = 0.0
            if bar is not None:
                bar.set_postfix(loss=f"{epoch_loss / n_seen:.4g}", lr=f"{result.lrs[-1]:.3g}")
        if bar is not None:
            bar.close()
        if n_seen != n_batches:
            raise ValueError(
                f"`train_loader` yielded {n_seen} batches in epoch {epoch + 1} but its length is "
                f"{n_batches}"
            )
        method.on_epoch_end(epoch)
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "loss": epoch_loss / n_seen,
            "lr": float(opt.param_groups[0]["lr"]),
            "time": time.perf_counter() - t_epoch,
            "steps": result.global_step,
        }
        if eval_fn is not None:
            if distributed:  # evaluate rank 0's model (the checkpoint's) on every rank
                broadcast_state(method, 0, buffers_only=True)
            method.eval()
            evaluated = eval_fn(method, epoch)
            method.train()
            record["eval"] = {
                str(k): (float(v) if isinstance(v, (int, float, Tensor)) else v)
                for k, v in dict(evaluated or {}).items()
            }
            check_serialisable(record["eval"], "eval_fn result")
        result.history.append(record)
        result.epochs = epoch + 1
        if ckpt_dir is not None:
            rng_states = _rng_states_all_ranks()
            if main:
                state = {
                    "format": CHECKPOINT_FORMAT,
                    "version": CHECKPOINT_VERSION,
                    "method": {
                        "name": method.name or type(method).__name__,
                        "registered": bool(method.name),
                        "kwargs": method_kwargs,
                    },
                    "model": method.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "scaler": scaler.state_dict() if scaler.is_enabled() else {},
                    "epoch": epoch + 1,
                    "global_step": result.global_step,
                    "rng": rng_states,
                    "loader": _loader_state(train_loader),
                    "history": result.history,
                    "config": config,
                }
                result.checkpoint = save_checkpoint(state, ckpt_dir / "last.pt")
                if keep_epoch_checkpoints:
                    save_checkpoint(state, ckpt_dir / f"epoch_{epoch + 1}.pt")
            else:
                result.checkpoint = ckpt_dir / "last.pt"
            D.barrier()
    result.train_time = time.perf_counter() - t_start
    return result
