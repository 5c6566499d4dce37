"""Kind ``method``: a registry :class:`~bayesurl.methods.Method` trained by
:func:`bayesurl.training.fit` (URL section 4, appendix B)."""

from __future__ import annotations

import inspect
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from bayesurl.runs.config import RunConfig
from bayesurl.runs.data import RunData, method_backbone
from bayesurl.runs.estimators.base import (
    ESTIMATORS,
    Estimator,
    FitContext,
    Tuning,
    check_kwargs,
    fit_options,
)
from bayesurl.types import Output

__all__ = ["PROBE_IMAGES", "MethodEstimator"]


@ESTIMATORS.register("method", distributed=True, tuning=Tuning.TRAINED)
class MethodEstimator(Estimator):
    """A registry method trained with :func:`bayesurl.training.fit` (URL section 4)."""

    def __init__(self, cfg: RunConfig) -> None:
        from bayesurl.methods import get

        super().__init__(cfg)
        name = cfg.estimator.method or cfg.estimator.name
        try:
            self.cls = get(name)
        except ValueError as exc:
            raise ValueError(f"`estimators.{cfg.estimator.name}.method`: {exc}") from None
        check_kwargs(
            self.cls.__init__,
            cfg.estimator.kwargs,
            f"estimators.{cfg.estimator.name}.kwargs",
            ("backbone", "embed_dim", "num_classes", "backbone_kwargs"),
        )
        self.method: nn.Module | None = None

    @classmethod
    def from_trained(cls, cfg: RunConfig, method: nn.Module) -> MethodEstimator:
        """An estimator around an already trained method (e.g. loaded from a checkpoint)."""
        est = cls(cfg)
        est.method = method
        return est

    @property
    def has_distribution(self) -> bool:
        return bool(self.cls.has_distribution)

    def build(self, data: RunData) -> nn.Module:
        """The untrained method with the config's backbone and constructor arguments."""
        cfg = self.cfg
        name, kwargs = method_backbone(cfg, data)
        self.kwargs = {
            "backbone": name,
            "embed_dim": cfg.backbone.embed_dim,
            "num_classes": data.num_classes,
            "backbone_kwargs": kwargs,
            **cfg.estimator.kwargs,
        }
        params = inspect.signature(self.cls.__init__).parameters
        if "backbone_kwargs" not in params and not any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        ):  # a method built on its own backbone (no backbone options to pass)
            del self.kwargs["backbone_kwargs"]
        self.method = self.cls(**self.kwargs)
        return self.method

    def fit(self, data: RunData, ctx: FitContext) -> dict[str, Any]:
        """Build and train the method (``ctx.resume`` / ``ctx.keep_epoch_checkpoints``: see
        :func:`bayesurl.training.fit`)."""
        from bayesurl.data import make_loader
        from bayesurl.training import Checkpointing, EpochEvaluation, Hook, fit

        cfg, t, device, out = self.cfg, self.cfg.train, ctx.device, ctx.out
        method = self.build(data)
        record = getattr(method, "hparams", None)
        method_kwargs = {**dict(record), **self.kwargs} if isinstance(record, dict) else self.kwargs
        two_view = bool(self.cls.two_view)
        loader = make_loader(
            data.sets.train,
            t.batch_size,
            shuffle=True,
            num_workers=t.num_workers,
            seed=cfg.seed,
            drop_last=two_view and len(data.sets.train) > t.batch_size,
        )
        augment = (data.augment if two_view else data.transform).to(device)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        opts = fit_options(
            cfg, world, augment=augment, device=device, progress=ctx.progress,
            resume=ctx.resume, method_kwargs=method_kwargs if out is not None else None,
        )  # fmt: skip
        # one process only: under DDP each rank would read and probe its own copy
        probe = _probe_batch(data, device) if world == 1 else None

        def curve(m: nn.Module, epoch: int) -> dict[str, float]:
            # the uncertainty head's convergence (a vMF kappa may barely move in a short run):
            # u on a fixed batch of training images after every epoch
            with torch.no_grad():
                u = m(probe, n_samples=0).uncertainty.reshape(-1).double()
            return {"probe_u_mean": float(u.mean()), "probe_u_median": float(u.median())}

        # the probe's record is part of the epoch's checkpoint: the evaluation comes first
        hooks: list[Hook] = [] if probe is None else [EpochEvaluation(curve)]
        if out is not None:
            hooks.append(Checkpointing(out, keep_epochs=ctx.keep_epoch_checkpoints))
        cpu0 = time.process_time()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*cannot rebuild the method.*")
            result = fit(method, loader, opts, hooks=hooks)
        self.checkpoint = result.checkpoint
        self.result = result
        self.method_kwargs = method_kwargs
        return {
            "train_time": float(result.train_time),
            "train_cpu_time": time.process_time() - cpu0,
            "final_loss": float(result.final_loss),
            "untrained_loss": getattr(method, "untrained_loss", lambda: None)(),
            "steps": int(result.global_step),
            "epochs": int(result.epochs),
            "loss_curve": [float(h["loss"]) for h in result.history],
            "u_curve": [float(h["eval"]["probe_u_median"]) for h in result.history if "eval" in h],
        }

    def predict(self, x: Tensor, n_samples: int = 0) -> Output:
        assert self.method is not None, "fit first"
        self.method.eval()
        return self.method(x, n_samples=n_samples)


#: training images whose median ``u`` is recorded after every epoch (``fit["u_curve"]``)
PROBE_IMAGES = 256


def _probe_batch(data: Any, device: torch.device | str) -> Tensor | None:
    """The first :data:`PROBE_IMAGES` training images, transformed (``None`` if unreadable)."""
    from bayesurl.runs.predict import transformed_inputs

    try:
        n = min(PROBE_IMAGES, len(data.sets.train))
        return transformed_inputs(data.sets.train, range(n), data.transform, device).float()
    except Exception:  # a data set whose items are not (image, label): no curve, nothing else
        return None
