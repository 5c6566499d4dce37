"""One run of a sweep on the one run pipeline: a recipe, a split, a seed -> a flat record.

:class:`PipelineRun` takes the run's resolved config (planned by
:func:`~bayesurl.sweeps.plan.plan_sweep`; resolved by :func:`~bayesurl.sweeps.plan.resolve_run`,
which states the order of the recipe, preset, tuned settings and overrides, when the run carries
none), runs it with :func:`bayesurl.runs.runner.run`
(:func:`bayesurl.runs.data.build_data` assembles the data) and returns its
:class:`~bayesurl.sweeps.record.RunRecord` as a row (every metric of the run, the mixed
R-AUROC and URL's crop test included, with the training curves).
The runs of one split share a :class:`~bayesurl.runs.runner.RunCache` (data built once, a
post-hoc estimator's base trained once per seed); a new split starts a new one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from bayesurl._checks import resolve_device
from bayesurl.files import jsonable
from bayesurl.runs.config import RunConfig, read_recipe_file
from bayesurl.runs.runner import RunCache, run
from bayesurl.sweeps.options import SweepOptions
from bayesurl.sweeps.plan import SweepPreset, plain_overrides, resolve_run
from bayesurl.sweeps.record import RunRecord
from bayesurl.sweeps.report import report_columns

__all__ = ["PipelineRun"]


class PipelineRun:
    """``run_fn(params) -> record`` of the sweep engine on the one run pipeline.

    Parameters
    ----------
    options : SweepOptions, optional
        The sweep's options; a run reads ``dataset`` (the recipe file), ``overrides`` (of every
        run, applied after the run's ``sweep_overrides``: the planning machine's, stored with
        each run of a stored sweep, so a worker started without them runs what the lead
        planned; its own come on top, e.g. a local cache path), ``recipe_tuned`` (a stored
        run's own, the planning machine's choice, wins), ``checkpoint_dir`` /
        ``save_checkpoints``, ``raise_errors`` and ``progress`` (the bar of a split's
        frozen-feature extraction). Default: ``SweepOptions()``.
    preset : SweepPreset
        Its ``recipe_preset`` sets the run settings.
    tuned : mapping, optional
        ``{estimator: [override, ...]}`` chosen by the tuning (used when the run's own
        ``overrides`` are empty).
    device : str or torch.device, optional
        Default: CUDA if available, else CPU.
    folder : path-like, optional
        The sweep's results folder: each run's per-query record goes to
        ``folder/queries/<estimator>[_split<k>]_s<seed>.npz`` (:mod:`bayesurl.runs.queries`,
        read by :mod:`bayesurl.report`) and, with ``options.save_checkpoints``, its checkpoint
        to ``folder/checkpoints/<estimator>[_split<k>]_s<seed>/`` (``options.checkpoint_dir``
        instead when given).
    recipe : mapping, optional
        The recipe file's tables as :func:`~bayesurl.runs.config.read_recipe_file` gave them
        (the sweep reads the file once); default: read here.

    Attributes
    ----------
    info : dict
        The data description of the last run (sizes, classes), for the sweep's settings.
    """

    def __init__(
        self,
        options: SweepOptions | None = None,
        *,
        preset: SweepPreset,
        tuned: Mapping[str, Sequence[str]] | None = None,
        device: str | torch.device | None = None,
        folder: str | os.PathLike[str] | None = None,
        recipe: Mapping[str, Any] | None = None,
    ) -> None:
        opts = SweepOptions() if options is None else options
        self.options, self.dataset, self.preset = opts, opts.dataset, preset
        self.overrides = list(opts.overrides)
        self.tuned = {k: list(v) for k, v in (tuned or {}).items()}
        self.recipe_tuned = opts.recipe_tuned
        self.device = device
        ckpt = opts.checkpoint_dir
        if ckpt is None and opts.save_checkpoints and folder is not None:
            ckpt = Path(folder) / "checkpoints"
        self.checkpoint_dir = None if ckpt is None else Path(ckpt)
        self.queries_dir = None if folder is None else Path(folder) / "queries"
        self.raise_errors = opts.raise_errors
        self.progress = opts.progress
        self.recipe = read_recipe_file(self.dataset) if recipe is None else recipe
        self.info: dict[str, Any] = {}
        self._split: Any = None
        # the estimators other rows start from (a post-hoc wrapper's or LAM's ``base``):
        # their own rows are kept in the cache, so a base is trained once per seed
        self._keep = {str(t["base"]) for t in self.recipe["estimators"].values() if "base" in t}
        self._cache = RunCache(keep=self._keep)

    def config(self, params: Mapping[str, Any]) -> RunConfig:
        """The :class:`~bayesurl.runs.config.RunConfig` of the run ``params``.

        A planned run carries its resolved config (``params["config"]``,
        :func:`~bayesurl.sweeps.plan.plan_sweep`): it is rebuilt as it is, on this machine's
        device. The run is resolved (:func:`~bayesurl.sweeps.plan.resolve_run`) when it carries
        none (a tuning trial, a run stored by an older bayesurl) or when this machine adds
        settings the plan did not have (its own overrides, tuned settings of its own).
        """
        dev = str(resolve_device(self.device))
        stored = params.get("config")
        if stored is not None and not self._adds_settings(params):
            cfg = RunConfig.from_dict(stored)
            for c in (cfg, cfg.base):
                if c is not None:
                    c.device = dev
            return cfg
        return resolve_run(
            self.dataset,
            self.preset,
            params,
            overrides=self.overrides,
            tuned=self.tuned,
            recipe_tuned=self.recipe_tuned,
            device=dev,
            recipe=self.recipe,
        )

    def _adds_settings(self, params: Mapping[str, Any]) -> bool:
        """Whether this machine's overrides or tuned settings change what the run planned."""
        lead = list(params.get("sweep_overrides", []))
        if self.overrides and plain_overrides(self.overrides) != lead:
            return True
        return not params.get("overrides") and bool(self.tuned.get(str(params["estimator"])))

    def tuned_classes(self, cfg: Any, params: Mapping[str, Any]) -> dict[str, list[int] | None]:
        """``tuned_on`` / ``tuned_trained_on`` of the run: the union over the settings it got
        (the recipe's tuned set for the estimator and its base, the sweep's own search);
        ``[]`` when none were tuned, ``None`` when some were but their classes are unknown."""
        own = params.get("overrides") or self.tuned.get(cfg.estimator.name)
        parts = [(cfg.tuned_on, cfg.tuned_trained_on)]
        if cfg.base is not None:
            parts.append((cfg.base.tuned_on, cfg.base.tuned_trained_on))
        if own:
            parts.append((params.get("tuned_on"), params.get("tuned_trained_on")))
        out: dict[str, list[int] | None] = {}
        for i, key in enumerate(("tuned_on", "tuned_trained_on")):
            vals = [p[i] for p in parts]
            out[key] = (
                None if any(v is None for v in vals) else sorted({int(c) for v in vals for c in v})  # type: ignore[union-attr]
            )
        return out

    @staticmethod
    def run_name(params: Mapping[str, Any]) -> str:
        """``<estimator>[_split<k>]_s<seed>``: the run's checkpoint folder and query record."""
        split = "" if params.get("class_split") is None else f"_split{params['split']}"
        return f"{params['estimator']}{split}_s{params['seed']}"

    def checkpoint(self, params: Mapping[str, Any]) -> Path | None:
        """Where the run keeps its checkpoint (``None``: nowhere)."""
        if self.checkpoint_dir is None:
            return None
        return self.checkpoint_dir / self.run_name(params)

    def queries(self, params: Mapping[str, Any]) -> Path | None:
        """Where the run writes its per-query record (``None``: nowhere)."""
        if self.queries_dir is None:
            return None
        return self.queries_dir / f"{self.run_name(params)}.npz"

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        cpu0 = time.process_time()
        out, queries = self.checkpoint(params), self.queries(params)
        cfg = self.config(params)
        key = (params.get("split"), params.get("stage", "final"))
        if key != self._split:  # a new split: new data, new cache (bases are per split too)
            self._split, self._cache = key, RunCache(keep=self._keep)
        data = self._cache.get_data(cfg, self.progress)
        self.info = dict(data.info)
        res = run(cfg, cache=self._cache, out=out, queries=queries, raise_errors=self.raise_errors)
        rec = res.record()
        for c in report_columns(shown=True):
            rec.setdefault(c.key, None)
        # training curves: loss and the median u of a fixed batch of training images per epoch
        rec.update(loss_curve=res.fit.get("loss_curve"), u_curve=res.fit.get("u_curve"))
        cs = params.get("class_split")
        rec.update(
            stage=cfg.data.stage,
            upstream=None if cs is None else list(cs["upstream"]),
            downstream=None if cs is None else list(cs["downstream"]),
            overrides=list(params.get("overrides") or self.tuned.get(cfg.estimator.name, [])),
            total_time=res.timings.get("total"),
            # the process's CPU time for the run, data assembly included (wall time on a
            # shared machine measures the neighbours)
            cpu_time=time.process_time() - cpu0,
            **self.tuned_classes(cfg, params),
        )
        if not rec.get("error"):
            rec.pop("traceback", None)
        error = rec.pop("error")
        values = {k: v for k, v in rec.items() if k not in ("estimator", "seed")}
        record = RunRecord(
            estimator=cfg.estimator.name,
            seed=cfg.seed,
            split=int(params.get("split", 0)),
            error=error,
            values=jsonable(values),
        )
        return record.to_row()
