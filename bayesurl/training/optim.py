"""Optimisers and the learning-rate schedules used to train every method.

URL (Kirchhof et al., 2023, section 4 "Training infrastructure" and appendix B) trains all
methods with LAMB (You et al., 2020) and a cosine schedule (Loshchilov & Hutter, 2017, SGDR
eq. 5) after a linear warm-up. AdamW is offered as the common alternative. The step decay
(x ``decay`` at given milestones, torch's ``MultiStepLR`` rule) is the schedule of the MCI
controlled experiment (Kirchhof et al., 2023, MCInfoNCE appendix B.3: x 0.1 after each quarter).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from bayesurl._checks import check_int

__all__ = [
    "OPTIMIZERS",
    "MultiStep",
    "OptimizerName",
    "WarmupCosine",
    "build_optimizer",
    "build_scheduler",
    "check_optimizer_kwargs",
    "even_milestones",
    "multistep_factor",
    "parse_optimizer",
    "warmup_cosine_factor",
]


class OptimizerName(str, Enum):
    """Names accepted by :func:`build_optimizer`."""

    ADAM = "adam"
    ADAMW = "adamw"
    LAMB = "lamb"
    SGD = "sgd"


def _lamb(params: Any, **kwargs: Any) -> Optimizer:
    from timm.optim import Lamb

    return Lamb(params, **kwargs)


#: the optimiser class (or factory) of each name
OPTIMIZERS: dict[OptimizerName, Callable[..., Optimizer]] = {
    OptimizerName.ADAM: torch.optim.Adam,
    OptimizerName.ADAMW: torch.optim.AdamW,
    OptimizerName.LAMB: _lamb,
    OptimizerName.SGD: torch.optim.SGD,
}


def parse_optimizer(name: str | OptimizerName) -> OptimizerName:
    """The :class:`OptimizerName` of ``name`` (any case); an unknown name raises ValueError
    listing the valid ones."""
    if isinstance(name, type):  # torch.optim.Adam, the class, not an instance
        raise ValueError(
            f"`optimizer` is the class {name.__name__}, not an optimiser: give a name "
            f"({', '.join(o.value for o in OptimizerName)}) or an instance built over the "
            f"method's parameters ({name.__name__}(method.parameters(), lr=...))"
        )
    try:
        return OptimizerName(str(getattr(name, "value", name)).lower())
    except ValueError:
        valid = ", ".join(o.value for o in OptimizerName)
        raise ValueError(f"unknown `optimizer` {name!r}; valid names: {valid}") from None


def check_optimizer_kwargs(name: str | OptimizerName, kwargs: Mapping[str, Any]) -> None:
    """Refuse an unknown optimiser ``name`` or a keyword its constructor does not take.

    Checked when the options are built, so a typo (``momentm``) is named before any data is
    read instead of failing in the optimiser's constructor after it.

    Raises
    ------
    ValueError
        Naming ``optimizer_kwargs`` and the keywords the optimiser takes.
    """
    kind = parse_optimizer(name)
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"`optimizer_kwargs` must be a mapping, got {type(kwargs).__name__}")
    if not kwargs:
        return
    cls: Any = OPTIMIZERS[kind]
    if kind is OptimizerName.LAMB:  # the factory passes everything on to timm's class
        from timm.optim import Lamb

        cls = Lamb
    takes = [
        p
        for p, spec in inspect.signature(cls).parameters.items()
        if p not in ("self", "params", "lr", "weight_decay")
        and spec.kind not in (spec.VAR_KEYWORD, spec.VAR_POSITIONAL)
    ]
    unknown = sorted(str(k) for k in kwargs if k not in takes)
    if unknown:
        raise ValueError(
            f"`optimizer_kwargs` {', '.join(unknown)}: no argument of the {kind.value} "
            f"optimiser ({cls.__name__} takes {', '.join(takes)})"
        )


def build_optimizer(
    params: Iterable[Tensor] | Iterable[dict[str, Any]],
    name: str | OptimizerName = "lamb",
    *,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    **kwargs: Any,
) -> Optimizer:
    """Create the optimiser ``name`` over ``params``.

    Parameters
    ----------
    params : iterable of Tensor or of param-group dicts
        What to optimise (``method.parameters()``).
    name : {"lamb", "adamw", "adam", "sgd"}
        ``"lamb"`` is :class:`timm.optim.Lamb`, the optimiser of URL appendix B (You et al.,
        2020, Algorithm 2); ``"adamw"`` is :class:`torch.optim.AdamW` (decoupled weight decay);
        ``"adam"`` is :class:`torch.optim.Adam` (L2 weight decay; LAM's optimiser);
        ``"sgd"`` is :class:`torch.optim.SGD` (momentum from ``kwargs``).
    lr : float
        Peak learning rate (URL searches it in ``[1e-4, 1e-2]``).
    weight_decay : float
        Weight decay coefficient.
    **kwargs
        Passed to the optimiser (``betas``, ``eps``, ``momentum``, ...).

    Returns
    -------
    torch.optim.Optimizer

    Raises
    ------
    ValueError
        If ``name`` is unknown (the message lists the valid names) or ``lr`` / ``weight_decay``
        is negative or not finite.
    """
    kind = parse_optimizer(name)
    if not (math.isfinite(lr) and lr >= 0):
        raise ValueError(f"`lr` must be a finite number >= 0, got {lr}")
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"`weight_decay` must be a finite number >= 0, got {weight_decay}")
    return OPTIMIZERS[kind](params, lr=lr, weight_decay=weight_decay, **kwargs)


def warmup_cosine_factor(
    step: int, total_steps: int, warmup_steps: int = 0, min_factor: float = 0.0
) -> float:
    """Multiplier of the peak learning rate at optimiser step ``step``.

    Linear warm-up over the first ``warmup_steps`` steps, then cosine annealing (SGDR,
    Loshchilov & Hutter 2017, eq. 5, one cycle) down to ``min_factor`` at ``total_steps``:

    .. math::

        f(t) = \\frac{t + 1}{W} \\quad (t < W), \\qquad
        f(t) = m + \\tfrac12 (1 - m)\\bigl(1 + \\cos(\\pi \\tfrac{t - W}{T - W})\\bigr)
        \\quad (t \\ge W),

    with ``t`` clipped to ``T``. The first step already trains (``f(0) = 1/W``), so no step is
    wasted at learning rate zero.

    Parameters
    ----------
    step : int
        Zero-based index of the optimiser step about to be taken.
    total_steps : int
        Number of optimiser steps in the whole run ``T``.
    warmup_steps : int
        Length ``W`` of the linear warm-up.
    min_factor : float
        Final multiplier ``m`` (``min_lr / lr``).

    Returns
    -------
    float
    """
    if total_steps < 1:
        raise ValueError(f"`total_steps` must be >= 1, got {total_steps}")
    if warmup_steps < 0:
        raise ValueError(f"`warmup_steps` must be >= 0, got {warmup_steps}")
    if not 0.0 <= min_factor <= 1.0:
        raise ValueError(f"`min_factor` must lie in [0, 1], got {min_factor}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_factor + 0.5 * (1.0 - min_factor) * (1.0 + math.cos(math.pi * progress))


class WarmupCosine:
    """Learning-rate multiplier for :class:`torch.optim.lr_scheduler.LambdaLR`.

    Holds only numbers, so ``LambdaLR.state_dict()`` (which stores ``__dict__`` of callable
    objects) stays loadable with ``torch.load(..., weights_only=True)``. See
    :func:`warmup_cosine_factor` for the formula (SGDR eq. 5 after a linear warm-up).
    """

    def __init__(self, total_steps: int, warmup_steps: int = 0, min_factor: float = 0.0) -> None:
        warmup_cosine_factor(0, total_steps, warmup_steps, min_factor)  # validates
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.min_factor = float(min_factor)

    def __call__(self, step: int) -> float:
        return warmup_cosine_factor(step, self.total_steps, self.warmup_steps, self.min_factor)


def build_scheduler(
    optimizer: Optimizer, total_steps: int, warmup_steps: int = 0, min_factor: float = 0.0
) -> LambdaLR:
    """Per-step warm-up + cosine schedule (URL appendix B; SGDR eq. 5).

    Call ``scheduler.step()`` after every optimiser step. The learning rate of the ``t``-th
    optimiser step (zero-based) is ``lr * warmup_cosine_factor(t, total_steps, warmup_steps,
    min_factor)``.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
    total_steps : int
        Number of optimiser steps of the run.
    warmup_steps : int
        Linear warm-up length in optimiser steps.
    min_factor : float
        Final learning rate as a fraction of the peak.

    Returns
    -------
    torch.optim.lr_scheduler.LambdaLR
    """
    return LambdaLR(optimizer, WarmupCosine(total_steps, warmup_steps, min_factor))


def even_milestones(total_steps: int, n_stages: int) -> list[int]:
    """First steps of stages ``2..n`` when ``total_steps`` steps are cut into ``n`` equal stages.

    Step ``t`` lies in stage ``min(n t // T, n - 1)`` (zero-based), so stage ``k`` starts at
    ``ceil(k T / n)``; e.g. ``even_milestones(8, 4) == [2, 4, 6]`` (the quarters of MCI
    appendix B.3).
    """
    t = check_int(total_steps, "total_steps", low=1)
    n = check_int(n_stages, "n_stages", low=1)
    return [-(-k * t // n) for k in range(1, n)]


def multistep_factor(step: int, milestones: Sequence[int], decay: float = 0.1) -> float:
    """Learning-rate multiplier ``decay ** (number of milestones <= step)`` (step decay).

    The rule of :class:`torch.optim.lr_scheduler.MultiStepLR` (``gamma = decay``) as a pure
    function of the zero-based optimiser step.

    Parameters
    ----------
    step : int
        Zero-based index of the optimiser step about to be taken.
    milestones : sequence of int
        Steps at which the rate is multiplied by ``decay`` (repeats multiply again).
    decay : float
        Multiplier per milestone, ``> 0``.
    """
    if not decay > 0:
        raise ValueError(f"`decay` must be positive, got {decay}")
    return decay ** sum(1 for m in milestones if m <= step)


class MultiStep:
    """Step-decay multiplier for :class:`torch.optim.lr_scheduler.LambdaLR` (see
    :func:`multistep_factor`); holds only numbers, so its state loads with ``weights_only``."""

    def __init__(self, milestones: Sequence[int], decay: float = 0.1) -> None:
        multistep_factor(0, milestones, decay)  # validates
        self.milestones = [int(m) for m in milestones]
        self.decay = float(decay)

    def __call__(self, step: int) -> float:
        return multistep_factor(step, self.milestones, self.decay)
