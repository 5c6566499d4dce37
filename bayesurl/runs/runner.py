"""One run: config -> data -> estimator -> predict -> evaluate -> result record.

:func:`run` is the road every command and the benchmark take: it builds
(or reuses) the data of a :class:`~bayesurl.runs.config.RunConfig`, seeds everything with the
run's seed, fits the estimator (training or reusing a post-hoc estimator's base first),
predicts the evaluation sets with the one sampling rule and scores them with
:func:`bayesurl.evaluation.evaluate` (URL section 3.2 zero-shot protocol;
docs/concepts/metrics.rst). The same config and seed give the same metrics whichever caller runs it.

A :class:`RunCache` shared by several runs (a sweep) keeps the assembled data and the fitted
base methods, so PVU, post-hoc TaU and Laplace-on-CE wrap the CE run of the same seed instead
of training it again, and the kNN searches of the test embeddings
(:class:`~bayesurl.evaluation.NeighborMemo`), so the rows that keep their base's embedding, or
score the same frozen features, search once.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from bayesurl._checks import check_int, resolve_device
from bayesurl.data.registry import DatasetKind, dataset_kind, dataset_names
from bayesurl.distributed import launch_rank, launched_by_torchrun
from bayesurl.evaluation import EvaluationResult, NeighborMemo
from bayesurl.evaluation.table import METRICS
from bayesurl.features import source_digests
from bayesurl.files import format_of, jsonable, write_json
from bayesurl.runs.config import DataConfig, RunConfig
from bayesurl.runs.data import RunData, build_data, data_key
from bayesurl.runs.estimators import ESTIMATORS, Estimator, FitContext, build_estimator
from bayesurl.runs.predict import n_samples_for, score
from bayesurl.runs.queries import record_from_outputs
from bayesurl.stats.intervals import flat_intervals

__all__ = [
    "CHECKPOINT_DATASETS",
    "CROP_IMAGES",
    "CROP_KEYS",
    "RESULT_FORMAT",
    "RunCache",
    "RunResult",
    "agree_on_outcome",
    "crop_test_images",
    "evaluate_checkpoint",
    "launch_rank",
    "launched_by_torchrun",
    "refuse_undistributed",
    "run",
    "torchrun_group",
    "train",
]

#: The format of a run's ``result.json`` (a reader refuses a newer one).
RESULT_FORMAT = format_of("bayesurl.result", 1)


@dataclass
class RunCache:
    """Assembled data and fitted base estimators shared by the runs of a sweep.

    Attributes
    ----------
    data : dict
        :class:`~bayesurl.runs.data.RunData` by :func:`~bayesurl.runs.data.data_key`.
    bases : dict
        ``(estimator, fit report)`` of base runs by their full settings (seed included).
    keep : set of str
        Estimator names whose own runs are kept in ``bases`` (a sweep's bases: a
        ``contrastive`` row is then the net that LAM's rows of the same seed start from,
        trained once).
    memos : dict
        :class:`~bayesurl.evaluation.NeighborMemo` by folder (:meth:`neighbor_memo`).
    """

    data: dict[Any, RunData] = field(default_factory=dict)
    bases: dict[str, tuple[Estimator, dict[str, Any]]] = field(default_factory=dict)
    keep: set[str] = field(default_factory=set)
    memos: dict[str | None, NeighborMemo] = field(default_factory=dict)

    def get_data(self, cfg: RunConfig, progress: bool = True) -> RunData:
        """The data of ``cfg``, built once per :func:`data_key` (``progress``: the bar of a
        frozen-feature extraction)."""
        key = data_key(cfg)
        if key not in self.data:
            self.data[key] = build_data(cfg, progress)
        return self.data[key]

    def neighbor_memo(self, cfg: RunConfig) -> NeighborMemo:
        """The search memo of ``cfg``'s runs: beside the frozen-feature store
        (``<backbone.cache>/neighbors``, shared by every worker of a sweep) with
        ``backbone.freeze``, else in memory."""
        folder = str(Path(cfg.backbone.cache) / "neighbors") if cfg.backbone.freeze else None
        if folder not in self.memos:
            self.memos[folder] = NeighborMemo(folder)
        return self.memos[folder]


@dataclass
class RunResult:
    """The record of one run.

    Attributes
    ----------
    estimator, dataset : str
        Estimator table and recipe file names.
    split : str
        ``"zero_shot"`` (URL section 3.2: upstream train, downstream test classes).
    seed : int
    preset : str or None
    metrics : dict
        Evaluator result: ``r@1``, ``r_auroc``, ``ausc``, ``ause``, ``ece`` (``None`` without
        a distribution), ``map@5``, ``ood_auroc``, ``ood_auprc``, ``mixed_r_auroc`` (URL
        App. C.5), ``crop_share`` / ``crop_spearman`` (URL's crop test on
        :data:`CROP_IMAGES` downstream images), sizes, notes.
    settings : dict
        The resolved :class:`RunConfig` and the data description.
    timings : dict
        ``fit`` (estimator's own fit), ``train_time`` (including a base's training),
        ``eval``, ``total`` in seconds.
    fit : dict
        The estimator's fit report (losses, steps, prior precision, ...).
    paper : dict or None
        Reference figures of the recipe table.
    checkpoint : str or None
    error : str or None
        Exception text of a failed run (then ``metrics`` is empty).
    outputs : dict or None
        The predicted ``(Output, labels)`` per evaluation set with ``keep_outputs=True``
        (not serialised; under ``torchrun`` this rank's rows).
    fitted : Estimator or None
        The fitted estimator with ``keep_outputs=True`` (not serialised), for checks that need
        new predictions.
    transform : callable or None
        The batch transform the estimator's inputs went through (with ``keep_outputs=True``).
    main_process : bool
        False on the ranks other than 0 of a ``torchrun`` launch (they neither write nor
        report; not serialised).
    """

    estimator: str
    dataset: str
    split: str
    seed: int
    preset: str | None
    metrics: dict[str, Any]
    settings: dict[str, Any]
    timings: dict[str, float]
    fit: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, Any] | None = None
    checkpoint: str | None = None
    error: str | None = None
    outputs: dict[str, Any] | None = field(default=None, repr=False)
    fitted: Any = field(default=None, repr=False)
    transform: Any = field(default=None, repr=False)
    main_process: bool = field(default=True, repr=False)

    def flat_metrics(self) -> dict[str, Any]:
        """The metrics with each interval as flat fields (``<key>_low``, ``<key>_high``,
        ``<key>_interval``, ``<key>_n``, ``<key>_over``, ``interval_level``;
        :func:`bayesurl.stats.intervals.flat_intervals`) in place of ``intervals``."""
        out = {k: v for k, v in self.metrics.items() if k != "intervals"}
        out.update(flat_intervals(self.metrics.get("intervals") or {}))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (without ``outputs``); the metrics' intervals as flat fields, their
        notes (:mod:`bayesurl.evaluation.notes`) under ``metrics["caveats"]``."""
        metrics = self.flat_metrics()
        if hasattr(self.metrics, "caveats"):
            metrics["caveats"] = [n.text for n in self.metrics.caveats]
        return {
            "format": RESULT_FORMAT,
            "estimator": self.estimator,
            "dataset": self.dataset,
            "split": self.split,
            "seed": self.seed,
            "preset": self.preset,
            "metrics": metrics,
            "settings": self.settings,
            "timings": self.timings,
            "fit": self.fit,
            "paper": self.paper,
            "checkpoint": self.checkpoint,
            "error": self.error,
        }

    def record(self) -> dict[str, Any]:
        """One flat row for sweep tables: ``estimator``, ``seed``, ``error``, metrics, times."""
        row: dict[str, Any] = {"estimator": self.estimator, "seed": self.seed, "error": self.error}
        row.update({k: v for k, v in self.flat_metrics().items() if k not in ("notes",)})
        row.update(
            train_time=self.timings.get("train_time"),
            eval_time=self.timings.get("eval"),
            train_cpu_time=self.fit.get("train_cpu_time"),
            final_loss=self.fit.get("final_loss"),
            steps=self.fit.get("steps"),
        )
        if self.error:
            row["traceback"] = self.settings.get("traceback")
        return row

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON (``null`` where a metric is undefined)."""
        return write_json(path, jsonable(self.to_dict()), indent=2)


def _mean_of(per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Mean of the numeric metrics over several test sets, the sets under ``per_set``."""
    first = next(iter(per.values()))
    out: dict[str, Any] = {}
    for key in first:
        vals = [r.get(key) for r in per.values()]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[key] = sum(float(v) for v in vals) / len(vals)
        elif all(v is None for v in vals):
            out[key] = None
    out["notes"] = [f"mean over the downstream sets {', '.join(per)}"]
    out["eval_time"] = sum(float(r["eval_time"]) for r in per.values())
    out["per_set"] = {k: {x: y for x, y in r.items() if x != "outputs"} for k, r in per.items()}
    if any("outputs" in r for r in per.values()):
        out["outputs"] = {k: r["outputs"]["test"] for k, r in per.items()}
    return out


def _base_key(cfg: RunConfig, device: torch.device) -> str:
    return json.dumps({**cfg.to_dict(), "device": str(device)}, sort_keys=True, default=str)


def refuse_undistributed(cfgs: Sequence[RunConfig], *, argument: str = "cfg") -> None:
    """Raise if any of ``cfgs`` has an estimator whose fit is not distributed.

    The kinds registered with ``distributed=True`` in
    :data:`~bayesurl.runs.estimators.base.ESTIMATORS` (registry methods and LAM) train under DDP
    (:func:`bayesurl.training.fit`); a post-hoc estimator's fit is not distributed, and under a
    process group its loaders would shard the training data, so each rank would fit a
    different model. Every offending estimator is named in one error, before anything runs.

    Parameters
    ----------
    cfgs : sequence of RunConfig
        The runs about to start under a process group.
    argument : str
        The argument named in the error (``"cfg"``, ``"estimators"`` ...).

    Raises
    ------
    ValueError
        Naming every estimator of a kind that is not distributed, and the distributed ones.
    """
    ddp_kinds = ESTIMATORS.names(distributed=True)
    bad = {c.estimator.name: c.estimator.kind for c in cfgs if c.estimator.kind not in ddp_kinds}
    if not bad:
        return
    ok = list(dict.fromkeys(c.estimator.name for c in cfgs if c.estimator.kind in ddp_kinds))
    listed = ", ".join(f"{n!r} (kind {k!r})" for n, k in bad.items())
    hint = f"; the distributed ones here: {','.join(ok)}" if ok else ""
    raise ValueError(
        f"`{argument}` under torchrun: estimator(s) {listed}, whose fit is not distributed; "
        f"only kinds {', '.join(map(repr, ddp_kinds))} train under DDP{hint}. Run them in one "
        "process (the evaluation of a checkpoint, `bayesurl evaluate --checkpoint`, is sharded "
        "under torchrun)"
    )


def agree_on_outcome(what: str, error: str | None) -> None:
    """Collective after a run under a process group: every rank had the same outcome.

    A run that failed on some ranks only cannot be recorded consistently (rank 0 would write
    a result the other ranks did not compute): then every rank raises, naming the failing
    ranks. A no-op without a multi-rank group.

    Parameters
    ----------
    what : str
        The run, for the message (``"ce seed 0"``).
    error : str or None
        This rank's error text (``None``: the run succeeded here).

    Raises
    ------
    RuntimeError
        When some ranks but not all report an error.
    """
    import torch.distributed as dist

    from bayesurl.distributed import get_world_size, is_distributed

    if not is_distributed():
        return
    errors: list[Any] = [None] * get_world_size()
    dist.all_gather_object(errors, error)
    failed = [r for r, e in enumerate(errors) if e]
    if failed and len(failed) != len(errors):
        first = next(e for e in errors if e)
        raise RuntimeError(
            f"run {what} failed on rank(s) {failed} only ({first}); it cannot be recorded "
            "consistently, so every rank stops"
        )


@contextlib.contextmanager
def torchrun_group(
    cfgs: Sequence[RunConfig], device: str | None, *, argument: str
) -> Iterator[torch.device | None]:
    """Under ``torchrun`` (``WORLD_SIZE > 1``) the default process group for the runs ``cfgs``.

    Yields this rank's device (``None``: not launched by torchrun, or a group already exists,
    which is then used and left alone -- :func:`bayesurl.sweeps.sweep.run_sweep` opens one
    group for all its runs, so each :func:`run` of the sweep finds it). Under torchrun or a
    process group, estimators that do not fit distributed are refused first
    (:func:`refuse_undistributed`, naming ``argument``) rather than evaluated inconsistently.
    ``device`` (``None``: ``cuda:LOCAL_RANK`` where CUDA
    is available, else CPU) is passed to :func:`bayesurl.distributed.init_from_env`.
    """
    from bayesurl import distributed as D

    if not (launched_by_torchrun() or D.is_distributed()):
        yield None
        return
    refuse_undistributed(cfgs, argument=argument)
    if D.is_distributed():
        yield None
        return
    info = D.init_from_env(device=device)
    try:
        yield resolve_device(device) if device else info.device
    finally:
        D.cleanup()


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, file=sys.stderr, flush=True)


def _fit_base(
    cfg: RunConfig, data: RunData, cache: RunCache, device: torch.device
) -> tuple[Estimator, dict[str, Any]]:
    from bayesurl.training import seed_everything

    key = _base_key(cfg, device)
    if key not in cache.bases:
        seed_everything(cfg.seed)
        est = build_estimator(cfg)
        report = est.fit(data, FitContext(device))
        cache.bases[key] = (est, report)
    return cache.bases[key]


def run(
    cfg: RunConfig,
    *,
    cache: RunCache | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: bool = False,
    keep_outputs: bool = False,
    raise_errors: bool = True,
    queries: str | os.PathLike[str] | None = None,
    **evaluate_kwargs: Any,
) -> RunResult:
    """Fit and evaluate the estimator of ``cfg`` zero-shot; return its :class:`RunResult`.

    Parameters
    ----------
    cfg : RunConfig
        From :func:`bayesurl.runs.config.load_recipe`.
    cache : RunCache, optional
        Shared data and base estimators (a sweep passes one; default: a fresh one).
    out : path-like, optional
        Folder for the checkpoint(s) and ``result.json``.
    progress : bool
        Print one line per phase (fit, evaluation) on stderr. The training loops run without
        per-batch bars either way: a live tqdm bar changed the float results of CPU training
        (CE smoke preset: R@1 0.687 without, 0.680 with a bar, both reproducible), and a run
        must give the same metrics whichever command starts it.
    keep_outputs : bool
        Keep the predicted outputs in ``RunResult.outputs``.
    raise_errors : bool
        Re-raise an exception of the estimator instead of recording it in ``error``.
    queries : path-like, optional
        Write the per-query record (u, nearest neighbour, hit flag, OOD u;
        :mod:`bayesurl.runs.queries`) of the downstream queries there, for the report
        (:mod:`bayesurl.report`). Not written under ``torchrun`` (each rank holds its rows
        only) nor for several downstream sets.
    **evaluate_kwargs
        Passed to :func:`bayesurl.evaluation.evaluate`.

    Returns
    -------
    RunResult

    Notes
    -----
    Under ``torchrun --nproc_per_node W`` (and no process group yet) the run initialises the
    default group from the environment: a registry method trains under DDP
    (:func:`bayesurl.training.fit`) and the evaluation is sharded
    (:func:`~bayesurl.runs.predict.score`) every rank computing the single-process
    metrics of the trained model; rank 0 writes
    ``result.json`` (``RunResult.main_process``) and the group is destroyed at the end. The
    device defaults to ``cuda:LOCAL_RANK`` where CUDA is available.

    Raises
    ------
    ValueError, FileNotFoundError
        On a bad config or missing data (always raised, even with ``raise_errors=False``:
        nothing was run); under torchrun, for an estimator kind that is not distributed.
    """
    with torchrun_group([cfg], cfg.device, argument=cfg.name) as rank_device:
        return _run(
            cfg,
            rank_device if rank_device is not None else resolve_device(cfg.device),
            cache=cache,
            out=out,
            progress=progress,
            keep_outputs=keep_outputs,
            raise_errors=raise_errors,
            queries=queries,
            **evaluate_kwargs,
        )


#: Downstream images of URL's crop test per run (evenly spaced over the retrieval set).
CROP_IMAGES = 2000

#: The record keys of URL's crop test (:func:`crop_test_images`).
CROP_KEYS = ("crop_share", "crop_spearman")


def crop_test_images(cfg: RunConfig) -> int:
    """Downstream images of URL's crop test in a run of ``cfg``: :data:`CROP_IMAGES`, or 0 on
    frozen features (``backbone.freeze``: the estimators see cached features, no pixels to
    crop), where :data:`CROP_KEYS` stay ``None``."""
    return 0 if cfg.backbone.freeze else CROP_IMAGES


def _metric_selection(cfg: RunConfig) -> dict[str, Any]:
    """``include`` for the evaluator: its defaults plus ``eval.metrics`` (none asked: nothing,
    so that a run's metrics are the defaults' by construction)."""
    if not cfg.eval.metrics:
        return {}
    asked = set(cfg.eval.metrics)  # names checked where the config was made
    return {"include": [m.name for m in METRICS.values() if m.default or m.name in asked]}


def _new_result(cfg: RunConfig, data: RunData, device: torch.device, main: bool) -> RunResult:
    """The record of a run of ``cfg`` before it fits: what it is and the settings it runs with."""
    from bayesurl.distributed import get_world_size

    settings: dict[str, Any] = {
        "config": cfg.to_dict(),
        "data": data.info,
        "device": str(device),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "world_size": get_world_size(),
    }
    return RunResult(
        estimator=cfg.estimator.name,
        dataset=cfg.dataset,
        split="zero_shot",
        seed=cfg.seed,
        preset=cfg.preset,
        metrics={},
        settings=settings,
        timings={},
        paper=dict(cfg.estimator.paper) or None,
        main_process=main,
    )


def _fit(
    cfg: RunConfig,
    estimator: Estimator,
    data: RunData,
    cache: RunCache,
    device: torch.device,
    out: Path | None,
    progress: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit ``estimator`` (its base first, trained or reused from ``cache``); the fit reports
    of the base (empty without one) and of the estimator. Under torchrun every rank then holds
    rank 0's model."""
    from bayesurl.distributed import broadcast_state, get_world_size
    from bayesurl.training import seed_everything

    name = cfg.name if progress else ""  # the messages are made only when they are shown
    base, base_report = None, {}
    if cfg.base is not None:
        _say(progress, f"{name}: base {cfg.base.estimator.name} (seed {cfg.seed})")
        base, base_report = _fit_base(cfg.base, data, cache, device)
    seed_everything(cfg.seed)
    _say(progress, f"{name}: fitting (seed {cfg.seed}, device {device})")
    report = estimator.fit(data, FitContext(device, base=base, out=out))
    _say(progress, f"{name}: fitted in {report.get('train_time', 0.0):.1f} s; evaluating")
    if cfg.estimator.name in cache.keep and cfg.base is None:
        cache.bases.setdefault(_base_key(cfg, device), (estimator, report))
    module = getattr(estimator, "method", None)
    if get_world_size() > 1 and isinstance(module, torch.nn.Module):
        # DDP keeps the parameters equal, not the buffers of each rank's last forward pass
        # (BatchNorm statistics): every rank evaluates rank 0's model, the checkpoint's
        broadcast_state(module, 0)
    return base_report, report


def _score_fitted(
    estimator: Estimator, data: RunData, samples: int, score_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The zero-shot scores of a fitted estimator, the one evaluation of every road that
    starts from a model (a run, a checkpoint): the sampling rule (``samples`` draws where it
    has a distribution, :func:`~bayesurl.runs.predict.n_samples_for`), then
    :func:`~bayesurl.runs.predict.score` of its ``predict`` on ``data``'s sets with
    ``score_kwargs``, or on each of several downstream sets and their mean."""
    kw = {"n_samples": n_samples_for(estimator.has_distribution, samples), **score_kwargs}
    if data.tests:  # several downstream sets: each scored, their mean reported
        return _mean_of(
            {
                k: score(estimator.predict, SimpleNamespace(test=v), data.transform, **kw)
                for k, v in data.tests.items()
            }
        )
    return score(estimator.predict, data.sets, data.transform, **kw)


def _run(
    cfg: RunConfig,
    device: torch.device,
    *,
    cache: RunCache | None,
    out: str | os.PathLike[str] | None,
    progress: bool,
    keep_outputs: bool,
    raise_errors: bool,
    queries: str | os.PathLike[str] | None = None,
    **evaluate_kwargs: Any,
) -> RunResult:
    from bayesurl.distributed import get_world_size, is_main_process

    t0 = time.perf_counter()
    cache = cache if cache is not None else RunCache()
    out_dir = None if out is None else Path(out)
    main = is_main_process()
    progress = progress and main
    data = cache.get_data(cfg, progress)
    result = _new_result(cfg, data, device, main)
    estimator = build_estimator(cfg)  # validates the options before anything trains
    try:
        base_report, fit_report = _fit(cfg, estimator, data, cache, device, out_dir, progress)
        record = queries is not None and main and get_world_size() == 1 and not data.tests
        score_kwargs = {
            "batch_size": cfg.eval.batch_size,
            "device": device,
            "seed": cfg.seed,
            "return_outputs": keep_outputs or record,
            # every metric a benchmark reports, a run reports
            "crop_images": crop_test_images(cfg),
            "neighbor_memo": cache.neighbor_memo(cfg),
            **_metric_selection(cfg),
            **evaluate_kwargs,
        }
        res = _score_fitted(estimator, data, cfg.eval.samples, score_kwargs)
        result.outputs = res.pop("outputs", None)
        if record:
            # a post-hoc u inherits its base's training: at chance if the base is
            _write_queries(queries, result.outputs, cfg, data, {**base_report, **fit_report})
            result.outputs = result.outputs if keep_outputs else None
        if keep_outputs:
            result.fitted, result.transform = estimator, data.transform
        result.metrics, result.fit = res, fit_report
        result.checkpoint = None if estimator.checkpoint is None else str(estimator.checkpoint)
        fit_time = float(fit_report.get("train_time", 0.0))
        base_time = float(base_report.get("train_time", 0.0))
        result.timings = {
            "fit": fit_time,
            "base_fit": base_time,
            "train_time": fit_time + base_time,
            "eval": float(res["eval_time"]),
        }
    except Exception as exc:
        if raise_errors:
            raise
        result.error = f"{type(exc).__name__}: {exc}"
        result.settings["traceback"] = traceback.format_exc(limit=4)
    result.timings["total"] = time.perf_counter() - t0
    if out_dir is not None and main:
        result.write_json(out_dir / "result.json")
    return result


def _write_queries(
    path: str | os.PathLike[str],
    outputs: Any,
    cfg: RunConfig,
    data: RunData,
    fit_report: dict[str, Any],
) -> None:
    """The per-query record of a run (:mod:`bayesurl.runs.queries`), with what rebuilds its
    images (the data and backbone settings), the digest of each query's and OOD image's pixels
    (for cached features, the store's link from each row to its image) and the training loss
    its notes compare with the untrained value."""
    meta = {
        "name": cfg.estimator.name,
        "seed": cfg.seed,
        "dataset": cfg.dataset,
        "config": {"data": cfg.to_dict()["data"], "backbone": cfg.to_dict()["backbone"]},
        "fit": {
            k: fit_report[k]
            for k in ("final_loss", "untrained_loss")
            if isinstance(fit_report.get(k), (int, float))
        },
    }
    ood = getattr(data.sets, "ood", None)
    rec = record_from_outputs(
        outputs,
        meta,
        source=source_digests(data.sets.test),
        ood_source=None if ood is None else source_digests(ood),
    )
    if rec is not None:
        rec.save(path)


#: Data sets :func:`evaluate_checkpoint` can build (those of ``bayesurl train``).
CHECKPOINT_DATASETS = dataset_names(DatasetKind.EMBEDDED)


def _checkpoint_dataset(path: Path) -> str:
    """The data set a checkpoint was trained on: ``dataset`` in the ``train.json`` beside it,
    else ``"default"``."""
    info = path.parent / "train.json"
    if info.is_file():
        try:
            return str(json.loads(info.read_text()).get("dataset") or "default")
        except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
            pass
    return "default"


def evaluate_checkpoint(
    path: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    root: str | os.PathLike[str] | None = None,
    n_samples: int | None = None,
    max_test: int | None = None,
    max_ood: int | None = None,
    device: str | torch.device | None = "cpu",
    batch_size: int = 500,
    seed: int = 0,
    **evaluate_kwargs: Any,
) -> dict[str, Any]:
    """Evaluate a trained method checkpoint zero-shot (URL section 3.2).

    Rebuilds the method with :func:`bayesurl.training.load_method_from_checkpoint`
    (weights-only load), assembles the zero-shot sets of its data set with
    :func:`bayesurl.runs.data.build_data` and scores it as a run scores its fitted estimator
    (the same sampling rule and :func:`bayesurl.runs.predict.score`).

    Parameters
    ----------
    path : path-like
        ``last.pt`` written by ``bayesurl train`` / ``bayesurl run`` /
        :func:`bayesurl.training.fit`.
    dataset : {"default", "fashion_mnist", "digits"}, optional
        Default: the ``dataset`` in ``train.json`` next to the checkpoint, else ``"default"``
        (FashionMNIST, digits if absent).
    root : path-like, optional
        FashionMNIST location.
    n_samples : int, optional
        Draws for the ECE (default 10 where the method has a distribution).
    max_test, max_ood : int, optional
        Caps on the downstream test / held-out upstream sets and on the OOD set.
    device : str or torch.device, optional
        CPU by default; ``None`` or ``"auto"``: CUDA if available.
    batch_size, seed, **evaluate_kwargs
        As for :func:`bayesurl.runs.predict.score`.

    Returns
    -------
    dict
        The scores plus ``method``, ``checkpoint`` and ``dataset``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the checkpoint is corrupted or not a method checkpoint (naming ``path``), or
        ``dataset`` / a cap is invalid.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {str(p)!r} does not exist")
    name, _ = dataset_kind(
        _checkpoint_dataset(p) if dataset is None else dataset,
        argument="dataset",
        allowed=CHECKPOINT_DATASETS,
    )
    for arg, value in (("max_test", max_test), ("max_ood", max_ood)):
        if value is not None:
            check_int(value, arg, low=1)
    root = None if root is None else str(root)
    caps = DataConfig(name=name, root=root, max_test=max_test, max_ood=max_ood)
    dev = resolve_device(device)
    estimator, data = _checkpoint_run(p, caps, dev)
    samples = 10 if n_samples is None else n_samples
    score_kwargs = {"batch_size": batch_size, "device": dev, "seed": seed, **evaluate_kwargs}
    res = _score_fitted(estimator, data, samples, score_kwargs)
    head = {"method": estimator.cfg.estimator.name, "checkpoint": str(p), "dataset": data.name}
    return EvaluationResult({**head, **res}, caveats=getattr(res, "caveats", ()))


def _checkpoint_run(
    path: Path, data: DataConfig, device: torch.device
) -> tuple[Estimator, RunData]:
    """The method of a checkpoint as the fitted estimator of its run (weights-only load onto
    ``device``; :meth:`RunConfig.from_checkpoint`) and that run's data of ``data``'s set."""
    from bayesurl.runs.estimators import MethodEstimator
    from bayesurl.training import load_method_from_checkpoint

    method = load_method_from_checkpoint(path, map_location=device)
    cfg = RunConfig.from_checkpoint(method, dataset=data.name, data=data)
    return MethodEstimator.from_trained(cfg, method), build_data(cfg)


def train(
    cfg: RunConfig,
    *,
    out: str | os.PathLike[str],
    resume: str | os.PathLike[str] | None = None,
    keep_epoch_checkpoints: bool = False,
    progress: bool = True,
) -> tuple[Any, Any]:
    """Train the registry method of ``cfg`` and checkpoint it (no evaluation).

    The training half of :func:`run` for ``bayesurl train``: the same data assembly, seeding
    and :class:`~bayesurl.runs.estimators.MethodEstimator`. Runs under ``torchrun`` too (DDP
    with one process per rank, :func:`bayesurl.distributed.init_from_env`).

    Returns
    -------
    (MethodEstimator, RunData)
        The fitted estimator (``.method``, ``.result``: the
        :class:`~bayesurl.training.TrainResult`, ``.method_kwargs``, ``.main_process``: rank 0
        under torchrun) and the data.

    Raises
    ------
    ValueError
        If the estimator is not of kind ``method``, or on bad options.
    """
    from bayesurl import distributed as D
    from bayesurl.runs.estimators import MethodEstimator
    from bayesurl.training import seed_everything

    if cfg.estimator.kind != "method":
        raise ValueError(f"`train` trains registry methods, not kind {cfg.estimator.kind!r}")
    estimator = build_estimator(cfg)
    assert isinstance(estimator, MethodEstimator)
    info = D.init_from_env(device=cfg.device)
    try:
        device = resolve_device(cfg.device) if cfg.device else info.device
        data = build_data(cfg)
        seed_everything(cfg.seed)
        ctx = FitContext(
            device,
            progress=progress,
            out=Path(out),
            resume=None if resume is None else Path(resume),
            keep_epoch_checkpoints=keep_epoch_checkpoints,
        )
        estimator.fit(data, ctx)
        estimator.main_process = D.is_main_process()  # rank 0 reports (before cleanup)
        return estimator, data
    finally:
        D.cleanup()
