"""Kind ``lam``: an embedding net trained with the contrastive loss and a post-hoc
last-layer Laplace (LAM section 3), or trained with online LAM (LAM eqs. 4-5), via
:mod:`bayesurl.laplace`."""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bayesurl.data import TransformedLoader
from bayesurl.files import atomic_open
from bayesurl.runs.config import RunConfig
from bayesurl.runs.data import RunData, method_backbone
from bayesurl.runs.estimators.base import ESTIMATORS, Estimator, FitContext, Tuning, fit_options
from bayesurl.types import Output

__all__ = ["LamEstimator"]


@ESTIMATORS.register("lam", distributed=True, tuning=Tuning.TRAINED)
class LamEstimator(Estimator):
    """LAM (Warburg et al., 2023): post-hoc (section 3) or online (eqs. 4-5) last-layer Laplace
    of an embedding net ending in a linear projection, trained with the contrastive loss.

    With a ``base`` (a trained registry method with an embedding net, e.g. ``contrastive``)
    the net starts from the base's weights, as the authors' configs resume from the
    deterministic model: post-hoc LAM then only fits the posterior, online LAM trains on.
    ``fit = { optimize_prior = false }`` keeps ``kwargs.prior_precision`` (LAM's fixed prior)
    instead of the marginal-likelihood one.
    """

    MODES: ClassVar[tuple[str, ...]] = ("posthoc", "online")
    FIT_OPTIONS: ClassVar[tuple[str, ...]] = ("optimize_prior",)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        e = cfg.estimator
        if e.mode not in self.MODES:
            raise ValueError(
                f"unknown `estimators.{e.name}.mode` {e.mode!r}; valid: {', '.join(self.MODES)}"
            )
        if cfg.backbone.embed_dim is None:
            raise ValueError("`backbone.embed_dim` must be set for LAM (its last linear layer)")
        unknown = [k for k in e.fit if k not in self.FIT_OPTIONS]
        if unknown:
            raise ValueError(
                f"unknown key `estimators.{e.name}.fit.{unknown[0]}`; valid: "
                f"{', '.join(self.FIT_OPTIONS)}"
            )
        if not isinstance(e.fit.get("optimize_prior", True), bool):
            raise ValueError(f"`estimators.{e.name}.fit.optimize_prior` must be true or false")
        self.la: Any = None

    def _start_net(self, data: RunData, base: Estimator | None, device: torch.device) -> nn.Module:
        """The base's trained embedding net (a copy), or a fresh one of the config."""
        from bayesurl.heads.embedding import EmbeddingNet

        cfg = self.cfg
        if base is None:
            bname, bkwargs = method_backbone(cfg, data)
            return EmbeddingNet(bname, cfg.backbone.embed_dim, **bkwargs).to(device)
        net = getattr(getattr(base, "method", None), "net", None)
        if not isinstance(net, EmbeddingNet):
            raise ValueError(
                f"`estimators.{cfg.estimator.name}.base` {cfg.estimator.base!r} has no "
                "embedding net (`method.net`) to start LAM from"
            )
        return copy.deepcopy(net).to(device)

    @property
    def has_distribution(self) -> bool:
        return True

    def fit(self, data: RunData, ctx: FitContext) -> dict[str, Any]:
        """Train the embedding net with :func:`bayesurl.training.fit` (contrastive loss, or
        online LAM with its Hessian-update hook), then fit / tune the Laplace posterior.

        Adam at the config's learning rate after its warm-up (no cosine decay: LAM trains at
        a constant rate), full precision (the GGN and the weight draws are taken in the
        model's dtype); under torchrun the net trains under DDP and every rank fits the same
        posterior. ``ctx.out`` receives fit's checkpoints (``ctx.resume`` continues one) and
        ``laplace.pt``. With a ``ctx.base`` the net starts from the base's; post-hoc LAM then
        trains nothing and only fits the posterior.
        """
        from bayesurl.data import make_loader
        from bayesurl.distributed import broadcast_state, get_world_size, is_main_process
        from bayesurl.laplace import (
            ContrastiveEmbedding,
            MetricLaplace,
            OnlineLam,
            OnlineLaplaceUpdate,
        )
        from bayesurl.training import Checkpointing, fit

        cfg, e, t = self.cfg, self.cfg.estimator, self.cfg.train
        base, device, progress, out = ctx.base, ctx.device, ctx.progress, ctx.out
        net = self._start_net(data, base, device)
        train = data.sets.train
        # the whole set on every rank: fit shards its own copy under DDP, and the post-hoc
        # Hessian is summed over all of it on each rank
        loader = make_loader(train, t.batch_size, shuffle=True, seed=cfg.seed, distributed=False)
        kwargs = dict(e.kwargs)
        if e.mode == "posthoc":
            method: nn.Module = ContrastiveEmbedding(net, margin=kwargs.get("margin", 0.2))
            hooks = []
        else:
            kwargs.setdefault("dataset_size", len(train))
            la = MetricLaplace(net, mode="online", **kwargs)
            gen = torch.Generator(device=device).manual_seed(cfg.seed)
            method, hooks = OnlineLam(la, gen), [OnlineLaplaceUpdate(la)]
        world = get_world_size()
        t0 = time.perf_counter()
        trained = e.mode == "online" or base is None  # post-hoc on a base: trained already
        if trained:
            opts = fit_options(
                cfg, world, optimizer="adam", min_lr=t.lr, amp="off",
                augment=data.transform.to(device), device=device, progress=progress,
                resume=ctx.resume,
            )  # fmt: skip
            hooks = [*hooks, *([] if out is None else [Checkpointing(out)])]
        result = fit(method, loader, opts, hooks=hooks) if trained else None
        if trained and world > 1:  # BatchNorm statistics of rank 0 (the checkpoint's) on every rank
            broadcast_state(net, 0, buffers_only=True)
        if e.mode == "posthoc":
            la = MetricLaplace(net, **kwargs)
            la.fit(TransformedLoader(loader, data.transform, device), progress=progress)
        if e.fit.get("optimize_prior", True):
            with contextlib.suppress(ValueError):  # every Hessian entry clamped: keep the prior
                la.optimize_prior_precision()
        train_time = time.perf_counter() - t0
        self.la, self.net, self.result = la, net, result
        if out is not None and is_main_process():
            self._save(out)
        return {
            "train_time": train_time,
            "final_loss": None if result is None else float(result.final_loss),
            "steps": 0 if result is None else int(result.global_step),
            "loss_curve": [] if result is None else [float(h["loss"]) for h in result.history],
            "prior_precision": float(torch.as_tensor(la.prior_precision).mean()),
            "clamped_fraction": float(la.clamped_fraction),
        }

    def _save(self, out: Path) -> None:
        """``out/laplace.pt``: the net's weights, the posterior and the config."""
        out.mkdir(parents=True, exist_ok=True)
        self.checkpoint = out / "laplace.pt"
        state = {
            "model": self.net.state_dict(),
            "laplace": self.la.state_dict(),
            "config": self.cfg.to_dict(),
        }
        with atomic_open(self.checkpoint, "wb") as fh:
            torch.save(state, fh)

    def predict(self, x: Tensor, n_samples: int = 0) -> Output:
        return self.la.predictive(x, n_samples=n_samples)
