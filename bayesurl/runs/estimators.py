"""Estimators: every way of getting u(x) behind one small interface.

An :class:`Estimator` is built from a :class:`~bayesurl.runs.config.RunConfig` and has

- ``fit(data, device=..., progress=..., base=..., out=...) -> dict``: train on the upstream
  data (:class:`~bayesurl.runs.data.RunData`), return a fit report (``train_time`` ...);
- ``predict(x, n_samples) -> Output``: one batch of transformed inputs to an
  :class:`~bayesurl.types.Output`, with ``samples [S, N, D]`` when ``n_samples > 0``;
- ``has_distribution``: whether it defines an embedding distribution. The sampling rule is
  the runner's, the same for all: ``S = eval.samples`` draws where there is a distribution,
  none otherwise (:func:`bayesurl.runs.predict.n_samples_for`).

Kinds (:data:`ESTIMATORS`):

- ``method``: a registry :class:`~bayesurl.methods.Method` trained by
  :func:`bayesurl.training.fit` (URL section 4, appendix B);
- ``posthoc``: :func:`bayesurl.wrap` (PVU, thesis section 5.3; post-hoc TaU, TaU section 4;
  last-layer Laplace, LAM section 3, with laplace-torch on a classifier) around a trained base
  method that the runner trains or reuses;
- ``baseline``: a free, training-free score of the input representation (the pretrained
  features of a frozen-feature run): ``1 / ||f||``, the k-NN cosine distance, the
  Mahalanobis distance to the upstream classes or a Gaussian-mixture density
  (:mod:`bayesurl.posthoc.reference`);
- ``lam``: an embedding net trained with the contrastive loss and a post-hoc last-layer
  Laplace (LAM section 3), or trained with online LAM (LAM eqs. 4-5), via
  :mod:`bayesurl.laplace`;
- ``deep_ensemble``: independently trained copies of a base registry method whose member
  embeddings are the draws of the predictive (LAM Table 2's "Deep Ensemble" row).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import re
import time
import warnings
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from bayesurl._checks import check_int, check_number
from bayesurl.data import TransformedLoader
from bayesurl.files import atomic_open
from bayesurl.runs.config import RunConfig
from bayesurl.runs.data import RunData, method_backbone
from bayesurl.types import Output

if TYPE_CHECKING:
    from bayesurl.training import FitOptions

__all__ = [
    "ESTIMATORS",
    "BASELINE_WRAPPERS",
    "BaselineEstimator",
    "BaselineScore",
    "DeepEnsembleEstimator",
    "Estimator",
    "LamEstimator",
    "MethodEstimator",
    "PosthocEstimator",
    "build_estimator",
]


def _epochs(cfg: RunConfig) -> int:
    return max(1, round(cfg.train.epochs * cfg.train.epochs_mult))


def _fit_options(cfg: RunConfig, world: int, **settings: Any) -> FitOptions:
    """The run's ``[train]`` table and seed as :class:`~bayesurl.training.FitOptions`, with
    ``settings`` replacing fields. Under torchrun the micro-batch is per process: the
    accumulation is divided by the ``world`` size so the aggregated batch stays (URL: about
    2048)."""
    from bayesurl.training import FitOptions

    t = cfg.train
    recipe = {
        "epochs": _epochs(cfg), "optimizer": t.optimizer, "lr": t.lr, "min_lr": t.min_lr,
        "weight_decay": t.weight_decay, "warmup_epochs": t.warmup_epochs,
        "grad_accum": max(1, round(t.grad_accum / world)), "amp": t.amp, "seed": cfg.seed,
    }  # fmt: skip
    return FitOptions(**{**recipe, **settings})


def _check_kwargs(fn: Any, kwargs: dict[str, Any], where: str, skip: tuple[str, ...]) -> None:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [k for k in params if k not in ("self", *skip)]
    unknown = [k for k in kwargs if k not in valid]
    if unknown:
        options = (
            f"valid: {', '.join(valid)}"
            if valid
            else f"{getattr(fn, '__qualname__', fn)} takes no further options"
        )
        raise ValueError(f"unknown key `{where}.{unknown[0]}`; {options}")


def _check_fit_values(fit: dict[str, Any], where: str) -> None:
    """The numbers of a post-hoc ``fit`` table, checked with the recipe (before the base is
    trained): whole ``epochs`` / ``batch_size`` >= 1, ``lr`` > 0, ``weight_decay`` >= 0."""
    for key in ("epochs", "batch_size"):
        if key in fit:
            check_int(fit[key], f"{where}.{key}", low=1)
    if "lr" in fit:
        check_number(fit["lr"], f"{where}.lr", low=0.0, low_open=True)
    if "weight_decay" in fit:
        check_number(fit["weight_decay"], f"{where}.weight_decay", low=0.0)


class Estimator:
    """Base class (see module docstring)."""

    kind: ClassVar[str] = ""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.checkpoint: Path | None = None
        #: set by :func:`bayesurl.runs.runner.train`: this process is rank 0
        self.main_process = True

    @property
    def has_distribution(self) -> bool:
        """``predict(x, n_samples > 0)`` returns samples."""
        return False

    def fit(
        self,
        data: RunData,
        *,
        device: torch.device,
        progress: bool = False,
        base: Estimator | None = None,
        out: Path | None = None,
    ) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict(self, x: Tensor, n_samples: int = 0) -> Output:  # pragma: no cover - abstract
        raise NotImplementedError


class MethodEstimator(Estimator):
    """A registry method trained with :func:`bayesurl.training.fit` (URL section 4)."""

    kind = "method"

    def __init__(self, cfg: RunConfig) -> None:
        from bayesurl.methods import get

        super().__init__(cfg)
        name = cfg.estimator.method or cfg.estimator.name
        try:
            self.cls = get(name)
        except ValueError as exc:
            raise ValueError(f"`estimators.{cfg.estimator.name}.method`: {exc}") from None
        _check_kwargs(
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

    def fit(
        self,
        data: RunData,
        *,
        device: torch.device,
        progress: bool = False,
        base: Estimator | None = None,
        out: Path | None = None,
        resume: str | Path | None = None,
        keep_epoch_checkpoints: bool = False,
    ) -> dict[str, Any]:
        """Build and train the method (``resume`` / ``keep_epoch_checkpoints``: see
        :func:`bayesurl.training.fit`)."""
        from bayesurl.data import make_loader
        from bayesurl.training import Checkpointing, EpochEvaluation, Hook, fit

        cfg, t = self.cfg, self.cfg.train
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
        opts = _fit_options(
            cfg, world, augment=augment, device=device, progress=progress, resume=resume,
            method_kwargs=method_kwargs if out is not None else None,
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
            hooks.append(Checkpointing(out, keep_epochs=keep_epoch_checkpoints))
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


class PosthocEstimator(Estimator):
    """:func:`bayesurl.wrap` around a trained base method (PVU, post-hoc TaU, Laplace, or a
    score fitted on the base's embeddings of the upstream images: kNN, Mahalanobis, GMM)."""

    kind = "posthoc"
    WRAPPERS: ClassVar[tuple[str, ...]] = ("pvu", "tau", "laplace", "knn", "mahalanobis", "gmm")

    def __init__(self, cfg: RunConfig) -> None:
        from bayesurl.posthoc.base import wrapper_class

        super().__init__(cfg)
        e = cfg.estimator
        where = f"estimators.{e.name}"
        if str(e.wrapper).lower() not in self.WRAPPERS:
            raise ValueError(
                f"unknown `{where}.wrapper` {e.wrapper!r}; valid: {', '.join(self.WRAPPERS)}"
            )
        self.wrapper_name = str(e.wrapper).lower()
        cls = wrapper_class(self.wrapper_name)
        _check_kwargs(cls.__init__, e.kwargs, f"{where}.kwargs", ("encoder", "classifier"))
        _check_kwargs(cls.fit, e.fit, f"{where}.fit", ("loader", "progress", "augment"))
        _check_fit_values(e.fit, f"{where}.fit")
        self.wrapped: Any = None

    @property
    def has_distribution(self) -> bool:
        if self.wrapped is not None:
            return bool(self.wrapped.has_distribution)
        return self.wrapper_name == "laplace" and not self.cfg.estimator.use_base_classifier

    def fit(
        self,
        data: RunData,
        *,
        device: torch.device,
        progress: bool = False,
        base: Estimator | None = None,
        out: Path | None = None,
    ) -> dict[str, Any]:
        from bayesurl.data import make_loader
        from bayesurl.posthoc import wrap

        if not isinstance(base, MethodEstimator) or base.method is None:
            raise ValueError(f"post-hoc estimator {self.cfg.estimator.name!r} needs a fitted base")
        e, cfg = self.cfg.estimator, self.cfg
        method = base.method.to(device)
        options = dict(e.kwargs)
        if e.use_base_classifier:
            head = getattr(method, "classifier", None)
            if not isinstance(head, nn.Module):
                raise ValueError(
                    f"`estimators.{e.name}.use_base_classifier`: base {cfg.estimator.base!r} "
                    "has no `classifier`"
                )
            if isinstance(head, nn.Linear) and type(head) is not nn.Linear:
                # BackPACK (laplace-torch's backend) knows nn.Linear, not its subclasses such
                # as LinearClassifier: hand it a plain copy of the same weights
                plain = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
                head = plain.to(head.weight.device, head.weight.dtype)
                head.load_state_dict(method.classifier.state_dict())
            options["classifier"] = head
        try:
            self.wrapped = wrap(method, self.wrapper_name, **options).to(device)
        except (ValueError, TypeError) as exc:  # a bad value of the recipe's kwargs, named so
            named = re.sub(
                r"`(\w+)`",
                lambda m: (
                    f"`estimators.{e.name}.kwargs.{m.group(1)}`"
                    if m.group(1) in e.kwargs
                    else m.group(0)
                ),
                str(exc),
            )
            raise type(exc)(named) from exc
        fit_kw = dict(e.fit)
        batch = int(fit_kw.pop("batch_size", cfg.train.batch_size))
        loader = make_loader(data.sets.train, batch, shuffle=True, seed=cfg.seed)
        if self.wrapper_name == "pvu":
            batches: Any = TransformedLoader(loader, data.augment, device)
            fit_kw["batch_size"] = batch
        elif self.wrapper_name == "tau":
            batches = TransformedLoader(loader, nn.Identity(), device)
            fit_kw["augment"] = data.augment.to(device)
        else:
            batches = TransformedLoader(loader, data.transform, device)
        t0 = time.perf_counter()
        report = self.wrapped.fit(batches, progress=progress, **fit_kw)
        train_time = time.perf_counter() - t0
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.checkpoint = out / f"{self.wrapper_name}.pt"
            self.wrapped.save(self.checkpoint)
        clean = {k: v for k, v in report.items() if isinstance(v, (int, float, str))}
        return {"train_time": train_time, "fit": clean}

    def predict(self, x: Tensor, n_samples: int = 0) -> Output:
        self.wrapped.eval()
        out = self.wrapped(x)
        samples = self.wrapped.sample(x, n_samples) if n_samples > 0 else None
        return Output(
            embedding=out.embedding,
            uncertainty=out.uncertainty,
            logits=getattr(out, "logits", None),
            samples=samples,
        )


class LamEstimator(Estimator):
    """LAM (Warburg et al., 2023): post-hoc (section 3) or online (eqs. 4-5) last-layer Laplace
    of an embedding net ending in a linear projection, trained with the contrastive loss.

    With a ``base`` (a trained registry method with an embedding net, e.g. ``contrastive``)
    the net starts from the base's weights, as the authors' configs resume from the
    deterministic model: post-hoc LAM then only fits the posterior, online LAM trains on.
    ``fit = { optimize_prior = false }`` keeps ``kwargs.prior_precision`` (LAM's fixed prior)
    instead of the marginal-likelihood one.
    """

    kind = "lam"
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

    def fit(
        self,
        data: RunData,
        *,
        device: torch.device,
        progress: bool = False,
        base: Estimator | None = None,
        out: Path | None = None,
        resume: str | Path | None = None,
    ) -> dict[str, Any]:
        """Train the embedding net with :func:`bayesurl.training.fit` (contrastive loss, or
        online LAM with its Hessian-update hook), then fit / tune the Laplace posterior.

        Adam at the config's learning rate after its warm-up (no cosine decay: LAM trains at
        a constant rate), full precision (the GGN and the weight draws are taken in the
        model's dtype); under torchrun the net trains under DDP and every rank fits the same
        posterior. ``out`` receives fit's checkpoints (``resume`` continues one) and
        ``laplace.pt``. With a ``base`` the net starts from the base's; post-hoc LAM then
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
            opts = _fit_options(
                cfg, world, optimizer="adam", min_lr=t.lr, amp="off",
                augment=data.transform.to(device), device=device, progress=progress,
                resume=resume,
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
            out.mkdir(parents=True, exist_ok=True)
            self.checkpoint = out / "laplace.pt"
            with atomic_open(self.checkpoint, "wb") as fh:
                torch.save(
                    {
                        "model": net.state_dict(),
                        "laplace": la.state_dict(),
                        "config": cfg.to_dict(),
                    },
                    fh,
                )
        return {
            "train_time": train_time,
            "final_loss": None if result is None else float(result.final_loss),
            "steps": 0 if result is None else int(result.global_step),
            "loss_curve": [] if result is None else [float(h["loss"]) for h in result.history],
            "prior_precision": float(torch.as_tensor(la.prior_precision).mean()),
            "clamped_fraction": float(la.clamped_fraction),
        }

    def predict(self, x: Tensor, n_samples: int = 0) -> Output:
        return self.la.predictive(x, n_samples=n_samples)


class DeepEnsembleEstimator(Estimator):
    """A deep ensemble of embedding nets (Lakshminarayanan et al., 2017), LAM Table 2's "Deep
    Ensemble" row (Warburg et al., 2023, section 4).

    ``kwargs.members`` copies of the ``base`` registry method (its method, options and
    training settings), each trained from its own initialisation by
    :class:`MethodEstimator` / :func:`bayesurl.training.fit`, member ``k`` with seed
    ``seed + k``. Member 0 is the fitted ``base`` itself (the base run of this seed); member
    ``k`` is bit for bit the plain run of the base at seed ``seed + k``, so at seed 0 with three
    members the ensemble is that of the base's rows of seeds 0, 1 and 2 (the ensemble of
    ``results/lam/fashion_mnist_closed/``). The predictive's draws are the ``K`` normalised
    member embeddings, the embedding their normalised mean and ``u = 1 / kappa_hat`` of them
    (:func:`bayesurl.heads.ensemble.pool_embeddings`), as the LAM code averages its members.

    ``kwargs.align = true`` first rotates each member onto member 0's frame by orthogonal
    Procrustes (:func:`bayesurl.heads.ensemble.orthogonal_procrustes`) fitted on the training
    images' embeddings. Not in LAM: a diagnostic, since the contrastive loss is invariant to
    rotations of the embedding space and the unaligned mean of independent nets mixes
    unrelated coordinates.

    ``out`` receives each trained member's :func:`~bayesurl.training.fit` checkpoints in
    ``member<k>/`` (a finished or interrupted member resumes from its ``last.pt`` instead of
    training again) and ``ensemble.pt`` (every member's weights, the rotations, the config).
    """

    kind = "deep_ensemble"
    OPTIONS: ClassVar[tuple[str, ...]] = ("members", "align")
    #: members without ``kwargs.members`` (the LAM code's ensemble of seeds 1-5)
    DEFAULT_MEMBERS: ClassVar[int] = 5

    def __init__(self, cfg: RunConfig) -> None:

        super().__init__(cfg)
        e = cfg.estimator
        where = f"estimators.{e.name}"
        if cfg.base is None:
            raise ValueError(f"`{where}.base` must name the registry method the members copy")
        for table, valid in (("kwargs", self.OPTIONS), ("fit", ())):
            unknown = [k for k in getattr(e, table) if k not in valid]
            if unknown:
                options = f"valid: {', '.join(valid)}" if valid else "it takes no options"
                raise ValueError(f"unknown key `{where}.{table}.{unknown[0]}`; {options}")
        self.n_members = check_int(
            e.kwargs.get("members", self.DEFAULT_MEMBERS), f"{where}.kwargs.members", low=2
        )
        self.align = e.kwargs.get("align", False)
        if not isinstance(self.align, bool):
            raise ValueError(f"`{where}.kwargs.align` must be true or false, got {self.align!r}")
        member_cfgs = [
            dataclasses.replace(cfg.base, seed=cfg.seed + k) for k in range(self.n_members)
        ]
        self.estimators = [MethodEstimator(c) for c in member_cfgs]  # checks the base's options
        self.members: list[nn.Module] = []
        self.rotations: Tensor | None = None

    @property
    def has_distribution(self) -> bool:
        return True

    def fit(
        self,
        data: RunData,
        *,
        device: torch.device,
        progress: bool = False,
        base: Estimator | None = None,
        out: Path | None = None,
    ) -> dict[str, Any]:
        """Train (or reuse, or resume) the members, then fit the rotations with ``align``."""
        from bayesurl.distributed import is_main_process
        from bayesurl.training import seed_everything

        t0 = time.perf_counter()
        reports = []
        for k, est in enumerate(self.estimators):
            if k == 0 and isinstance(base, MethodEstimator) and base.method is not None:
                self.estimators[0] = base
                reports.append({"seed": est.cfg.seed, "reused": "base"})
                continue
            folder = None if out is None else out / f"member{k}"
            last = None if folder is None else folder / "last.pt"
            resume = last if last is not None and last.is_file() else None
            seed_everything(est.cfg.seed)  # the initialisation a plain run of this seed draws
            report = est.fit(data, device=device, progress=progress, out=folder, resume=resume)
            reports.append({"seed": est.cfg.seed, "resumed": resume is not None, **report})
        self.members = [est.method.eval() for est in self.estimators]  # type: ignore[union-attr]
        self.rotations = self._fit_rotations(data, device) if self.align else None
        train_time = time.perf_counter() - t0
        if out is not None and is_main_process():
            out.mkdir(parents=True, exist_ok=True)
            self.checkpoint = out / "ensemble.pt"
            state = {
                "members": [m.state_dict() for m in self.members],
                "seeds": [est.cfg.seed for est in self.estimators],
                "rotations": None if self.rotations is None else self.rotations.cpu(),
                "config": self.cfg.to_dict(),
            }
            with atomic_open(self.checkpoint, "wb") as fh:
                torch.save(state, fh)
        return {"train_time": train_time, "align": self.align, "members": reports}

    @torch.no_grad()
    def _member_embeddings(self, x: Tensor) -> Tensor:
        return torch.stack([m(x, n_samples=0).embedding for m in self.members])

    @torch.no_grad()
    def _fit_rotations(self, data: RunData, device: torch.device) -> Tensor:
        """``[K, D, D]`` maps of each member onto member 0, fitted on the training images."""
        from bayesurl.data import make_loader
        from bayesurl.heads.ensemble import orthogonal_procrustes

        loader = make_loader(
            data.sets.train, self.cfg.eval.batch_size, shuffle=False, distributed=False
        )
        batches = TransformedLoader(loader, data.transform, device)
        z = torch.cat([self._member_embeddings(x) for x, _ in batches], dim=1).double()
        z = nn.functional.normalize(z, dim=-1)  # the draws of the predictive, before rotation
        return torch.stack([orthogonal_procrustes(zk, z[0]) for zk in z])

    def predict(self, x: Tensor, n_samples: int = 0) -> Output:
        """Normalised mean embedding, ``u = 1 / kappa_hat`` of the ``K`` member embeddings,
        and those as ``samples`` when ``n_samples > 0`` (always ``K`` of them: the ensemble's
        draws are its members)."""
        from bayesurl.evaluation.functional import uncertainty_from_samples
        from bayesurl.heads.ensemble import pool_embeddings

        assert self.members, "fit first"
        embedding, samples = pool_embeddings(self._member_embeddings(x), self.rotations)
        u = uncertainty_from_samples(samples).to(embedding.dtype)
        return Output(
            embedding=embedding, uncertainty=u, samples=samples if n_samples > 0 else None
        )


class BaselineScore(str, Enum):
    """Uncertainty scores of the run's input representation that train nothing."""

    #: ``1 / ||f||``
    INVERSE_NORM = "inverse_norm"
    #: mean cosine distance to the ``k`` nearest upstream features (Sun et al., 2022)
    KNN_DISTANCE = "knn_distance"
    #: squared Mahalanobis distance to the nearest upstream class mean (Lee et al., 2018)
    MAHALANOBIS = "mahalanobis"
    #: ``-log`` density of a Gaussian mixture of the upstream features (DDU)
    GMM = "gmm"


#: The post-hoc wrapper (:mod:`bayesurl.posthoc.reference`) fitted on the upstream features
#: behind each score but ``inverse_norm``: one implementation for ``wrap`` and the protocols.
BASELINE_WRAPPERS = {
    BaselineScore.KNN_DISTANCE: "knn",
    BaselineScore.MAHALANOBIS: "mahalanobis",
    BaselineScore.GMM: "gmm",
}


class BaselineEstimator(Estimator):
    """A free baseline: the input representation itself, with a ``u(x)`` that trains nothing.

    With ``backbone.freeze`` the inputs are the pretrained features ``f``, so the embedding is
    ``f`` and ``u`` is (``kwargs.score``):

    - ``"inverse_norm"``: ``1 / ||f||`` (the feature norm tracks how typical an input is for
      the pretrained network, a reference score of the PVU thesis, section 5.3);
    - ``"knn_distance"``: the mean cosine distance to the ``k`` nearest upstream training
      features (Sun et al., 2022; :class:`~bayesurl.posthoc.reference.KNNWrapper`);
    - ``"mahalanobis"``: the squared Mahalanobis distance to the nearest upstream class mean
      under a shared, shrunk covariance (Lee et al., 2018;
      :class:`~bayesurl.posthoc.reference.MahalanobisWrapper`);
    - ``"gmm"``: ``-log`` density of a Gaussian mixture of the upstream features, one
      component per upstream class or ``components`` k-means clusters (DDU, Mukhoti et al.,
      2023; :class:`~bayesurl.posthoc.reference.GMMWrapper`).

    The last three are the post-hoc wrappers of :func:`bayesurl.wrap` around an identity,
    fitted on the upstream training images' features (deterministic transform, with their
    labels); the other ``kwargs`` are the wrapper's options (``k``, ``reduce``,
    ``shrinkage``, ``components``, ``covariance``, ``seed``). From scratch the inputs are the
    normalised pixels: the same scores in pixel space.
    """

    kind = "baseline"

    def __init__(self, cfg: RunConfig) -> None:
        from bayesurl.posthoc import wrap
        from bayesurl.posthoc.base import wrapper_class

        super().__init__(cfg)
        e = cfg.estimator
        where = f"estimators.{e.name}.kwargs"
        raw = e.kwargs.get("score", "inverse_norm")
        try:
            self.score = BaselineScore(str(raw))
        except ValueError:
            valid = ", ".join(s.value for s in BaselineScore)
            raise ValueError(f"unknown `{where}.score` {raw!r}; valid: {valid}") from None
        options = {k: v for k, v in e.kwargs.items() if k != "score"}
        self.wrapped: Any = None
        if self.score is BaselineScore.INVERSE_NORM:
            if options:
                raise ValueError(
                    f"unknown key `{where}.{next(iter(options))}`; score 'inverse_norm' takes "
                    "no options"
                )
            return
        name = BASELINE_WRAPPERS[self.score]
        _check_kwargs(wrapper_class(name).__init__, options, where, ("encoder", "embed_dim"))
        try:
            self.wrapped = wrap(nn.Identity(), name, **options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"`{where}`: {exc}") from exc

    def fit(
        self,
        data: RunData,
        *,
        device: torch.device,
        progress: bool = False,
        base: Estimator | None = None,
        out: Path | None = None,
    ) -> dict[str, Any]:
        from bayesurl.data import make_loader

        t0 = time.perf_counter()
        report: dict[str, Any] = {}
        if self.wrapped is not None:
            loader = make_loader(data.sets.train, 1024, shuffle=False, distributed=False)
            batches = (
                (x.flatten(1).float(), y)
                for x, y in TransformedLoader(loader, data.transform, device)
            )
            report = self.wrapped.fit(batches, progress=progress)
        if out is not None:  # what the score needs, loadable with weights_only=True
            out.mkdir(parents=True, exist_ok=True)
            if self.wrapped is not None:  # bayesurl.posthoc.load(path, nn.Identity())
                self.checkpoint = out / f"{BASELINE_WRAPPERS[self.score]}.pt"
                self.wrapped.save(self.checkpoint)
            else:
                self.checkpoint = out / "baseline.pt"
                with atomic_open(self.checkpoint, "wb") as fh:
                    torch.save({"score": self.score.value, "config": self.cfg.to_dict()}, fh)
        clean = {k: v for k, v in report.items() if isinstance(v, (int, float, str))}
        return {"train_time": time.perf_counter() - t0, "fit": clean}

    def predict(self, x: Tensor, n_samples: int = 0) -> Output:
        emb = x.flatten(1).float()
        if self.wrapped is None:
            u = 1.0 / emb.norm(dim=1).clamp_min(torch.finfo(emb.dtype).tiny)
            return Output(embedding=emb, uncertainty=u)
        self.wrapped.eval()
        return Output(embedding=emb, uncertainty=self.wrapped(emb).uncertainty)


#: Estimator classes by ``kind``.
ESTIMATORS: dict[str, type[Estimator]] = {
    "method": MethodEstimator,
    "posthoc": PosthocEstimator,
    "lam": LamEstimator,
    "baseline": BaselineEstimator,
    "deep_ensemble": DeepEnsembleEstimator,
}


def build_estimator(cfg: RunConfig) -> Estimator:
    """The (unfitted) estimator of ``cfg`` by its ``kind``; options are checked here.

    Raises
    ------
    ValueError
        For an unknown method, wrapper, mode or option (naming the config key).
    """
    return ESTIMATORS[cfg.estimator.kind](cfg)
