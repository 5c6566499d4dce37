"""The sweep engine of ``bayesurl benchmark``: plan, store, work, report.

A sweep is every (class split, estimator, seed) run of a preset
(:func:`bayesurl.sweeps.plan.plan_runs`); each run is ``run_fn(params) -> record``, by default
:class:`~bayesurl.sweeps.pipeline.PipelineRun` -- the same :func:`bayesurl.runs.runner.run`
that ``bayesurl run`` makes, so a row equals the single run of the same estimator, data and
seed. :func:`run_sweep`

1. reads the preset's plan (``[presets.<name>.sweep]``: splits, seeds, storage) and resolves
   every run's config once (:func:`bayesurl.sweeps.plan.plan_sweep`; the options are a
   :class:`SweepOptions`);
2. optionally tunes every estimator first (``tune=N``, :mod:`bayesurl.sweeps.tuning`; the runs
   are then planned again with the chosen settings);
3. keeps the runs in a :class:`~bayesurl.sweeps.storage.RunStore`: in memory
   (:class:`~bayesurl.sweeps.storage.MemoryStore`) or in an Optuna RDB storage
   (:class:`~bayesurl.sweeps.storage.SweepStorage`: SQLite ``<out>/sweep.db`` or any SQLAlchemy
   URL; workers on other machines join with ``worker=True``; a killed sweep resumes) and works
   through them;
4. reports through the one sweep report, :func:`bayesurl.sweeps.report.write_results`: the
   standard split is one split (intervals over the seeds, ``--merge``-able), class splits
   give t-intervals over the splits, the paired comparison against CE and the split-half
   reproducibility.

Under ``torchrun`` every rank runs each run together (DDP training, sharded evaluation) and
rank 0 alone reports: in memory every rank works through the same plan in the same order; with
a storage rank 0 claims each run and sends it to the other ranks (:func:`lead`,
:func:`follow`).

A small, offline instance of the URL benchmark (Kirchhof et al., 2023, section 3 / appendix
B) extended with the post-hoc and Laplace estimators (PVU thesis section 5.3; TaU section 4;
LAM, Warburg et al., 2023, section 3).
"""

from __future__ import annotations

import contextlib
import platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from bayesurl._checks import resolve_device
from bayesurl.files import jsonable, write_json
from bayesurl.runs.config import RunConfig, read_recipe_file, tuned_sets
from bayesurl.runs.runner import (
    CROP_KEYS,
    agree_on_outcome,
    crop_test_images,
    launched_by_torchrun,
    torchrun_group,
)
from bayesurl.sweeps.options import SweepOptions
from bayesurl.sweeps.pipeline import PipelineRun
from bayesurl.sweeps.plan import (
    SweepPreset,
    plan_sweep,
    preset_splits,
    resolve_estimators,
    run_label,
    smoke_notice,
    sweep_preset,
)
from bayesurl.sweeps.record import RunRecord, run_rows
from bayesurl.sweeps.report import report_columns, save_results
from bayesurl.sweeps.results import SweepResults
from bayesurl.sweeps.storage import Claim, MemoryStore, OnDone, RunFn, RunStore, SweepStorage
from bayesurl.sweeps.tuning import load_tuned, load_tuned_classes, tune_estimators, tuning_leaks

__all__ = [
    "SweepOptions",
    "follow",
    "lead",
    "refuse_under_torchrun",
    "resolve_estimators",
    "resolve_preset",
    "run_sweep",
]

#: Seconds between two writes of a stored sweep's ``partial_runs.json`` (each reads every
#: record from the storage); the last run always writes it.
PARTIAL_EVERY_S = 60.0


# --------------------------------------------------------------------------- torchrun
class NamedRuns:
    """A given run function whose records name their run: ``estimator``, ``split`` and
    ``seed`` taken from the run's parameters where the record does not give them, every
    record a row of :class:`~bayesurl.sweeps.record.RunRecord`."""

    def __init__(self, fn: RunFn) -> None:
        self.fn = fn

    @property
    def info(self) -> dict[str, Any]:
        """The wrapped function's data description (``{}`` when it keeps none)."""
        return dict(getattr(self.fn, "info", {}) or {})

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        rec = self.fn(params)
        run = {"estimator": params["estimator"], "split": params.get("split", 0)}
        return RunRecord.from_row({**run, "seed": params.get("seed"), **rec}).to_row()


def under_torchrun() -> bool:
    """Whether this process is one rank of a ``torchrun`` launch or a process group."""
    from bayesurl.distributed import is_distributed

    return launched_by_torchrun() or is_distributed()


def refuse_under_torchrun(*, worker: bool = False, tune: int = 0) -> None:
    """Raise for the parts of a sweep that cannot run under ``torchrun``.

    Under ``torchrun`` every rank runs each run together. Two parts cannot follow it:
    ``worker=True`` waits for another machine's plan (up to an hour, longer than the process
    group's collectives may block the other ranks), and ``tune`` runs Optuna's trials on one
    process. Start a worker per GPU (``CUDA_VISIBLE_DEVICES=k bayesurl benchmark --worker
    --storage URL``) and tune in one process first instead.

    Raises
    ------
    ValueError
        Under torchrun (``WORLD_SIZE > 1``) or a multi-rank process group, with ``worker`` or
        ``tune``.
    """
    if not under_torchrun() or not (worker or tune):
        return
    what = "`--worker` (`worker=True`)" if worker else "`--tune` (`tune`)"
    raise ValueError(
        f"{what} does not run under torchrun: "
        + (
            "a worker waits for another machine's plan, longer than the other ranks may wait "
            "in a collective. Start one worker process per GPU instead "
            "(`CUDA_VISIBLE_DEVICES=k bayesurl benchmark --worker --storage URL`)"
            if worker
            else "the Optuna trials run in one process. Tune first without torchrun (the "
            "chosen settings go to OUT/tuned.json), then start the sweep under torchrun"
        )
    )


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (collective)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def agreed(fn: RunFn) -> RunFn:
    """``fn`` followed by the check that every rank had the same outcome (torchrun)."""

    def run_agreed(params: dict[str, Any]) -> Mapping[str, Any]:
        try:
            rec = fn(params)
        except Exception as exc:
            agree_on_outcome(run_label(params), f"{type(exc).__name__}: {exc}")
            raise
        agree_on_outcome(run_label(params), rec.get("error"))
        return rec

    return run_agreed


def lead(fn: RunFn) -> RunFn:
    """Rank 0's ``run_fn`` of a stored sweep under torchrun: send the claimed run to the other
    ranks, run it with them, and check that every rank had the same outcome."""
    checked = agreed(fn)

    def run_led(params: dict[str, Any]) -> Mapping[str, Any]:
        _broadcast(params)
        return checked(params)

    return run_led


def follow(fn: RunFn) -> int:
    """The other ranks of a stored sweep under torchrun: run every run rank 0 sends until it
    sends ``None``; return how many."""
    checked = agreed(fn)
    done = 0
    while (params := _broadcast(None)) is not None:
        with contextlib.suppress(Exception):  # rank 0 records the run's error (it raised too)
            checked(dict(params))
        done += 1
    return done


# --------------------------------------------------------------------------- the engine
def run_sweep(
    estimators: str | Iterable[str] | None = None,
    options: SweepOptions | None = None,
    *,
    run_fn: RunFn | None = None,
    log: Callable[[str], None] = print,
    **settings: Any,
) -> SweepResults:
    """Run (or join) the sweep of ``options.preset`` over ``estimators``; see the module docs.

    Parameters
    ----------
    estimators : str, iterable of str or None
        Estimator tables of the recipe file (``None``: all of them; ignored by a ``worker``).
    options : SweepOptions, optional
        How to run it; ``settings`` (any :class:`SweepOptions` field as a keyword, e.g.
        ``run_sweep("ce", preset="quick", seeds=2)``) replace its fields.
    run_fn : callable, optional
        ``run_fn(params) -> record``; default :class:`~bayesurl.sweeps.pipeline.PipelineRun`
        (the run function gives the names their meaning: nothing is resolved).
    log : callable
        Progress output (rank 0 only).

    Returns
    -------
    SweepResults
        Every finished run's record and the settings; ``status`` (counts of the plan),
        ``done_here`` (runs of this process) and ``paths`` (files written; empty until every
        run is finished); ``main_process`` False on the ranks other than 0 under torchrun.

    Raises
    ------
    ValueError
        As :class:`SweepOptions`; for an unknown estimator / preset / override key, empty or
        negative seeds (every run is resolved before anything trains); under ``torchrun``,
        for ``worker``, ``tune`` or estimators whose fit is not distributed (all named in one
        error).
    RuntimeError
        Under ``torchrun``, when a run failed on some ranks only.
    """
    opts = options or SweepOptions(**settings)
    if options is not None and settings:
        opts = replace(options, **settings)
    refuse_under_torchrun(worker=opts.worker, tune=opts.tune)
    # the sweep's one read of its recipe file: every step below is handed its tables
    recipe = read_recipe_file(opts.dataset)
    stored = bool(opts.storage or opts.worker)
    seeds, splits = opts.seeds, opts.splits
    plan = resolve_preset(
        opts.dataset, opts.preset, seeds=seeds, splits=splits, stored=stored, recipe=recipe
    )
    folder, dev = results_folder(opts, plan), resolve_device(opts.device)
    names: list[str] = []
    if run_fn and not opts.worker:
        names = _names(estimators)
    elif not opts.worker:
        names = resolve_estimators(estimators, opts.dataset, recipe=recipe)
    # every run resolved (recipe, preset, tuned set, overrides) before anything trains
    tuned = {} if opts.tune else _earlier_tuned(folder)
    runs: list[dict[str, Any]] = []
    if not opts.worker:
        runs = _planned(opts, plan, folder, names, tuned, dev, run_fn is None, recipe)
    cfgs = []
    if under_torchrun():  # the estimators' kinds decide whether they may run distributed
        firsts = {r["estimator"]: r["config"] for r in runs if "config" in r}
        cfgs = [RunConfig.from_dict(c) for c in firsts.values()]
    asked = None if opts.device is None else str(dev)
    with torchrun_group(cfgs, asked, argument="estimators") as rank_device:
        if rank_device is not None:  # torchrun: cuda:LOCAL_RANK
            dev = rank_device
        sweep = _Sweep(opts, plan, folder, dev, log, run_fn, recipe)
        return sweep.go(names, runs, tuned)


def results_folder(opts: SweepOptions, plan: SweepPreset) -> Path | None:
    """The results folder of a sweep of ``plan``: ``out``; else a stored sweep's
    ``results/sweeps/<name>``, an in-memory one's ``default_out`` (``None``: nowhere)."""
    if opts.out is not None:
        return Path(opts.out)
    if plan.stored:
        return Path("results") / "sweeps" / plan.name
    return None if opts.default_out is None else Path(opts.default_out)


def _names(estimators: str | Iterable[str] | None) -> list[str]:
    if estimators is None:
        raise ValueError("`estimators` must be named when a `run_fn` is given")
    items = estimators.split(",") if isinstance(estimators, str) else estimators
    names = [str(e).strip() for e in items if str(e).strip()]
    if not names:
        raise ValueError("`estimators` is empty")
    return list(dict.fromkeys(names))


def resolve_preset(
    dataset: str,
    preset: str | SweepPreset | None,
    *,
    seeds: int | Sequence[int] | None,
    splits: int | None,
    stored: bool,
    recipe: Mapping[str, Any] | None = None,
) -> SweepPreset:
    """The plan of ``preset`` with the caller's seeds, splits and storage (``recipe``: the
    file's tables, :func:`~bayesurl.sweeps.plan.sweep_preset`).

    Raises
    ------
    ValueError
        For an unknown preset or empty / negative seeds.
    TypeError
        For a ``preset`` that is neither a name, a :class:`SweepPreset` nor ``None``.
    """
    if isinstance(preset, SweepPreset):
        plan = preset
    elif preset is None:
        plan = SweepPreset("defaults")
    elif isinstance(preset, str):
        plan = sweep_preset(dataset, preset, recipe=recipe)
    else:
        raise TypeError(f"`preset` must be a preset name, got {type(preset).__name__}")
    changes: dict[str, Any] = {}
    if seeds is not None:
        if isinstance(seeds, bool):
            raise ValueError(f"`seeds` must be an int or a list of ints, got {seeds!r}")
        changes["seeds"] = tuple(range(int(seeds))) if isinstance(seeds, int) else tuple(seeds)
        if not changes["seeds"]:
            raise ValueError(f"`seeds` must hold non-negative integers, got {list(seeds)}")
    if splits is not None:
        changes["splits"] = splits
    if stored:
        changes["storage"] = "stored"
    return SweepPreset(**{**asdict(plan), **changes}) if changes else plan


def _earlier_tuned(folder: Path | None) -> dict[str, list[str]]:
    """The settings an earlier ``tune`` of ``folder`` chose (``{}``: none)."""
    return {} if folder is None else load_tuned(folder)


def uncomputed(runs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The metric keys that none of the planned ``runs`` computes, by their resolved configs
    (URL's crop test on frozen features: :func:`~bayesurl.runs.runner.crop_test_images`);
    empty when a run carries no config (nothing is left out on a guess)."""
    if not runs or not all(isinstance(r.get("config"), Mapping) for r in runs):
        return set()
    configs = [RunConfig.from_dict(r["config"]) for r in runs]
    return set(CROP_KEYS) if all(crop_test_images(c) == 0 for c in configs) else set()


def _planned(
    opts: SweepOptions,
    plan: SweepPreset,
    folder: Path | None,
    names: list[str],
    tuned: Mapping[str, Sequence[str]],
    device: torch.device,
    resolve: bool,
    recipe: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The runs of the sweep with their resolved configs (:func:`plan_sweep`)."""
    return plan_sweep(
        opts.dataset,
        names,
        plan,
        overrides=opts.overrides,
        tuned=tuned,
        tuned_classes={} if folder is None else load_tuned_classes(folder),
        recipe_tuned=opts.recipe_tuned,
        device=str(device),
        resolve=resolve,
        recipe=recipe,
    )


class _Sweep:
    """One sweep's state: its plan, store and output (the steps of :func:`run_sweep`)."""

    def __init__(
        self,
        opts: SweepOptions,
        plan: SweepPreset,
        folder: Path | None,
        device: torch.device,
        log: Callable[[str], None],
        run_fn: RunFn | None,
        recipe: Mapping[str, Any],
    ) -> None:
        from bayesurl.distributed import is_main_process

        self.opts, self.plan, self.folder, self.device = opts, plan, folder, device
        self.given_fn = run_fn
        #: the tables of the sweep's recipe file, read once by :func:`run_sweep`
        self.recipe = recipe
        self.main = is_main_process()
        self.distributed = under_torchrun()
        self.log = log if self.main else (lambda text: None)
        self.t0 = time.perf_counter()
        #: metric keys no run of the sweep computes, left out of its progress lines
        self.uncomputed: set[str] = set()
        #: the planned estimators (the settings' list when no run has a record yet)
        self.names: list[str] = []

    def factory(self, tuned: Mapping[str, Sequence[str]]) -> RunFn:
        """The run function: the given one, or the pipeline with the sweep's tuned settings."""
        if self.given_fn is not None:
            return NamedRuns(self.given_fn)
        return PipelineRun(
            self.opts,
            preset=self.plan,
            tuned=tuned,
            device=self.device,
            folder=self.folder,
            recipe=self.recipe,
        )

    def go(
        self, names: list[str], runs: list[dict[str, Any]], tuned: Mapping[str, Sequence[str]]
    ) -> SweepResults:
        """Tune, store the planned ``runs``, work and report (``tune_only``: tune and stop)."""
        opts, factory = self.opts, self.factory
        self.names = list(names)
        if self.plan.stored and self.distributed and not self.main:
            done = follow(factory(tuned))
            return self._result([], {}, None, done, {})
        notice = smoke_notice(self.plan, opts.dataset)
        if notice:
            self.log(notice)
        self.uncomputed = uncomputed(runs)
        store = self.open_store()
        fn = factory(tuned)
        if opts.tune:
            chosen = self.tune(names, fn, store)
            if opts.tune_only:
                settings = {"preset": self.plan.name, "tuned": chosen}
                written = {} if self.folder is None else {
                    f: self.folder / f for f in ("tuned.json", "tuned.toml")
                }  # fmt: skip
                return self._result([], settings, None, 0, written)
            tuned = {k: v["overrides"] for k, v in chosen.items()}
            fn = factory(tuned)
            resolve = self.given_fn is None
            runs = _planned(
                opts, self.plan, self.folder, names, tuned, self.device, resolve, self.recipe
            )
            self.uncomputed = uncomputed(runs)
        if opts.worker:
            self.wait_for_plan(store)
        else:
            added = store.add_runs(runs)
            if self.plan.stored:
                self.log(
                    f"sweep {self.plan.name!r}: {len(runs)} runs planned, {added} new; "
                    f"storage {store.url}"
                )
        if self.plan.stored and self.distributed:
            work_fn = lead(fn)
        elif self.distributed:
            work_fn = agreed(fn)
        else:
            work_fn = fn
        try:
            # a stored sweep under torchrun does not wait for runs elsewhere: the other ranks
            # would wait in a collective
            done = store.work(
                work_fn, wait=not self.distributed, poll=opts.poll, on_done=self.on_done(store)
            )
        finally:
            if self.plan.stored and self.distributed:
                _broadcast(None)  # rank 0 releases the other ranks
        return self.report(store, done, getattr(fn, "info", {}))

    def tune(self, names: list[str], fn: RunFn, store: RunStore) -> dict[str, Any]:
        """Tune every estimator on the split ``tune_split``; the chosen settings."""
        splits = preset_splits(self.plan) or preset_splits(
            SweepPreset("tune", splits=1, classes=self.plan.classes)
        )
        k = int(self.opts.tune_split)
        if not 0 <= k < len(splits):
            raise ValueError(f"`tune_split` must be in [0, {len(splits) - 1}], got {k}")
        return tune_estimators(
            names,
            self.opts.tune,
            fn,
            store,
            split=splits[k],
            out=self.folder,
            tables=self.recipe["estimators"],
            preset=self.plan.recipe_preset,
            log=self.log,
        )

    def open_store(self) -> RunStore:
        """The storage of a stored sweep, or a :class:`~bayesurl.sweeps.storage.MemoryStore`."""
        if not self.plan.stored:
            return MemoryStore()
        assert self.folder is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        return SweepStorage(
            self.opts.storage,
            out=self.folder,
            sweep=self.plan.name,
            heartbeat_interval=self.opts.heartbeat_interval,
        )

    def wait_for_plan(self, store: RunStore) -> None:
        """A worker waits for the first machine to enqueue the plan (it may still be tuning)."""
        others = store.other_sweeps() if store.status()["total"] == 0 else []
        if others:
            raise ValueError(
                f"the storage {store.url} holds no runs of sweep {self.plan.name!r} but runs of "
                f"{', '.join(repr(o) for o in others)}: give the lead's --preset (and --dataset)"
            )
        poll, plan_timeout = self.opts.poll, self.opts.plan_timeout
        waited = 0.0
        while store.status()["total"] == 0 and waited < plan_timeout:
            time.sleep(poll)
            waited += poll
        if store.status()["total"] == 0:
            raise ValueError(
                f"no runs in the storage {store.url} after {plan_timeout:.0f} s: start the "
                "first machine (without --worker) with the same --storage and --preset"
            )

    def on_done(self, store: RunStore) -> OnDone:
        """One line per finished run; a stored sweep also keeps ``partial_runs.json``."""

        written = float("-inf")

        def done(claim: Claim, record: Mapping[str, Any] | None, error: str | None) -> None:
            nonlocal written
            params = claim.params
            if not (self.opts.progress or self.plan.stored):
                return
            st = store.status()  # reads every trial: once per run
            keep = self.plan.stored and not error and self.folder is not None
            last = st["waiting"] == st["running"] == 0
            if keep and (last or time.monotonic() - written >= PARTIAL_EVERY_S):
                # the finished runs so far, readable (and committable) before the sweep ends
                so_far = {"preset": self.plan.name, "status": st, "runs": run_rows(store.records())}
                # machine-read (tools/protocol_report.py --interim): compact
                write_json(self.folder / "partial_runs.json", jsonable(so_far), indent=None)
                written = time.monotonic()
            head = f"[{st['complete'] + st['failed']}/{st['total']}] {run_label(params)}"
            if error or record is None:
                self.log(f"{head}: FAILED {error}")
            else:
                # a worker does not know the plan: it leaves out what its own run skips
                skip = self.uncomputed or uncomputed([params])
                self.log(
                    f"{head}: "
                    + ", ".join(
                        f"{c.title} {c.format(record.get(c.key))}"
                        for c in report_columns(shown=True)
                        if c.key not in skip
                    )
                )

        return done

    def report(self, store: RunStore, done: int, info: Mapping[str, Any]) -> SweepResults:
        """The sweep's results; written to ``out`` when every run is finished."""
        status = store.status()
        records = run_rows(store.records())
        finished = status["total"] and status["waiting"] == status["running"] == 0
        settings = self.settings(store, records, info)
        paths: dict[str, Any] = {}
        doc = None
        if finished and self.main and self.folder is not None:
            doc, paths = save_results(records, self.folder, settings)
            if self.plan.n_splits:
                self.log(tuning_leaks(records)["line"])
            self.log(f"results written to {self.folder}")
        res = self._result(records, settings, status, done, paths)
        res.document = doc
        return res

    def _result(
        self,
        records: list[dict[str, Any]],
        settings: dict[str, Any],
        status: dict[str, int] | None,
        done: int,
        paths: Mapping[str, Any],
    ) -> SweepResults:
        return SweepResults(
            runs=records,
            settings=settings,
            main_process=self.main,
            status=status,
            done_here=done,
            paths={k: str(v) for k, v in paths.items()},
        )

    def settings(
        self, store: RunStore, records: list[dict[str, Any]], info: Mapping[str, Any]
    ) -> dict[str, Any]:
        """What the sweep ran with: preset, plan, data, device, versions, times."""
        from bayesurl.distributed import get_world_size

        p, opts, recipe = self.plan, self.opts, self.opts.dataset
        return {
            "dataset": info.get("dataset", recipe),
            "recipe": recipe,
            "preset": p.name,
            "plan": {**asdict(p), "storage": p.storage.value},
            # a smoke-scale preset's warning, for every display of the results (the report)
            "notice": smoke_notice(p, recipe),
            "overrides": [o if isinstance(o, str) else f"{o[0]}={o[1]!r}" for o in opts.overrides],
            "estimators": list(dict.fromkeys(r["estimator"] for r in records)) or self.names,
            "seeds": list(p.seeds),
            "class_splits": [s.to_dict() for s in preset_splits(p)] or None,
            "tuned": {} if self.folder is None else load_tuned(self.folder),
            # the settings the recipe commits for this preset, as applied ({} when the
            # sweep ran the recipe's defaults: recipe_tuned_applied false)
            "recipe_tuned": [
                {
                    "name": t.name,
                    "tuned_on": t.tuned_on,
                    "trained_on": t.trained_on,
                    "settings": t.table,
                }
                for t in tuned_sets(self.recipe, p.recipe_preset, recipe)
            ]
            if opts.recipe_tuned
            else [],
            "recipe_tuned_applied": opts.recipe_tuned,
            "storage": None
            if not p.stored
            else (store.url if opts.storage else f"sqlite:///{self.folder.name}/sweep.db"),
            "failed_attempts": store.failures(),
            "device": str(self.device),
            "world_size": get_world_size(),
            **{k: info.get(k) for k in ("ood", "upstream_classes", "downstream_classes", "sizes")},
            "data_seed": info.get("data_seed"),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "platform": sys.platform,
            "machine": platform.machine(),
            "sum_of_run_times_s": sum(float(r.get("total_time") or 0.0) for r in records),
            "total_time": time.perf_counter() - self.t0,
        }
