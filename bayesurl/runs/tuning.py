"""Hyper-parameter search of a sweep: URL's selection protocol with Optuna.

Per estimator, ``N`` TPE trials on the class-disjoint validation classes of the first class
split (``data.stage = "tune"``); the objective is the R-AUROC and trials with R@1 < 0.1 are
discarded (URL, Kirchhof et al., 2023, section 3, "Hyperparameters"). The chosen settings go
to ``<out>/tuned.json`` and every later run of the sweep reuses them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bayesurl.data.class_splits import ClassSplit
from bayesurl.files import write_json

__all__ = ["TUNE_SPACES", "load_tuned", "search_space", "tune_estimators"]

#: Search spaces (URL appendix B): ``{override key: ("log" | "float" | "int", low, high)}``.
#: Every estimator tunes the learning rate in URL's range [1e-4, 1e-2]; some add their own.
TUNE_SPACES: dict[str, dict[str, tuple[str, float, float]]] = {
    "_default": {"train.lr": ("log", 1e-4, 1e-2)},
    "infonce": {"estimator.kwargs.inverse_temperature": ("float", 8.0, 64.0)},
    "mcinfonce": {"estimator.kwargs.inverse_temperature": ("float", 8.0, 64.0)},
    "losspred": {"estimator.kwargs.lam": ("log", 1e-3, 1.0)},
    "mcdropout": {"estimator.kwargs.p": ("float", 0.05, 0.5)},
}


def search_space(estimator: str) -> dict[str, tuple[str, float, float]]:
    """The search space of ``estimator``: the learning rate and its own keys."""
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
    store: Any,
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
    in ``store`` (``"tune:<sweep>:<estimator>"`` studies of a
    :class:`~bayesurl.runs.storage.SweepStorage`, or in-memory studies), so a restarted or
    multi-worker search goes on where it stopped and stops at ``n_trials`` finished trials.

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
        space = search_space(est)
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
