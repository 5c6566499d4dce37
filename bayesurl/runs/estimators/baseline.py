"""Kind ``baseline``: a free, training-free score of the input representation (the
pretrained features of a frozen-feature run): ``1 / ||f||``, the k-NN cosine distance, the
Mahalanobis distance to the upstream classes or a Gaussian-mixture density
(:mod:`bayesurl.posthoc.reference`)."""

from __future__ import annotations

import time
from enum import Enum
from typing import Any

import torch
from torch import Tensor, nn

from bayesurl.data import TransformedLoader
from bayesurl.files import atomic_open
from bayesurl.runs.config import RunConfig
from bayesurl.runs.data import RunData
from bayesurl.runs.estimators.base import ESTIMATORS, Estimator, FitContext, Tuning, check_kwargs
from bayesurl.types import Output

__all__ = ["BASELINE_WRAPPERS", "BaselineEstimator", "BaselineScore"]


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


@ESTIMATORS.register("baseline", distributed=False, tuning=Tuning.NONE)
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
        check_kwargs(wrapper_class(name).__init__, options, where, ("encoder", "embed_dim"))
        try:
            self.wrapped = wrap(nn.Identity(), name, **options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"`{where}`: {exc}") from exc

    def fit(self, data: RunData, ctx: FitContext) -> dict[str, Any]:
        from bayesurl.data import make_loader

        t0 = time.perf_counter()
        report: dict[str, Any] = {}
        if self.wrapped is not None:
            loader = make_loader(data.sets.train, 1024, shuffle=False, distributed=False)
            batches = (
                (x.flatten(1).float(), y)
                for x, y in TransformedLoader(loader, data.transform, ctx.device)
            )
            report = self.wrapped.fit(batches, progress=ctx.progress)
        out = ctx.out
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
