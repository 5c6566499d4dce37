"""Kind ``posthoc``: :func:`bayesurl.wrap` (PVU, thesis section 5.3; post-hoc TaU, TaU
section 4; last-layer Laplace, LAM section 3, with laplace-torch on a classifier; the kNN,
Mahalanobis and GMM scores) around a trained base method that the runner trains or reuses."""

from __future__ import annotations

import re
import time
from typing import Any

from torch import Tensor, nn

from bayesurl.data import TransformedLoader
from bayesurl.posthoc.base import WRAPPERS
from bayesurl.runs.config import RunConfig
from bayesurl.runs.data import RunData
from bayesurl.runs.estimators.base import (
    ESTIMATORS,
    Estimator,
    FitContext,
    Tuning,
    check_fit_values,
    check_kwargs,
)
from bayesurl.runs.estimators.method import MethodEstimator
from bayesurl.types import Output

__all__ = ["PosthocEstimator"]


@ESTIMATORS.register("posthoc", distributed=False, tuning=Tuning.FIT_RATE)
class PosthocEstimator(Estimator):
    """:func:`bayesurl.wrap` around a trained base method (PVU, post-hoc TaU, Laplace, or a
    score fitted on the base's embeddings of the upstream images: kNN, Mahalanobis, GMM)."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        e = cfg.estimator
        where = f"estimators.{e.name}"
        entry = WRAPPERS.entry(e.wrapper, argument=f"{where}.wrapper")
        self.wrapper_name, cls = entry.name, entry.obj
        check_kwargs(cls.__init__, e.kwargs, f"{where}.kwargs", ("encoder", "classifier"))
        check_kwargs(cls.fit, e.fit, f"{where}.fit", ("loader", "progress", "augment"))
        check_fit_values(e.fit, f"{where}.fit")
        self.wrapped: Any = None

    @property
    def has_distribution(self) -> bool:
        if self.wrapped is not None:
            return bool(self.wrapped.has_distribution)
        return self.wrapper_name == "laplace" and not self.cfg.estimator.use_base_classifier

    def fit(self, data: RunData, ctx: FitContext) -> dict[str, Any]:
        from bayesurl.data import make_loader
        from bayesurl.posthoc import wrap

        base, device = ctx.base, ctx.device
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
        inputs = WRAPPERS.traits(self.wrapper_name).get("fit_inputs", "transformed")
        if inputs == "augmented":  # one augmented view per image, passes cached per batch size
            batches: Any = TransformedLoader(loader, data.augment, device)
            fit_kw["batch_size"] = batch
        elif inputs == "raw":  # the wrapper draws its own views with the augmentation
            batches = TransformedLoader(loader, nn.Identity(), device)
            fit_kw["augment"] = data.augment.to(device)
        else:
            batches = TransformedLoader(loader, data.transform, device)
        t0 = time.perf_counter()
        report = self.wrapped.fit(batches, progress=ctx.progress, **fit_kw)
        train_time = time.perf_counter() - t0
        out = ctx.out
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
