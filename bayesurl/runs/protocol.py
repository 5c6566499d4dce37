"""The reproducible benchmark protocol: class splits x seeds, tuning, stored sweeps, verdicts.

A run is (estimator, class split, seed) (URL, Kirchhof et al., 2023, section 3: every model is
averaged over downstream sets and seeds). :func:`run_protocol`

1. draws the class splits of the preset (:func:`bayesurl.data.class_splits.class_splits`;
   complementary pairs, all downstream images as the retrieval set,
   :func:`bayesurl.data.class_splits.split_data`);
2. optionally tunes every estimator first (``tune=N``, :func:`tune_estimators`: Optuna TPE,
   ``N`` trials per estimator on the class-disjoint validation classes of split 0, objective
   R-AUROC, trials with R@1 < 0.1 discarded -- URL section 3, "Hyperparameters"); the chosen
   settings go to ``<out>/tuned.json`` and every later run of the sweep reuses them;
3. enqueues the plan in a :class:`~bayesurl.runs.storage.SweepStorage` (SQLite
   ``<out>/sweep.db`` or any SQLAlchemy URL) and works through it; any number of workers
   (``worker=True``, other machines / GPUs) can join; a killed sweep resumes where it stopped;
   under ``torchrun`` rank 0 claims each run and every rank runs it (:func:`run_protocol`);
4. once every run is finished, writes ``results.json`` (every run with ``method``, ``split``,
   ``seed`` and its metrics, the per-estimator means with t-intervals, the paired comparison
   against CE and the split-half reproducibility), ``results.csv`` and
   ``recall_vs_rauroc.png`` (R@1 against R-AUROC with the intervals) to ``out``
   (:func:`write_results`, :mod:`bayesurl.runs.aggregate`).

The run itself is a callable ``run_fn(params) -> record``; :func:`pipeline_run_fn` adapts the
one run pipeline (``bayesurl.runs.runner.run``) to the class-split data. Tests pass a cheap
fake.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bayesurl.data.class_splits import ClassSplit, class_splits
from bayesurl.files import atomic_open, write_json
from bayesurl.runs.aggregate import paired_comparison, split_half_reproducibility, summarize
from bayesurl.runs.storage import SweepStorage

__all__ = [
    "PROTOCOL_PRESETS",
    "REPORT_METRICS",
    "TUNE_SPACES",
    "ProtocolPreset",
    "get_protocol_preset",
    "pipeline_run_fn",
    "plan_runs",
    "plot_results",
    "plot_training_curves",
    "refuse_under_torchrun",
    "run_protocol",
    "tune_estimators",
    "write_results",
]

#: Metrics reported per estimator (issue: R@1, R-AUROC, AUSC, ECE, OOD AUROC, mAP@k) and the
#: mixed in-distribution / downstream R-AUROC (URL App. C.5) and the crop test's share
#: (URL section 4.5: the share of crops with a higher ``u``; higher is better).
REPORT_METRICS: tuple[str, ...] = (
    "r@1",
    "r_auroc",
    "ausc",
    "ece",
    "ood_auroc",
    "map@5",
    "mixed_r_auroc",
    "crop_share",
)

#: Metrics whose split-half reproducibility is reported.
REPRO_METRICS: tuple[str, ...] = ("r_auroc", "r@1", "ood_auroc")


@dataclass(frozen=True)
class ProtocolPreset:
    """One scale of the protocol.

    Parameters
    ----------
    name : str
        Preset name; also the sweep's name in the storage.
    recipe_preset : str or None
        Preset of the recipe file whose training settings the runs use.
    overrides : tuple of str
        ``"section.key=value"`` overrides on top of the recipe preset.
    n_splits : int
        Class splits (complementary pairs).
    seeds : tuple of int
        Training seeds per split.
    max_train, max_test, max_id, max_ood : int or None
        Caps of :func:`bayesurl.data.class_splits.split_data` (``None``: every image).
    smoke : bool
        A smoke-scale preset: says so when it runs.
    note : str
        How it was sized.
    """

    name: str
    recipe_preset: str | None
    overrides: tuple[str, ...] = ()
    n_splits: int = 4
    seeds: tuple[int, ...] = (0,)
    max_train: int | None = None
    max_test: int | None = None
    max_id: int | None = None
    max_ood: int | None = None
    smoke: bool = False
    note: str = ""


PROTOCOL_PRESETS: dict[str, ProtocolPreset] = {
    "smoke": ProtocolPreset(
        "smoke",
        recipe_preset="smoke",
        n_splits=2,
        seeds=(0,),
        max_train=200,
        max_test=300,
        max_id=150,
        max_ood=80,
        smoke=True,
        note="seconds per run: tests only",
    ),
    "quick": ProtocolPreset(
        "quick",
        recipe_preset="quick",
        n_splits=2,
        seeds=(0,),
        max_train=4000,
        max_test=4000,
        max_id=2000,
        max_ood=1000,
        smoke=True,
        note="minutes on 2 CPU cores; its ranking is noise (issue #13)",
    ),
    "standard": ProtocolPreset(
        "standard",
        recipe_preset="quick",
        overrides=("train.epochs=5",),
        n_splits=4,
        seeds=(0,),
        max_train=None,
        max_test=None,
        max_id=None,
        max_ood=None,
        note=(
            "all 30,000 upstream images x 5 epochs, every downstream image a query; 17 "
            "estimators x 4 splits x 1 seed estimated at 1.7 h on 2 CPU cores with two "
            "one-thread workers from measured per-run CPU times "
            "(benchmarks/protocol_run_costs.py)"
        ),
    ),
}


def get_protocol_preset(preset: str | ProtocolPreset) -> ProtocolPreset:
    """The :class:`ProtocolPreset` named ``preset`` (or ``preset`` itself).

    Raises
    ------
    ValueError
        For an unknown name (listing the valid ones).
    """
    if isinstance(preset, ProtocolPreset):
        return preset
    key = str(preset).lower()
    if key not in PROTOCOL_PRESETS:
        raise ValueError(
            f"unknown `preset` {preset!r}; valid presets: {', '.join(PROTOCOL_PRESETS)}"
        )
    return PROTOCOL_PRESETS[key]


def plan_runs(
    estimators: Sequence[str], preset: ProtocolPreset, *, split_seed: int = 0
) -> list[dict[str, Any]]:
    """The runs of the sweep: every estimator x split x seed, split-major (a worker finishes
    a split's data before the next one)."""
    if not estimators:
        raise ValueError("`estimators` is empty")
    splits = class_splits(preset.n_splits, seed=split_seed)
    return [
        {
            "estimator": str(e),
            "split": sp.index,
            "seed": int(s),
            "class_split": sp.to_dict(),
            "stage": "final",
        }
        for sp in splits
        for s in preset.seeds
        for e in estimators
    ]


# --------------------------------------------------------------------------- tuning
#: Search spaces (URL appendix B): ``{override key: ("log" | "float" | "int", low, high)}``.
#: Every estimator tunes the learning rate in URL's range [1e-4, 1e-2]; some add their own.
TUNE_SPACES: dict[str, dict[str, tuple[str, float, float]]] = {
    "_default": {"train.lr": ("log", 1e-4, 1e-2)},
    "infonce": {"estimator.kwargs.inverse_temperature": ("float", 8.0, 64.0)},
    "mcinfonce": {"estimator.kwargs.inverse_temperature": ("float", 8.0, 64.0)},
    "losspred": {"estimator.kwargs.lam": ("log", 1e-3, 1.0)},
    "mcdropout": {"estimator.kwargs.p": ("float", 0.05, 0.5)},
}


def _space(estimator: str) -> dict[str, tuple[str, float, float]]:
    return {**TUNE_SPACES["_default"], **TUNE_SPACES.get(estimator, {})}


def _suggest(trial: Any, space: Mapping[str, tuple[str, float, float]]) -> list[str]:
    out = []
    for key, (kind, lo, hi) in space.items():
        if kind == "log":
            v: float | int = trial.suggest_float(key, lo, hi, log=True)
        elif kind == "int":
            v = trial.suggest_int(key, int(lo), int(hi))
        else:
            v = trial.suggest_float(key, lo, hi)
        out.append(f"{key}={v!r}")
    return out


def tune_estimators(
    estimators: Sequence[str],
    n_trials: int,
    run_fn: Callable[[dict[str, Any]], Mapping[str, Any]],
    store: SweepStorage,
    *,
    split: ClassSplit,
    out: str | os.PathLike[str] | None = None,
    min_r1: float = 0.1,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """URL's selection protocol with Optuna: per estimator ``n_trials`` TPE trials.

    Each trial trains on the upstream classes of ``split`` minus its validation classes and
    retrieves among the validation classes (``stage="tune"``); the objective is the R-AUROC,
    and trials with R@1 < ``min_r1`` are discarded (pruned; URL section 3). The trials live
    in ``store`` (``"tune:<sweep>:<estimator>"`` studies), so a restarted or multi-worker
    search goes on where it stopped and stops at ``n_trials`` finished trials in all.

    Returns
    -------
    dict
        ``{estimator: {"overrides", "params", "r_auroc", "r@1", "trials", "discarded"}}``
        (``overrides`` empty when every trial was discarded: the recipe's defaults stay);
        also written to ``<out>/tuned.json`` when ``out`` is given.
    """
    import optuna

    if int(n_trials) < 1:
        raise ValueError(f"`n_trials` must be positive, got {n_trials}")
    st = optuna.trial.TrialState
    chosen: dict[str, dict[str, Any]] = {}
    for est in estimators:
        space = _space(est)
        study = store.tuning_study(est, sampler=optuna.samplers.TPESampler(seed=seed))

        def objective(trial: Any, est: str = est, space: Mapping[str, Any] = space) -> float:
            overrides = _suggest(trial, space)
            rec = run_fn(
                {
                    "estimator": est,
                    "split": split.index,
                    "seed": seed,
                    "class_split": split.to_dict(),
                    "stage": "tune",
                    "overrides": overrides,
                }
            )
            for k in ("r@1", "r_auroc"):
                v = rec.get(k)
                trial.set_user_attr(k, None if v is None else float(v))
            if rec.get("error"):
                trial.set_user_attr("error", str(rec["error"]))
                raise optuna.TrialPruned(f"run failed: {rec['error']}")
            r1, ra = rec.get("r@1"), rec.get("r_auroc")
            if r1 is None or ra is None or not math.isfinite(float(ra)) or float(r1) < min_r1:
                trial.set_user_attr("discarded", f"R@1 {r1} < {min_r1}")
                raise optuna.TrialPruned(f"R@1 {r1} < {min_r1}")
            log(f"tune {est} trial {trial.number}: R-AUROC {ra:.4f}, R@1 {r1:.4f} {overrides}")
            return float(ra)

        done = len(study.get_trials(deepcopy=False, states=(st.COMPLETE, st.PRUNED)))
        if done < int(n_trials):
            study.optimize(
                objective,
                n_trials=int(n_trials) - done,
                callbacks=[
                    optuna.study.MaxTrialsCallback(int(n_trials), states=(st.COMPLETE, st.PRUNED))
                ],
                catch=(),
            )
        complete = study.get_trials(deepcopy=False, states=(st.COMPLETE,))
        pruned = study.get_trials(deepcopy=False, states=(st.PRUNED,))
        if complete:
            best = max(complete, key=lambda t: t.value)
            chosen[est] = {
                "overrides": [f"{k}={v!r}" for k, v in best.params.items()],
                "params": dict(best.params),
                "r_auroc": best.value,
                "r@1": best.user_attrs.get("r@1"),
                "trials": len(complete) + len(pruned),
                "discarded": len(pruned),
            }
        else:
            chosen[est] = {"overrides": [], "params": {}, "r_auroc": None, "r@1": None}
            chosen[est].update(trials=len(pruned), discarded=len(pruned))
    if out is not None:
        path = Path(out) / "tuned.json"
        old = json.loads(path.read_text()) if path.is_file() else {}
        old.update(chosen)
        write_json(path, old)
    return chosen


def load_tuned(out: str | os.PathLike[str]) -> dict[str, list[str]]:
    """The chosen overrides per estimator from ``<out>/tuned.json`` (``{}`` if absent).

    Raises
    ------
    ValueError
        If the file is not valid JSON of the expected form.
    """
    path = Path(out) / "tuned.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        return {str(k): [str(o) for o in v["overrides"]] for k, v in data.items()}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a tuned-settings file: {exc}") from None


# --------------------------------------------------------------------------- the pipeline
def pipeline_run_fn(
    *,
    dataset: str = "fashion_mnist",
    preset: ProtocolPreset,
    overrides: Sequence[str] = (),
    tuned: Mapping[str, Sequence[str]] | None = None,
    root: str | os.PathLike[str] | None = None,
    device: str | None = None,
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A ``run_fn`` for :func:`run_protocol` on the one run pipeline
    (``bayesurl.runs.runner.run``) with the class-split data.

    The recipe ``<dataset>/<estimator>`` is loaded with the preset's recipe preset, its
    overrides, ``overrides``, the estimator's tuned overrides and the run's seed; its data are
    replaced by :func:`bayesurl.data.class_splits.split_data` of the run's split and stage
    (assembled once per split and kept while the worker stays on that split).
    """
    from torch import nn

    from bayesurl import data as bd
    from bayesurl.backbones import data_config
    from bayesurl.data.class_splits import split_data
    from bayesurl.runs.config import load_recipe
    from bayesurl.runs.data import RunData, backbone_kwargs, data_key
    from bayesurl.runs.runner import RunCache, run

    tuned = dict(tuned or {})
    state: dict[str, Any] = {"key": None, "cache": None}

    class _Keep(nn.Module):  # keep uint8 items; batches are transformed later
        def forward(self, x: Any) -> Any:
            return x

    def fn(params: dict[str, Any]) -> dict[str, Any]:
        est, seed = str(params["estimator"]), int(params["seed"])
        cs = params["class_split"]
        split = ClassSplit(
            index=int(cs["index"]),
            upstream=tuple(cs["upstream"]),
            downstream=tuple(cs["downstream"]),
            val=tuple(cs["val"]),
        )
        stage = str(params.get("stage", "final"))
        extra = list(params.get("overrides") or tuned.get(est, []))
        dev = device or ("cuda" if _cuda() else "cpu")
        cfg = load_recipe(
            f"{dataset}/{est}",
            [*preset.overrides, *overrides, *extra, ("seed", seed), ("device", dev)],
            preset=preset.recipe_preset,
        )
        key = (split.index, stage, data_key(cfg))
        if state["key"] != key:  # a new split: new data, new cache (bases are per split too)
            sets = split_data(
                split,
                stage=stage,
                root=root,
                dataset="digits" if cfg.data.name == "digits" else "fashion_mnist",
                max_train=preset.max_train,
                max_test=preset.max_test,
                max_id=preset.max_id,
                max_ood=preset.max_ood,
                seed=cfg.data.seed,
            ).with_transform(_Keep())
            channels = data_config(cfg.backbone.name, **backbone_kwargs(cfg, None)).in_chans
            info = {
                "dataset": sets.name,
                "ood": sets.ood_name,
                "upstream_classes": list(sets.upstream_classes),
                "downstream_classes": list(sets.downstream_classes),
                "class_split": split.to_dict(),
                "stage": stage,
                "sizes": dict(sets.info["sizes"]),
                "channels": channels,
                "data_seed": cfg.data.seed,
            }
            rd = RunData(
                sets.name,
                sets,
                int(sets.num_train_classes),
                channels,
                bd.default_transform(channels),
                bd.default_augmentation(channels),
                info,
            )
            cache = RunCache()
            cache.data[data_key(cfg)] = rd
            state.update(key=key, cache=cache, test=sets.test)
        res = run(cfg, cache=state["cache"], raise_errors=False)
        rec = res.record()
        # training curves: loss and the median u of a fixed batch of training images per epoch
        rec.update(loss_curve=res.fit.get("loss_curve"), u_curve=res.fit.get("u_curve"))
        rec.update(
            method=est,
            split=split.index,
            seed=seed,
            stage=stage,
            upstream=list(split.upstream),
            downstream=list(split.downstream),
            overrides=extra,
            total_time=res.timings.get("total"),
        )
        if not rec.get("error"):
            rec.pop("traceback", None)
        return _jsonable(rec)

    return fn


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (int, str, bool)):
        return obj
    try:
        f = float(obj)
        return f if math.isfinite(f) else None
    except (TypeError, ValueError):
        return str(obj)


# --------------------------------------------------------------------------- results
def write_results(
    records: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    settings: Mapping[str, Any],
    *,
    metrics: Sequence[str] = REPORT_METRICS,
    reference: str = "ce",
) -> dict[str, Path]:
    """Write ``results.json``, ``results.csv``, ``recall_vs_rauroc.png`` and
    ``training_curves.png`` (when the runs carry curves) to ``out``.

    ``results.json`` holds ``settings``, ``runs`` (every record), ``summary`` (mean and 95 %
    t-interval over the splits' seed means, :func:`~bayesurl.runs.aggregate.summarize`),
    ``paired_vs_<reference>`` per metric (paired t / Wilcoxon over (split, seed), Holm) and
    ``reproducibility`` (split-half Spearman for R-AUROC, R@1, OOD AUROC).
    """
    import csv

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    recs = [_jsonable(dict(r)) for r in records]
    summary = summarize(recs, metrics)
    names = {r.get("method", r.get("estimator")) for r in recs if r.get("error") is None}
    paired: dict[str, Any] = {}
    if reference in names:
        for m in metrics:
            try:
                paired[m] = paired_comparison(recs, m, reference=reference)
            except ValueError as exc:
                paired[m] = {"note": str(exc)}
    repro: dict[str, Any] = {}
    for m in REPRO_METRICS:
        try:
            repro[m] = split_half_reproducibility(recs, m)
        except ValueError as exc:
            repro[m] = {"note": str(exc)}
    doc = {
        "settings": _jsonable(dict(settings)),
        "runs": recs,
        "summary": _jsonable(summary),
        f"paired_vs_{reference}": _jsonable(paired),
        "reproducibility": _jsonable(repro),
    }
    paths = {"json": folder / "results.json", "csv": folder / "results.csv"}
    write_json(paths["json"], doc)
    cols = ["method", "split", "seed", "error", *metrics]
    cols += sorted(
        {k for r in recs for k in r}
        - set(cols)
        - {"traceback", "upstream", "downstream", "overrides"}
    )
    with atomic_open(paths["csv"], "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in recs:
            w.writerow(
                {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()}
            )
    paths["png"] = plot_results(
        summary, folder / "recall_vs_rauroc.png", title=str(settings.get("preset", ""))
    )
    curves = plot_training_curves(
        recs, folder / "training_curves.png", title=str(settings.get("preset", ""))
    )
    if curves is not None:
        paths["curves"] = curves
    return paths


def plot_results(
    summary: Mapping[str, Mapping[str, Any]], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """R@1 against R-AUROC per estimator with their 95 % t-intervals (URL Fig. 2 style).

    Intervals are drawn clipped to ``[0, 1]`` (both metrics live there; with 4 splits the
    t-interval's factor is 3.18 and can reach past the range); each estimator gets its own
    colour and marker, named in a legend beside the axes.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 6.0))
    markers = "osD^v<>phX*P"
    cmap = plt.get_cmap("tab20")
    xs: list[float] = []
    ys: list[float] = []
    for i, (name, row) in enumerate(summary.items()):
        r1, ra = row.get("r@1", {}), row.get("r_auroc", {})
        if r1.get("mean") is None or ra.get("mean") is None:
            continue

        def err(d: Mapping[str, Any]) -> tuple[list[list[float]], float, float]:
            lo, hi, m = d.get("low"), d.get("high"), float(d["mean"])
            if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
                return [[0.0], [0.0]], m, m
            lo, hi = max(float(lo), 0.0), min(float(hi), 1.0)
            return [[m - lo], [hi - m]], lo, hi

        ex, x0, x1 = err(ra)
        ey, y0, y1 = err(r1)
        xs += [x0, x1]
        ys += [y0, y1]
        ax.errorbar(
            ra["mean"],
            r1["mean"],
            xerr=ex,
            yerr=ey,
            fmt=markers[i % len(markers)],
            color=cmap(i % 20),
            capsize=3,
            ms=7,
            label=name,
        )
    ax.axvline(0.5, color="grey", lw=0.8, ls="--")
    if xs:
        pad = 0.02
        ax.set_xlim(max(min(xs) - pad, 0.0), min(max(xs) + pad, 1.0))
        ax.set_ylim(max(min(ys) - pad, 0.0), min(max(ys) + pad, 1.0))
    ax.set_xlabel("R-AUROC (downstream, mean and 95 % t-interval over class splits)")
    ax.set_ylabel("R@1 (downstream)")
    ax.set_title(f"bayesurl benchmark {title}".strip())
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def plot_training_curves(
    records: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *, title: str = ""
) -> Path | None:
    """Per-epoch training loss and median ``u`` of a fixed training batch, per estimator.

    The convergence check of issue 13 (the vMF methods' kappa barely moved in 3-epoch runs):
    one line per (estimator, split), both curves divided by their first epoch's value so that
    estimators with different scales share the axes (``u`` of the vMF methods is ``1/kappa``).
    Returns ``None`` (and writes nothing) when no record carries a curve.
    """
    curves = [
        r for r in records if r.get("error") is None and (r.get("u_curve") or r.get("loss_curve"))
    ]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = sorted({str(r.get("method", r.get("estimator"))) for r in curves})
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(i % 20) for i, n in enumerate(names)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for key, ax, label in (
        ("loss_curve", axes[0], "training loss / epoch-1 loss"),
        ("u_curve", axes[1], "median u on a fixed training batch / epoch-1 value"),
    ):
        seen: set[str] = set()
        for r in curves:
            c = [float(v) for v in (r.get(key) or []) if v is not None]
            if len(c) < 1 or c[0] == 0 or not all(math.isfinite(v) for v in c):
                continue
            n = str(r.get("method", r.get("estimator")))
            ax.plot(
                range(1, len(c) + 1),
                [v / c[0] for v in c],
                color=colour[n],
                lw=1,
                alpha=0.8,
                label=None if n in seen else n,
            )
            seen.add(n)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[1].legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.suptitle(f"training curves {title}".strip())
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _under_torchrun() -> bool:
    from bayesurl.distributed import is_distributed
    from bayesurl.runs.runner import launched_by_torchrun

    return launched_by_torchrun() or is_distributed()


def refuse_under_torchrun(*, worker: bool = False, tune: int = 0) -> None:
    """Raise for the parts of the protocol that cannot run under ``torchrun``.

    Under ``torchrun`` rank 0 claims the runs and every rank runs each claimed run together
    (:func:`run_protocol`). Two parts cannot follow it: ``worker=True`` waits for another
    machine's plan (up to an hour, longer than the process group's collectives may block the
    other ranks), and ``tune`` runs Optuna's trials on one process. Start a worker per GPU
    (``CUDA_VISIBLE_DEVICES=k bayesurl benchmark --worker --storage URL``) and tune in one
    process first instead.

    Raises
    ------
    ValueError
        Under torchrun (``WORLD_SIZE > 1``) or a multi-rank process group, with ``worker`` or
        ``tune``.
    """
    if not _under_torchrun() or not (worker or tune):
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


def _lead(fn: Callable[[dict[str, Any]], Mapping[str, Any]]) -> Callable[..., Any]:
    """Rank 0's ``run_fn`` under torchrun: send the claimed run to the other ranks, run it
    with them, and check that every rank had the same outcome."""
    from bayesurl.runs.runner import agree_on_outcome

    def lead(params: dict[str, Any]) -> Mapping[str, Any]:
        _broadcast(params)
        try:
            rec = fn(params)
        except Exception as exc:
            agree_on_outcome(_key(params), f"{type(exc).__name__}: {exc}")
            raise
        agree_on_outcome(_key(params), rec.get("error"))
        return rec

    return lead


def _follow(fn: Callable[[dict[str, Any]], Mapping[str, Any]]) -> int:
    """The other ranks under torchrun: run every run rank 0 sends until it sends ``None``."""
    from bayesurl.runs.runner import agree_on_outcome

    done = 0
    while (params := _broadcast(None)) is not None:
        try:
            rec = fn(dict(params))
        except Exception as exc:  # rank 0 records the run's error (it raised the same)
            agree_on_outcome(_key(params), f"{type(exc).__name__}: {exc}")
        else:
            agree_on_outcome(_key(params), rec.get("error"))
        done += 1
    return done


def _key(params: Mapping[str, Any]) -> str:
    cs = params.get("class_split") or {}
    return f"{params.get('estimator')}/split{cs.get('index')}/seed{params.get('seed')}"


def run_protocol(
    estimators: Sequence[str] | None,
    *,
    preset: str | ProtocolPreset = "standard",
    out: str | os.PathLike[str] | None = None,
    storage: str | None = None,
    worker: bool = False,
    tune: int = 0,
    run_fn: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
    dataset: str = "fashion_mnist",
    overrides: Sequence[str] = (),
    root: str | os.PathLike[str] | None = None,
    device: str | None = None,
    poll: float = 10.0,
    heartbeat_interval: int = 30,
    plan_timeout: float = 3600.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or join) the benchmark sweep of ``preset``; see the module docs.

    Parameters
    ----------
    estimators : sequence of str or None
        Estimators of the recipe file (``None``: all of them; ignored with ``worker=True``).
    preset : str or ProtocolPreset
        ``"standard"``, ``"quick"`` or ``"smoke"`` (``PROTOCOL_PRESETS``).
    out : path-like, optional
        Results folder; default ``results/benchmark/<preset>``.
    storage : str, optional
        SQLAlchemy URL of the sweep storage; default ``sqlite:///<out>/sweep.db``.
    worker : bool
        Only work on the runs already in the storage (no tuning, no enqueueing); for the
        extra machines / GPUs of a multi-worker sweep.
    tune : int
        Optuna trials per estimator before the sweep (0: reuse ``<out>/tuned.json`` if any).
    run_fn : callable, optional
        ``run_fn(params) -> record``; default :func:`pipeline_run_fn`.
    dataset, overrides, root, device
        Recipe file, extra ``section.key=value`` overrides, Fashion-MNIST root, device.
    poll : float
        Seconds between looks while waiting for other workers.
    heartbeat_interval : int
        Seconds between a running run's heartbeats (a crashed worker's run is given to another
        after four missed beats).
    plan_timeout : float
        How long a ``worker`` waits for the first machine to enqueue the plan.
    log : callable
        Progress output.

    Returns
    -------
    dict
        ``{"status", "done_here", "paths", "main_process"}``; ``paths`` is empty until every
        run is finished.

    Raises
    ------
    ValueError
        Under ``torchrun`` with ``worker`` or ``tune`` (:func:`refuse_under_torchrun`) or an
        estimator whose fit is not distributed, before the storage is opened.

    Notes
    -----
    Under ``torchrun --nproc_per_node W`` the sweep opens one process group; rank 0 alone
    opens the storage, enqueues the plan, claims each run and sends it to the other ranks, so
    every rank runs the same run at the same time (DDP training, sharded evaluation; the mixed
    R-AUROC from every rank's rows) and rank 0 alone stores, logs and writes the results. It
    does not wait for runs claimed by other workers (the other ranks would wait in a
    collective): when nothing is left to claim it returns, and the last worker to finish
    writes the results. Every rank returns ``main_process`` (False on the ranks other than 0,
    whose ``status`` is ``None``).
    """
    refuse_under_torchrun(worker=worker, tune=tune)
    p = get_protocol_preset(preset)
    folder = Path(out) if out is not None else Path("results") / "benchmark" / p.name
    if worker:
        names: list[str] = []
    elif estimators is None:
        from bayesurl.runs.sweep import resolve_estimators

        names = resolve_estimators(None, dataset)
    else:
        names = list(estimators)
    distributed = _under_torchrun()
    with contextlib.ExitStack() as stack:
        if distributed:  # one process group for the whole sweep (bayesurl.runs.runner.run uses it)
            from bayesurl.distributed import is_main_process
            from bayesurl.runs.config import load_recipe
            from bayesurl.runs.runner import _torchrun_group

            cfgs = [  # estimators whose fit is not distributed: refused before anything runs
                load_recipe(f"{dataset}/{n}", [*p.overrides, *overrides], preset=p.recipe_preset)
                for n in names
            ]
            stack.enter_context(_torchrun_group(cfgs, device, argument="estimators"))
            if not is_main_process():
                fn = run_fn or pipeline_run_fn(
                    dataset=dataset,
                    preset=p,
                    overrides=overrides,
                    tuned=load_tuned(folder),
                    root=root,
                    device=device,
                )
                return {
                    "status": None,
                    "done_here": _follow(fn),
                    "paths": {},
                    "main_process": False,
                }
            stack.callback(_broadcast, None)  # at the end, rank 0 releases the other ranks
        folder.mkdir(parents=True, exist_ok=True)
        if p.smoke:
            log(
                f"NOTE: preset {p.name!r} is a smoke-scale run ({p.note}); its ranking is not a "
                "verdict. For the real benchmark run `bayesurl benchmark --preset standard` "
                "(<= 3 h on 2 CPU cores, minutes on a GPU; resumable, add workers with --worker)."
            )
        store = SweepStorage(
            storage, out=folder, sweep=p.name, heartbeat_interval=heartbeat_interval
        )
        tuned = {} if tune else load_tuned(folder)

        def pipeline(tuned: dict[str, Any]) -> Callable[[dict[str, Any]], Mapping[str, Any]]:
            return run_fn or pipeline_run_fn(
                dataset=dataset, preset=p, overrides=overrides, tuned=tuned, root=root,
                device=device,
            )  # fmt: skip

        fn = pipeline(tuned)
        if tune and not worker:
            split0 = class_splits(p.n_splits)[0]
            chosen = tune_estimators(names, tune, fn, store, split=split0, out=folder, log=log)
            tuned = {k: v["overrides"] for k, v in chosen.items()}
            fn = pipeline(tuned)
        t0 = time.perf_counter()
        if not worker:
            plan = plan_runs(names, p)
            for r in plan:
                r["overrides"] = list(tuned.get(r["estimator"], []))
            added = store.add_runs(plan)
            log(f"sweep {p.name!r}: {len(plan)} runs planned, {added} new; storage {store.url}")

        def on_done(claim: Any, record: Any, error: str | None) -> None:
            st = store.status()
            head = f"[{st['complete']}/{st['total']}] {claim.key}"
            if error:
                log(f"{head}: FAILED {error}")
            else:
                # the finished runs so far, readable (and committable) before the sweep ends
                done_so_far = {"preset": p.name, "status": st, "runs": store.records()}
                write_json(folder / "partial_runs.json", _jsonable(done_so_far))
                log(
                    f"{head}: R@1 {record.get('r@1')}, R-AUROC {record.get('r_auroc')}, "
                    f"OOD AUROC {record.get('ood_auroc')}, {record.get('total_time')} s"
                )

        if worker:  # the first machine may still be tuning or planning: wait for the plan
            waited = 0.0
            while store.status()["total"] == 0 and waited < plan_timeout:
                time.sleep(poll)
                waited += poll
            if store.status()["total"] == 0:
                raise ValueError(
                    f"no runs in the storage {store.url} after {plan_timeout:.0f} s: start the "
                    "first machine (without --worker) with the same --storage and --preset"
                )
        # under torchrun rank 0 claims, every rank runs the claimed run (_lead / _follow);
        # no waiting for runs elsewhere: the other ranks would wait in a collective
        work_fn = _lead(fn) if distributed else fn
        done = store.work(work_fn, wait=not distributed, poll=poll, on_done=on_done)
        status = store.status()
        paths: dict[str, Path] = {}
        if status["total"] and status["waiting"] == status["running"] == 0:
            records = store.records()
            failures = store.failures()
            settings = {
                "preset": p.name,
                "protocol": asdict(p),
                "dataset": dataset,
                "estimators": sorted({r.get("method", "") for r in records}),
                "class_splits": [s.to_dict() for s in class_splits(p.n_splits)],
                "seeds": list(p.seeds),
                "overrides": list(overrides),
                "tuned": load_tuned(folder),
                "storage": store.url if storage else f"sqlite:///{folder.name}/sweep.db",
                "failed_attempts": failures,
                "sum_of_run_times_s": sum(float(r.get("total_time") or 0.0) for r in records),
                "this_worker_wall_s": time.perf_counter() - t0,
                "python": platform.python_version(),
                "platform": sys.platform,
            }
            paths = write_results(records, folder, settings)
            log(f"results written to {folder}")
        return {
            "status": status,
            "done_here": done,
            "paths": {k: str(v) for k, v in paths.items()},
            "main_process": True,
        }
