"""The training entry point: :func:`fit` trains every method of the URL benchmark and LAM.

URL (Kirchhof et al., 2023), section 4 "Training infrastructure" and appendix B: every method is
trained with LAMB, a linear warm-up followed by cosine annealing, and gradient accumulation of
micro-batches into a large aggregated batch; self-supervised methods (InfoNCE, MCInfoNCE) see
two augmented views of each image. The settings are one checked object,
:class:`~bayesurl.training.options.FitOptions`; :func:`fit` builds the optimiser and schedule
from them, restores a checkpoint, and runs a :class:`~bayesurl.training.trainer.Trainer` whose
hooks (:mod:`bayesurl.training.hooks`, given as ``hooks=[...]``) carry everything else: an
evaluation per epoch, checkpoints, LAM's online Hessian update
(:class:`~bayesurl.laplace.lam.OnlineLaplaceUpdate`); ``progress`` shows the bar. The old
keywords ``checkpoint_dir``, ``keep_epoch_checkpoints`` and ``eval_fn`` still install their hook,
with a :class:`DeprecationWarning` naming it. Mixed precision
on GPU, seeded runs, bit-identical resume on CPU, and DistributedDataParallel under
``torchrun`` (:mod:`bayesurl.distributed`).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from bayesurl import distributed as D
from bayesurl._checks import check_output_dir
from bayesurl._modules import device_of
from bayesurl.methods.base import Method
from bayesurl.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    RESUME_KEYS,
    check_serialisable,
    load_checkpoint,
)
from bayesurl.training.hooks import Checkpointing, EpochEvaluation, ProgressBar
from bayesurl.training.optim import WarmupCosine, build_optimizer, build_scheduler
from bayesurl.training.options import AmpMode, FitOptions
from bayesurl.training.result import TrainResult
from bayesurl.training.seed import seed_everything
from bayesurl.training.trainer import Hook, Trainer, TrainPlan

__all__ = ["fit"]


def _resolve_amp(mode: AmpMode, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``mode`` on ``device`` (``None``: full precision)."""
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


def fit(
    method: Method,
    train_loader: Iterable[Any],
    options: FitOptions | None = None,
    *,
    hooks: Sequence[Hook] = (),
    **settings: Any,
) -> TrainResult:
    """Train ``method`` on ``train_loader`` as ``options`` say (URL section 4, appendix B).

    The learning rate follows :func:`~bayesurl.training.optim.warmup_cosine_factor` per
    optimiser step; after each epoch come ``method.on_epoch_end``, then the ``hooks``::

        url = FitOptions(epochs=4, lr=1e-3, warmup_epochs=1)
        fit(method, loader, url, hooks=[EpochEvaluation(eval_fn), Checkpointing("runs/ce")])
        fit(method, loader, epochs=4, lr=1e-3, warmup_epochs=1)  # the same settings

    Parameters
    ----------
    method : Method
        Anything following the :class:`~bayesurl.methods.Method` contract; its
        ``training_loss((x, y))`` is minimised.
    train_loader : iterable with ``len``
        Yields ``(x, y)`` (or ``((x1, x2), y)`` for two-view methods), e.g. a
        :class:`~torch.utils.data.DataLoader`; under torch.distributed its sampler becomes a
        ``DistributedSampler`` (:func:`~bayesurl.distributed.distributed_loader`).
    options : FitOptions, optional
        The run's settings (default ``FitOptions()``).
    hooks : sequence of Hook
        Called in order after the progress bar (:mod:`bayesurl.training.hooks`: evaluation,
        checkpoints last, LAM's Hessian, EMA); one with a ``key`` is saved and resumed.
    **settings
        :class:`FitOptions` fields replacing those of ``options``. The old keywords
        ``checkpoint_dir``, ``keep_epoch_checkpoints`` and ``eval_fn`` warn
        (:class:`DeprecationWarning`) and append the hooks that replaced them.

    Returns
    -------
    TrainResult
        The trained method, per-epoch history, per-step losses and learning rates.

    Raises
    ------
    TypeError
        For a ``method`` that is no Method, ``options`` no FitOptions, an unknown keyword.
    ValueError
        As :class:`FitOptions`; for ``amp="fp16"`` off CUDA, an empty loader, a method without
        trainable parameters, an unusable ``resume`` checkpoint.
    FloatingPointError
        If a loss is NaN or infinite (naming the epoch and step).
    """
    opts, old_hooks = _options(options, settings)
    if not isinstance(method, Method):
        raise TypeError(f"`method` must be a bayesurl Method, got {type(method).__name__}")
    method_kwargs = _method_record(method, opts.method_kwargs)
    device = opts.device if opts.device is not None else device_of(method)
    all_hooks = [*([ProgressBar()] if opts.progress else []), *hooks, *old_hooks]
    method.to(device)
    amp_dtype = _resolve_amp(opts.amp, device)
    if opts.seed is not None:
        seed_everything(opts.seed)
    if D.is_distributed() and hasattr(train_loader, "dataset"):
        train_loader = D.distributed_loader(train_loader, seed=opts.seed or 0)
    plan = TrainPlan(opts.epochs, _n_batches(train_loader), opts.grad_accum)
    schedule = _schedule(opts, plan)
    opt = _optimizer(method, opts)
    sched = build_scheduler(opt, plan.total_steps, schedule.warmup_steps, schedule.min_factor)
    config = _run_config(opts, plan, schedule.warmup_steps)
    _give_header(all_hooks, _checkpoint_header(method, method_kwargs, config))
    trainer = Trainer(
        method, train_loader, opt, sched, plan, device, amp_dtype=amp_dtype,
        clip_grad=opts.clip_grad, augment=opts.augment, hooks=all_hooks,
        ddp_kwargs=opts.ddp_kwargs,
    )  # fmt: skip
    if opts.resume is not None:
        _resume(trainer, opts.resume, method_kwargs, config)
        # the schedule follows this call's settings (LambdaLR restored the saved ones)
        sched.lr_lambdas[0] = schedule
    return trainer.run()


#: the names of the settings, the keywords fit passes on to FitOptions
_FIELDS = frozenset(f.name for f in dataclasses.fields(FitOptions))


def _options(options: FitOptions | None, settings: dict[str, Any]) -> tuple[FitOptions, list[Hook]]:
    """The run's settings (``options`` with ``settings`` replacing its fields) and the hooks of
    the old keywords among ``settings``."""
    old = {k: settings.pop(k) for k in list(settings) if k in _DEPRECATED}
    unknown = sorted(set(settings) - _FIELDS)
    if unknown:
        raise TypeError(f"fit() got an unexpected keyword argument {unknown[0]!r}")
    _warn_deprecated(old)
    if options is None:
        opts = FitOptions(**settings)
    elif not isinstance(options, FitOptions):
        raise TypeError(f"`options` must be a FitOptions, got {type(options).__name__}")
    else:
        opts = dataclasses.replace(options, **settings) if settings else options
    return opts, _deprecated_hooks(old)


def _schedule(opts: FitOptions, plan: TrainPlan) -> WarmupCosine:
    """The learning-rate factor per optimiser step: warm-up (``warmup_steps``, else
    ``warmup_epochs``, at most the whole run), then a cosine down to ``min_lr``."""
    steps = opts.warmup_steps
    if steps is None:
        steps = round(opts.warmup_epochs * plan.steps_per_epoch)
    min_factor = opts.min_lr / opts.lr if opts.lr > 0 else 0.0
    return WarmupCosine(plan.total_steps, min(int(steps), plan.total_steps), min_factor)


def _run_config(opts: FitOptions, plan: TrainPlan, n_warmup: int) -> dict[str, Any]:
    """The settings that shape the run, as its checkpoints record them."""
    return {
        "epochs": opts.epochs, "optimizer": _optimizer_name(opts.optimizer),
        "lr": float(opts.lr), "weight_decay": float(opts.weight_decay),
        "warmup_steps": n_warmup, "min_lr": float(opts.min_lr), "grad_accum": opts.grad_accum,
        "clip_grad": opts.clip_grad, "amp": opts.amp.value, "seed": opts.seed,
        "steps_per_epoch": plan.steps_per_epoch, "total_steps": plan.total_steps,
        "world_size": D.get_world_size(),
    }  # fmt: skip


def _give_header(hooks: Sequence[Hook], header: dict[str, Any]) -> None:
    """The run's header for each :class:`Checkpointing` hook that has none of its own."""
    for hook in hooks:
        if isinstance(hook, Checkpointing) and hook.header is None:
            hook.header = header


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
            stacklevel=4,
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
    """The constructor kwargs a checkpoint stores: the given ones (checked by FitOptions) or
    the method's record."""
    return _recorded_kwargs(method) if method_kwargs is None else dict(method_kwargs)


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


def _n_batches(loader: Iterable[Any]) -> int:
    try:
        n_batches = len(loader)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError("`train_loader` must have a length (e.g. a DataLoader)") from None
    if n_batches == 0:
        raise ValueError("`train_loader` yields no batches")
    return n_batches


def _optimizer(method: Method, opts: FitOptions) -> torch.optim.Optimizer:
    """The optimiser over the method's trainable parameters (an instance is used as is)."""
    params = [p for p in method.parameters() if p.requires_grad]
    if not params:
        raise ValueError("`method` has no trainable parameters")
    if isinstance(opts.optimizer, torch.optim.Optimizer):
        _check_holds(opts.optimizer, params)
        return opts.optimizer
    kwargs = dict(opts.optimizer_kwargs or {})
    return build_optimizer(
        params, opts.optimizer, lr=opts.lr, weight_decay=opts.weight_decay, **kwargs
    )


def _check_holds(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """Refuse an optimiser that steps none of the method's trainable parameters (it would
    train nothing, in silence); warn when it steps only some of them."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    mine = [p for p in params if id(p) in held]
    if not mine:
        raise ValueError(
            f"`optimizer` ({type(optimizer).__name__}) holds none of the method's {len(params)} "
            "trainable parameters: it would train nothing. Build it over this method's "
            "parameters, e.g. torch.optim.SGD(method.parameters(), lr=...)"
        )
    if len(mine) < len(params):
        n_left = sum(p.numel() for p in params if id(p) not in held)
        warnings.warn(
            f"`optimizer` ({type(optimizer).__name__}) holds {len(mine)} of the method's "
            f"{len(params)} trainable parameter tensors: the other {len(params) - len(mine)} "
            f"({n_left} values) stay as they are",
            stacklevel=4,
        )


def _optimizer_name(optimizer: str | torch.optim.Optimizer) -> str:
    if isinstance(optimizer, torch.optim.Optimizer):
        return type(optimizer).__name__.lower()
    return str(getattr(optimizer, "value", optimizer))
