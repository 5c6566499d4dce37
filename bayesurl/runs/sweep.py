"""A sweep: many runs (estimators x seeds) on the same data, one table (``bayesurl benchmark``).

Every row is :func:`bayesurl.runs.runner.run` of the recipe ``<dataset>/<estimator>`` with the
preset and overrides of the sweep -- the same call ``bayesurl run`` makes, so a row equals the
single run of the same estimator, data and seed. The runs share one
:class:`~bayesurl.runs.runner.RunCache`: the data are assembled once and a post-hoc
estimator's base (CE for PVU, post-hoc TaU, Laplace-on-CE) is trained once per seed.

Under ``torchrun`` every rank runs the same runs in the same order in one process group (DDP
training, sharded evaluation) and rank 0 alone writes (:func:`run_sweep`, Notes).

This is a small, offline instance of the URL benchmark (Kirchhof et al., 2023, section 3 /
appendix B) extended with the post-hoc and Laplace estimators (PVU thesis section 5.3; TaU
section 4; LAM, Warburg et al., 2023, section 3).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from bayesurl.runs.config import load_recipe, read_recipe_file
from bayesurl.runs.results import METRICS, SweepResults, _fmt
from bayesurl.runs.runner import (
    RunCache,
    _torchrun_group,
    agree_on_outcome,
    resolve_device,
    run,
)

__all__ = ["resolve_estimators", "run_sweep"]


def resolve_estimators(estimators: str | Iterable[str] | None, dataset: str) -> list[str]:
    """Validate estimator names against the tables of ``dataset``'s recipe file.

    Parameters
    ----------
    estimators : str, iterable of str or None
        Names (a comma-separated string is split); ``None`` or ``"all"``: every table, in
        file order.
    dataset : str
        Recipe file name (or ``.toml`` path).

    Returns
    -------
    list of str
        Lower-case names in the given order, without duplicates.

    Raises
    ------
    ValueError
        For an unknown name (listing the valid ones) or an empty list.
    """
    valid = list(read_recipe_file(dataset)["estimators"])
    if estimators is None:
        return valid
    if isinstance(estimators, str):
        estimators = estimators.split(",")
    names = [str(m).strip().lower() for m in estimators if str(m).strip()]
    if names == ["all"]:
        return valid
    if not names:
        raise ValueError(f"`estimators` is empty; valid names: {', '.join(valid)}")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"unknown estimator(s) {', '.join(repr(u) for u in unknown)} in `estimators`; "
            f"valid names: {', '.join(valid)}"
        )
    return list(dict.fromkeys(names))


def run_sweep(
    estimators: str | Iterable[str] | None = None,
    *,
    dataset: str = "fashion_mnist",
    preset: str | None = "quick",
    seeds: int | Sequence[int] = (0,),
    overrides: Iterable[str | tuple[str, Any]] = (),
    device: str | torch.device | None = None,
    out: str | os.PathLike[str] | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    raise_errors: bool = False,
) -> SweepResults:
    """Run every (estimator, seed) of ``dataset`` with ``preset``; one :class:`SweepResults`.

    Parameters
    ----------
    estimators : str, iterable of str or None
        Estimator tables of the recipe file (``None``: all of them).
    dataset : str
        Recipe file (``"fashion_mnist"`` ...).
    preset : str or None
        ``[presets.<name>]`` of the file (``"smoke"``, ``"quick"``, ``"full"``).
    seeds : int or sequence of int
        Training seeds; an int ``n`` means ``range(n)``.
    overrides : iterable
        ``"section.key=value"`` overrides applied to every run.
    device : str or torch.device, optional
        Default: CUDA if available, else CPU.
    out : path-like, optional
        Folder for ``results.json``, ``results.csv``, ``recall_vs_rauroc.png`` and each run's
        per-query record ``queries/<estimator>_s<seed>.npz`` (:mod:`bayesurl.runs.queries`).
    checkpoint_dir : path-like, optional
        Keep each run's checkpoint in ``checkpoint_dir/<estimator>_s<seed>/``.
    progress : bool
        A tqdm bar over the runs and one line per finished run.
    raise_errors : bool
        Re-raise a failing run's exception instead of recording it and going on.

    Returns
    -------
    SweepResults
        ``main_process`` is False on the ranks other than 0 of a ``torchrun`` sweep.

    Raises
    ------
    ValueError
        For an unknown estimator / preset / override key, an empty seed list or a negative
        seed (checked for every estimator before anything trains); under ``torchrun``, for
        estimators whose fit is not distributed (all named in one error,
        :func:`bayesurl.runs.runner.refuse_undistributed`).
    RuntimeError
        Under ``torchrun``, when a run failed on some ranks only
        (:func:`bayesurl.runs.runner.agree_on_outcome`).

    Notes
    -----
    Under ``torchrun --nproc_per_node W`` (issue 16) the sweep initialises one process group
    for all its runs (``device`` ``None``: ``cuda:LOCAL_RANK`` where CUDA is available, else
    CPU) and every rank runs the same (estimator, seed) list in the same order: each registry
    method trains under DDP and is evaluated sharded (:func:`bayesurl.runs.runner.run`), so
    every rank holds the same metrics; rank 0 alone shows progress, writes ``out`` and the
    checkpoints, and ``settings["world_size"]`` records ``W``. A run failing on every rank is
    recorded as usual; one failing on some ranks only stops the sweep on every rank (a rank
    that fails while the others wait inside a collective cannot be caught, torchrun ends the
    job).
    """
    names = resolve_estimators(estimators, dataset)
    if isinstance(seeds, bool):
        raise ValueError(f"`seeds` must be an int or a list of ints, got {seeds!r}")
    seed_list = list(range(int(seeds))) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list or min(seed_list) < 0:
        raise ValueError(f"`seeds` must hold non-negative integers, got {seed_list}")
    overrides = list(overrides)
    dev = resolve_device(device)

    def recipes(on: torch.device) -> dict[str, Any]:
        return {
            n: load_recipe(f"{dataset}/{n}", [*overrides, ("device", str(on))], preset=preset)
            for n in names
        }

    cfgs = recipes(dev)  # every recipe, preset and override checked before anything trains
    asked = None if device is None else str(dev)
    with _torchrun_group(list(cfgs.values()), asked, argument="estimators") as rank_device:
        if rank_device is not None and rank_device != dev:  # torchrun: cuda:LOCAL_RANK
            dev = rank_device
            cfgs = recipes(dev)
        return _sweep(
            names,
            cfgs,
            dataset=dataset,
            preset=preset,
            seed_list=seed_list,
            overrides=overrides,
            dev=dev,
            out=out,
            checkpoint_dir=checkpoint_dir,
            progress=progress,
            raise_errors=raise_errors,
        )


def _sweep(
    names: list[str],
    cfgs: dict[str, Any],
    *,
    dataset: str,
    preset: str | None,
    seed_list: list[int],
    overrides: list[Any],
    dev: torch.device,
    out: str | os.PathLike[str] | None,
    checkpoint_dir: str | os.PathLike[str] | None,
    progress: bool,
    raise_errors: bool,
) -> SweepResults:
    from tqdm.auto import tqdm

    from bayesurl.distributed import get_world_size, is_main_process

    main = is_main_process()
    progress = progress and main
    ckpt = None if checkpoint_dir is None else Path(checkpoint_dir)
    t0 = time.perf_counter()
    cache = RunCache()
    records: list[dict[str, Any]] = []
    jobs = [(n, s) for n in names for s in seed_list]  # the same order on every rank
    bar = tqdm(jobs, disable=not progress, desc="sweep", unit="run")
    first = None
    for name, seed in bar:
        bar.set_description(f"{name} seed {seed}")
        cfg = load_recipe(
            f"{dataset}/{name}",
            [*overrides, ("device", str(dev)), ("seed", seed)],
            preset=preset,
        )
        res = run(
            cfg,
            cache=cache,
            out=None if ckpt is None else ckpt / f"{name}_s{seed}",
            raise_errors=raise_errors,
            queries=None if out is None else Path(out) / "queries" / f"{name}_s{seed}.npz",
        )
        first = first or res
        rec = res.record()
        agree_on_outcome(f"{name} seed {seed}", rec["error"])
        for k, _ in METRICS:
            rec.setdefault(k, None)
        records.append(rec)
        if progress:
            if rec["error"]:
                bar.write(f"{name} seed {seed}: FAILED {rec['error']}")
            else:
                bar.write(
                    f"{name} seed {seed}: "
                    + ", ".join(f"{t} {_fmt({'mean': rec.get(k)}, k)}" for k, t in METRICS)
                )
    bar.close()
    info = first.settings["data"] if first is not None else {}
    settings = {
        "dataset": info.get("dataset", dataset),
        "recipe": dataset,
        "preset": preset,
        "overrides": [o if isinstance(o, str) else f"{o[0]}={o[1]!r}" for o in overrides],
        "configs": {n: c.to_dict() for n, c in cfgs.items()},
        "estimators": names,
        "seeds": seed_list,
        "device": str(dev),
        "world_size": get_world_size(),
        **{k: info.get(k) for k in ("ood", "upstream_classes", "downstream_classes", "sizes")},
        "data_seed": info.get("data_seed"),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "total_time": time.perf_counter() - t0,
    }
    results = SweepResults(runs=records, settings=settings, main_process=main)
    if out is not None and main:
        results.save(out)
    return results
