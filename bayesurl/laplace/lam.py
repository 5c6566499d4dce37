"""LAM's training through :func:`bayesurl.training.fit` (LAM section 3, eqs. 1 and 4-5).

LAM trains an embedding net either deterministically with the contrastive loss (eq. 1; the
post-hoc Laplace of eq. 3 is fitted afterwards) or online, with the expected contrastive loss
over last-layer draws from the running posterior (eq. 4) and a running Hessian (eq. 5). Both
are :class:`~bayesurl.methods.Method` s here, so they train in the one training loop (warm-up,
gradient accumulation, checkpoints and resume, DDP): :class:`ContrastiveEmbedding` and
:class:`OnlineLam`, whose Hessian update is the per-step hook :class:`OnlineLaplaceUpdate`.
:func:`train_contrastive` and :func:`train_online` are thin calls of ``fit`` with a given
optimiser at a constant learning rate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import check_int, check_labels
from bayesurl.laplace.metric import Miner, OnlineMetricLaplace, loss_miner
from bayesurl.losses.contrastive import ContrastiveLoss
from bayesurl.methods.base import Method
from bayesurl.training.loop import fit
from bayesurl.training.options import FitOptions
from bayesurl.training.trainer import Hook, Trainer
from bayesurl.types import Output

__all__ = [
    "ContrastiveEmbedding",
    "OnlineLam",
    "OnlineLaplaceUpdate",
    "PriorPrecisionTuning",
    "train_contrastive",
    "train_online",
]


class ContrastiveEmbedding(Method):
    """An embedding net trained with the contrastive loss (LAM eq. 1), the deterministic
    baseline of online LAM and the model of post-hoc LAM.

    Parameters
    ----------
    net : nn.Module
        Maps a batch to the unnormalised embedding ``[N, D]``.
    margin : float
        Negative margin of the loss.
    miner : callable, optional
        PML miner of the loss pairs; default ``PairMarginMiner(0, margin)`` (the pairs with a
        non-zero loss).
    loss_fn : callable, optional
        ``loss_fn(embeddings, labels, indices_tuple)``; default
        :class:`~bayesurl.losses.contrastive.ContrastiveLoss` with this margin.
    """

    def __init__(
        self,
        net: nn.Module,
        margin: float = 0.2,
        miner: Miner | None = None,
        loss_fn: Callable[..., Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.net = net
        self.miner = miner if miner is not None else loss_miner(margin)
        self.loss_fn = loss_fn if loss_fn is not None else ContrastiveLoss(margin=margin)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        u = F.normalize(self.net(x), dim=1)
        return Output(embedding=u, uncertainty=u.new_zeros(u.shape[0]))

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        x, y = batch
        emb = F.normalize(self.net(x), dim=1)
        y = check_labels(y, emb.shape[0]).to(emb.device)
        return self.loss_fn(emb, y, self.miner(emb.detach(), y))


class OnlineLam(Method):
    """Online LAM as a method: the expected contrastive loss of LAM eq. 4.

    Train it with :class:`OnlineLaplaceUpdate` among ``fit``'s hooks, which takes the Hessian
    update of LAM eq. 5 after every backward pass; its predictions are the posterior's
    (:meth:`~bayesurl.laplace.BaseMetricLaplace.predictive`).

    Parameters
    ----------
    laplace : OnlineMetricLaplace
        Built with ``MetricLaplace(net, mode="online", dataset_size=...)``; its model is
        trained.
    generator : torch.Generator, optional
        For the weight draws; its state is part of the method's ``state_dict`` (resume).
    miner, hessian_miner, loss_fn : optional
        As in :meth:`~bayesurl.laplace.OnlineMetricLaplace.online_loss`.
    """

    has_distribution = True

    def __init__(
        self,
        laplace: OnlineMetricLaplace,
        generator: torch.Generator | None = None,
        *,
        miner: Miner | None = None,
        hessian_miner: Miner | None = None,
        loss_fn: Callable[..., Tensor] | None = None,
    ) -> None:
        if not isinstance(laplace, OnlineMetricLaplace):
            raise TypeError("`laplace` must be built with MetricLaplace(mode='online')")
        super().__init__()
        self.net = laplace.model
        self.laplace = laplace
        self.generator = generator
        self.options = {"miner": miner, "hessian_miner": hessian_miner, "loss_fn": loss_fn}

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        return self.laplace.predictive(x, n_samples=n_samples, generator=self.generator)

    def get_extra_state(self) -> dict[str, Tensor]:
        # the weight draws' generator travels with the weights, so a resumed run draws on
        return {} if self.generator is None else {"generator": self.generator.get_state()}

    def set_extra_state(self, state: Mapping[str, Tensor]) -> None:
        if self.generator is not None and "generator" in state:
            self.generator.set_state(state["generator"])

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:
        x, y = batch
        return self.laplace.online_loss(
            x, y, generator=self.generator, update_hessian=False, **self.options
        )


def _mean_over_ranks(t: Tensor) -> Tensor:
    t = t.clone()
    dist.all_reduce(t)
    return t / dist.get_world_size()


class OnlineLaplaceUpdate(Hook):
    """Online LAM's Hessian update (LAM eq. 5) after every micro-batch's backward pass.

    The method's loss is ``laplace.online_loss(..., update_hessian=False)`` (LAM eq. 4);
    this hook then takes ``H <- (1 - alpha) H + (N / b) relu(H_batch)`` with
    :meth:`~bayesurl.laplace.OnlineMetricLaplace.update_hessian`. Under DDP the batch
    curvature is first averaged over the ranks (each saw one shard of the global batch;
    ``diag`` only), so every rank keeps the same ``H``. The posterior is saved in checkpoints
    (:attr:`key`), and each epoch appends its pair count and clamped fraction to
    ``laplace.fit_report``.
    """

    key = "online_laplace"

    def __init__(self, laplace: OnlineMetricLaplace) -> None:
        if not isinstance(laplace, OnlineMetricLaplace):
            raise TypeError("`laplace` must be built with MetricLaplace(mode='online')")
        self.laplace = laplace

    def on_backward_end(self, trainer: Trainer, loss: float) -> None:
        self.laplace.update_hessian(reduce=_mean_over_ranks if trainer.distributed else None)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.laplace.fit_report.append(
            {
                "mode": "online",
                "epoch": record["epoch"] - 1,
                "n_pairs": self.laplace.n_pairs,
                "clamped_fraction": self.laplace.clamped_fraction,
            }
        )

    def state_dict(self) -> dict[str, Any]:
        return self.laplace.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.laplace.load_state_dict(dict(state))


class PriorPrecisionTuning(Hook):
    """Re-tune the prior precision by the marginal likelihood every ``every`` optimiser steps
    (online marginal-likelihood updates in the style of Immer et al., 2021; LAM itself keeps
    the prior fixed). A Hessian whose every entry is clamped keeps the prior."""

    def __init__(self, laplace: OnlineMetricLaplace, every: int) -> None:
        check_int(every, "optimize_prior_every", low=1)
        self.laplace, self.every = laplace, int(every)

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.result.global_step % self.every == 0:
            with contextlib.suppress(ValueError):
                self.laplace.optimize_prior_precision()


def _constant_lr(optimizer: torch.optim.Optimizer, epochs: int, progress: bool) -> FitOptions:
    """``fit`` options that keep an optimiser's learning rate (no warm-up, no decay)."""
    lr = float(optimizer.param_groups[0]["lr"])
    return FitOptions(
        epochs=int(epochs), optimizer=optimizer, lr=lr, min_lr=lr, amp="off", progress=progress
    )


def train_contrastive(
    model: nn.Module,
    loader: Iterable[Any],
    optimizer: torch.optim.Optimizer,
    epochs: int,
    *,
    margin: float = 0.2,
    miner: Miner | None = None,
    loss_fn: Callable[..., Tensor] | None = None,
    progress: bool = True,
) -> list[float]:
    """Deterministic contrastive training (LAM eq. 1), the baseline of online LAM.

    ``fit`` of a :class:`ContrastiveEmbedding` with ``optimizer`` at its learning rate; same
    default miner and loss as :meth:`~bayesurl.laplace.OnlineMetricLaplace.online_step`.
    ``model(x)`` must return the unnormalised embedding. Returns the mean epoch losses (none
    for ``epochs=0``).
    """
    method = ContrastiveEmbedding(model, margin=margin, miner=miner, loss_fn=loss_fn)
    if int(epochs) == 0:
        return []
    result = fit(method, loader, _constant_lr(optimizer, epochs, progress))
    return [float(h["loss"]) for h in result.history]


def train_online(
    laplace: OnlineMetricLaplace,
    loader: Iterable[Any],
    optimizer: torch.optim.Optimizer,
    epochs: int,
    *,
    miner: Miner | None = None,
    hessian_miner: Miner | None = None,
    loss_fn: Callable[..., Tensor] | None = None,
    generator: torch.Generator | None = None,
    optimize_prior_every: int | None = None,
    progress: bool = True,
) -> list[float]:
    """Train with online LAM for ``epochs`` epochs (LAM eqs. 4-5); returns mean epoch losses.

    ``fit`` of an :class:`OnlineLam` with the :class:`OnlineLaplaceUpdate` hook, ``optimizer``
    at its learning rate. ``laplace.dataset_size`` defaults to ``len(loader.dataset)``. Each
    epoch appends the pair count and the clamped fraction of ``H`` to ``laplace.fit_report``.
    With ``optimize_prior_every=k`` the prior precision is re-tuned by the marginal likelihood
    every ``k`` steps (:class:`PriorPrecisionTuning`; LAM keeps the prior fixed, the default).
    """
    if not isinstance(laplace, OnlineMetricLaplace):
        raise ValueError("`laplace` must be built with mode='online'")
    hooks: list[Hook] = [OnlineLaplaceUpdate(laplace)]
    if optimize_prior_every is not None:
        hooks.append(PriorPrecisionTuning(laplace, optimize_prior_every))
    if laplace.dataset_size is None:
        dataset = getattr(loader, "dataset", None)
        if dataset is None:
            raise ValueError("pass `dataset_size` to MetricLaplace(mode='online', ...)")
        laplace.dataset_size = len(dataset)
    method = OnlineLam(
        laplace, generator, miner=miner, hessian_miner=hessian_miner, loss_fn=loss_fn
    )
    if int(epochs) == 0:
        return []
    result = fit(method, loader, _constant_lr(optimizer, epochs, progress), hooks=hooks)
    return [float(h["loss"]) for h in result.history]
