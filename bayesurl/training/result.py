"""What a training run returns: the method, its history and per-step curves."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bayesurl.methods.base import Method

__all__ = ["TrainResult"]


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
