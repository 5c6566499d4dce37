"""Kind ``deep_ensemble``: independently trained copies of a base registry method whose
member embeddings are the draws of the predictive (LAM Table 2's "Deep Ensemble" row)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bayesurl._checks import check_int
from bayesurl.data import TransformedLoader
from bayesurl.files import atomic_open
from bayesurl.runs.config import RunConfig
from bayesurl.runs.data import RunData
from bayesurl.runs.estimators.base import ESTIMATORS, Estimator, FitContext, Tuning
from bayesurl.runs.estimators.method import MethodEstimator
from bayesurl.types import Output

__all__ = ["DeepEnsembleEstimator"]


@ESTIMATORS.register("deep_ensemble", distributed=False, tuning=Tuning.TRAINED)
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

    def fit(self, data: RunData, ctx: FitContext) -> dict[str, Any]:
        """Train (or reuse, or resume) the members, then fit the rotations with ``align``."""
        from bayesurl.distributed import is_main_process
        from bayesurl.training import seed_everything

        t0 = time.perf_counter()
        base, out = ctx.base, ctx.out
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
            member = FitContext(ctx.device, progress=ctx.progress, out=folder, resume=resume)
            report = est.fit(data, member)
            reports.append({"seed": est.cfg.seed, "resumed": resume is not None, **report})
        self.members = [est.method.eval() for est in self.estimators]  # type: ignore[union-attr]
        self.rotations = self._fit_rotations(data, ctx.device) if self.align else None
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
